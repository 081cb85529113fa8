"""Typed errors of the journal (design §5). Every message names the segment file and, where one applies, the
byte offset; the CLI maps these to exit codes (design §7), so this package imports nothing from upgrade_core.

Split by cause, in the manner of trio's Closed/Broken pair:

- :class:`JournalCorruptError`: the bytes on disk are bad where a torn write cannot explain it (a valid frame
  after a bad one, or any bad frame in a sealed segment). Nothing is truncated.
- :class:`JournalDecodeError`: a frame is intact but its payload is not a record this code can read (unknown
  tag, bad envelope). Never dropped.
- :class:`JournalVersionError`: the journal was written by a newer format version; it is refused, never
  misread.
- :class:`JournalPoisonedError`: an fsync/fdatasync failed ("Broken": external). Never retried, because a
  later fsync may report success without having written the lost pages; the writer takes no more appends.
- :class:`JournalFullError`: ENOSPC/EDQUOT while appending. The partial batch was cut off again; the
  journal stays readable and holds nothing half-written.
- :class:`JournalClosedError`: your code closed the writer ("Closed").
"""

from __future__ import annotations


class JournalStoreError(Exception):
    """Base of every journal failure.

    Attributes:
        path: the file (segment or directory) involved, or None.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class JournalCorruptError(JournalStoreError):
    """A segment holds a bad frame that is not a torn tail; recovery must not guess.

    Attributes:
        path: absolute path of the segment file.
        offset: byte offset of the bad frame (in the decompressed content for a sealed ``.jnl.zst``
            segment), or of the segment itself for a missing/misnamed segment.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"journal corrupt: {path} at offset {offset}: {reason}", path)
        self.offset = offset
        self.reason = reason


class JournalDecodeError(JournalStoreError):
    """An intact frame's payload could not be decoded (bad envelope, or the codec raised).

    Attributes:
        path: absolute path of the segment file.
        offset: byte offset of the frame.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"journal record undecodable: {path} at offset {offset}: {reason}", path)
        self.offset = offset
        self.reason = reason


class JournalVersionError(JournalStoreError):
    """A segment was written by a newer journal format than this code supports.

    Attributes:
        path: absolute path of the segment file.
        found: the format version in its header.
        supported: the newest version this code reads.
    """

    def __init__(self, path: str, found: int, supported: int) -> None:
        super().__init__(
            f"journal format version {found} in {path} is newer than supported version {supported}; "
            "upgrade this tool before reading it",
            path,
        )
        self.found = found
        self.supported = supported


class JournalPoisonedError(JournalStoreError):
    """An fsync/fdatasync failed; the writer refuses every later append (no retry, see module doc)."""


class JournalClosedError(JournalStoreError):
    """The writer was closed by its owner (``aclose``) before this call."""


class JournalFullError(JournalStoreError):
    """ENOSPC or EDQUOT on append: the record was not accepted; the journal stays readable."""


class JournalRefusedError(JournalStoreError):
    """A path of the journal is not ours (design §10, case C23): a symlink, FIFO, device, directory or
    hard link where a file belongs, a foreign owner, a group/world-writable mode, or permission denied.
    Nothing was opened through it, written or removed. The agent maps it to exit 4.

    Attributes:
        path: the path refused.
        what: what is wrong with it (one phrase).
    """

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: {what}", path)
        self.what = what


class JournalBusyError(JournalStoreError):
    """Another writer holds the journal directory's own lock (one writer per journal, design §10). Exit 75."""


class JournalOwnerError(JournalStoreError):
    """The journal belongs to another owner (agent name and unit) than the one opening it (case C25).

    Attributes:
        path: the journal directory.
        found: the owner recorded in the journal.
        expected: the owner the caller claimed.
    """

    def __init__(self, path: str, found: dict[str, str], expected: dict[str, str]) -> None:
        def who(owner: dict[str, str]) -> str:
            return f"agent {owner.get('agent', '?')} (unit {owner.get('unit', '?')})"

        super().__init__(f"{path} holds the journal of {who(found)}; it was opened as {who(expected)}", path)
        self.found = found
        self.expected = expected

"""Reading a journal directory without an event loop (design §5): scan, classify, decode. Never writes.

Directory layout (``state_dir/journal/``):

- ``<first_seq:020d>.jnl``: a live segment (appendable, uncompressed); normally only the last one.
- ``<first_seq:020d>.jnl.zst``: a sealed segment: the zstd frame of a former live segment's exact bytes.
  When both names exist for one ``first_seq`` (a crash between sealing and removing the live file), the
  sealed one is read and the live one is a leftover: replay never sees a record twice.
- ``*.tmp``: unfinished temp files of sealing; ignored here, removed by the next writer.

Classification (design §5, cases C12, C13): a bad frame (or header) in the *last* segment, when it is live and
no frame valid on its own follows at an 8-aligned offset, is a torn tail: reported, and the records before
it are the replay. Anything else bad raises :class:`JournalCorruptError` naming the file and offset. A
zero-length or header-less last segment is a torn write at offset 0 (evidence of a crash, not a valid empty
log); the same in an earlier segment is corruption. Gaps in the sequence are corruption unless a snapshot
record covers them (compaction dropped those segments).

This module imports only the standard library and ``journal._framing`` at import time; ``zstandard`` is
imported only when a sealed segment is read, and ``attrs`` (for :class:`~journal.Record`) only by
:func:`replay`, so a boot-time recovery that finds nothing to do starts fast.
"""

from __future__ import annotations

import gc
import os

from ._framing import (
    ENVELOPE,
    FORMAT_VERSION,
    KIND_EVENT,
    SEGMENT_HEADER_SIZE,
    BadFrame,
    decode_envelope,
    decode_frames,
    decode_segment_header,
    valid_frame_after,
)
from .errors import (
    JournalCorruptError,
    JournalDecodeError,
    JournalRefusedError,
    JournalStoreError,
    JournalVersionError,
)
from .safefs import open_dir, read_file, walk_to

# Not ``typing.TYPE_CHECKING``: importing typing costs several ms at boot (mypy treats this name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ._records import Codec, Replay

LIVE_SUFFIX = ".jnl"
SEALED_SUFFIX = ".jnl.zst"
TMP_SUFFIX = ".tmp"


def parse_segment_name(name: str) -> tuple[int, bool] | None:
    """(first_seq, sealed) for a segment file name, or None for any other name."""
    digits, suffix = name[:20], name[20:]
    if len(digits) != 20 or not (digits.isascii() and digits.isdigit()):
        return None
    if suffix == LIVE_SUFFIX:
        return int(digits), False
    if suffix == SEALED_SUFFIX:
        return int(digits), True
    return None


def segment_name(first_seq: int, sealed: bool) -> str:
    """File name of the segment whose first record is ``first_seq``."""
    return f"{first_seq:020d}{SEALED_SUFFIX if sealed else LIVE_SUFFIX}"


RawRecord = tuple[int, str, float, "int | None", bytes, str, int]
"""A validated, not yet decoded record: (seq, episode_id, wall_time, covers_through, event bytes, segment
path, frame offset). A plain tuple: replay makes one per record."""


class Segment:
    """What a scan learned about one segment file.

    Attributes:
        path: absolute path.
        first_seq: sequence number its first record carries (from the name, checked against the header).
        sealed: True for a ``.jnl.zst`` segment.
        last_seq: sequence number of its last valid record (``first_seq - 1`` when it holds none).
        end: bytes of its valid prefix (live segments: where the next frame goes).
        chain: chain CRC of its last valid frame (the header CRC when none).
        episodes: episode ids of its records (``"-"`` for snapshots).
    """

    __slots__ = ("chain", "end", "episodes", "first_seq", "last_seq", "path", "sealed")

    def __init__(self, path: str, first_seq: int, sealed: bool) -> None:
        self.path = path
        self.first_seq = first_seq
        self.sealed = sealed
        self.last_seq = first_seq - 1
        self.end = 0
        self.chain = 0
        self.episodes: set[str] = set()


class Scan:
    """The result of :func:`scan`: every segment, leftover and record of a journal directory.

    Attributes:
        directory: absolute path of the journal directory.
        segments: the segments replay reads, in sequence order.
        shadowed: live files whose sealed twin exists (leftovers of an interrupted seal).
        temps: ``*.tmp`` leftovers.
        records: every valid record in sequence order, including ones hidden by a snapshot (empty when
            the scan decoded them: see ``decoded``).
        decoded: with a ``decode`` function (:func:`replay`), the same records as
            :class:`~journal.Record` values; a record ``decode`` refused holds None as its event and is
            listed in ``undecodable``.
        undecodable: (seq, error) of each record ``decode`` refused, in sequence order.
        covers_through: the highest ``covers_through`` of any snapshot record (0 when none).
        torn: (path, offset) of the torn tail of the last segment, or None.
        next_seq: the sequence number the next appended record gets.
        stopped: a salvaging scan (:func:`salvage`) only: the corruption it stopped at, or None.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.segments: list[Segment] = []
        self.shadowed: list[str] = []
        self.temps: list[str] = []
        self.records: list[RawRecord] = []
        self.decoded: list[Any] = []
        self.undecodable: list[tuple[int, JournalDecodeError]] = []
        self.covers_through = 0
        self.torn: tuple[str, int] | None = None
        self.next_seq = 1
        self.stopped: JournalStoreError | None = None

    def visible(self) -> list[RawRecord]:
        """The records replay returns: those not summarised by a snapshot."""
        covers = self.covers_through
        if covers == 0:
            return self.records
        return [r for r in self.records if r[0] > covers]


class gc_paused:  # lower case: used like a function, ``with gc_paused():``
    """Pause the cyclic garbage collector while a replay allocates its records.

    Replay creates several objects per record and none of them form cycles; with the collector on, the
    growing record list is traversed again and again by generation-2 collections, which cost about a third
    of a 100k-record replay (``benchmarks/bench_journal.py``). Reference counting still frees everything.
    A class rather than ``contextlib.contextmanager``, to keep contextlib off the boot path.

    On exit the objects made meanwhile are moved to the collector's oldest generation (``gc.freeze()`` then
    ``gc.unfreeze()``, which moves without traversing), where they would end up anyway: otherwise the
    first young collection after the pause traverses every record, and the next ones again as they are
    promoted, while the caller folds them (about a sixth of a 100k-record replay and fold, design §9
    ``journal.replay``). Skipped when the process froze objects itself (``gc.get_freeze_count()``):
    unfreezing would undo that.
    """

    def __enter__(self) -> None:
        self._enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc_info: object) -> None:
        if self._enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def open_journal_dir(directory: str) -> int | None:
    """Open the journal directory through its checked parent (read-only; never creates anything).

    The parent is reached by :func:`journal.safefs.walk_to` (from ``/``, one component at a time, each by
    :func:`journal.safefs.check_parent`: owned by root or us, not writable by others unless sticky and
    root-owned), the directory itself :func:`journal.safefs.check_owned`; it is opened
    ``O_NOFOLLOW`` relative to the parent's descriptor, so neither a symlink nor a swapped directory is
    followed (design §10, case C23).

    Returns:
        Its descriptor, or None when the directory (or its parent) does not exist.

    Raises:
        JournalRefusedError: the parent or the directory fails its check.
    """
    parent = os.path.dirname(directory) or "/"
    pfd = walk_to(parent)
    if pfd is None:
        return None
    try:
        return open_dir(directory, dir_fd=pfd, name=os.path.basename(directory))
    finally:
        os.close(pfd)


def _read(dir_fd: int, path: str) -> bytes:
    return read_file(dir_fd, os.path.basename(path), path)


MAX_SEALED_BYTES = 1 << 30
"""Largest decompressed sealed segment accepted (bytes): a damaged zstd header must not make replay
allocate whatever size it claims."""


def _decompress(path: str, data: bytes) -> bytes:
    import zstandard  # lazily: only sealed history needs it

    try:
        size = zstandard.frame_content_size(data)
        if size < 0 or size > MAX_SEALED_BYTES:
            raise JournalCorruptError(path, 0, f"sealed segment declares an invalid content size {size}")
        return zstandard.ZstdDecompressor().decompress(data)
    except zstandard.ZstdError as exc:
        raise JournalCorruptError(path, 0, f"sealed segment is not a complete zstd frame: {exc}") from None


def _list(dir_fd: int, directory: str) -> tuple[list[tuple[int, bool, str]], list[str], list[str]]:
    names = os.listdir(dir_fd)
    live: dict[int, str] = {}
    sealed: dict[int, str] = {}
    temps: list[str] = []
    for name in names:
        parsed = parse_segment_name(name)
        if parsed is not None:
            (sealed if parsed[1] else live)[parsed[0]] = os.path.join(directory, name)
        elif name.endswith(TMP_SUFFIX):
            temps.append(os.path.join(directory, name))
    shadowed = sorted(live.pop(seq) for seq in list(live) if seq in sealed)
    ordered = sorted([(s, False, p) for s, p in live.items()] + [(s, True, p) for s, p in sealed.items()])
    return ordered, shadowed, sorted(temps)


OWNER_FILE = "owner.json"


def read_owner_at(dir_fd: int, directory: str) -> dict[str, str] | None:
    """The owner recorded in ``owner.json`` under the checked directory ``dir_fd``, or None when none is.

    Raises:
        JournalRefusedError: ``owner.json`` is not a regular file of ours.
        JournalCorruptError: it is not a JSON object of strings.
    """
    path = os.path.join(directory, OWNER_FILE)
    try:
        data = read_file(dir_fd, OWNER_FILE, path)
    except FileNotFoundError:
        return None
    import json

    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise JournalCorruptError(path, 0, "the owner record is not a JSON object of strings")
    return doc


def read_owner(directory: str | os.PathLike[str]) -> dict[str, str] | None:
    """The journal's recorded owner (e.g. ``{"agent": NAME, "unit": UNIT}``), read-only; None when the
    directory does not exist or records none (a journal written before owners were recorded).

    Raises:
        JournalRefusedError: the directory, its parent or ``owner.json`` is not ours.
        JournalCorruptError: ``owner.json`` is not a JSON object of strings.
    """
    directory = os.path.abspath(os.fspath(directory))
    fd = open_journal_dir(directory)
    if fd is None:
        return None
    try:
        return read_owner_at(fd, directory)
    finally:
        os.close(fd)


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_FCS_SIZES = (0, 2, 4, 8)
_DID_SIZES = (0, 1, 2, 4)


def zstd_frame_intact(data: bytes) -> bool:
    """A cheap structural check of one whole zstd frame, standard library only, nothing decompressed.

    True when ``data`` is exactly one zstd frame (RFC 8878 section 3.1.1) that declares its content size:
    the magic number, a frame header with no reserved bit set, then block headers whose sizes lead, block
    by block, to the last block and its optional 4-byte checksum at exactly the end of ``data``. A sealed
    segment cut short, extended, zeroed or with a damaged header or block header fails it; a flipped bit
    inside compressed block data passes it (only decompression and the content checksum see that, which a
    full replay does).
    """
    n = len(data)
    if n < 9 or data[:4] != _ZSTD_MAGIC:
        return False
    fhd = data[4]
    if fhd & 0x08:  # reserved bit
        return False
    fcs_flag, single, checksum, did_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
    fcs = _FCS_SIZES[fcs_flag] if fcs_flag or not single else 1
    if fcs == 0:  # no declared content size: design §5's sealer always writes one (scan requires it)
        return False
    pos = 5 + (0 if single else 1) + _DID_SIZES[did_flag] + fcs
    while True:
        if pos + 3 > n:
            return False
        header = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:  # reserved block type
            return False
        pos += 3 + (1 if kind == 1 else size)
        if last:
            break
    return pos + (4 if checksum else 0) == n


def _older_segments_plausible(dir_fd: int, ordered: list[tuple[int, bool, str]]) -> bool:
    """Every segment before the live one is a sealed segment whose zstd frame is structurally whole
    (:func:`zstd_frame_intact`); an older *live* segment (not normal) sends the caller to the full path.
    Each is read through the checked directory handle (a symlink or FIFO is refused, never followed)."""
    for _first_seq, sealed, path in ordered[:-1]:
        if not sealed or not zstd_frame_intact(_read(dir_fd, path)):
            return False
    return True


UNSURE = "unsure"
"""What :func:`live_tail` returns when only a full replay can tell (see there)."""


def live_tail(
    directory: str | os.PathLike[str], unsure: Callable[[bytes], bool] | None = None
) -> bytes | str | None:
    """The newest episode record of the live segment, read with the standard library only (design §9).

    For the boot-time no-op recovery, which must not pay for a replay: it reads only the live segment,
    never writes, never creates a file and never raises for the journal's contents.

    Returns:
        None when no episode record is live: no directory or no segment, an intact and empty live
        segment, or one holding compaction snapshots only (sealing only ever happens once every episode
        is closed, design §5). The codec payload (bytes) of the newest record that is not a snapshot, when
        the live segment is intact. :data:`UNSURE` for anything else (a torn or corrupt tail, a newer
        format, a sealed newest segment, a shadowed segment or a leftover temporary file, an unreadable
        file, an older segment that is not a structurally whole sealed frame): the caller must take the
        full path (lock, repair, replay), which names any corruption with its file and offset. An older
        sealed segment is checked by structure only (:func:`zstd_frame_intact`), never decompressed.
        :data:`UNSURE` too when ``unsure`` is given and says so of the intact live segment's bytes: the
        caller's own way to say that a record still live needs the full path whatever follows it (byte
        searches; a false True only costs the full path).
    """
    try:
        dir_fd = open_journal_dir(os.path.abspath(os.fspath(directory)))
        if dir_fd is None:
            return None
        try:
            ordered, shadowed, temps = _list(dir_fd, os.fspath(directory))
            if not ordered:
                return None
            if shadowed or temps:
                return UNSURE
            first_seq, sealed, path = ordered[-1]
            if sealed or not _older_segments_plausible(dir_fd, ordered):
                return UNSURE
            data = _read(dir_fd, path)  # a symlink, FIFO or hard link is refused, never opened or waited on
        finally:
            os.close(dir_fd)
    except (OSError, JournalRefusedError):
        return UNSURE
    header = decode_segment_header(data)
    if isinstance(header, BadFrame):
        return UNSURE
    if header.version != FORMAT_VERSION or header.first_seq != first_seq:
        return UNSURE
    frames, end, _chain, bad = decode_frames(data, SEGMENT_HEADER_SIZE, first_seq, header.crc)
    if bad is not None or end != len(data):
        return UNSURE
    if unsure is not None and unsure(data):
        return UNSURE
    # Walk back over compaction snapshots (episode "-"): the newest episode record decides.
    for _offset, _seq, start, stop in reversed(frames):
        env = decode_envelope(data, start, stop)
        if env.covers_through is not None:
            continue
        return data[env.event_start : stop]
    return None


def scan(directory: str | os.PathLike[str], *, dir_fd: int | None = None) -> Scan:
    """Read and validate every segment of ``directory`` (sync; never writes or creates anything).

    Every file is opened relative to the checked directory descriptor (see :func:`open_journal_dir`).

    Args:
        directory: the journal directory; a missing one is an empty journal.
        dir_fd: an open, checked descriptor of ``directory`` (the writer's); None: opened and closed here.

    Returns:
        The :class:`Scan`.

    Raises:
        JournalCorruptError: a bad frame that is not a torn tail, a bad sealed segment, a sequence gap not
            covered by a snapshot, or overlapping segments (file and offset named).
        JournalVersionError: a segment header written by a newer format version.
        JournalDecodeError: an intact frame whose envelope cannot be decoded.
        JournalRefusedError: the directory, its parent or a segment is not ours (a symlink, FIFO, device,
            directory or hard link where a segment belongs, a foreign owner, a group/world-writable mode).
        OSError: the directory or a segment cannot be read (e.g. EIO).
    """
    directory = os.path.abspath(os.fspath(directory))
    if dir_fd is not None:
        return _scan(directory, dir_fd)
    return _scan_path(directory)


def _scan_path(directory: str, decode: Callable[[bytes], Any] | None = None) -> Scan:
    """:func:`_scan` of the absolute ``directory``, opened (checked) and closed here; a missing directory is
    an empty :class:`Scan`."""
    fd = open_journal_dir(directory)
    if fd is None:
        return Scan(directory)
    try:
        return _scan(directory, fd, decode)
    finally:
        os.close(fd)


def _scan(
    directory: str, dir_fd: int, decode: Callable[[bytes], Any] | None = None, salvage: bool = False
) -> Scan:
    """:func:`scan`; with ``decode``, each record's event is decoded as soon as its frame is validated and
    the records go to ``decoded`` (:func:`replay`: each payload is freed once decoded instead of every
    payload of the journal being held at once). With ``salvage`` (:func:`salvage`), the first corruption
    ends the scan instead of raising: it is kept in ``stopped`` and the records before it are the result."""
    result = Scan(directory)
    try:  # noqa: SIM105  (not contextlib.suppress: contextlib stays off the boot path, see gc_paused)
        _scan_into(result, directory, dir_fd, decode, salvage)
    except _Stop:
        pass
    return result


class _Stop(Exception):
    """A salvaging scan met its first corruption (kept in ``Scan.stopped``)."""


def _scan_into(
    result: Scan, directory: str, dir_fd: int, decode: Callable[[bytes], Any] | None, salvage: bool
) -> None:
    def halt(error: JournalStoreError) -> None:
        if not salvage:
            raise error
        result.stopped = error

    make_record: Any = None
    if decode is not None:
        from ._records import Record

        make_record = Record
    ordered, result.shadowed, result.temps = _list(dir_fd, directory)
    expected: int | None = None
    gaps: list[tuple[str, int, int]] = []  # (path, first missing seq, last missing seq)
    records = result.records
    decoded_append = result.decoded.append
    prev_eid, prev_id = b"", ""
    unpack_env = ENVELOPE.unpack_from
    env_size = ENVELOPE.size
    for index, (first_seq, sealed, path) in enumerate(ordered):
        tolerant = not sealed and index == len(ordered) - 1
        data = _read(dir_fd, path)
        if sealed:
            try:
                data = _decompress(path, data)
            except JournalCorruptError as exc:
                halt(exc)
                raise _Stop from None
        where = " (offset in the decompressed sealed segment)" if sealed else ""
        seg = Segment(path, first_seq, sealed)
        if expected is None:
            if first_seq > 1:
                gaps.append((path, 1, first_seq - 1))
        elif first_seq > expected:
            gaps.append((path, expected, first_seq - 1))
        elif first_seq < expected:
            halt(JournalCorruptError(
                path, 0, f"segment starts at seq {first_seq} but the previous one ends at {expected - 1}"
            ))
            raise _Stop
        header = decode_segment_header(data)
        if isinstance(header, BadFrame):
            # A segment's header is written and fsynced before any frame is appended to it, so a bad header
            # is a torn write only while the file is no longer than a header: a crash while the segment was
            # being created (empty, cut, or zero-filled). A bad header with bytes after it was damaged after
            # the fact: corruption, never truncated (C12: a segment of garbage is not an empty log).
            if tolerant and len(data) <= SEGMENT_HEADER_SIZE:
                result.torn = (path, 0)
                result.segments.append(seg)
                expected = first_seq
                break
            halt(JournalCorruptError(path, 0, header.reason + where))
            raise _Stop
        if header.version > FORMAT_VERSION:
            halt(JournalVersionError(path, header.version, FORMAT_VERSION))
            raise _Stop
        if header.first_seq != first_seq:
            halt(JournalCorruptError(
                path, 0, f"header says first seq {header.first_seq}, the file name says {first_seq}"
            ))
            raise _Stop
        frames, end, chain, bad = decode_frames(data, SEGMENT_HEADER_SIZE, first_seq, header.crc)
        if bad is not None:
            after = valid_frame_after(data, bad.offset)
            if not tolerant or after is not None:
                detail = f"; a valid frame follows at offset {after}" if after is not None else ""
                halt(JournalCorruptError(path, bad.offset, bad.reason + detail + where))
            else:
                result.torn = (path, bad.offset)
        seg.end = end
        seg.chain = chain
        episodes = seg.episodes
        append = records.append
        prev_len = -1  # this segment's first event record decodes its episode id and adds it to episodes
        for offset, seq, start, stop in frames:
            # Fast path for the common case (an event record); snapshots and errors take decode_envelope.
            pos = start + env_size
            kind, wall_time, eid_len = unpack_env(data, start) if pos <= stop else (-1, 0.0, 0)
            try:
                if kind == KIND_EVENT and pos + eid_len <= stop:
                    covers = None
                    event_start = pos + eid_len
                    # An episode's records mostly follow each other: compare its id in place with the
                    # previous record's and share the string (no slice, no decoding, one copy in memory);
                    # that id is in episodes already (prev_len is reset for each segment).
                    if eid_len == prev_len and data.startswith(prev_eid, pos):
                        episode_id = prev_id
                    else:
                        prev_eid = data[pos:event_start]
                        episode_id = prev_id = prev_eid.decode()
                        prev_len = eid_len
                        episodes.add(episode_id)
                else:
                    wall_time, episode_id, covers, event_start = decode_envelope(data, start, stop)
                    if covers is not None and covers > result.covers_through:
                        result.covers_through = covers
                    episodes.add(episode_id)
            except ValueError as exc:  # UnicodeDecodeError included
                halt(JournalDecodeError(path, offset, str(exc)))
                break
            if decode is None:
                append((seq, episode_id, wall_time, covers, data[event_start:stop], path, offset))
                continue
            try:
                event = decode(data[event_start:stop])
            except Exception as exc:
                error = JournalDecodeError(path, offset, f"{type(exc).__name__}: {exc}")
                error.__cause__ = exc
                result.undecodable.append((seq, error))
                event = None
            decoded_append(make_record(seq, episode_id, wall_time, event))
        if frames:
            seg.last_seq = frames[-1][1]
        result.segments.append(seg)
        expected = seg.last_seq + 1
        if result.stopped is not None:
            raise _Stop
    for path, lo, hi in gaps:
        if hi > result.covers_through:
            halt(JournalCorruptError(path, 0, f"records {lo}..{hi} are missing and no snapshot covers them"))
            result.records = [r for r in result.records if r[0] < lo]
            result.decoded = [r for r in result.decoded if r.seq < lo]
            raise _Stop
    result.next_seq = expected if expected is not None else 1


def decode_records(raw: list[RawRecord], codec: Codec[Any]) -> list[Any]:
    """Decode raw records into :class:`~journal.Record` values with ``codec``.

    Raises:
        JournalDecodeError: ``codec.decode`` raised; names the segment and the frame offset.
    """
    from ._records import Record

    decode = codec.decode
    out: list[Any] = []
    append = out.append
    for seq, episode_id, wall_time, _covers, data, path, offset in raw:
        try:
            event = decode(data)
        except Exception as exc:
            raise JournalDecodeError(path, offset, f"{type(exc).__name__}: {exc}") from exc
        append(Record(seq, episode_id, wall_time, event))
    return out


def replay(directory: str | os.PathLike[str], codec: Codec[Any]) -> Replay[Any]:
    """Replay a journal directory: every visible record, decoded, plus any torn tail (design §5).

    Sync, needs no event loop, never writes or creates anything (usable by ``status``, ``history``,
    ``journal verify`` and by recovery at boot).

    Args:
        directory: the journal directory; a missing directory is an empty journal.
        codec: decodes the event bytes.

    Returns:
        ``Replay(records, torn_tail)``; records in sequence order, those summarised by a compaction
        snapshot left out.

    Raises:
        JournalCorruptError: see :func:`scan`.
        JournalVersionError: see :func:`scan`.
        JournalDecodeError: an undecodable envelope, or ``codec.decode`` raised (unknown tag, bad shape).
    """
    from ._records import Replay, TornTail

    with gc_paused():
        result = _scan_path(os.path.abspath(os.fspath(directory)), codec.decode)
        covers = result.covers_through
        for seq, error in result.undecodable:  # the first one replay would return
            if seq > covers:
                raise error
        records = result.decoded
        if covers:
            records = [r for r in records if r.seq > covers]
        torn = TornTail(result.torn[0], result.torn[1]) if result.torn else None
        return Replay(records, torn)


def salvage(
    directory: str | os.PathLike[str], codec: Codec[Any]
) -> tuple[Replay[Any], JournalStoreError | None]:
    """Replay as much of a damaged journal as can be read: the visible records before its first corruption.

    For ``journal quarantine`` (design §10), which keeps what an untrusted journal still tells (the
    anti-rollback watermark, the known-bad memory) before it moves the journal aside. Sync; never writes,
    never creates anything; reads through the same checks as :func:`replay`.

    Returns:
        ``(Replay(records, torn_tail), error)``: the records in sequence order that come before the first
        corruption, undecodable record or uncovered gap (snapshot-covered records left out), and that
        problem (None: the journal replays whole, as :func:`replay` would return it).

    Raises:
        JournalRefusedError: the directory, its parent or a segment is not ours (nothing is read through it).
        OSError: the directory or a segment cannot be read.
    """
    from ._records import Replay, TornTail

    with gc_paused():
        path = os.path.abspath(os.fspath(directory))
        fd = open_journal_dir(path)
        if fd is None:
            return Replay([], None), None
        try:
            result = _scan(path, fd, codec.decode, salvage=True)
        finally:
            os.close(fd)
        records = result.decoded
        error = result.stopped
        if result.undecodable:
            seq, first = result.undecodable[0]
            records = [r for r in records if r.seq < seq]
            error = first
        covers = result.covers_through
        if covers:
            records = [r for r in records if r.seq > covers]
        torn = TornTail(result.torn[0], result.torn[1]) if result.torn else None
        return Replay(records, torn), error

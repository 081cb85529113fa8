"""One streaming pass from archive bytes to a staged candidate file (design §4.3 step 3, design §6 Extract).

Pipeline (constant memory, whatever the archive size)::

    chunks (async, from agent.release.fetch) --bounded memory stream--> worker thread:
        [content codings the server applied anyway (gzip, deflate, zstd), undone, outermost first; C27]
        -> sha256 + byte count of the file as published (limits.max_archive_bytes)
        -> decompress, chosen by magic bytes (never by file name; C28): gzip (ISA-L, else zlib; any number of
           members: pigz), zstd (zstandard, every frame form: several frames, skippable frames, with or
           without content size and checksum; window <= max_zstd_window_bytes), xz (lzma, several
           streams and stream padding; decoder memory <= 96 MiB), bzip2 (bz2, several streams),
           or plain tar
        -> byte count of all decompressed bytes (limits.max_total_bytes), zero-tail tracking
        -> tarfile (mode "r" over a forward-only file, _TarFeed), headers read one by one and discarded
           (max_entries)
        -> the member's data, taken straight from the decoder's output, handed to a writer thread:
           sha256 + write into the staging file (created O_EXCL|O_NOFOLLOW, 0755, fsynced at the end)

With ``agent.member_policy = "none"`` there is no archive: the file as published *is* the candidate. Its
bytes are hashed and written to the staging file as they arrive (same O_EXCL/no-follow staging, same
``max_archive_bytes``, and ``max_member_bytes`` for its size); its content is never sniffed for magic.

The tar side runs in one worker thread (tarfile, zlib, zstandard, lzma, bz2 and hashing are blocking)
which pulls batches of chunks (about 256 KiB, as the list of network reads, taken one read at a time)
from the event loop with ``anyio.from_thread.run``; the fetch side runs as a task on the loop. The
member's sha256 and writes run on one more thread (:class:`_Writer`), fed through a bounded queue, so
that hashing the archive and decoding (this thread) overlap with hashing and writing the member (hashlib,
zlib and ``os.write`` release the GIL on large buffers); it is always joined before the staging file is
closed or removed. The memory stream and the queue hold at most a few pieces each, so the peak RSS does
not depend on archive size. Every decoder bounds each call's output (``max_length`` or one zstd block at
a time).

Member rules (cases C01-C03):

- ``exact``: the archive holds exactly one entry, the member.
- ``select``: exactly one entry is named like the member; every other entry of any type (regular file,
  directory, link, device, FIFO) is passed over without being written, since nothing but the member is
  ever written and a link is harmful only if we followed it. We chose to ignore, not refuse, other types
  there so that release archives with a ``LICENSE`` symlink or a ``bin/`` directory still work.
- In both policies: names are compared after dropping empty and ``.`` components (``./NAME`` is ``NAME``);
  an absolute name or a ``..`` component in *any* entry refuses the whole archive; the member must be a
  regular file (tar type ``0`` or NUL; hard links, symlinks, devices, FIFOs, sparse and contiguous files
  refused), non-empty, and its name must occur once.
- We never call ``TarFile.extract``/``extractall`` and never use tarfile's extraction filters (C03: their
  behaviour changed across 2025 patch releases); the member's bytes are read through its file object and
  written to the one file we created, so the outcome is identical on every Python patch level.

End checks: after tarfile reports the end of the archive, the rest of the decompressed stream is drained
and must be zeros, at least the two 512-byte end blocks (POSIX ustar) must be present, the decompressor
must have reached the proper end of its last gzip member / zstd frame / xz or bzip2 stream with a valid
trailer (CRC32+ISIZE / frame end and checksum / index, footer and check / stream CRC) and no trailing
bytes (xz stream padding excepted). A cut anywhere, or corrupt compressed data, yields the one
:class:`ArchiveTruncatedError` ("archive truncated/corrupt"; C07, C28); bytes after the proper end that
do not start another member/frame/stream are "trailing data" (:class:`ArchiveRejectedError`). A header
that understates its data leaves non-zero bytes after tarfile's end: refused (C04).

Detection limits: an input that ends inside a compression magic number, or is empty, is truncated; a
plain tar is recognised by its ``ustar`` magic at offset 257, so a plain tar cut before that offset is
refused as "not an archive" (there is nothing left to tell it from any other short file).
"""

from __future__ import annotations

import bz2
import collections
import contextlib
import errno
import hashlib
import hmac
import lzma
import os
import queue
import tarfile
import threading
import types
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import anyio
import attrs
import zstandard

from agent.errors import ConfigError
from agent.fs import durable
from agent.fs.regular import write_all, write_all_pieces
from agent.groups import leaves, sole_error
from agent.release.fetch import ChunkSink, CodingSink
from upgrade_core.errors import (
    ArchiveLimitError,
    ArchiveRejectedError,
    ArchiveTruncatedError,
    DeltaBaseError,
    DigestMismatchError,
    HostError,
    NoSpaceError,
    UpgradeError,
)

try:
    # ISA-L's inflate (python-isal) decodes the same gzip members 2 to 3 times faster than zlib on release
    # binaries (single thread, about 240-410 against 90-160 MiB/s; docs/benchmarks-history.md), and gzip is
    # what most releases ship, so the decoder, not the network or the disk, was this pass's bottleneck. The
    # fallback is the standard zlib, which reads every stream ISA-L reads with the same checks (CRC32 and
    # ISIZE of each member): it serves where no isal wheel exists for the platform, slower only.
    from isal import isal_zlib

    _inflate: types.ModuleType = isal_zlib
except ImportError:  # pragma: no cover - isal is a dependency; this is the platform without a wheel
    _inflate = zlib
_INFLATE_ERRORS: tuple[type[Exception], ...] = (_inflate.error, zlib.error)

__all__ = [
    "DeltaBase",
    "ExtractLimits",
    "ExtractResult",
    "MemberPolicy",
    "delta_window_limit",
    "extract",
    "extract_sync",
    "first_line",
    "member_parts",
]

MemberPolicy = Literal["exact", "select", "none"]

_BLOCK = 512
_END_BLOCKS = 2 * _BLOCK
# Decoded bytes asked of the decoder at a time, and so the size of each member piece queued for the writer:
# 256 KiB rather than 1 MiB took 3.7 MiB off the peak RSS of a 64 MiB gzip release at the same CPU time
# (fetch.extract.gzip, design §9: peak RSS <= 48 MiB).
_READ_BYTES = 256 * 1024
_TAR_PIECE = 64 * 1024  # the least decoded at a time for tar headers (C04: 100,000 entries)
_STREAM_DEPTH = 4  # batches in flight between the fetch task and the worker thread (peak RSS: design §9)
_BATCH_BYTES = 256 * 1024  # network chunks are handed to the worker in batches of about this size
_WRITE_DEPTH = 4  # batches of member pieces queued for the writer thread
_BATCH_PIECES = 64  # member pieces in one batch at most (writev takes 1024)
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_BZ2_MAGIC = b"BZh"
_XZ_MEMLIMIT = 96 << 20  # every xz preset decodes within this (-9/-9e: 64 MiB dictionary, ~65 MiB)
_CODING_CHUNK = 256 * 1024  # bytes per call out of a content-coding decoder
_TRUNC = "archive truncated/corrupt"
_CORRUPTION_WINDOW = 2 << 20  # decoded bytes read past a tar error to let a block check speak
_REGULAR_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)


@attrs.frozen
class ExtractLimits:
    """The ``[limits]`` of design §3, in bytes and entries (case C04).

    Attributes:
        max_archive_bytes: compressed bytes read from the source.
        max_member_bytes: the member's size.
        max_total_bytes: all decompressed bytes (headers, every entry's data, padding).
        max_entries: tar entries, the member included (pax/GNU extension headers not counted).
        max_zstd_window_bytes: the largest zstd window (decoder memory) accepted.
    """

    max_archive_bytes: int = 268435456
    max_member_bytes: int = 268435456
    max_total_bytes: int = 536870912
    max_entries: int = 10000
    max_zstd_window_bytes: int = 33554432


@attrs.frozen
class ExtractResult:
    """A member extracted into its staging file, fsynced.

    Attributes:
        member_sha256: 64 lowercase hex of the member bytes.
        member_size: member size, bytes.
        archive_sha256: 64 lowercase hex of the compressed bytes as received.
        archive_size: compressed size, bytes.
        decompressed_size: all decompressed bytes, padding included.
        compression: ``"gzip"``, ``"zstd"``, ``"xz"``, ``"bzip2"``, ``"tar"`` (an uncompressed tar) or
            ``"none"`` (member policy ``none``: no archive).
        entries: tar entries seen (1 for policy ``none``).
        content_codings: the content codings the server applied and that were undone, e.g. ``("gzip",)``.
    """

    member_sha256: str
    member_size: int
    archive_sha256: str
    archive_size: int
    decompressed_size: int
    compression: str
    entries: int
    content_codings: tuple[str, ...] = ()


class _Aborted(Exception):
    """The producer stopped without an end-of-data marker (it failed or was cancelled)."""


Message = bytes | tuple[str, ...] | None
Pull = Callable[[], Message]
"""Returns the next chunk, None at the end of data; a tuple of content codings may come first only."""


def member_parts(member: str) -> tuple[str, ...]:
    """Normalise the configured member path (``agent.member``) into its components.

    Raises:
        ConfigError: an empty, absolute or ``..``-containing member path.
    """
    parts = tuple(p for p in member.split("/") if p not in ("", "."))
    if not parts or member.startswith("/") or ".." in parts:
        raise ConfigError(f"agent.member: {member!r} must be a relative path without '..'")
    return parts


class _RawInput:
    """Compressed bytes from the producer: sha256, count, max_archive_bytes, one-chunk look-ahead."""

    def __init__(
        self,
        pull: Callable[[], bytes | None],
        limit: int,
        shown: str,
        hashing: bool = True,
        observe: Callable[[bytes], None] | None = None,
    ) -> None:
        self._pull = pull
        self._observe = observe
        self._limit = limit
        self._shown = shown
        self._hashing = hashing
        self._hash = hashlib.sha256()
        self.size = 0
        self.ended = False
        self._pushback = b""

    def read_chunk(self) -> bytes:
        """Next chunk of compressed bytes; b"" once the producer signalled the end."""
        if self._pushback:
            chunk, self._pushback = self._pushback, b""
            return chunk
        if self.ended:
            return b""
        pulled = self._pull()
        if pulled is None:
            self.ended = True
            return b""
        chunk = pulled
        self.size += len(chunk)
        if self.size > self._limit:
            raise ArchiveLimitError(
                f"{self._shown}: archive exceeds limits.max_archive_bytes = {self._limit} bytes"
            )
        if self._hashing:
            self._hash.update(chunk)
        if self._observe is not None:
            self._observe(chunk)
        return chunk

    def peek(self, n: int) -> bytes:
        """Up to ``n`` leading bytes (fewer only at the end), pushed back for the next read."""
        buf = self._pushback
        self._pushback = b""
        while len(buf) < n:
            chunk = self.read_chunk()
            if not chunk:
                break
            buf += chunk
        self._pushback = buf
        return buf[:n]

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class _PlainDecoder:
    """An uncompressed tar: bytes pass through in pieces of at most ``n``."""

    name = "tar"

    def __init__(self, raw: _RawInput, shown: str) -> None:
        self._raw = raw
        self._rest = memoryview(b"")

    def read(self, n: int) -> bytes:
        if not self._rest:
            self._rest = memoryview(self._raw.read_chunk())
        out, self._rest = self._rest[:n], self._rest[n:]
        return bytes(out)


class _GzipDecoder:
    """gzip (RFC 1952), any number of concatenated members, each with its CRC32 and ISIZE checked by the
    inflater (ISA-L through ``isal``, else zlib; see the import above).

    ``max_length`` bounds every zlib call's output, so a 40 KiB bomb never expands past ``n`` bytes at a
    time (case C04). Bytes after the last member that are not another valid member are refused.
    """

    name = "gzip"

    def __init__(self, raw: _RawInput, shown: str) -> None:
        self._raw = raw
        self._shown = shown
        self._d: Any = None
        self._buf = b""
        self._fed = False  # a call into this member's inflater has succeeded
        self.members = 0

    def read(self, n: int) -> bytes:
        while True:
            if self._d is not None and self._d.eof:
                self._buf, self._d = self._d.unused_data, None
            if self._d is None:
                if not self._buf:
                    self._buf = self._raw.read_chunk()
                    if not self._buf:
                        return b""  # clean end: the last member had its trailer
                if self.members and not _GZIP_MAGIC.startswith(self._buf[:2]):
                    raise ArchiveRejectedError(
                        f"{self._shown}: trailing data after the gzip stream "
                        f"(at compressed offset {self._raw.size - len(self._buf)})"
                    )
                self._d = _inflate.decompressobj(wbits=31)
                self._fed = False
                self.members += 1
            if self._d.unconsumed_tail:
                data = self._d.unconsumed_tail
            else:
                data, self._buf = self._buf or self._raw.read_chunk(), b""
                if not data:
                    raise ArchiveTruncatedError(
                        f"{self._shown}: {_TRUNC}: gzip stream ends inside member {self.members} "
                        f"(no trailer) after {self._raw.size} compressed bytes"
                    )
            try:
                out = self._d.decompress(data, n)
            except _INFLATE_ERRORS as exc:
                if self.members > 1 and not self._fed:  # its header is not a gzip member's
                    raise ArchiveRejectedError(
                        f"{self._shown}: trailing data after the gzip stream ({exc})"
                    ) from None
                raise ArchiveTruncatedError(
                    f"{self._shown}: {_TRUNC}: corrupt gzip data in member {self.members} ({exc})"
                ) from None
            self._fed = True
            if out:
                return out


class _ZstdDataError(ArchiveTruncatedError):
    """libzstd refused the data itself (not a cut the frame walker saw): for a delta, also what decoding
    against other bytes than its base looks like."""


class _ZstdDecoder:
    """zstd (RFC 8878) frames, decoded one block at a time.

    Written around ``zstandard.ZstdDecompressionObj`` rather than ``stream_reader`` because the library is
    wrong for this job in two ways: ``stream_reader`` returns a silent end on a frame cut mid-way (C07), and
    ``decompressobj().decompress`` has no output bound. So this class walks the frame structure (frame
    header, 3-byte block headers, optional checksum) and feeds the decompressor one whole block at a time:
    a block never decodes to more than 128 KiB (RFC 8878 Block_Maximum_Size), which bounds memory; libzstd
    still does all decoding and checks (window limit, checksum, reserved bits); the walker knows exactly
    where each frame ends, so a cut or trailing bytes are detected.
    """

    name = "zstd"

    def __init__(
        self,
        raw: _RawInput,
        shown: str,
        max_window: int,
        *,
        dictionary: zstandard.ZstdCompressionDict | None = None,
        window_rule: str = "limits.max_zstd_window_bytes",
    ) -> None:
        self._raw = raw
        self._shown = shown
        self._dctx = zstandard.ZstdDecompressor(dict_data=dictionary, max_window_size=max_window)
        self._max_window = max_window
        self._window_rule = window_rule
        self._in = bytearray()
        self._pos = 0
        self._out = memoryview(b"")
        self._d: Any = None
        self._checksum = False
        self.frames = 0
        self.skipped = 0  # skippable frames (RFC 8878 3.1.2), passed over unread

    def _available(self, k: int) -> bool:
        """Make ``k`` unread input bytes available; False if the input ends first."""
        while len(self._in) - self._pos < k:
            if self._pos > (1 << 20):
                del self._in[: self._pos]
                self._pos = 0
            chunk = self._raw.read_chunk()
            if not chunk:
                return False
            self._in += chunk
        return True

    def _take(self, k: int) -> bytes:
        piece = bytes(self._in[self._pos : self._pos + k])
        self._pos += k
        return piece

    def _truncated(self, where: str) -> ArchiveTruncatedError:
        return ArchiveTruncatedError(
            f"{self._shown}: {_TRUNC}: zstd frame {self.frames + self.skipped} cut {where} "
            f"after {self._raw.size} compressed bytes"
        )

    def _feed(self, d: Any, piece: bytes) -> bytes:
        try:
            return bytes(d.decompress(piece))
        except zstandard.ZstdError as exc:
            if "memory" in str(exc) or "window" in str(exc).lower():
                raise ArchiveLimitError(
                    f"{self._shown}: zstd frame {self.frames} needs a window above "
                    f"{self._window_rule} = {self._max_window}"
                ) from None
            raise _ZstdDataError(
                f"{self._shown}: {_TRUNC}: corrupt zstd data in frame {self.frames} ({exc})"
            ) from None

    def _frame(self) -> Any:
        """Parse and feed the next data frame's header; returns its decompressor, or None at a clean end.

        Skippable frames (magic 0x184D2A50-0x184D2A5F, a 4-byte little-endian size, that many bytes of
        user data) are passed over in a streaming way wherever they occur.
        """
        while True:
            if not self._available(4):
                rest = bytes(self._in[self._pos :])
                if not rest and self.frames + self.skipped > 0:
                    return None
                if self.frames + self.skipped > 0 and not _ZSTD_MAGIC.startswith(rest):
                    raise ArchiveRejectedError(
                        f"{self._shown}: trailing data after the zstd stream (at compressed offset "
                        f"{self._consumed()})"
                    )
                raise self._truncated("in its magic number")
            magic = bytes(self._in[self._pos : self._pos + 4])
            if _is_skippable(magic):
                self._skip_frame()
                continue
            if magic != _ZSTD_MAGIC:
                if self.frames + self.skipped:
                    raise ArchiveRejectedError(
                        f"{self._shown}: trailing data after the zstd stream (at compressed offset "
                        f"{self._consumed()})"
                    )
                raise ArchiveRejectedError(f"{self._shown}: not a zstd frame at compressed offset 0")
            break
        self.frames += 1
        if not self._available(5):
            raise self._truncated("in its header")
        fhd = self._in[self._pos + 4]
        single_segment = (fhd >> 5) & 1
        fcs_size = (1 if single_segment else 0, 2, 4, 8)[fhd >> 6]
        header = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[fhd & 3] + fcs_size
        if not self._available(header):
            raise self._truncated("in its header")
        self._checksum = bool((fhd >> 2) & 1)
        d = self._dctx.decompressobj()
        self._feed(d, self._take(header))
        return d

    def _skip_frame(self) -> None:
        if not self._available(8):
            raise self._truncated("in a skippable frame's header")
        left = int.from_bytes(self._in[self._pos + 4 : self._pos + 8], "little")
        self._pos += 8
        while left:
            if self._pos == len(self._in) and not self._available(1):
                raise self._truncated("inside a skippable frame")
            step = min(left, len(self._in) - self._pos)
            self._pos += step
            left -= step
        self.skipped += 1

    def _consumed(self) -> int:
        return self._raw.size - (len(self._in) - self._pos)

    def read(self, n: int) -> bytes:
        while not self._out:
            if self._d is None:
                self._d = self._frame()
                if self._d is None:
                    return b""
            if not self._available(3):
                raise self._truncated("in a block header")
            h = int.from_bytes(self._in[self._pos : self._pos + 3], "little")
            last, btype, bsize = h & 1, (h >> 1) & 3, h >> 3
            if btype == 3:
                raise ArchiveTruncatedError(f"{self._shown}: {_TRUNC}: zstd block of the reserved type")
            need = 3 + (1 if btype == 1 else bsize) + (4 if last and self._checksum else 0)
            if not self._available(need):
                raise self._truncated("inside a block")
            self._out = memoryview(self._feed(self._d, self._take(need)))
            if last:
                if not self._d.eof:
                    raise ArchiveTruncatedError(f"{self._shown}: {_TRUNC}: zstd frame {self.frames} end")
                self._d = None
        out, self._out = self._out[:n], self._out[n:]
        return bytes(out)


def _is_skippable(magic: bytes) -> bool:
    return len(magic) == 4 and magic[1:] == b"\x2a\x4d\x18" and magic[0] & 0xF0 == 0x50


class _StreamsDecoder:
    """xz (lzma) or bzip2 (bz2): one or more concatenated streams, each decoded to its proper end.

    ``max_length`` bounds each call's output; a decompressor that holds buffered input
    (``needs_input`` False) is called again before more input is read. xz allows stream padding (NUL
    bytes, a multiple of four) after a stream (xz file format 1.0.4, section 2.2); bzip2 does not.
    """

    def __init__(self, raw: _RawInput, shown: str, name: str) -> None:
        self.name = name
        self._raw = raw
        self._shown = shown
        self._magic = _XZ_MAGIC if name == "xz" else _BZ2_MAGIC
        self._d: Any = None
        self._buf = b""
        self.streams = 0

    def _new(self) -> Any:
        if self.name == "xz":
            return lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=_XZ_MEMLIMIT)
        return bz2.BZ2Decompressor()

    def _start(self) -> bool:
        """Begin the next stream; False at a clean end of input."""
        padding = 0
        while True:
            if not self._buf:
                self._buf = self._raw.read_chunk()
                if not self._buf:
                    if padding % 4:
                        raise ArchiveTruncatedError(
                            f"{self._shown}: {_TRUNC}: xz stream padding of {padding} bytes "
                            "(not a multiple of 4)"
                        )
                    if self.streams == 0:
                        raise ArchiveTruncatedError(f"{self._shown}: {_TRUNC}: empty {self.name} stream")
                    return False
            if self.name == "xz" and self.streams:
                kept = self._buf.lstrip(b"\0")
                padding += len(self._buf) - len(kept)
                self._buf = kept
                if not kept:
                    continue
            break
        if padding % 4:
            raise ArchiveTruncatedError(
                f"{self._shown}: {_TRUNC}: xz stream padding of {padding} bytes (not a multiple of 4)"
            )
        if self.streams and not self._magic.startswith(self._buf[: len(self._magic)]):
            raise ArchiveRejectedError(
                f"{self._shown}: trailing data after the {self.name} stream "
                f"(at compressed offset {self._raw.size - len(self._buf)})"
            )
        self._d = self._new()
        self.streams += 1
        return True

    def read(self, n: int) -> bytes:
        while True:
            if self._d is not None and self._d.eof:
                self._buf, self._d = self._d.unused_data, None
            if self._d is None and not self._start():
                return b""
            if self._d.needs_input:
                data, self._buf = self._buf or self._raw.read_chunk(), b""
                if not data:
                    raise ArchiveTruncatedError(
                        f"{self._shown}: {_TRUNC}: {self.name} stream {self.streams} ends before its end "
                        f"after {self._raw.size} compressed bytes"
                    )
            else:
                data = b""
            try:
                out = self._d.decompress(data, n)
            except lzma.LZMAError as exc:
                if "memory" in str(exc).lower():
                    raise ArchiveLimitError(
                        f"{self._shown}: xz stream {self.streams} needs more than {_XZ_MEMLIMIT >> 20} MiB "
                        "of decoder memory"
                    ) from None
                raise ArchiveTruncatedError(
                    f"{self._shown}: {_TRUNC}: corrupt xz data in stream {self.streams} ({exc})"
                ) from None
            except (OSError, EOFError, ValueError) as exc:
                raise ArchiveTruncatedError(
                    f"{self._shown}: {_TRUNC}: corrupt {self.name} data in stream {self.streams} ({exc})"
                ) from None
            if out:
                return bytes(out)


class _DeflateDecoder:
    """HTTP ``deflate`` (RFC 9110 8.4.1.2: a zlib stream, RFC 1950; raw deflate, which some servers send,
    is accepted too), decoded to its end with a bounded output per call. Content coding only."""

    name = "deflate"

    def __init__(self, raw: _RawInput, shown: str) -> None:
        self._raw = raw
        self._shown = shown
        self._d: Any = None
        self._done = False

    def read(self, n: int) -> bytes:
        while not self._done:
            if self._d is None:
                head = self._raw.peek(2)
                if len(head) < 2:
                    raise ArchiveTruncatedError(f"{self._shown}: {_TRUNC}: deflate stream is empty or cut")
                zlib_header = (head[0] & 0x0F) == 8 and int.from_bytes(head, "big") % 31 == 0
                self._d = zlib.decompressobj(wbits=15 if zlib_header else -15)
            if self._d.eof:
                rest = self._d.unused_data or self._raw.read_chunk()
                if rest:
                    raise ArchiveRejectedError(f"{self._shown}: trailing data after the deflate stream")
                self._done = True
                break
            data = self._d.unconsumed_tail or self._raw.read_chunk()
            if not data:
                raise ArchiveTruncatedError(
                    f"{self._shown}: {_TRUNC}: deflate stream cut after {self._raw.size} bytes"
                )
            try:
                out = self._d.decompress(data, n)
            except zlib.error as exc:
                raise ArchiveTruncatedError(
                    f"{self._shown}: {_TRUNC}: corrupt deflate data ({exc})"
                ) from None
            if out:
                return out
        return b""


class _Decoder(Protocol):
    name: str

    def read(self, n: int, /) -> bytes: ...


def _content_decoder(coding: str, raw: _RawInput, shown: str, limits: ExtractLimits) -> _Decoder:
    label = f"{shown}: Content-Encoding {coding}"
    if coding in ("gzip", "x-gzip"):
        return _GzipDecoder(raw, label)
    if coding == "zstd":
        return _ZstdDecoder(raw, label, limits.max_zstd_window_bytes)
    if coding == "deflate":
        return _DeflateDecoder(raw, label)
    raise ArchiveRejectedError(f"{shown}: unsupported Content-Encoding {coding}")


def _undo_codings(
    pull: Callable[[], bytes | None], codings: tuple[str, ...], shown: str, limits: ExtractLimits
) -> Callable[[], bytes | None]:
    """Wrap ``pull`` so that it yields the file as published: the codings undone, last applied first."""
    for coding in reversed(codings):
        label = f"{shown}: Content-Encoding {coding}"
        layer = _RawInput(pull, limits.max_archive_bytes, label, hashing=False)
        decoder = _content_decoder(coding, layer, shown, limits)

        def pull_decoded(decoder: _Decoder = decoder) -> bytes | None:
            return decoder.read(_CODING_CHUNK) or None

        pull = pull_decoded
    return pull


def _sniff(raw: _RawInput, shown: str, limits: ExtractLimits) -> _Decoder:
    """Choose the decoder by the content's magic bytes (never by a file name)."""
    head = raw.peek(6)
    if not head:
        raise ArchiveTruncatedError(f"{shown}: {_TRUNC}: the archive is empty")
    if head.startswith(_GZIP_MAGIC):
        return _GzipDecoder(raw, shown)
    if head[:4] == _ZSTD_MAGIC or _is_skippable(head[:4]):
        return _ZstdDecoder(raw, shown, limits.max_zstd_window_bytes)
    if head.startswith(_XZ_MAGIC):
        return _StreamsDecoder(raw, shown, "xz")
    if head.startswith(_BZ2_MAGIC) and head[3:4].isdigit() and head[3:4] != b"0":
        return _StreamsDecoder(raw, shown, "bzip2")
    skippable_prefix = len(head) < 4 and head[0] & 0xF0 == 0x50 and b"\x2a\x4d\x18".startswith(head[1:])
    magics = (_GZIP_MAGIC, _ZSTD_MAGIC, _XZ_MAGIC, b"BZh9")
    if len(head) < 6 and (skippable_prefix or any(m.startswith(head) for m in magics)):
        raise ArchiveTruncatedError(f"{shown}: {_TRUNC}: the input ends inside a compression magic number")
    # A plain tar starts with a header whose magic at offset 257 is "ustar" (POSIX ustar, GNU and pax
    # alike); anything else (an HTML error page, an unknown compression, a cut stub) is not an archive.
    if raw.peek(_BLOCK)[257:262] != b"ustar":
        raise ArchiveRejectedError(
            f"{shown}: not an archive: no gzip, zstd, xz or bzip2 magic and no tar (ustar) header "
            "(a bare executable needs agent.member_policy = \"none\")"
        )
    return _PlainDecoder(raw, shown)


class _TarFeed:
    """The decompressed stream as a forward-only, read-only file for ``tarfile.TarFile(mode="r")``.

    Counts every byte (``max_total_bytes``) and remembers where the last non-zero byte was, so the end
    checks can prove that only zero padding follows the end-of-archive position.

    Why a file with ``tell``/``seek`` and not tarfile's stream mode (``"r|"``): in stream mode every byte
    of the member goes through tarfile's own buffer, which joins and re-slices it three to four times
    while holding the GIL (measured: about 40% of the pass's CPU for a 256 MiB member). Here
    tarfile still reads and checks every header (pax, GNU long names, checksums), and the member's bytes
    are taken with :meth:`read_some` straight from the decoder's output. ``seek`` moves forward by
    decoding and discarding: the data of the entries tarfile skips, and the padding after the member
    (tarfile's ``next`` seeks to the next header's offset minus one and reads that byte, which is at or
    after the current position once the member's bytes were taken). Going back is supported only within
    the piece decoded last, defensively; anything further back raises :class:`RuntimeError`.
    """

    def __init__(self, decoder: _Decoder, limit: int, shown: str) -> None:
        self._decoder = decoder
        self._limit = limit
        self._shown = shown
        self._buf = b""  # the piece decoded last; [self._off:] is not read yet
        self._off = 0
        self.total = 0
        self.nonzero_end = 0
        self.ended = False

    def _fill(self, hint: int) -> bool:
        """Decode the next piece (up to ``max(hint, 64 KiB)`` bytes); False at the end of the stream."""
        if self.ended:
            return False
        out = self._decoder.read(max(hint, _TAR_PIECE))
        if not out:
            self.ended = True
            return False
        start = self.total
        self.total += len(out)
        if self.total > self._limit:
            raise ArchiveLimitError(
                f"{self._shown}: archive expands past limits.max_total_bytes = {self._limit} bytes"
            )
        if out[-1]:
            self.nonzero_end = self.total
        else:
            tail = out[-_BLOCK:]  # look at a short tail first: rstrip of the whole piece would copy it
            kept = len(tail.rstrip(b"\0"))
            if kept:
                self.nonzero_end = self.total - len(tail) + kept
            else:
                kept = len(out.rstrip(b"\0"))
                if kept:
                    self.nonzero_end = start + kept
        self._buf, self._off = out, 0
        return True

    def tell(self) -> int:
        """The decompressed offset of the next byte :meth:`read` returns."""
        return self.total - (len(self._buf) - self._off)

    def read_some(self, n: int) -> bytes:
        """Between 1 and ``n`` bytes (b"" only at the end); a whole decoded piece is returned uncopied."""
        if self._off == len(self._buf) and not self._fill(n):
            return b""
        if self._off == 0 and n >= len(self._buf):
            self._off = len(self._buf)
            return self._buf
        out = self._buf[self._off : self._off + n]
        self._off += len(out)
        return out

    def read(self, n: int = -1) -> bytes:
        """Exactly ``n`` bytes, fewer only at the end of the stream (``-1``: up to 1 MiB)."""
        if n is None or n < 0:
            n = _READ_BYTES
        pieces = []
        left = n
        while left > 0:
            piece = self.read_some(left)
            if not piece:
                break
            pieces.append(piece)
            left -= len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def seek(self, offset: int, whence: int = 0) -> int:
        """Move to the absolute decompressed ``offset`` (``whence`` must be 0).

        Raises:
            RuntimeError: ``whence`` is not 0, or a backward seek beyond the piece decoded last.
        """
        if whence != 0:
            raise RuntimeError("_TarFeed.seek: only absolute offsets")
        here = self.tell()
        if offset < here:
            back = here - offset
            if back > self._off:
                raise RuntimeError(f"_TarFeed.seek: cannot go back from {here} to {offset}")
            self._off -= back
            return offset
        left = offset - here
        while left:
            piece = self.read_some(min(left, _READ_BYTES))
            if not piece:
                break
            left -= len(piece)
        return self.tell()

    def drain(self, at_most: int | None = None) -> None:
        """Read to the end of the stream (or ``at_most`` more bytes), discarding."""
        stop = None if at_most is None else self.total + at_most
        self._off = len(self._buf)
        while (stop is None or self.total < stop) and self._fill(_READ_BYTES):
            self._off = len(self._buf)


def _entry_parts(info: tarfile.TarInfo, shown: str) -> tuple[str, ...]:
    name = info.name
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if name.startswith("/") or name.startswith("\\"):
        raise ArchiveRejectedError(f"{shown}: archive entry {name!r} has an absolute name (C01)")
    if ".." in parts or any(".." in p.split("\\") for p in parts):
        raise ArchiveRejectedError(f"{shown}: archive entry {name!r} contains '..' (C01)")
    return parts


def _kind(info: tarfile.TarInfo) -> str:
    if info.islnk():
        return f"a hard link to {info.linkname!r}"
    if info.issym():
        return f"a symlink to {info.linkname!r}"
    if info.ischr():
        return "a character device"
    if info.isblk():
        return "a block device"
    if info.isfifo():
        return "a FIFO"
    if info.isdir():
        return "a directory"
    return f"tar type {info.type!r}"


def _write_all(fd: int, data: bytes | list[bytes], staging_path: str) -> None:
    try:
        if isinstance(data, list):
            write_all_pieces(fd, data)
        else:
            write_all(fd, data)
    except OSError as exc:
        raise _staging_error(exc, staging_path, "write") from None


def _staging_error(exc: OSError, staging_path: str, what: str) -> HostError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpaceError(f"{staging_path}: no space left while staging the candidate ({what})")
    return HostError(f"{staging_path}: cannot {what} the staging file: {exc.strerror or exc}")


def extract_sync(
    pull: Pull,
    staging_path: str,
    *,
    member: str,
    policy: MemberPolicy,
    limits: ExtractLimits,
    expected_sha256: str | None,
    source_name: str,
    observe: Callable[[bytes], None] | None = None,
    delta_base: DeltaBase | None = None,
) -> ExtractResult:
    """Blocking core of :func:`extract`: read the archive from ``pull`` and stage its member.

    Run it in a worker thread. On any failure the staging file, if it was created, is removed.

    Args:
        pull: returns the next chunk, None at the end of data; raises to abort. Its first message may be
            a tuple of content codings (``("gzip",)``): the chunks are then undone before anything else.
        staging_path: created here with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0755 (a new inode: never an
            existing file, never one a process executes, case C09).
        member: ``agent.member``, e.g. ``demo-agent-linux-amd64`` (not used by policy ``none``).
        policy: ``"exact"``, ``"select"`` or ``"none"`` (the file itself is the candidate).
        limits: the size and count bounds.
        expected_sha256: 64 lowercase hex over the file as published, or None.
        source_name: the redacted source, used in messages.
        observe: called with every chunk of the file as published (the bytes the sha256 is over), in
            order, in the worker thread (a release signature's pre-hash, docs/trust.md).
        delta_base: the file is a delta (docs/delta.md): one zstd frame made with ``delta_base.content``
            as a raw-content dictionary; the member is what it decodes to (``member``/``policy`` unused).

    Returns:
        The :class:`ExtractResult`; the staging file holds the member and is fsynced.

    Raises:
        ArchiveRejectedError: a member rule, not an archive, or trailing data (C01-C04).
        ArchiveTruncatedError: any stream (content coding, compression, tar) cut or corrupt (C07, C28).
        ArchiveLimitError: a ``limits.*`` bound (C04).
        DigestMismatchError: the file does not match ``expected_sha256``, or a rebuilt member does not
            match ``delta_base.member_sha256``.
        DeltaBaseError: a delta that does not decode against ``delta_base`` although it is the file
            ``expected_sha256`` names (made against another base).
        NoSpaceError: ENOSPC/EDQUOT writing the staging file (C05).
        HostError: the staging file cannot be created or written for another reason.
        ConfigError: ``member`` is not a relative path.
    """
    want = member_parts(member)
    shown = source_name
    fd = -1
    done = False
    try:
        try:
            fd = durable.create_exclusive(staging_path, 0o755)  # fchmod-ed: the umask keeps the execute bits
        except OSError as exc:
            raise _staging_error(exc, staging_path, "create") from None
        first = pull()
        codings: tuple[str, ...] = ()
        if isinstance(first, tuple):
            codings, first = first, pull()
        replay: list[Message] = [first]

        def pull_bytes() -> bytes | None:
            message = replay.pop() if replay else pull()
            if isinstance(message, tuple):
                raise RuntimeError("content codings announced after the first chunk")
            return message

        file_pull = _undo_codings(pull_bytes, codings, shown, limits) if codings else pull_bytes
        raw = _RawInput(file_pull, limits.max_archive_bytes, shown, observe=observe)
        if delta_base is not None:
            return_value = _stage_delta(
                raw, fd, limits, delta_base, shown, staging_path, expected_sha256, codings
            )
            done = True
            return return_value
        if policy == "none":
            return_value = _stage_file(raw, fd, limits, shown, staging_path, expected_sha256, codings)
            done = True
            return return_value
        decoder = _sniff(raw, shown, limits)
        feed = _TarFeed(decoder, limits.max_total_bytes, shown)
        result = _read_tar(feed, raw, fd, want, member, policy, limits, shown, staging_path)
        member_sha256, member_size, entries, end_offset = result
        feed.drain()
        if feed.nonzero_end > end_offset:
            raise ArchiveRejectedError(
                f"{shown}: data after the end of the tar archive at offset {end_offset} "
                "(a header that understates its data, or garbage; C04)"
            )
        if feed.total < end_offset + _END_BLOCKS:
            raise ArchiveTruncatedError(
                f"{shown}: {_TRUNC}: no tar end-of-archive blocks at offset {end_offset}"
            )
        archive_sha256 = _check_digest(raw, expected_sha256, shown)
        _fsync(fd, staging_path)
        done = True
        return ExtractResult(
            member_sha256=member_sha256,
            member_size=member_size,
            archive_sha256=archive_sha256,
            archive_size=raw.size,
            decompressed_size=feed.total,
            compression=decoder.name,
            entries=entries,
            content_codings=codings,
        )
    finally:
        if fd >= 0:
            os.close(fd)
            if not done:
                with contextlib.suppress(OSError):
                    durable.remove_if_present(staging_path, sync_dir=False)


def _check_digest(raw: _RawInput, expected_sha256: str | None, shown: str, what: str = "archive") -> str:
    """The sha256 of the file as published; DigestMismatchError when it is not ``expected_sha256``.

    The refusal names the expected digest only, never the one the bytes have: the source may be a local
    file that whoever asked for the upgrade cannot read (a control plane's operation), and the reason is
    journaled, logged and published as the operation's status, so the digest would tell them about that
    file.
    """
    archive_sha256 = raw.hexdigest()
    if expected_sha256 is not None and not hmac.compare_digest(archive_sha256, expected_sha256):
        raise DigestMismatchError(f"{shown}: the {what}'s sha256 is not the expected {expected_sha256}")
    return archive_sha256


def _fsync(fd: int, staging_path: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise _staging_error(exc, staging_path, "fsync") from None


def _stage_file(
    raw: _RawInput,
    fd: int,
    limits: ExtractLimits,
    shown: str,
    staging_path: str,
    expected_sha256: str | None,
    codings: tuple[str, ...],
) -> ExtractResult:
    """Policy ``none``: the file as published is the candidate; its bytes go to the staging file as is."""
    size = 0
    while chunk := raw.read_chunk():
        size += len(chunk)
        if size > limits.max_member_bytes:
            raise ArchiveLimitError(
                f"{shown}: the file exceeds limits.max_member_bytes = {limits.max_member_bytes} bytes"
            )
        _write_all(fd, chunk, staging_path)
    if size == 0:
        raise ArchiveRejectedError(f"{shown}: the downloaded file is empty (agent.member_policy = \"none\")")
    digest = _check_digest(raw, expected_sha256, shown)
    _fsync(fd, staging_path)
    return ExtractResult(
        member_sha256=digest,
        member_size=size,
        archive_sha256=digest,
        archive_size=size,
        decompressed_size=size,
        compression="none",
        entries=1,
        content_codings=codings,
    )


@attrs.frozen
class DeltaBase:
    """What a delta is decoded against (docs/delta.md): the current slot's bytes, loaded whole.

    Attributes:
        content: the current slot's bytes (at most ``limits.max_member_bytes``): zstd's raw-content
            dictionary, which libzstd needs as one contiguous buffer (a match may reach any offset of it).
        label: what to call it in messages, e.g. ``slot a (/usr/local/lib/demo/demo-a)``.
        member_sha256: 64 lowercase hex the rebuilt member must have (``--member-sha256``), or None: then
            the frame must carry zstd's content checksum (RFC 8878 §3.1.1: XXH64 of the rebuilt bytes,
            which ``zstd --patch-from`` writes by default), and the decoder checks it. The delta's own sha256
            pins that checksum, and the base is this host's own slot, so a wrong base cannot pass unnoticed
            except by an accidental 64-bit collision.
    """

    content: bytes
    label: str
    member_sha256: str | None

    @property
    def sha256(self) -> str:
        """64 lowercase hex of ``content``, hashed only when a refusal names it (a good stage never does)."""
        return hashlib.sha256(self.content).hexdigest()


def delta_window_limit(limits: ExtractLimits) -> int:
    """The largest window a delta's frame may ask for, bytes: ``2 * limits.max_member_bytes``.

    ``zstd --patch-from`` sizes the window to cover the larger of base and target (the next power of two
    above it, so less than twice it): a delta between binaries within ``max_member_bytes`` never needs more.
    The decoder's own buffer is the smaller of the window and the frame's content size.
    """
    return 2 * limits.max_member_bytes


def _stage_delta(
    raw: _RawInput,
    fd: int,
    limits: ExtractLimits,
    base: DeltaBase,
    shown: str,
    staging_path: str,
    expected_sha256: str | None,
    codings: tuple[str, ...],
) -> ExtractResult:
    """A delta: decode its zstd frame(s) against ``base`` one block at a time into the staging file."""
    window = delta_window_limit(limits)
    head = raw.peek(18)
    if head[:4] != _ZSTD_MAGIC:
        if _ZSTD_MAGIC.startswith(head):
            raise ArchiveTruncatedError(f"{shown}: {_TRUNC}: the delta ends inside its zstd magic number")
        raise ArchiveRejectedError(f"{shown}: not a delta: no zstd frame at offset 0")
    with contextlib.suppress(zstandard.ZstdError):  # a header cut short: the decoder names the cut
        params = zstandard.get_frame_parameters(head)
        if params.window_size > window:
            raise ArchiveLimitError(
                f"{shown}: the delta's zstd frame asks for a {params.window_size}-byte window, above "
                f"2 * limits.max_member_bytes = {window}"
            )
        if params.dict_id:
            raise ArchiveRejectedError(
                f"{shown}: not a patch-from delta: its frame names zstd dictionary {params.dict_id}"
            )
        if base.member_sha256 is None and not params.has_checksum:
            raise ArchiveRejectedError(
                f"{shown}: the delta's zstd frame carries no content checksum and no member sha256 was "
                "given: the rebuilt binary could not be told from one rebuilt against another base"
            )
        rebuilds = params.content_size
        if rebuilds != zstandard.CONTENTSIZE_UNKNOWN and rebuilds > limits.max_member_bytes:
            raise ArchiveLimitError(
                f"{shown}: the delta's frame says it rebuilds {rebuilds} bytes, above "
                f"limits.max_member_bytes = {limits.max_member_bytes}"
            )
    dictionary = zstandard.ZstdCompressionDict(base.content, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    decoder = _ZstdDecoder(
        raw, shown, window, dictionary=dictionary, window_rule="2 * limits.max_member_bytes"
    )
    member = hashlib.sha256()
    size = 0
    try:
        while piece := decoder.read(_READ_BYTES):
            size += len(piece)
            if size > limits.max_member_bytes:
                raise ArchiveLimitError(
                    f"{shown}: the delta rebuilds more than limits.max_member_bytes = "
                    f"{limits.max_member_bytes} bytes"
                )
            member.update(piece)
            _write_all(fd, piece, staging_path)
    except _ZstdDataError as exc:
        # Corrupt, or made against other bytes? The delta's own digest tells: read the rest (bounded by
        # limits.max_archive_bytes), never decoded.
        while raw.read_chunk():
            pass
        _check_digest(raw, expected_sha256, shown, "delta")
        if expected_sha256 is None:
            raise
        raise DeltaBaseError(
            f"{shown}: the delta does not apply to {base.label} (sha256 {base.sha256}): it was made "
            f"against another base ({first_line(exc)})"
        ) from None
    delta_sha256 = _check_digest(raw, expected_sha256, shown, "delta")
    rebuilt = member.hexdigest()
    if base.member_sha256 is not None and not hmac.compare_digest(rebuilt, base.member_sha256):
        # the rebuilt digest is not named, as for the archive (_check_digest)
        raise DigestMismatchError(
            f"{shown}: the member rebuilt from {base.label} (sha256 {base.sha256}) is not the expected "
            f"{base.member_sha256}: the delta was made against another base"
        )
    _fsync(fd, staging_path)
    return ExtractResult(
        member_sha256=rebuilt,
        member_size=size,
        archive_sha256=delta_sha256,
        archive_size=raw.size,
        decompressed_size=size,
        compression="zstd-delta",
        entries=1,
        content_codings=codings,
    )


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its class name when it has none (a reason in one line)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _read_tar(
    feed: _TarFeed,
    raw: _RawInput,
    fd: int,
    want: tuple[str, ...],
    member: str,
    policy: MemberPolicy,
    limits: ExtractLimits,
    shown: str,
    staging_path: str,
) -> tuple[str, int, int, int]:
    """Walk the tar headers; write the member; returns (sha256, size, entries, end offset)."""
    entries = 0
    found: tuple[str, int] | None = None
    try:
        # Not a context manager: closing a TarFile on a file object it did not open does nothing we need
        # (we own the feed). Mode "r" over the forward-only feed: see _TarFeed for why not stream mode.
        tf = tarfile.TarFile(fileobj=feed, mode="r")  # type: ignore[arg-type]
        while True:
            info = tf.next()
            tf.members.clear()  # type: ignore[attr-defined]  # else every TarInfo is kept (C04: 100,000 entries)
            if info is None:
                break
            entries += 1
            if entries > limits.max_entries:
                raise ArchiveLimitError(
                    f"{shown}: more than limits.max_entries = {limits.max_entries} entries"
                )
            parts = _entry_parts(info, shown)
            if parts != want:
                if policy == "exact":
                    raise ArchiveRejectedError(
                        f"{shown}: archive must hold exactly one entry, {member!r}; found {info.name!r} "
                        "(agent.member_policy = 'exact')"
                    )
                continue
            if found is not None:
                raise ArchiveRejectedError(f"{shown}: archive holds {member!r} more than once")
            if info.type not in _REGULAR_TYPES:
                raise ArchiveRejectedError(
                    f"{shown}: archive member {info.name!r} is {_kind(info)}, not a regular file (C02)"
                )
            if info.size <= 0:
                raise ArchiveRejectedError(f"{shown}: archive member {info.name!r} is empty")
            if info.size > limits.max_member_bytes:
                raise ArchiveLimitError(
                    f"{shown}: member {info.name!r} is {info.size} bytes, above limits.max_member_bytes = "
                    f"{limits.max_member_bytes}"
                )
            found = _copy_member(feed, info, fd, shown, staging_path)
        end_offset = tf.offset
    except tarfile.TarError as exc:
        cut = feed.ended or raw.ended
        if not cut:
            # bzip2 checks a block's CRC only at the block's end (<= 900 kB of output): read a little
            # further so that corruption is reported as such, not as the garbage it decoded to.
            with contextlib.suppress(ArchiveRejectedError, ArchiveLimitError):
                feed.drain(_CORRUPTION_WINDOW)
        if cut:
            raise ArchiveTruncatedError(
                f"{shown}: {_TRUNC}: tar stream ends early at decompressed offset {feed.total}"
            ) from None
        raise ArchiveRejectedError(f"{shown}: not a valid tar archive: {exc}") from None
    if found is None:
        raise ArchiveRejectedError(f"{shown}: archive has no member {member!r} (agent.member)")
    return found[0], found[1], entries, end_offset


def _copy_member(
    feed: _TarFeed, info: tarfile.TarInfo, fd: int, shown: str, staging_path: str
) -> tuple[str, int]:
    """Copy the member's ``info.size`` bytes from ``feed`` (positioned at its data) into ``fd``.

    The bytes are hashed and written by a :class:`_Writer` thread while this thread decodes the next
    piece (sha256 and ``os.write`` release the GIL). Returns (sha256 hex, size).
    """
    if feed.tell() != info.offset_data:  # tarfile left the feed at the entry's data: a bug otherwise
        raise RuntimeError(f"tar feed at {feed.tell()}, member data at {info.offset_data}")
    digest = hashlib.sha256()

    def consume(pieces: list[bytes]) -> None:
        for piece in pieces:
            digest.update(piece)
        _write_all(fd, pieces, staging_path)

    # Decoded pieces go to the writer in batches of about _READ_BYTES (never joined: see extract()'s flush),
    # one queue hand-off and one writev per batch.
    size = 0
    batch: list[bytes] = []
    batched = 0
    writer = _Writer(consume, _WRITE_DEPTH)
    try:
        while size < info.size:
            data = feed.read_some(min(_READ_BYTES, info.size - size))
            if not data:
                break
            batch.append(data)
            batched += len(data)
            size += len(data)
            if batched >= _READ_BYTES or len(batch) >= _BATCH_PIECES:
                writer.submit(batch)
                batch, batched = [], 0
        if batch:
            writer.submit(batch)
    except BaseException:
        writer.close()  # joined before the error propagates (and the caller closes the fd)
        raise
    error = writer.close()
    if error is not None:
        raise error
    if size != info.size:
        raise ArchiveTruncatedError(
            f"{shown}: {_TRUNC}: member {info.name!r} has {size} of its {info.size} bytes"
        )
    return digest.hexdigest(), size


class _Writer:
    """Runs ``consume(pieces)`` for each submitted batch of pieces, in order, on its own thread.

    A bounded queue (``depth`` batches) keeps memory constant. The first exception ``consume`` raises is
    re-raised by the next :meth:`submit` or returned by :meth:`close`; batches after it are dropped.
    :meth:`close` always joins the thread, so once it returns nothing uses the staging file descriptor.
    """

    def __init__(self, consume: Callable[[list[bytes]], None], depth: int) -> None:
        self._consume = consume
        self._queue: queue.SimpleQueue[list[bytes] | None] = queue.SimpleQueue()
        self._slots = threading.Semaphore(depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="extract-writer")
        self._thread.start()

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            try:
                if self._error is None:
                    self._consume(batch)
            except BaseException as exc:  # handed to the submitting thread, never lost
                self._error = exc
            finally:
                self._slots.release()

    def submit(self, batch: list[bytes]) -> None:
        """Queue ``batch`` (waits while ``depth`` batches are queued).

        Raises:
            Whatever ``consume`` raised for an earlier batch.
        """
        if self._error is not None:
            raise self._error
        self._slots.acquire()
        self._queue.put(batch)

    def close(self) -> BaseException | None:
        """Let the queued pieces be consumed, stop and join the thread; idempotent.

        Returns:
            The first exception ``consume`` raised (once: a second call returns None), or None.
        """
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        error, self._error = self._error, None
        return error


async def extract(
    feed: Callable[[ChunkSink, CodingSink], Awaitable[object]],
    staging_path: str,
    *,
    member: str,
    policy: MemberPolicy,
    limits: ExtractLimits,
    expected_sha256: str | None = None,
    source_name: str,
    observe: Callable[[bytes], None] | None = None,
    delta_base: DeltaBase | None = None,
) -> ExtractResult:
    """Run ``feed`` (the fetch) and the extraction together; stage the member at ``staging_path``.

    Args:
        feed: called once with a chunk sink and a coding sink; must await the chunk sink with each chunk
            and return once all bytes were delivered; may await the coding sink once, before the first
            chunk, with the content codings the server applied (e.g. ``lambda sink, coding:
            agent.release.fetch.fetch(src, policy, sink, content_coding=coding)``). Raising aborts the
            extraction.
        staging_path: new file to create (O_EXCL, 0755), fsynced on success.
        member: ``agent.member``.
        policy: ``agent.member_policy``.
        limits: ``[limits]``.
        expected_sha256: 64 lowercase hex over the file as published (see
        ``agent.release.sources.parse_sha256``).
        source_name: the redacted source for messages.
        observe: see :func:`extract_sync`.
        delta_base: see :func:`extract_sync`.

    Returns:
        The :class:`ExtractResult`.

    Raises:
        Everything :func:`extract_sync` raises, and whatever ``feed`` raises (``FetchError`` ...).

    Cancellation: the worker thread is never abandoned: it sees the chunk stream close, stops, and
    removes the staging file before the cancellation propagates.
    """
    send, receive = anyio.create_memory_object_stream[Message | list[bytes]](max_buffer_size=_STREAM_DEPTH)

    async def announce(codings: tuple[str, ...]) -> None:
        await send.send(tuple(codings))

    pending: list[bytes] = []
    pending_bytes = 0

    async def flush() -> None:
        # The batch goes as the list of network reads (64 KiB at most each), never joined: with 256 KiB
        # pieces in flight (joined here, or in the worker) glibc's heaps grew 9 MiB larger (fetch.extract,
        # design §9: peak RSS 51 against 42 MiB for the 256 MiB incompressible archive; 128 KiB pieces: 45).
        # Smaller pieces cost that row about 0.1 s of CPU (more hashing, decoding and write calls); the
        # compressible rows did not move.
        nonlocal pending, pending_bytes
        if pending:
            batch, pending, pending_bytes = pending, [], 0
            await send.send(batch)

    async def sink(chunk: bytes) -> None:
        # Network reads are 64 KiB at most: one worker-thread round trip per ~256 KiB batch, not per read.
        nonlocal pending_bytes
        pending.append(chunk)
        pending_bytes += len(chunk)
        if pending_bytes >= _BATCH_BYTES:
            await flush()

    async def produce() -> None:
        async with send:
            await feed(sink, announce)
            await flush()
            await send.send(None)

    unread: collections.deque[bytes] = collections.deque()

    def pull() -> Message:
        if unread:
            return unread.popleft()
        try:
            message = anyio.from_thread.run(receive.receive)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise _Aborted from None
        if isinstance(message, list):  # a batch of network reads, never empty
            unread.extend(message)
            return unread.popleft()
        return message

    def work() -> ExtractResult:
        return extract_sync(
            pull,
            staging_path,
            member=member,
            policy=policy,
            limits=limits,
            expected_sha256=expected_sha256,
            source_name=source_name,
            observe=observe,
            delta_base=delta_base,
        )

    results: list[ExtractResult] = []
    try:
        async with receive, anyio.create_task_group() as tg:
            tg.start_soon(produce)
            results.append(await anyio.to_thread.run_sync(work))
    except BaseExceptionGroup as group:
        if all(isinstance(e, _Aborted) for e in leaves(group)):
            # Only the worker saw the chunk stream close: that close came from our own cancellation (the
            # worker is never abandoned, so it finished first and removed the staging file). Let the
            # cancellation itself propagate, never the internal abort.
            await anyio.lowlevel.checkpoint_if_cancelled()
        _raise_leaf(group)
    return results[0]


def _raise_leaf(group: BaseExceptionGroup[BaseException]) -> None:
    """Re-raise the one meaningful error of a task group (the other side only saw the stream abort)."""
    error = sole_error(group, ignore=(_Aborted,), prefer=UpgradeError)
    if error is group:
        raise group
    raise error.with_traceback(error.__traceback__) from None

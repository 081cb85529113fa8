"""Pure byte layout of journal segments (design §5): no I/O, no imports beyond the standard library.

Segment file (every offset is a multiple of 8; all integers little-endian)::

    segment header (32 bytes)
      0  magic        8 bytes  b"\\x8bUCJ\\r\\n\\x1a\\n" (PNG-style: catches text-mode and 7-bit mangling)
      8  version      u32      FORMAT_VERSION
     12  flags        u32      0
     16  first_seq    u64      sequence number of the segment's first frame
     24  reserved     u32      0
     28  header_crc   u32      CRC-32 of bytes 0..28
    frame (at an 8-aligned offset; size = align8(16 + length + 4))
      0  length       u32      payload bytes
      4  seq          u64      sequence number (+1 per frame, across segments)
     12  head_crc     u32      CRC-32 of bytes 0..12 (length and seq)
     16  payload      length bytes
    16+length chain_crc u32    CRC-32 of frame bytes 0..16+length, seeded with the previous frame's
                               chain_crc (the header_crc for a segment's first frame)
      .. padding      zeros up to the next multiple of 8 (checked: any non-zero byte is a bad frame)

Why this shape: the length field is the first 4 bytes of an 8-aligned frame, so it never straddles a
512-byte sector and cannot tear; a frame's header is checked on its own (``head_crc``) before ``length`` is
trusted, so a scan can tell a valid frame at any aligned offset after a bad one (a torn tail has none; a
corruption in the middle has one); the chained CRC ties each frame to the one before it, so a stale or
reordered frame is caught. Every byte of a segment is covered by some check. Newer formats must keep bytes
0..16 (magic, version) and the CRC at 28 so this code can refuse them by version.

Decoding is h11-like: :func:`decode_frames` returns the frames it could validate, then a :class:`BadFrame`
sentinel (or None at a clean end) for the caller to classify as a torn tail or a corruption.
"""

from __future__ import annotations

import struct
from zlib import crc32

# Not ``typing.TYPE_CHECKING``: this module is on the boot-time no-op path (design §9 ``recover.noop``).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

MAGIC = b"\x8bUCJ\r\n\x1a\n"
FORMAT_VERSION = 1
ALIGN = 8
MAX_PAYLOAD = 1 << 24  # bytes; a record is an event, not a blob

SEGMENT_HEADER = struct.Struct("<8sIIQII")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size  # 32
FRAME_HEADER = struct.Struct("<IQI")
FRAME_HEADER_SIZE = FRAME_HEADER.size  # 16
_U32 = struct.Struct("<I")
_HEAD_COVERED = 12  # head_crc covers length + seq
_ZERO_PAD = tuple(bytes(n) for n in range(ALIGN))
_ZERO_HEAD = bytes(FRAME_HEADER_SIZE)


# Small tuple types written out by hand: typing.NamedTuple would import ``typing`` (several ms) on the
# boot-time recovery path, which must start fast (design §9, ``recover.noop``).
class BadFrame(tuple[int, str]):
    """The first frame (or header) that failed validation: (offset, reason).

    Attributes:
        offset: byte offset of the frame start (0 for the segment header).
        reason: what failed, for the error message.
    """

    __slots__ = ()

    def __new__(cls, offset: int, reason: str) -> BadFrame:
        return tuple.__new__(cls, (offset, reason))

    @property
    def offset(self) -> int:
        return self[0]

    @property
    def reason(self) -> str:
        return self[1]


class SegmentHeader(tuple[int, int, int]):
    """A decoded segment header: (version, first_seq, crc).

    Attributes:
        version: the format version written in it.
        first_seq: sequence number of the segment's first frame.
        crc: the header CRC (seed of the frame chain).
    """

    __slots__ = ()

    def __new__(cls, version: int, first_seq: int, crc: int) -> SegmentHeader:
        return tuple.__new__(cls, (version, first_seq, crc))

    @property
    def version(self) -> int:
        return self[0]

    @property
    def first_seq(self) -> int:
        return self[1]

    @property
    def crc(self) -> int:
        return self[2]


Frame = tuple[int, int, int, int]
"""One validated frame: (offset, seq, start, end); its payload is ``buf[start:end]``. A plain tuple
because replay builds one per record (100k-record journals)."""


def frame_size(payload_len: int) -> int:
    """Bytes a frame with ``payload_len`` payload bytes occupies on disk, padding included."""
    return (FRAME_HEADER_SIZE + payload_len + 4 + ALIGN - 1) & ~(ALIGN - 1)


def encode_segment_header(first_seq: int, version: int = FORMAT_VERSION) -> bytes:
    """The 32-byte header of a segment whose first frame will carry ``first_seq``."""
    head = SEGMENT_HEADER.pack(MAGIC, version, 0, first_seq, 0, 0)[:28]
    return head + _U32.pack(crc32(head))


def decode_segment_header(buf: bytes | memoryview) -> SegmentHeader | BadFrame:
    """Decode and check a segment header (the first 32 bytes of ``buf``).

    Returns:
        The header, or a :class:`BadFrame` at offset 0 when it is short, has the wrong magic, a bad CRC, or
        an unknown (zero) version. A header with a valid CRC and a version above :data:`FORMAT_VERSION` is
        returned as is: refusing it is the caller's job (``JournalVersionError``).
    """
    if len(buf) < SEGMENT_HEADER_SIZE:
        return BadFrame(0, f"segment header incomplete ({len(buf)} of {SEGMENT_HEADER_SIZE} bytes)")
    magic, version, _flags, first_seq, _reserved, crc = SEGMENT_HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        return BadFrame(0, "segment header has a wrong magic")
    if crc32(buf[:28]) != crc:
        return BadFrame(0, "segment header CRC mismatch")
    if version < 1:
        return BadFrame(0, f"segment header has an invalid version {version}")
    return SegmentHeader(version, first_seq, crc)


def encode_frame(seq: int, payload: bytes, prev_chain: int) -> tuple[bytes, int]:
    """Frame ``payload`` as record ``seq``, chained to ``prev_chain``.

    Args:
        seq: the record's sequence number (u64).
        payload: at most :data:`MAX_PAYLOAD` bytes.
        prev_chain: the previous frame's chain CRC, or the segment header's CRC for the first frame.

    Returns:
        (frame bytes, this frame's chain CRC).

    Raises:
        ValueError: the payload is larger than :data:`MAX_PAYLOAD`.
    """
    n = len(payload)
    if n > MAX_PAYLOAD:
        raise ValueError(f"journal record payload of {n} bytes exceeds {MAX_PAYLOAD} bytes")
    head12 = struct.pack("<IQ", n, seq)
    body = head12 + _U32.pack(crc32(head12)) + payload
    chain = crc32(body, prev_chain)
    pad = frame_size(n) - len(body) - 4
    return body + _U32.pack(chain) + _ZERO_PAD[pad], chain


def decode_frames(
    buf: bytes, offset: int, seq: int, chain: int
) -> tuple[list[Frame], int, int, BadFrame | None]:
    """Validate consecutive frames of ``buf`` from ``offset``.

    Args:
        buf: the whole segment content.
        offset: where the first frame starts (8-aligned; 32 after the header).
        seq: the sequence number the first frame must carry.
        chain: the chain CRC to seed the first frame with.

    Returns:
        (frames, end offset of the last valid frame, its chain CRC, None at a clean end of ``buf`` or the
        :class:`BadFrame` that stopped decoding).
    """
    frames: list[Frame] = []
    n = len(buf)
    unpack_head = FRAME_HEADER.unpack_from
    unpack_u32 = _U32.unpack_from
    append = frames.append
    while offset < n:
        if n - offset < FRAME_HEADER_SIZE:
            return frames, offset, chain, BadFrame(offset, "incomplete frame header")
        length, fseq, _head_crc = unpack_head(buf, offset)
        end = offset + FRAME_HEADER_SIZE + length
        nxt = (end + 4 + ALIGN - 1) & ~(ALIGN - 1)
        # Fast path: the chained CRC covers the frame header too, so a frame whose chain CRC, sequence
        # number and padding hold is valid; head_crc only matters to say why a frame is bad and to find a
        # frame valid on its own after a bad one (valid_frame_after). Byte slices are cheaper than
        # memoryview slices for record-sized frames.
        if (
            length <= MAX_PAYLOAD
            and nxt <= n
            and fseq == seq
            and (computed := crc32(buf[offset:end], chain)) == unpack_u32(buf, end)[0]
            and (nxt - end == 4 or buf[end + 4 : nxt] == _ZERO_PAD[nxt - end - 4])
        ):
            append((offset, fseq, offset + FRAME_HEADER_SIZE, end))
            chain = computed
            seq += 1
            offset = nxt
            continue
        return frames, offset, chain, BadFrame(offset, _why_bad(buf, offset, seq, chain))
    return frames, offset, chain, None


def _why_bad(buf: bytes, offset: int, seq: int, chain: int) -> str:
    """The reason a frame that failed the fast path is bad, checking fields in layout order."""
    n = len(buf)
    length, fseq, head_crc = FRAME_HEADER.unpack_from(buf, offset)
    if crc32(buf[offset : offset + _HEAD_COVERED]) != head_crc:
        return "frame header CRC mismatch"
    if fseq != seq:
        return f"sequence number {fseq}, expected {seq}"
    if length > MAX_PAYLOAD:
        return f"frame length {length} exceeds {MAX_PAYLOAD}"
    end = offset + FRAME_HEADER_SIZE + length
    if (end + 4 + ALIGN - 1) & ~(ALIGN - 1) > n:
        return "incomplete frame"
    if crc32(buf[offset:end], chain) != _U32.unpack_from(buf, end)[0]:
        return "chained CRC mismatch"
    return "non-zero frame padding"


def valid_frame_after(buf: bytes, bad_offset: int) -> int | None:
    """Scan the 8-aligned offsets after a bad frame for a frame that is valid on its own.

    A frame is valid on its own when its header CRC holds, it fits in ``buf`` and its padding is zero (its
    chain CRC cannot be checked: the frame before it is bad). A torn tail has no such frame (design §5).

    Returns:
        The offset of the first such frame, or None.
    """
    n = len(buf)
    mv = memoryview(buf)
    unpack_head = FRAME_HEADER.unpack_from
    pos = bad_offset + ALIGN
    while pos + FRAME_HEADER_SIZE <= n:
        if buf[pos : pos + FRAME_HEADER_SIZE] != _ZERO_HEAD:
            length, _seq, head_crc = unpack_head(buf, pos)
            if crc32(mv[pos : pos + _HEAD_COVERED]) == head_crc and length <= MAX_PAYLOAD:
                end = pos + FRAME_HEADER_SIZE + length
                nxt = (end + 4 + ALIGN - 1) & ~(ALIGN - 1)
                if nxt <= n and buf[end + 4 : nxt] == _ZERO_PAD[nxt - end - 4]:
                    return pos
        pos += ALIGN
    return None


# -- the record envelope inside a frame's payload ------------------------------------------------------
#   0  kind        u8   KIND_EVENT, or KIND_SNAPSHOT followed by covers_through (u64)
#   1  wall_time   f64  Unix seconds, informational only
#   9  eid_len     u16  bytes of the UTF-8 episode id
#  11  [covers_through u64]  snapshot only: every record with seq <= this is summarised by the snapshot
#  ..  episode id, then the codec's bytes for the event
KIND_EVENT = 0
KIND_SNAPSHOT = 1
ENVELOPE = struct.Struct("<BdH")
_U64 = struct.Struct("<Q")
MAX_EPISODE_ID = 0xFFFF  # UTF-8 bytes


def encode_envelope(
    episode_id: bytes, wall_time: float, event: bytes, covers_through: int | None = None
) -> bytes:
    """Wrap codec bytes with the envelope; ``covers_through`` marks a snapshot record."""
    if covers_through is None:
        return ENVELOPE.pack(KIND_EVENT, wall_time, len(episode_id)) + episode_id + event
    return (
        ENVELOPE.pack(KIND_SNAPSHOT, wall_time, len(episode_id))
        + _U64.pack(covers_through)
        + episode_id
        + event
    )


class Envelope(tuple[float, str, "int | None", int]):
    """A decoded envelope: (wall_time, episode_id, covers_through, event_start); the event bytes are
    ``buf[event_start:end]``."""

    __slots__ = ()

    def __new__(
        cls, wall_time: float, episode_id: str, covers_through: int | None, event_start: int
    ) -> Envelope:
        return tuple.__new__(cls, (wall_time, episode_id, covers_through, event_start))

    @property
    def wall_time(self) -> float:
        return self[0]

    @property
    def episode_id(self) -> str:
        return self[1]

    @property
    def covers_through(self) -> int | None:
        return self[2]

    @property
    def event_start(self) -> int:
        return self[3]


def decode_envelope(buf: bytes | memoryview, start: int = 0, end: int | None = None) -> Envelope:
    """Inverse of :func:`encode_envelope`, reading the payload ``buf[start:end]`` in place (no copy).

    Raises:
        ValueError: unknown kind, a short envelope, or an episode id that is not UTF-8.
    """
    if end is None:
        end = len(buf)
    pos = start + ENVELOPE.size
    if pos > end:
        raise ValueError(f"record envelope too short ({end - start} bytes)")
    kind, wall_time, eid_len = ENVELOPE.unpack_from(buf, start)
    covers: int | None = None
    if kind == KIND_SNAPSHOT:
        if pos + 8 > end:
            raise ValueError("snapshot envelope too short")
        covers = _U64.unpack_from(buf, pos)[0]
        pos += 8
    elif kind != KIND_EVENT:
        raise ValueError(f"unknown record kind {kind}")
    if pos + eid_len > end:
        raise ValueError("episode id runs past the record")
    episode_id = bytes(buf[pos : pos + eid_len]).decode("utf-8")
    return Envelope(wall_time, episode_id, covers, pos + eid_len)


def encode_records(
    first_seq: int, entries: Iterable[tuple[bytes, float, bytes]], prev_chain: int | None = None
) -> tuple[bytes, int]:
    """The bytes a writer appends for ``entries``, framed and chained exactly as it frames them.

    For tools that must build a journal without an fsync per record (the replay benchmark) or measure the
    bare cost of writing the same bytes (the append baselines); the writer itself appends through
    :func:`encode_frame` and :func:`encode_envelope`.

    Args:
        first_seq: the sequence number of the first entry; the rest follow by +1.
        entries: ``(episode_id bytes, wall-clock seconds, codec bytes)`` per record.
        prev_chain: the chain CRC to continue from; None starts a new segment (its header is included
            and the first frame chains to the header's CRC).

    Returns:
        (the bytes, the last frame's chain CRC).
    """
    parts: list[bytes] = []
    if prev_chain is None:
        header = encode_segment_header(first_seq)
        parts.append(header)
        prev_chain = _U32.unpack_from(header, SEGMENT_HEADER_SIZE - 4)[0]
    chain = prev_chain
    for seq, (episode_id, wall_time, payload) in enumerate(entries, first_seq):
        frame, chain = encode_frame(seq, encode_envelope(episode_id, wall_time, payload), chain)
        parts.append(frame)
    return b"".join(parts), chain

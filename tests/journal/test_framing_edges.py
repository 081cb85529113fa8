"""The byte layout (design §5) at its edges: records that fill their bounds exactly, records one byte short,
and ``encode_records`` against the real writer.

``test_framing.py`` pins the golden bytes; these pin where a length check starts to refuse (an envelope, a
snapshot's ``covers_through`` or an episode id that ends exactly at the record's end is whole; one byte more
is not, even when the buffer goes on past the record, as it does inside a segment) and the reasons given.
"""

from __future__ import annotations

import binascii
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from journal._framing import (
    ENVELOPE,
    MAX_PAYLOAD,
    SEGMENT_HEADER_SIZE,
    decode_envelope,
    decode_frames,
    decode_segment_header,
    encode_envelope,
    encode_frame,
    encode_records,
    encode_segment_header,
    valid_frame_after,
)

from ._support import CODEC, Closed, Noted, Opened, build_journal, only_segment

WALL = 1_700_000_000.5  # build_journal's wall clock


# -- envelopes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("eid", "event", "covers"),
    [(b"", b"", None), (b"op", b"", None), (b"", b"", 7), (b"op", b"", 2**64 - 1), (b"op", b"{}", None)],
)
def test_an_envelope_that_ends_exactly_at_the_records_end_is_whole(
    eid: bytes, event: bytes, covers: int | None
) -> None:
    data = encode_envelope(eid, 2.5, event, covers)
    for env in (decode_envelope(data), decode_envelope(b"\xff" * 5 + data + b"\xff" * 9, 5, 5 + len(data))):
        assert (env.wall_time, env.episode_id, env.covers_through) == (2.5, eid.decode(), covers)
    assert decode_envelope(data).event_start == len(data) - len(event)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (encode_envelope(b"", 2.5, b"")[:-1], r"^record envelope too short \(10 bytes\)$"),
        (encode_envelope(b"", 2.5, b"", 7)[:-1], r"^snapshot envelope too short$"),
        (encode_envelope(b"op", 2.5, b"")[:-1], r"^episode id runs past the record$"),
        (encode_envelope(b"op", 2.5, b"", 7)[:-1], r"^episode id runs past the record$"),
    ],
)
def test_a_record_one_byte_short_is_refused_even_inside_a_longer_buffer(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_envelope(data)
    with pytest.raises(ValueError, match=message):
        decode_envelope(b"\x00" * 3 + data + bytes(40), 3, 3 + len(data))


def test_a_snapshot_envelope_short_of_its_covers_field_is_refused() -> None:
    head = ENVELOPE.pack(1, 2.5, 0)
    for cut in range(8):
        with pytest.raises(ValueError, match=r"^snapshot envelope too short$"):
            decode_envelope(head + bytes(cut) + bytes(64), 0, len(head) + cut)


@given(eid=st.text(max_size=20), wall=st.floats(allow_nan=False), event=st.binary(max_size=40),
       covers=st.none() | st.integers(0, 2**64 - 1), before=st.binary(max_size=9),
       after=st.binary(max_size=9))
def test_envelopes_decode_in_place_anywhere_in_a_buffer(
    eid: str, wall: float, event: bytes, covers: int | None, before: bytes, after: bytes
) -> None:
    data = encode_envelope(eid.encode(), wall, event, covers)
    buf = before + data + after
    env = decode_envelope(memoryview(buf), len(before), len(before) + len(data))
    assert (env.wall_time, env.episode_id, env.covers_through) == (wall, eid, covers)
    assert buf[env.event_start : len(before) + len(data)] == event


# -- encode_records: the writer's bytes without the writer -----------------------------------------------
ITEMS = [("op1", Opened("a")), ("op1", Noted(1, "x" * 13)), ("op2", Opened("b")), ("op1", Closed())]


def test_encode_records_writes_the_bytes_the_writer_writes(tmp_path: Path) -> None:
    build_journal(str(tmp_path), ITEMS)
    on_disk = Path(only_segment(str(tmp_path))).read_bytes()
    entries = [(eid.encode(), WALL, CODEC.encode(event)) for eid, event in ITEMS]
    data, chain = encode_records(1, entries)
    assert data == on_disk
    header = decode_segment_header(data)
    frames, end, last_chain, bad = decode_frames(data, SEGMENT_HEADER_SIZE, 1, header.crc)  # type: ignore[union-attr]
    assert (bad, end, last_chain, chain) == (None, len(data), chain, last_chain)
    assert [seq for _, seq, _, _ in frames] == [1, 2, 3, 4]
    assert [decode_envelope(data, start, stop).episode_id for _, _, start, stop in frames] == [
        "op1", "op1", "op2", "op1"]


def test_encode_records_continues_a_chain_without_a_header() -> None:
    entries = [(b"op", 1.0, b"one"), (b"op", 2.0, b"two")]
    whole, chain = encode_records(5, entries)
    header = whole[:SEGMENT_HEADER_SIZE]
    assert header == encode_segment_header(5)
    first, mid = encode_frame(5, encode_envelope(b"op", 1.0, b"one"), struct.unpack_from("<I", header, 28)[0])
    rest, end = encode_records(6, entries[1:], prev_chain=mid)
    assert whole == header + first + rest and end == chain
    assert encode_records(9, [], prev_chain=1234) == (b"", 1234)


# -- why a frame is bad, and the scan after it -------------------------------------------------------------
GOOD, GOOD_CHAIN = encode_frame(2, b"ok", 0)


def _frame(seq: int = 3, payload: bytes = b"abc", chain: int = GOOD_CHAIN) -> bytes:
    """A frame that would follow :data:`GOOD` (chained to it)."""
    return encode_frame(seq, payload, chain)[0]


def _with(frame: bytes, offset: int, data: bytes) -> bytes:
    return frame[:offset] + data + frame[offset + len(data) :]


def _reheaded(length: int, seq: int, rest: bytes) -> bytes:
    """A frame header whose own CRC holds (length and seq as given), followed by ``rest``."""
    head = struct.pack("<IQ", length, seq)
    return head + struct.pack("<I", binascii.crc32(head)) + rest


@pytest.mark.parametrize(
    ("buf", "reason"),
    [
        (_with(_frame(), 0, b"\x04"), "frame header CRC mismatch"),
        (_frame(seq=9), "sequence number 9, expected 3"),
        (_reheaded(MAX_PAYLOAD + 1, 3, bytes(16)), f"frame length {MAX_PAYLOAD + 1} exceeds {MAX_PAYLOAD}"),
        (_reheaded(3, 3, b"abc" + bytes(4))[:-1], "incomplete frame"),
        (_with(_frame(), 16, b"x"), "chained CRC mismatch"),
        # no padding (16 + 4 + 4 bytes): the frame fits exactly, so it is its CRC that is wrong
        (_with(_frame(payload=b"abcd"), 16, b"x"), "chained CRC mismatch"),
        (_frame()[:-1] + b"\x01", "non-zero frame padding"),
        (_frame()[:15], "incomplete frame header"),
        # a whole header and nothing after it: the header can be read, so it is the frame that is cut
        (_frame()[:16], "incomplete frame"),
    ],
)
def test_each_bad_frame_is_named_by_the_first_field_that_fails(buf: bytes, reason: str) -> None:
    frames, end, chain, bad = decode_frames(GOOD + buf, 0, 2, 0)
    assert (len(frames), end, chain) == (1, len(GOOD), GOOD_CHAIN)
    assert bad == (len(GOOD), reason)


def test_a_frame_that_ends_exactly_at_the_buffers_end_is_whole() -> None:
    for n in range(17):  # every padding length, 0 to 7
        frame = _frame(payload=bytes(range(n)), chain=0)
        frames, end, _, bad = decode_frames(frame, 0, 3, 0)
        assert (len(frames), end, bad) == (1, len(frame), None)
        assert decode_frames(frame[:-1], 0, 3, 0)[3] is not None


def test_the_scan_after_a_bad_frame_finds_the_next_frame_valid_on_its_own() -> None:
    second = _frame(seq=4, payload=b"defgh", chain=12345)  # its chain cannot be checked, its header can
    for gap in (0, 8, 64):
        buf = _with(_frame(), 0, b"\x04") + bytes(gap) + second
        assert valid_frame_after(buf, 0) == 24 + gap
        assert valid_frame_after(buf, 24 + gap) is None  # nothing after the last frame
    # a frame exactly at the end of the buffer is found; one byte short, or with dirty padding, is not
    assert valid_frame_after(bytes(8) + second, 0) == 8
    assert valid_frame_after(bytes(8) + second[:-1], 0) is None
    assert valid_frame_after(bytes(8) + second[:-1] + b"\x01", 0) is None
    # a header whose CRC holds but whose length is past MAX_PAYLOAD is not a frame
    assert valid_frame_after(bytes(8) + _reheaded(MAX_PAYLOAD + 1, 4, bytes(16)), 0) is None
    # a frame header at the very end, too short to hold a frame, is not scanned past the end
    assert valid_frame_after(bytes(8) + second[:15], 0) is None


def test_a_frame_of_the_largest_payload_is_whole() -> None:
    frame = encode_frame(3, bytes(MAX_PAYLOAD), 0)[0]
    frames, end, _, bad = decode_frames(frame, 0, 3, 0)
    assert (len(frames), end, bad) == (1, len(frame), None)
    assert valid_frame_after(bytes(8) + frame, 0) == 8  # valid on its own too


_HEADER = encode_segment_header(5)


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (b"XXXX" + _HEADER[4:], "segment header has a wrong magic"),
        (_HEADER[:-1] + bytes([_HEADER[-1] ^ 1]), "segment header CRC mismatch"),
        (_HEADER[:20], "segment header incomplete (20 of 32 bytes)"),
    ],
)
def test_each_bad_segment_header_is_named_exactly(header: bytes, reason: str) -> None:
    """The reason names what is wrong, word for word (it reaches the operator in the corruption error)."""
    assert decode_segment_header(header) == (0, reason)
    if len(header) == len(_HEADER):  # the frames after it change nothing
        assert decode_segment_header(header + bytes(64)) == (0, reason)

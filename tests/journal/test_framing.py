"""Golden byte layout of segment headers, frames and envelopes (design §5), h11 SIMPLE_CASES style.

The hex strings pin the on-disk format: a change here is a format change and needs a new FORMAT_VERSION.
"""

from __future__ import annotations

import binascii
import struct

import pytest

from journal._framing import (
    FORMAT_VERSION,
    MAX_PAYLOAD,
    BadFrame,
    decode_envelope,
    decode_frames,
    decode_segment_header,
    encode_envelope,
    encode_frame,
    encode_segment_header,
    frame_size,
    valid_frame_after,
)


def h(*fields: str) -> str:
    """Join hex fields (written apart so that each field of the layout is visible)."""
    return "".join(fields)


HEADER_CASES = [
    # first_seq -> 32 bytes: magic, version 1, flags 0, first_seq, reserved 0, CRC-32 of bytes 0..28
    (1, h("8b55434a0d0a1a0a", "01000000", "00000000", "0100000000000000", "00000000", "c04f3941")),
]

FRAME_CASES = [
    # (seq, payload, previous chain CRC) -> frame hex: length | seq | head CRC | payload | chain CRC | pad
    (1, b"", 0, h("00000000", "0100000000000000", "f1c67fb7", "", "1cdf4421", "00000000")),
    (
        1,
        b"hello",
        0x12345678,
        h("05000000", "0100000000000000", "e1b1dc2f", "68656c6c6f", "07d7c0bd", "00000000000000"),
    ),
    (7, b"abcd", 0, h("04000000", "0700000000000000", "09f41672", "61626364", "64cde4a9", "")),
    (
        2**64 - 1,
        bytes(range(13)),
        0xFFFFFFFF,
        h(
            "0d000000",
            "ffffffffffffffff",
            "f4c71ca1",
            "000102030405060708090a0b0c",
            "5ecbced4",
            "00000000000000",
        ),
    ),
]

ENVELOPE_CASES = [
    # (episode id, wall, event, covers_through) -> kind | f64 wall | u16 id len | [u64] | id | event
    (b"op-1", 1.5, b"{}", None, h("00", "000000000000f83f", "0400", "", "6f702d31", "7b7d")),
    (b"-", 2.0, b"S", 41, h("01", "0000000000000040", "0100", "2900000000000000", "2d", "53")),
]


@pytest.mark.parametrize(("first_seq", "expected"), HEADER_CASES)
def test_segment_header_golden(first_seq: int, expected: str) -> None:
    header = encode_segment_header(first_seq)
    assert header.hex() == expected
    assert binascii.crc32(header[:28]) == struct.unpack_from("<I", header, 28)[0]
    decoded = decode_segment_header(header)
    assert not isinstance(decoded, BadFrame)
    assert (decoded.version, decoded.first_seq) == (FORMAT_VERSION, first_seq)


@pytest.mark.parametrize(("seq", "payload", "prev", "expected"), FRAME_CASES)
def test_frame_golden(seq: int, payload: bytes, prev: int, expected: str) -> None:
    frame, chain = encode_frame(seq, payload, prev)
    assert frame.hex() == expected
    assert len(frame) % 8 == 0 and len(frame) == frame_size(len(payload))
    # Independent re-derivation of every checked field with binascii.
    length, fseq, head_crc = struct.unpack_from("<IQI", frame, 0)
    assert (length, fseq) == (len(payload), seq)
    assert head_crc == binascii.crc32(frame[:12])
    end = 16 + length
    assert chain == struct.unpack_from("<I", frame, end)[0] == binascii.crc32(frame[:end], prev)
    frames, stop, chain2, bad = decode_frames(frame, 0, seq, prev)
    assert bad is None and stop == len(frame) and chain2 == chain
    assert [frame[start:end] for _, _, start, end in frames] == [payload]


@pytest.mark.parametrize(("eid", "wall", "event", "covers", "expected"), ENVELOPE_CASES)
def test_envelope_golden(eid: bytes, wall: float, event: bytes, covers: int | None, expected: str) -> None:
    data = encode_envelope(eid, wall, event, covers)
    assert data.hex() == expected
    env = decode_envelope(b"pre" + data + b"post", 3, 3 + len(data))
    assert (env.episode_id, env.wall_time, env.covers_through, data[env.event_start - 3 :]) == (
        eid.decode(),
        wall,
        covers,
        event,
    )


def test_length_field_never_straddles_a_sector() -> None:
    # Frames start 8-aligned, so the 4-byte length at a frame's start never crosses a 512-byte boundary.
    pos = 32
    for n in range(0, 3000, 7):
        assert pos % 8 == 0 and pos // 512 == (pos + 3) // 512
        pos += frame_size(n)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "incomplete"),
        (encode_segment_header(1)[:31], "incomplete"),
        (b"X" + encode_segment_header(1)[1:], "magic"),
        (encode_segment_header(1)[:20] + b"\x01" + encode_segment_header(1)[21:], "CRC"),
        (encode_segment_header(1, version=0), "invalid version"),
    ],
)
def test_bad_segment_headers(data: bytes, reason: str) -> None:
    bad = decode_segment_header(data)
    assert isinstance(bad, BadFrame) and bad.offset == 0 and reason in bad.reason


def test_newer_version_header_is_returned_for_the_caller_to_refuse() -> None:
    decoded = decode_segment_header(encode_segment_header(5, version=FORMAT_VERSION + 1))
    assert not isinstance(decoded, BadFrame) and decoded.version == FORMAT_VERSION + 1


def test_sequence_mismatch_and_padding_are_checked() -> None:
    frame, _ = encode_frame(3, b"abc", 0)
    _, _, _, bad = decode_frames(frame, 0, 4, 0)
    assert bad == BadFrame(0, "sequence number 3, expected 4")
    dirty = frame[:-1] + b"\x01"
    _, _, _, bad = decode_frames(dirty, 0, 3, 0)
    assert bad == BadFrame(0, "non-zero frame padding")
    # A frame intact on its own is found by the scan after a bad one; zeros are not a frame.
    assert valid_frame_after(bytes(8) + frame, 0) == 8
    assert valid_frame_after(bytes(64), 0) is None


def test_oversized_payload_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        encode_frame(1, bytes(MAX_PAYLOAD + 1), 0)


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x00" * 5, b"\x02" + bytes(10), encode_envelope(b"\xff\xfe", 0.0, b"")],
)
def test_bad_envelopes_raise_value_error(payload: bytes) -> None:
    with pytest.raises(ValueError):
        decode_envelope(payload)

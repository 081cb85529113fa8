"""Property tests of replay over journals written by the real writer (design §5, cases C12, C13).

Definitions pinned here (the segment has one 32-byte header, then 8-aligned frames; a frame includes its
padding):
- cut at offset c: the records whose frames end at or before c; a torn report at the first frame that does
  not fit iff c is not a frame boundary; a cut inside the header (c < 32, including an empty file) is a
  torn write at offset 0 with no records.
- one flipped byte in frame i (header, payload, chain CRC or padding): the corruption error names frame i's
  offset when an intact frame follows it; when frame i is the last one, the records before it and a torn
  report at its offset.
- one flipped byte in the segment header: corruption at offset 0 if any frame follows; otherwise (a
  header-only segment) a torn write at 0.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import JournalCorruptError, TornTail, _reader, replay
from journal._framing import (
    SEGMENT_HEADER_SIZE,
    SegmentHeader,
    decode_segment_header,
    encode_envelope,
    encode_frame,
    encode_segment_header,
)
from journal._reader import segment_name

from ._support import CODEC, Closed, Noted, Opened, build_journal, frame_bounds, only_segment, visible

events = st.one_of(
    st.builds(Opened, st.text(max_size=40)),
    st.builds(Noted, st.integers(-(2**63), 2**63 - 1), st.text(max_size=120)),
    st.just(Closed()),
)
items = st.lists(st.tuples(st.sampled_from(["op-a", "op-b", "épisode"]), events), max_size=12)
_CHECKS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]  # each example gets its own subdir
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=_CHECKS)


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


@SETTINGS
@given(items)
def test_cut_at_every_offset_yields_whole_records_and_torn_iff_inside(tmp_path: Path, items_: list) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        records = build_journal(d, items_)
        seg = only_segment(d)
        with open(seg, "rb") as f:
            data = f.read()
        bounds = frame_bounds(data)
        assert len(bounds) == len(records)
        ends = [SEGMENT_HEADER_SIZE] + [e for _, e in bounds]
        for cut in range(len(data) + 1):
            _write(seg, data[:cut])
            result = replay(d, CODEC)
            whole = sum(1 for _, e in bounds if e <= cut)
            assert visible(result.records) == visible(records[:whole])
            if cut < SEGMENT_HEADER_SIZE:
                assert result.torn_tail == TornTail(seg, 0)
            elif cut in ends:
                assert result.torn_tail is None
            else:
                assert result.torn_tail == TornTail(seg, ends[whole])


def _flip_expectation(bounds: list[tuple[int, int]], pos: int) -> tuple[str, int, int]:
    """(kind, offset, records kept) for a flip at ``pos``: kind is "corrupt" or "torn"."""
    if pos < SEGMENT_HEADER_SIZE:
        return ("corrupt", 0, 0) if bounds else ("torn", 0, 0)
    for i, (start, end) in enumerate(bounds):
        if start <= pos < end:
            return ("torn", start, i) if i == len(bounds) - 1 else ("corrupt", start, i)
    raise AssertionError(pos)


def _check_flip(d: str, seg: str, data: bytes, records: list, pos: int, mask: int) -> None:
    bounds = frame_bounds(data)
    flipped = bytearray(data)
    flipped[pos] ^= mask
    _write(seg, bytes(flipped))
    kind, offset, kept = _flip_expectation(bounds, pos)
    if kind == "corrupt":
        with pytest.raises(JournalCorruptError) as info:
            replay(d, CODEC)
        assert (info.value.path, info.value.offset) == (seg, offset)
        assert seg in str(info.value) and f"offset {offset}" in str(info.value)
    else:
        result = replay(d, CODEC)
        assert visible(result.records) == visible(records[:kept])
        assert result.torn_tail == TornTail(seg, offset)


@SETTINGS
@given(items.filter(lambda xs: sum(len(str(x)) for x in xs) < 1500), st.integers(1, 255))
def test_every_single_byte_flip_small_journals(tmp_path: Path, items_: list, mask: int) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        records = build_journal(d, items_)
        seg = only_segment(d)
        with open(seg, "rb") as f:
            data = f.read()
        if len(data) > 4096:
            return
        for pos in range(len(data)):
            _check_flip(d, seg, data, records, pos, mask)


@settings(max_examples=40, deadline=None, suppress_health_check=_CHECKS)
@given(
    st.lists(
        st.tuples(
            st.just("op"),
            st.builds(
                Noted,
                st.integers(0, 9),
                st.builds(lambda s, n: (s or "x") * n, st.text(), st.integers(150, 300)),
            ),
        ),
        min_size=30,
        max_size=40,
    ),
    st.data(),
)
def test_byte_flips_in_larger_journals(tmp_path: Path, items_: list, data_: st.DataObject) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        records = build_journal(d, items_)
        seg = only_segment(d)
        with open(seg, "rb") as f:
            data = f.read()
        assert len(data) > 4096
        for _ in range(5):
            pos = data_.draw(st.integers(0, len(data) - 1), label="position")
            mask = data_.draw(st.integers(1, 255), label="mask")
            _check_flip(d, seg, data, records, pos, mask)


@SETTINGS
@given(items, st.integers(1, 64))
def test_zero_filled_tail_is_torn_not_corrupt(tmp_path: Path, items_: list, words: int) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        records = build_journal(d, items_)
        seg = only_segment(d)
        size = os.path.getsize(seg)
        with open(seg, "ab") as f:
            f.write(bytes(8 * words))
        result = replay(d, CODEC)
        assert visible(result.records) == visible(records)
        assert result.torn_tail == TornTail(seg, size)


# Episode ids that share a prefix, have equal lengths, are empty or non-ASCII, or are the snapshot's "-".
_IDS = st.sampled_from(["", "a", "b", "ab", "ac", "abc", "abd", "op1", "op10", "op2", "-", "é", "e"])
_SEGMENTS = st.lists(  # per segment, at least one (is a snapshot record, episode id)
    st.lists(st.tuples(st.integers(0, 3).map(lambda n: n == 0), _IDS), min_size=1, max_size=5),
    min_size=1, max_size=4,
)


def _write_segments(directory: str, segments: list[list[tuple[bool, str]]]) -> None:
    """Segments written frame by frame: the writer never puts an empty episode id or a snapshot in the middle
    of a segment, and the scan must still read those right."""
    seq = 1
    for recs in segments:
        header = encode_segment_header(seq)
        decoded = decode_segment_header(header)
        assert isinstance(decoded, SegmentHeader)
        chain = decoded.crc  # the seed of the segment's frame chain
        parts = [header]
        for snapshot, episode_id in recs:
            envelope = encode_envelope(episode_id.encode(), 1.5, b"E%d" % seq, seq - 1 if snapshot else None)
            frame, chain = encode_frame(seq, envelope, chain)
            parts.append(frame)
            seq += 1
        _write(os.path.join(directory, segment_name(seq - len(recs), False)), b"".join(parts))


@settings(max_examples=150, deadline=None, suppress_health_check=_CHECKS)
@given(segments=_SEGMENTS)
def test_each_segments_episode_set_is_the_ids_written_into_it(tmp_path: Path, segments: list) -> None:
    """A segment's episode set (what compaction and sealing decide on) is exactly the ids of its records,
    whether the scan decodes them or not: the scan adds an id only when it decodes one that differs from the
    record before, so a segment starting with a snapshot, or with the previous segment's last id, is the
    case to get right."""
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        _write_segments(d, segments)
        written = [{e for _, e in recs} for recs in segments]
        for decode in (None, bytes):
            scan = _reader._scan_path(d, decode)
            assert [g.episodes for g in scan.segments] == written
            records = scan.decoded if decode is not None else scan.records
            assert len(records) == sum(map(len, segments))

"""Field cases C12 and C13 (/work/shared/cases/README.md), kind K6: torn tails are repaired by the next
writer and nothing appended after the repair is lost; corruption in the middle is reported, never skipped
or truncated; a zero-length segment is evidence of a crash, not a valid empty log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from journal import (
    JournalCorruptError,
    JournalDecodeError,
    JournalVersionError,
    JournalWriter,
    TornTail,
    replay,
)
from journal._framing import FORMAT_VERSION, encode_segment_header
from journal._reader import segment_name

from ._support import (
    CODEC,
    Closed,
    Noted,
    Opened,
    SmallEvent,
    frame_bounds,
    only_segment,
    visible,
    write_journal,
)

pytestmark = pytest.mark.anyio

ITEMS: list[tuple[str, SmallEvent]] = [
    ("op-1", Opened("agent")),
    ("op-1", Noted(1, "fetched")),
    ("op-1", Noted(2, "staged")),
    ("op-1", Closed()),
]


def _cut_mid_last(data: bytes) -> tuple[bytes, int]:
    start, end = frame_bounds(data)[-1]
    return data[: start + (end - start) // 2], start


def _bad_crc_last(data: bytes) -> tuple[bytes, int]:
    start, end = frame_bounds(data)[-1]
    b = bytearray(data)
    b[end - 8] ^= 0x40  # inside the chain CRC or the payload's end: the length stays valid
    return bytes(b), start


def _zero_tail(data: bytes) -> tuple[bytes, int]:
    return data + bytes(4096), len(data)


@pytest.mark.parametrize(
    "damage", [_cut_mid_last, _bad_crc_last, _zero_tail], ids=["cut", "bad-crc", "zeros"]
)
async def test_c13_torn_tail_recover_append_recover(tmp_path: Path, damage) -> None:  # type: ignore[no-untyped-def]
    d = str(tmp_path / "journal")
    records = await write_journal(d, ITEMS)
    seg = only_segment(d)
    damaged, torn_at = damage(Path(seg).read_bytes())
    Path(seg).write_bytes(damaged)
    kept = records if damage is _zero_tail else records[:-1]

    first = replay(d, CODEC)
    assert first.torn_tail == TornTail(seg, torn_at)
    assert visible(first.records) == visible(kept)
    assert Path(seg).read_bytes() == damaged  # readers never repair

    async with await JournalWriter.open(d, CODEC) as w:  # the next lock holder repairs
        assert w.repaired == TornTail(seg, torn_at)
        assert os.path.getsize(seg) == torn_at
        new = await w.append("op-2", Opened("again"))
        assert new.seq == len(kept) + 1
        after_repair = list(w.records())

    again = replay(d, CODEC)
    assert again.torn_tail is None
    assert visible(again.records) == visible(after_repair) == visible([*kept, new])
    async with await JournalWriter.open(d, CODEC) as w:
        assert w.repaired is None
        assert visible(w.records()) == visible(after_repair)


async def test_c13_middle_corruption_is_reported_not_skipped(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    await write_journal(d, ITEMS)
    seg = only_segment(d)
    data = bytearray(Path(seg).read_bytes())
    start, _ = frame_bounds(bytes(data))[1]
    data[start + 20] ^= 0x01
    Path(seg).write_bytes(bytes(data))
    for attempt in (lambda: replay(d, CODEC),):
        with pytest.raises(JournalCorruptError) as info:
            attempt()
        assert (info.value.path, info.value.offset) == (seg, start)
    with pytest.raises(JournalCorruptError) as info:
        await JournalWriter.open(d, CODEC)
    assert info.value.offset == start
    assert Path(seg).read_bytes() == bytes(data)  # nothing truncated


@pytest.mark.parametrize("fill", ["random", "zeros"])
async def test_a_live_segment_overwritten_whole_is_corruption_not_torn(tmp_path: Path, fill: str) -> None:
    """A header is fsynced before any frame is appended, so a bad header with bytes after it is damage,
    not a crash: replay refuses it (offset 0) and the writer never truncates away the records it held."""
    d = str(tmp_path / "journal")
    await write_journal(d, ITEMS)
    seg = only_segment(d)
    size = Path(seg).stat().st_size
    damaged = os.urandom(size) if fill == "random" else bytes(size)
    Path(seg).write_bytes(damaged)
    with pytest.raises(JournalCorruptError) as info:
        replay(d, CODEC)
    assert (info.value.path, info.value.offset) == (seg, 0)
    with pytest.raises(JournalCorruptError):
        await JournalWriter.open(d, CODEC)
    assert Path(seg).read_bytes() == damaged  # nothing truncated or rewritten


@pytest.mark.parametrize("cut", [1, 16, 31, 32])
async def test_a_live_segment_cut_inside_its_header_is_a_torn_creation(tmp_path: Path, cut: int) -> None:
    d = tmp_path / "journal"
    d.mkdir()
    seg = d / segment_name(1, sealed=False)
    seg.write_bytes(bytes(cut) if cut == 32 else encode_segment_header(1)[:cut])
    assert replay(d, CODEC).torn_tail == TornTail(str(seg), 0)


async def test_c12_zero_length_last_segment_is_a_crash_not_an_empty_log(tmp_path: Path) -> None:
    d = tmp_path / "journal"
    d.mkdir()
    seg = d / segment_name(1, sealed=False)
    seg.write_bytes(b"")
    result = replay(d, CODEC)
    assert result.records == [] and result.torn_tail == TornTail(str(seg), 0)
    async with await JournalWriter.open(d, CODEC) as w:
        assert w.repaired == TornTail(str(seg), 0)
        rec = await w.append("op", Closed())
    assert rec.seq == 1
    assert visible(replay(d, CODEC).records) == [(1, "op", Closed())]
    assert seg.read_bytes()[:32] == encode_segment_header(1)


async def test_c12_zero_length_segment_that_is_not_last_is_corruption(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    async with await JournalWriter.open(d, CODEC) as w:
        await w.append("op", Opened("x"))
        await w.seal(lambda _e: True)
        await w.append("op2", Opened("y"))
    sealed = os.path.join(d, segment_name(1, sealed=True))
    Path(sealed).write_bytes(b"")
    with pytest.raises(JournalCorruptError) as info:
        replay(d, CODEC)
    assert (info.value.path, info.value.offset) == (sealed, 0)


async def test_header_only_last_segment_with_torn_header_after_a_sealed_one(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    async with await JournalWriter.open(d, CODEC) as w:
        await w.append("op", Opened("x"))
        await w.seal(lambda _e: True)
    live = os.path.join(d, segment_name(2, sealed=False))
    Path(live).write_bytes(encode_segment_header(2)[:13])
    result = replay(d, CODEC)
    assert result.torn_tail == TornTail(live, 0) and [r.seq for r in result.records] == [1]
    async with await JournalWriter.open(d, CODEC) as w:
        assert (await w.append("op2", Closed())).seq == 2


async def test_newer_format_version_is_refused_untouched(tmp_path: Path) -> None:
    d = tmp_path / "journal"
    d.mkdir()
    seg = d / segment_name(1, sealed=False)
    content = encode_segment_header(1, version=FORMAT_VERSION + 1) + b"future frames we cannot read"
    seg.write_bytes(content)
    for call in (lambda: replay(d, CODEC),):
        with pytest.raises(JournalVersionError) as info:
            call()
        assert (info.value.found, info.value.supported) == (FORMAT_VERSION + 1, FORMAT_VERSION)
        assert str(seg) in str(info.value)
    with pytest.raises(JournalVersionError):
        await JournalWriter.open(d, CODEC)
    assert seg.read_bytes() == content


async def test_unknown_tag_is_a_typed_error_naming_file_and_offset(tmp_path: Path) -> None:
    class Future:
        def encode(self, event: object) -> bytes:
            return b"Z{}"

        def decode(self, data: bytes) -> object:
            return data

    d = str(tmp_path / "journal")
    await write_journal(d, [("op", Opened("x"))])
    async with await JournalWriter.open(d, Future()) as w:
        await w.append("op", object())
    seg = only_segment(d)
    start, _ = frame_bounds(Path(seg).read_bytes())[1]
    with pytest.raises(JournalDecodeError) as info:
        replay(d, CODEC)
    assert (info.value.path, info.value.offset) == (seg, start)
    assert isinstance(info.value.__cause__, KeyError)


def test_missing_directory_is_empty_and_not_created(tmp_path: Path) -> None:
    d = tmp_path / "state" / "journal"
    result = replay(d, CODEC)
    assert result.records == [] and result.torn_tail is None
    assert not (tmp_path / "state").exists()


async def test_writer_creates_directory_0700(tmp_path: Path) -> None:
    d = tmp_path / "state" / "journal"
    async with await JournalWriter.open(d, CODEC) as w:
        await w.append("op", Closed())
    assert (d.stat().st_mode & 0o777) == 0o700
    assert [r.seq for r in replay(d, CODEC).records] == [1]


def test_intact_frame_with_a_bad_envelope_is_a_decode_error(tmp_path: Path) -> None:
    from journal._framing import encode_frame

    header = encode_segment_header(1)
    frame, _ = encode_frame(1, b"\x07not an envelope", int.from_bytes(header[28:32], "little"))
    seg = tmp_path / segment_name(1, sealed=False)
    seg.write_bytes(header + frame)
    with pytest.raises(JournalDecodeError, match="unknown record kind 7") as info:
        replay(tmp_path, CODEC)
    assert (info.value.path, info.value.offset) == (str(seg), 32)


async def test_scan_gives_the_raw_records_replay_decodes(tmp_path: Path) -> None:
    from journal import scan

    records = await write_journal(str(tmp_path), ITEMS)
    raw = scan(tmp_path)
    assert [(r[0], r[1], CODEC.decode(r[4])) for r in raw.visible()] == visible(records)
    assert raw.torn is None and raw.next_seq == len(ITEMS) + 1

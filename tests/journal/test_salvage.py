"""``journal.salvage``: a damaged journal read as far as it can be (``journal quarantine`` keeps what the
records before the damage tell, design §10).

Expected, written down: an intact journal salvages to exactly what ``replay`` returns, with no error; a
flipped byte in the middle record of the live segment gives the records before it and the same
``JournalCorruptError`` (file, offset) ``replay`` raises; a damaged sealed segment gives nothing of it or
after it; an undecodable record ends the salvage before it; a gap no snapshot covers ends it before the
gap; a torn tail is no problem (the records before it, no error). The journal's bytes never change.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from journal import JournalCorruptError, JournalDecodeError, JournalWriter, replay, salvage
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
    ("op-1", Opened("agent")), ("op-1", Noted(1, "fetched")), ("op-1", Noted(2, "staged")),
    ("op-1", Closed()),
]


def _tree(d: str) -> dict[str, bytes]:
    return {name: Path(d, name).read_bytes() for name in sorted(os.listdir(d))}


async def test_an_intact_journal_salvages_to_its_replay(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    await write_journal(d, ITEMS)
    got, error = salvage(d, CODEC)
    assert error is None and visible(got.records) == visible(replay(d, CODEC).records)


async def test_a_corrupt_middle_record_ends_the_salvage_before_it(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    await write_journal(d, ITEMS)
    seg = only_segment(d)
    data = bytearray(Path(seg).read_bytes())
    start, _ = frame_bounds(bytes(data))[2]
    data[start + 20] ^= 0x01
    Path(seg).write_bytes(bytes(data))
    before = _tree(d)
    got, error = salvage(d, CODEC)
    assert [r.seq for r in got.records] == [1, 2]
    with pytest.raises(JournalCorruptError) as info:
        replay(d, CODEC)
    assert isinstance(error, JournalCorruptError) and (error.path, error.offset) == (seg, start)
    assert str(error) == str(info.value)
    assert _tree(d) == before


async def test_a_damaged_sealed_segment_gives_nothing_of_it_or_after_it(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    async with await JournalWriter.open(d, CODEC) as w:
        await w.append("op-1", Opened("x"))
        await w.seal(lambda _e: True)
        await w.append("op-2", Opened("y"))
        await w.seal(lambda _e: True)
        await w.append("op-3", Opened("z"))
    second = Path(d, segment_name(2, sealed=True))
    second.write_bytes(second.read_bytes()[:-3])
    got, error = salvage(d, CODEC)
    assert [r.seq for r in got.records] == [1]
    assert isinstance(error, JournalCorruptError) and error.path == str(second)


async def test_an_undecodable_record_ends_the_salvage_before_it(tmp_path: Path) -> None:
    class Future:
        def encode(self, event: object) -> bytes:
            return b"Z{}"

        def decode(self, data: bytes) -> object:
            return data

    d = str(tmp_path / "journal")
    await write_journal(d, ITEMS[:2])
    async with await JournalWriter.open(d, Future()) as w:
        await w.append("op-1", object())
        await w.append("op-1", object())
    got, error = salvage(d, CODEC)
    assert [r.seq for r in got.records] == [1, 2]
    assert isinstance(error, JournalDecodeError)


async def test_a_gap_no_snapshot_covers_ends_the_salvage_before_it(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    async with await JournalWriter.open(d, CODEC) as w:
        await w.append("op-1", Opened("x"))
        await w.seal(lambda _e: True)
        await w.append("op-2", Opened("y"))
        await w.seal(lambda _e: True)
        await w.append("op-3", Opened("z"))
    os.unlink(os.path.join(d, segment_name(2, sealed=True)))
    got, error = salvage(d, CODEC)
    assert [r.seq for r in got.records] == [1]
    assert isinstance(error, JournalCorruptError) and "records 2..2 are missing" in str(error)


async def test_a_torn_tail_is_no_problem(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    await write_journal(d, ITEMS)
    seg = only_segment(d)
    data = Path(seg).read_bytes()
    start, end = frame_bounds(data)[-1]
    Path(seg).write_bytes(data[: start + (end - start) // 2])
    got, error = salvage(d, CODEC)
    assert error is None and [r.seq for r in got.records] == [1, 2, 3]
    assert got.torn_tail is not None and got.torn_tail.offset == start


def test_a_missing_directory_salvages_to_nothing(tmp_path: Path) -> None:
    got, error = salvage(str(tmp_path / "none"), CODEC)
    assert (got.records, got.torn_tail, error) == ([], None, None)
    assert not (tmp_path / "none").exists()

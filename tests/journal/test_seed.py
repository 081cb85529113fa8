"""``JournalWriter.seed``: a journal started afresh begins with a snapshot record that covers nothing
(``journal quarantine`` carries the old journal's facts in it, design §10).

Expected, written down: the seed is record 1 (episode ``"-"``), visible to replay with everything after it;
a journal holding a record refuses a seed (``ValueError``, nothing written); compaction summarises the seed
like any snapshot (the next summary carries it) and drops it with the segment it is in.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from journal import SNAPSHOT_EPISODE, JournalWriter, replay

from ._support import CODEC, Closed, Opened, Summary, summarize

pytestmark = pytest.mark.anyio


async def test_a_seed_is_the_first_record_and_stays_visible(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    async with await JournalWriter.open(d, CODEC) as w:
        seeded = await w.seed(Summary(("old-1", "old-2"), 9))
        assert (seeded.seq, seeded.episode_id) == (1, SNAPSHOT_EPISODE)
        await w.append("op", Opened("x"))
    records = replay(d, CODEC).records
    assert [(r.seq, r.episode_id, r.event) for r in records] == [
        (1, SNAPSHOT_EPISODE, Summary(("old-1", "old-2"), 9)), (2, "op", Opened("x"))]


async def test_a_journal_holding_a_record_refuses_a_seed(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    async with await JournalWriter.open(d, CODEC) as w:
        await w.append("op", Opened("x"))
        before = [p.read_bytes() for p in sorted(Path(d).glob("*.jnl"))]
        with pytest.raises(ValueError, match="only an empty journal"):
            await w.seed(Summary((), 0))
        assert [p.read_bytes() for p in sorted(Path(d).glob("*.jnl"))] == before


async def test_compaction_carries_the_seed_on(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    async with await JournalWriter.open(d, CODEC) as w:
        await w.seed(Summary(("old-1",), 5))
        await w.append("op-1", Opened("x"))
        await w.append("op-1", Closed())
        await w.seal(lambda _e: True)
        await w.append("op-2", Opened("y"))
        await w.append("op-2", Closed())
        stats = await w.compact(1, lambda _e: True, summarize)
    assert stats.dropped_records == 3
    records = replay(d, CODEC).records
    assert [r.event for r in records if r.episode_id == SNAPSHOT_EPISODE] == [Summary(("old-1", "op-1"), 7)]

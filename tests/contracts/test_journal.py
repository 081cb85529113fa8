"""Journal contract (``upgrade_core.ports.Journal``): the simulator and ``agent.session.wiring.JournalPort``
over a
real ``journal.JournalWriter`` in a temporary directory run the same tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.session.wiring import JournalPort
from journal import JournalWriter
from tests.core.journals import PRE_SWITCH
from tests.sim.host import SIM_POLICY, SimJournal, World
from upgrade_core import EVENT_CODEC, Event, Recorded
from upgrade_core.ports import Journal

pytestmark = pytest.mark.anyio


def envelope(records: Sequence[Recorded]) -> list[tuple[int, str, Event]]:
    """What the contract compares: (seq, episode id, event); ``wall_time`` is informational only."""
    return [(r.seq, r.episode_id, r.event) for r in records]


class JournalRig:
    """Creates the port and the situations the suite needs; one subclass per adapter."""

    journal: Journal

    async def reopen(self) -> Journal:
        """The journal a fresh process opens on the same durable storage (this one is closed first)."""
        raise NotImplementedError

    async def append_as_other_process(self, episode_id: str, event: Event) -> None:
        """Another lock holder appends durably (only valid once :attr:`journal` relinquished)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what the rig opened."""


class SimJournalRig(JournalRig):
    def __init__(self) -> None:
        self.world = World(SIM_POLICY)
        self.journal = SimJournal(self.world)

    async def reopen(self) -> Journal:
        self.journal = SimJournal(self.world)
        return self.journal

    async def append_as_other_process(self, episode_id: str, event: Event) -> None:
        await SimJournal(self.world).append(episode_id, event)


class RealJournalRig(JournalRig):
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._writers: list[JournalWriter[Event]] = []

    async def _open(self) -> JournalPort:
        writer: JournalWriter[Event] = await JournalWriter.open(self.directory, EVENT_CODEC)
        self._writers.append(writer)
        return JournalPort(writer)

    async def start(self) -> None:
        self.journal = await self._open()

    async def reopen(self) -> Journal:
        await self._writers[-1].aclose()
        self.journal = await self._open()
        return self.journal

    async def append_as_other_process(self, episode_id: str, event: Event) -> None:
        other = await self._open()
        try:
            await other.append(episode_id, event)
        finally:
            await other.writer.aclose()

    async def aclose(self) -> None:
        for writer in self._writers:
            await writer.aclose()


class JournalContract:
    """What every Journal must do, from the port's docstrings (design §5)."""

    @pytest.fixture
    async def rig(self) -> AsyncIterator[JournalRig]:
        raise NotImplementedError
        yield  # pragma: no cover

    async def test_a_new_journal_holds_no_records(self, rig: JournalRig) -> None:
        assert list(rig.journal.records()) == []
        assert list(await rig.journal.reread()) == []

    async def test_append_returns_the_record_with_seq_plus_one(self, rig: JournalRig) -> None:
        got = [await rig.journal.append("op1", event) for event in PRE_SWITCH[:3]]
        assert [(r.episode_id, r.event) for r in got] == [("op1", e) for e in PRE_SWITCH[:3]]
        assert [r.seq for r in got] == [got[0].seq, got[0].seq + 1, got[0].seq + 2]
        assert got[0].seq == 1  # the first record of a new journal
        assert all(isinstance(r.wall_time, float) for r in got)

    async def test_seq_is_global_across_episodes(self, rig: JournalRig) -> None:
        a = await rig.journal.append("op-a", PRE_SWITCH[0])
        b = await rig.journal.append("op-b", PRE_SWITCH[0])
        c = await rig.journal.append("op-a", PRE_SWITCH[1])
        assert (a.seq, b.seq, c.seq) == (1, 2, 3)
        assert [r.episode_id for r in rig.journal.records()] == ["op-a", "op-b", "op-a"]

    async def test_records_are_the_appends_in_sequence_order(self, rig: JournalRig) -> None:
        got = [await rig.journal.append("op1", event) for event in PRE_SWITCH]
        assert envelope(rig.journal.records()) == envelope(got)

    async def test_concurrent_appends_all_land_with_distinct_consecutive_seqs(self, rig: JournalRig) -> None:
        got: list[Any] = []

        async def one(i: int) -> None:
            got.append(await rig.journal.append(f"op{i}", PRE_SWITCH[0]))

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(one, i)
        assert sorted(r.seq for r in got) == [1, 2, 3, 4, 5]
        assert envelope(rig.journal.records()) == sorted(envelope(got), key=lambda t: t[0])

    async def test_an_append_is_durable_for_the_next_process(self, rig: JournalRig) -> None:
        got = [await rig.journal.append("op1", event) for event in PRE_SWITCH[:2]]
        fresh = await rig.reopen()
        assert envelope(fresh.records()) == envelope(got)
        nxt = await fresh.append("op1", PRE_SWITCH[2])
        assert nxt.seq == got[-1].seq + 1

    async def test_reread_returns_every_durable_record(self, rig: JournalRig) -> None:
        got = [await rig.journal.append("op1", event) for event in PRE_SWITCH[:3]]
        assert envelope(await rig.journal.reread()) == envelope(got)
        assert envelope(rig.journal.records()) == envelope(got)

    async def test_append_after_reread_continues_the_sequence(self, rig: JournalRig) -> None:
        await rig.journal.append("op1", PRE_SWITCH[0])
        await rig.journal.reread()
        nxt = await rig.journal.append("op1", PRE_SWITCH[1])
        assert nxt.seq == 2
        assert [r.seq for r in rig.journal.records()] == [1, 2]

    async def test_after_relinquish_reread_sees_another_process_appends(self, rig: JournalRig) -> None:
        mine = await rig.journal.append("op1", PRE_SWITCH[0])
        await rig.journal.relinquish()
        await rig.append_as_other_process("op1", PRE_SWITCH[1])
        seen = await rig.journal.reread()
        assert envelope(seen) == [(mine.seq, "op1", PRE_SWITCH[0]), (mine.seq + 1, "op1", PRE_SWITCH[1])]
        assert envelope(rig.journal.records()) == envelope(seen)

    async def test_a_cancelled_append_is_durable_or_never_accepted(self, rig: JournalRig) -> None:
        await rig.journal.append("op1", PRE_SWITCH[0])
        with anyio.CancelScope() as scope:
            scope.cancel()
            await rig.journal.append("op1", PRE_SWITCH[1])
        in_memory = envelope(rig.journal.records())
        on_disk = envelope((await rig.reopen()).records())
        assert in_memory == on_disk
        assert on_disk in ([(1, "op1", PRE_SWITCH[0])],
                           [(1, "op1", PRE_SWITCH[0]), (2, "op1", PRE_SWITCH[1])])


class TestSimJournal(JournalContract):
    @pytest.fixture
    async def rig(self) -> AsyncIterator[JournalRig]:
        yield SimJournalRig()


class TestRealJournal(JournalContract):
    @pytest.fixture
    async def rig(self, tmp_path: Path) -> AsyncIterator[JournalRig]:
        rig = RealJournalRig(tmp_path / "state" / "journal")
        await rig.start()
        try:
            yield rig
        finally:
            await rig.aclose()

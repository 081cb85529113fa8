"""The writer's one long-lived thread: every sync on that thread, batches that form while a
sync is in flight, a failed sync failing every waiter of its batch, and cancelled waiters whose records are
written exactly once."""

from __future__ import annotations

import errno
import gc
import os
import threading
from pathlib import Path

import anyio
import pytest

from journal import JournalPoisonedError, JournalWriter, Record, replay

from ._support import CODEC, Noted, Opened, SmallEvent, visible, wait_for

pytestmark = pytest.mark.anyio
_real_fdatasync = os.fdatasync


def _writer_threads(directory: Path) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"journal-writer {directory}"]


class _Gate:
    """An ``os.fdatasync`` stand-in that records the calling thread and holds the first ``held`` calls until
    the test opens the gate; with ``error``, every call fails with it (after the hold) instead of syncing."""

    def __init__(self, held: int = 0, error: OSError | None = None) -> None:
        self.threads: list[int] = []
        self.held = held
        self.error = error
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, fd: int) -> None:
        self.threads.append(threading.get_ident())
        if len(self.threads) <= self.held:
            self.started.set()
            assert self.release.wait(10), "test never released the fsync"
        if self.error is not None:
            raise self.error
        _real_fdatasync(fd)


async def test_every_sync_runs_on_one_long_lived_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _Gate()
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        monkeypatch.setattr(os, "fdatasync", gate)
        (thread,) = _writer_threads(tmp_path)
        for i in range(20):
            await w.append("op", Noted(i, ""))
        async with anyio.create_task_group() as tg:
            for i in range(20, 52):
                tg.start_soon(w.append, "op", Noted(i, ""))
        assert _writer_threads(tmp_path) == [thread]
        assert set(gate.threads) == {thread.ident}
        assert thread.ident != threading.get_ident()  # never the event loop's thread
        assert 21 <= len(gate.threads) <= 28  # 20 one by one, the 32 concurrent ones group-committed
    assert not thread.is_alive()  # aclose() stops it
    assert [r.seq for r in replay(tmp_path, CODEC).records] == list(range(1, 53))


async def test_appends_made_during_a_sync_form_the_next_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _Gate(held=1)
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        monkeypatch.setattr(os, "fdatasync", gate)
        results: list[Record[SmallEvent]] = []

        async def one(i: int) -> None:
            results.append(await w.append("op", Noted(i, "")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            await wait_for(gate.started.is_set, "the first sync to start")
            for i in range(1, 11):
                tg.start_soon(one, i)
            await anyio.sleep(0.05)
            assert results == []  # nothing returns before its sync
            gate.release.set()
        assert len(gate.threads) == 2  # the first record alone, then the ten that queued behind it
        assert sorted(r.seq for r in results) == list(range(1, 12))
        assert [r.event for r in results if r.seq == 1] == [Noted(0, "")]
    assert visible(replay(tmp_path, CODEC).records) == visible(sorted(results, key=lambda r: r.seq))


async def test_failed_sync_fails_every_waiter_of_its_batch_and_later_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = _Gate(held=1, error=OSError(errno.EIO, "Input/output error"))
    calls = failing.threads
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await w.append("op", Opened("before"))
        monkeypatch.setattr(os, "fdatasync", failing)
        errors: list[BaseException] = []

        async def one(i: int) -> None:
            try:
                await w.append("op", Noted(i, ""))
            except JournalPoisonedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for i in range(16):  # one batch, syncing
                tg.start_soon(one, i)
            await wait_for(failing.started.is_set, "the failing sync to start")
            for i in range(16, 24):  # the next batch, queued behind it
                tg.start_soon(one, i)
            await anyio.sleep(0.02)
            failing.release.set()
        assert len(errors) == 24
        for exc in errors:
            assert isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EIO
        assert len(calls) == 1  # the queued batch never reached the file: no retried sync
        assert [r.seq for r in w.records()] == [1]
        with pytest.raises(JournalPoisonedError):
            await w.append("op", Noted(99, ""))
        assert len(calls) == 1


async def test_cancelled_waiters_are_written_once_and_return_their_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _Gate(held=1)
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        monkeypatch.setattr(os, "fdatasync", gate)
        returned: dict[int, Record[SmallEvent]] = {}
        scopes = [anyio.CancelScope() for _ in range(9)]

        async def one(i: int) -> None:
            with scopes[i]:
                returned[i] = await w.append(f"op-{i}", Noted(i, ""))
                await anyio.sleep(10)  # the cancel is delivered here, after the durable append

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            await wait_for(gate.started.is_set, "the first sync to start")
            for i in range(1, 9):
                tg.start_soon(one, i)
            await anyio.sleep(0.02)
            for scope in scopes:  # the one being synced and the eight queued behind it
                scope.cancel()
            await anyio.sleep(0.02)
            assert returned == {}
            gate.release.set()
        assert sorted(returned) == list(range(9))
        assert all(scope.cancelled_caught for scope in scopes)
    records = replay(tmp_path, CODEC).records
    assert [r.seq for r in records] == list(range(1, 10))
    assert sorted(r.event.n for r in records) == list(range(9))  # type: ignore[union-attr]
    assert visible(records) == visible(sorted(returned.values(), key=lambda r: r.seq))


async def test_a_writer_dropped_without_aclose_stops_its_thread(tmp_path: Path) -> None:
    w = await JournalWriter.open(tmp_path, CODEC)
    await w.append("op", Opened("a"))
    (thread,) = _writer_threads(tmp_path)
    for fd in (w._live.fd, w._dir_fd):  # what aclose() would have closed
        os.close(fd)
    del w
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()

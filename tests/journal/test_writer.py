"""The writer: group commit, durability under cancellation, fsync poisoning, ENOSPC (design §5)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import anyio
import pytest

from journal import (
    JournalClosedError,
    JournalFullError,
    JournalPoisonedError,
    JournalWriter,
    replay,
)

from ._support import CODEC, Closed, Noted, Opened, only_segment, visible, wait_for

pytestmark = pytest.mark.anyio
_real_fdatasync = os.fdatasync


class FdatasyncSpy:
    """Counts ``os.fdatasync`` calls and still performs the real one."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        _real_fdatasync(fd)


async def test_64_concurrent_appends_group_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        spy = FdatasyncSpy()
        monkeypatch.setattr(os, "fdatasync", spy)
        results = []

        async def one(i: int) -> None:
            results.append(await w.append(f"op-{i % 4}", Noted(i, "x" * 200)))

        async with anyio.create_task_group() as tg:
            for i in range(64):
                tg.start_soon(one, i)
        assert 1 <= spy.calls <= 8, spy.calls
        assert sorted(r.seq for r in results) == list(range(1, 65))
        assert sorted(r.event.n for r in results) == list(range(64))  # type: ignore[union-attr]
        mine = list(w.records())
    assert (
        visible(replay(tmp_path, CODEC).records)
        == visible(mine)
        == visible(sorted(results, key=lambda r: r.seq))
    )


async def test_many_tasks_each_record_once_in_order(tmp_path: Path) -> None:
    async with await JournalWriter.open(tmp_path, CODEC) as w:

        async def worker(k: int) -> None:
            for i in range(15):
                await w.append(f"task-{k}", Noted(i, ""))

        async with anyio.create_task_group() as tg:
            for k in range(12):
                tg.start_soon(worker, k)
    records = replay(tmp_path, CODEC).records
    assert [r.seq for r in records] == list(range(1, 181))
    for k in range(12):
        mine = [r.event.n for r in records if r.episode_id == f"task-{k}"]
        assert mine == list(range(15))


async def test_cancelled_append_returns_only_once_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    started = threading.Event()
    release = threading.Event()

    def slow_fdatasync(fd: int) -> None:
        started.set()
        assert release.wait(10), "test never released the fsync"
        _real_fdatasync(fd)
        log.append("fsync-done")

    async with await JournalWriter.open(tmp_path, CODEC) as w:
        monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
        scope = anyio.CancelScope()

        async def appender() -> None:
            with scope:
                try:
                    await w.append("op", Opened("durable"))
                    log.append("append-returned")
                finally:
                    log.append("task-exit")

        async with anyio.create_task_group() as tg:
            tg.start_soon(appender)
            await wait_for(started.is_set, "the fsync to start")
            scope.cancel()
            await anyio.sleep(0)  # let the cancel reach the task; it must stay parked in the shielded append
            assert log == []
            release.set()
        monkeypatch.setattr(os, "fdatasync", _real_fdatasync)
        assert log == ["fsync-done", "append-returned", "task-exit"]
        assert scope.cancel_called
    assert visible(replay(tmp_path, CODEC).records) == [(1, "op", Opened("durable"))]


async def test_fsync_failure_poisons_without_retry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def failing(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    w = await JournalWriter.open(tmp_path, CODEC)
    await w.append("op", Opened("before"))
    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(JournalPoisonedError) as info:
        await w.append("op", Noted(1, "lost?"))
    assert only_segment(str(tmp_path)) in str(info.value)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.EIO
    monkeypatch.setattr(os, "fdatasync", _real_fdatasync)
    with pytest.raises(JournalPoisonedError):
        await w.append("op", Noted(2, "refused"))
    with pytest.raises(JournalPoisonedError):
        await w.seal(lambda _e: True)
    assert len(calls) == 1  # never retried
    assert [r.seq for r in w.records()] == [1]
    await w.aclose()
    assert replay(tmp_path, CODEC).records[0].event == Opened("before")


async def test_enospc_from_write_is_cut_off_and_recoverable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pwrite = os.pwrite

    def half_then_enospc(fd: int, data: bytes, offset: int) -> int:
        if len(data) > 8:
            return real_pwrite(fd, bytes(data)[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await w.append("op", Opened("a"))
        seg = only_segment(str(tmp_path))
        size = os.path.getsize(seg)
        monkeypatch.setattr(os, "pwrite", half_then_enospc)
        with pytest.raises(JournalFullError) as info:
            await w.append("op", Noted(1, "y" * 300))
        assert seg in str(info.value)
        monkeypatch.setattr(os, "pwrite", real_pwrite)
        assert os.path.getsize(seg) == size  # nothing half-written stays
        result = replay(tmp_path, CODEC)
        assert result.torn_tail is None and [r.seq for r in result.records] == [1]
        again = await w.append("op", Closed())  # space is back: the journal goes on, no gap
    assert again.seq == 2
    assert visible(replay(tmp_path, CODEC).records) == [(1, "op", Opened("a")), (2, "op", Closed())]


async def test_closed_writer_refuses(tmp_path: Path) -> None:
    w = await JournalWriter.open(tmp_path, CODEC)
    await w.aclose()
    await w.aclose()
    with pytest.raises(JournalClosedError):
        await w.append("op", Closed())


async def test_bad_episode_ids_are_refused_before_writing(tmp_path: Path) -> None:
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        for bad in ("", "-", "x" * 70000):
            with pytest.raises(ValueError):
                await w.append(bad, Closed())
        assert w.records() == ()
    assert replay(tmp_path, CODEC).records == []


async def test_wall_clock_is_recorded_and_seq_continues_after_reopen(tmp_path: Path) -> None:
    async with await JournalWriter.open(tmp_path, CODEC, wall_clock=lambda: 42.25) as w:
        assert (await w.append("op", Closed())).wall_time == 42.25
    async with await JournalWriter.open(tmp_path, CODEC, wall_clock=lambda: 43.0) as w:
        rec = await w.append("op", Closed())
    assert (rec.seq, rec.wall_time) == (2, 43.0)
    assert [r.wall_time for r in replay(tmp_path, CODEC).records] == [42.25, 43.0]

"""Sealing into zstd segments, retention with snapshot records, and crash safety of both (design §5):
at every crash point, replay shows each record exactly once (the state before or after the operation),
and the next writer cleans the leftovers."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import zstandard

from journal import JournalCorruptError, JournalPoisonedError, JournalWriter, replay
from journal._reader import segment_name

from ._support import CODEC, Closed, Noted, Opened, Summary, frame_bounds, summarize, visible

pytestmark = pytest.mark.anyio


def _closed_except(*open_ids: str) -> Callable[[str], bool]:
    return lambda episode_id: episode_id not in open_ids


async def _episodes(w: JournalWriter, names: list[str], seal: bool = True) -> None:
    for name in names:
        await w.append(name, Opened(name))
        await w.append(name, Noted(1, name))
        await w.append(name, Closed())
        if seal:
            assert await w.seal(_closed_except())


async def test_seal_keeps_every_record_and_the_sequence(tmp_path: Path) -> None:
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await _episodes(w, ["a", "b"])
        before = visible(w.records())
    assert sorted(os.listdir(tmp_path)) == [
        segment_name(1, True),
        segment_name(4, True),
        segment_name(7, False),
    ]
    assert (tmp_path / segment_name(1, True)).read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    assert visible(replay(tmp_path, CODEC).records) == before
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        assert (await w.append("c", Opened("c"))).seq == 7


async def test_seal_waits_for_open_episodes_and_needs_records(tmp_path: Path) -> None:
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        assert not await w.seal(_closed_except())  # empty live segment
        await w.append("a", Opened("a"))
        assert not await w.seal(_closed_except("a"))
        assert await w.seal(_closed_except())
    assert len(replay(tmp_path, CODEC).records) == 1


async def test_compact_keeps_newest_episodes_and_snapshots_the_rest(tmp_path: Path) -> None:
    names = [f"ep{i}" for i in range(6)]
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await _episodes(w, names)
        await w.append("open-one", Opened("still running"))
        stats = await w.compact(2, _closed_except("open-one"), summarize)
        assert (stats.sealed, stats.dropped_segments, stats.dropped_records) == (False, 4, 12)
        assert stats.snapshot_seq == 20
        records = list(w.records())
    result = replay(tmp_path, CODEC).records
    assert visible(result) == visible(records)
    assert [r.episode_id for r in result] == ["ep4"] * 3 + ["ep5"] * 3 + ["open-one", "-"]
    assert result[-1].event == Summary(("ep0", "ep1", "ep2", "ep3"), 12)
    # A second round folds the older snapshot into the new one; seq stays monotonic.
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await w.append("open-one", Closed())
        await _episodes(w, ["ep6", "ep7"])
        stats = await w.compact(1, _closed_except(), summarize)
        # ep4, ep5, open-one (2), the old snapshot and ep6: its segment was sealed with open-one's close
        assert (stats.dropped_segments, stats.dropped_records, stats.snapshot_seq) == (3, 12, 28)
    result = replay(tmp_path, CODEC).records
    assert [r.episode_id for r in result] == ["ep7"] * 3 + ["-"]
    assert result[-1].event == Summary(("ep4", "ep5", "open-one", "ep0", "ep1", "ep2", "ep3", "ep6"), 23)
    assert [r.seq for r in result] == [25, 26, 27, 28]


@pytest.mark.parametrize("closed", [1, 2, 3, 4, 5])
async def test_compact_with_fewer_closed_than_kept_drops_nothing(tmp_path: Path, closed: int) -> None:
    """Every count below ``keep_episodes`` keeps everything (a negative slice start once kept too few)."""
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await _episodes(w, [f"e{i}" for i in range(closed)])
        stats = await w.compact(5, _closed_except(), summarize)
    assert (stats.dropped_segments, stats.snapshot_seq) == (0, None)
    assert len(replay(tmp_path, CODEC).records) == 3 * closed


async def test_bad_sealed_segments_are_corruption(tmp_path: Path) -> None:
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await _episodes(w, ["a"])
    sealed = tmp_path / segment_name(1, True)
    good = sealed.read_bytes()
    content = zstandard.ZstdDecompressor().decompress(good)
    last_start, last_end = frame_bounds(content)[-1]
    # A bad last frame in a sealed segment is not a torn tail.
    damaged = bytearray(content)
    damaged[last_end - 6] ^= 1
    sealed.write_bytes(zstandard.ZstdCompressor().compress(bytes(damaged)))
    with pytest.raises(JournalCorruptError) as info:
        replay(tmp_path, CODEC)
    assert (info.value.path, info.value.offset) == (str(sealed), last_start)
    assert "decompressed" in str(info.value)
    # Damage to the compressed bytes themselves (zstd checksum).
    broken = bytearray(good)
    broken[len(broken) // 2] ^= 0xFF
    sealed.write_bytes(bytes(broken))
    with pytest.raises(JournalCorruptError) as info:
        replay(tmp_path, CODEC)
    assert (info.value.path, info.value.offset) == (str(sealed), 0)
    with pytest.raises(JournalCorruptError):
        await JournalWriter.open(tmp_path, CODEC)


async def test_missing_segment_without_snapshot_is_corruption(tmp_path: Path) -> None:
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await _episodes(w, ["a", "b"])
    (tmp_path / segment_name(4, True)).unlink()
    with pytest.raises(JournalCorruptError, match=r"records 4\.\.6 are missing"):
        replay(tmp_path, CODEC)


class _Crash(Exception):
    """Stands for the process dying at this call (what was written stays, like a process crash)."""


_FS_CALLS = ("pwrite", "fsync", "fdatasync", "replace", "unlink", "ftruncate", "open")


@contextlib.contextmanager
def _crash_at(monkeypatch: pytest.MonkeyPatch, n: int):  # type: ignore[no-untyped-def]
    count = [0]

    def wrap(real):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            count[0] += 1
            if count[0] == n:
                raise _Crash(f"crash at fs call {n} ({real.__name__})")
            return real(*args, **kwargs)

        return call

    with monkeypatch.context() as m:
        for name in _FS_CALLS:
            m.setattr(os, name, wrap(getattr(os, name)))
        yield count


async def _prepared(d: Path) -> list:
    async with await JournalWriter.open(d, CODEC) as w:
        await _episodes(w, ["a", "b", "c"], seal=False)
        assert await w.seal(_closed_except())
        await _episodes(w, ["d", "e"], seal=False)
        return visible(w.records())


async def _crash_sweep(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    operation: Callable[[JournalWriter], Awaitable[object]],
) -> int:
    """Crash ``operation`` at its 1st, 2nd, ... file-system call until it completes; return the count."""
    reference = tmp_path / "reference"
    before = await _prepared(reference)
    async with await JournalWriter.open(reference, CODEC) as w:
        await operation(w)
        after = visible(w.records())
    n = 1
    while True:
        d = tmp_path / f"crash{n}"
        assert await _prepared(d) == before
        w = await JournalWriter.open(d, CODEC)
        crashed = False
        with _crash_at(monkeypatch, n):
            try:
                await operation(w)
            except _Crash:
                crashed = True
        for fd in (w._live.fd, w._dir_fd):  # the crashed process's descriptors (and the directory's lock)
            with contextlib.suppress(OSError):
                os.close(fd)
        seen = visible(replay(d, CODEC).records)
        assert seen in (before, after), f"crash point {n}"
        async with await JournalWriter.open(d, CODEC) as w2:
            assert visible(w2.records()) == seen
            new = await w2.append("z", Closed())
        assert visible(replay(d, CODEC).records) == [*seen, visible([new])[0]]
        names = os.listdir(d)
        assert not [f for f in names if f.endswith(".tmp")]
        firsts = [f.split(".")[0] for f in names]
        assert len(firsts) == len(set(firsts)), names  # the shadowed live twin of a sealed copy is gone
        if not crashed:
            assert seen == after
            return n
        n += 1


async def test_seal_is_crash_safe_at_every_fs_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    points = await _crash_sweep(tmp_path, monkeypatch, lambda w: w.seal(_closed_except()))
    assert points > 5


async def test_compact_is_crash_safe_at_every_fs_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    points = await _crash_sweep(tmp_path, monkeypatch, lambda w: w.compact(1, _closed_except(), summarize))
    assert points > 8


async def test_failure_after_the_sealed_rename_poisons_and_open_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the rename replay reads the sealed copy, so the writer must not append to the old live file."""
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await _episodes(w, ["a"], seal=False)
        real_unlink = os.unlink

        def failing_unlink(path: str, *args: object, **kwargs: object) -> None:
            if str(path).endswith(".jnl"):
                raise OSError(5, "Input/output error", path)
            real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "unlink", failing_unlink)
        with pytest.raises(JournalPoisonedError, match="sealing failed"):
            await w.seal(_closed_except())
        monkeypatch.setattr(os, "unlink", real_unlink)
        with pytest.raises(JournalPoisonedError):
            await w.append("b", Opened("b"))
    assert sorted(os.listdir(tmp_path)) == [segment_name(1, False), segment_name(1, True)]
    assert [r.seq for r in replay(tmp_path, CODEC).records] == [1, 2, 3]
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        assert (await w.append("b", Opened("b"))).seq == 4
    assert sorted(os.listdir(tmp_path)) == [segment_name(1, True), segment_name(4, False)]
    assert [r.seq for r in replay(tmp_path, CODEC).records] == [1, 2, 3, 4]


async def test_failure_before_the_sealed_rename_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await _episodes(w, ["a"], seal=False)
        real_fsync = os.fsync
        monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left")))
        with pytest.raises(OSError, match="No space"):
            await w.seal(_closed_except())
        monkeypatch.setattr(os, "fsync", real_fsync)
        assert (await w.append("b", Opened("b"))).seq == 4  # the live segment goes on
    assert os.listdir(tmp_path) == [segment_name(1, False)]
    assert [r.seq for r in replay(tmp_path, CODEC).records] == [1, 2, 3, 4]


async def test_c12_durability_order_of_a_seal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """File data fsynced -> renamed -> directory fsynced; a removal or creation -> directory fsynced."""
    trace: list[tuple[str, str]] = []
    real = {name: getattr(os, name) for name in ("fsync", "replace", "unlink", "open")}

    def path_of(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def at(path: str, dir_fd: int | None) -> str:  # the writer works relative to its directory's fd
        return str(path) if dir_fd is None else os.path.join(path_of(dir_fd), path)

    def fsync(fd: int) -> None:
        trace.append(("fsync", path_of(fd)))
        real["fsync"](fd)

    def replace(src: str, dst: str, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        trace.append(("replace", f"{at(src, src_dir_fd)} -> {at(dst, dst_dir_fd)}"))
        real["replace"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def unlink(path: str, *, dir_fd: int | None = None) -> None:
        trace.append(("unlink", at(path, dir_fd)))
        real["unlink"](path, dir_fd=dir_fd)

    def open_(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if flags & os.O_CREAT:
            trace.append(("create", at(path, dir_fd)))
        return int(real["open"](path, flags, mode, dir_fd=dir_fd))

    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await _episodes(w, ["a"], seal=False)
        for name, fn in (("fsync", fsync), ("replace", replace), ("unlink", unlink), ("open", open_)):
            monkeypatch.setattr(os, name, fn)
        assert await w.seal(_closed_except())
    d = str(tmp_path)
    sealed = os.path.join(d, segment_name(1, True))
    tmp = sealed + ".tmp"
    live, new = os.path.join(d, segment_name(1, False)), os.path.join(d, segment_name(4, False))
    assert trace == [
        ("create", tmp),
        ("fsync", tmp),
        ("replace", f"{tmp} -> {sealed}"),
        ("fsync", d),
        ("unlink", live),
        ("fsync", d),
        ("create", new),
        ("fsync", new),
        ("fsync", d),
    ]


async def test_sealed_segment_claiming_a_huge_size_is_corruption(tmp_path: Path) -> None:
    async with await JournalWriter.open(tmp_path, CODEC) as w:
        await _episodes(w, ["a"])
    sealed = tmp_path / segment_name(1, True)
    content = zstandard.ZstdDecompressor().decompress(sealed.read_bytes())
    # A stream without a content size in its frame header (as a damaged or foreign file might be).
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(content)
    sealed.write_bytes(no_size)
    with pytest.raises(JournalCorruptError, match="content size") as info:
        replay(tmp_path, CODEC)
    assert (info.value.path, info.value.offset) == (str(sealed), 0)

"""Journal benchmarks (design §9): durable append, group commit, replay, each against raw ``write`` +
``fdatasync`` (or ``json.loads``) and, in the ``.sqlite`` rows, against SQLite doing the same job (stdlib
``sqlite3``, WAL, ``synchronous=FULL``). Run on a disk-backed directory (never tmpfs); each row reports the
file-system type. Our side runs on anyio's asyncio backend (the agent's backend); times are per event, in
microseconds.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _harness

APPENDS = 400  # durable appends timed per run
GROUP = 64  # concurrent writers
GROUP_ROUNDS = 30
REPLAY_EVENTS = 100_000
SQLITE_TARGET = 1.0  # no target of its own: "where it stands against SQLite" (<= 1: not slower)


def _episode(op: str) -> list[Any]:
    """The events of one successful supervised upgrade, in the order a real run journals them (design
    §4.3)."""
    import upgrade_core as ev

    sha = "3f" * 32
    result = ev.UpgradeResult(op, "committed", "1.4.2", "1.5.0", "green", None)
    return [
        ev.EpisodeOpened(
            op,
            "upgrade",
            "https://releases.example.net/demo-agent/1.5.0/demo-agent-linux-amd64.tar.gz",
            sha,
            "1.5.0",
            "blue",
            "1.4.2",
            3,
            3.0,
            60.0,
        ),
        ev.ArchiveFetched(18_874_368, sha),
        ev.CandidateStaged(
            "green", sha, 52_428_800, "/opt/upgrade-agent/lib/demo-agent/.demo-agent-green.stage-9f3a"
        ),
        ev.CandidateVerified("1.5.0"),
        ev.CandidateInstalled("green", sha),
        ev.SwitchIntended("green", "blue", "blue"),
        ev.SwitchCommitted("green"),
        ev.MirrorsSynced(()),
        ev.HealthAttemptStarted(1),
        ev.RestartRequested(f"demo-agent-restart-{op[:8]}-1-a9c2", 81234.5625),
        ev.RestartObserved(48211, "8b1c2f0e6d2a4f1e9c3b5a7d0e4f6a12"),
        ev.HealthPassed(1),
        ev.UpgradeCommitted("green", "1.5.0"),
        ev.ResultPublished(result),
        ev.EpisodeClosed("committed"),
    ]


def _payload_event() -> Any:
    """An event whose codec bytes are about 200 B (the append benchmarks' record size)."""
    import upgrade_core as ev

    return ev.HealthFailed(
        2,
        "probe http://127.0.0.1:8080/healthz answered 503 after 2.4 s; MainPID 48211 "
        "restarted (NRestarts 1 -> 2)",
    )


async def _durable_appends(journal_dir: Path) -> float:
    """Seconds per durable append of :func:`_payload_event` by one writer, best of 3 rounds of
    ``APPENDS`` (after 20 to warm up)."""
    from journal import JournalWriter
    from upgrade_core.codec import EVENT_CODEC

    event = _payload_event()
    async with await JournalWriter.open(journal_dir, EVENT_CODEC) as w:
        for _ in range(20):
            await w.append("0123456789abcdef", event)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(APPENDS):
                await w.append("0123456789abcdef", event)
            best = min(best, time.perf_counter() - start)
        return best / APPENDS


def append_durable() -> dict[str, Any]:
    """One writer, one durable append at a time vs ``os.write`` + ``os.fdatasync`` of the same bytes."""
    import anyio

    from journal import encode_records
    from upgrade_core.codec import EVENT_CODEC

    directory = _harness.disk_dir("append_durable")
    event = _payload_event()
    payload = EVENT_CODEC.encode(event)
    frame, _ = encode_records(1, [(b"0123456789abcdef", time.time(), payload)], prev_chain=0)

    async def ours() -> float:
        return await _durable_appends(directory / "journal")

    def baseline() -> float:
        fd = os.open(directory / "baseline.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(20):
                os.write(fd, frame)
                os.fdatasync(fd)
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(APPENDS):
                    os.write(fd, frame)
                    os.fdatasync(fd)
                best = min(best, time.perf_counter() - start)
            return best / APPENDS
        finally:
            os.close(fd)

    # Interleave to share the disk's mood; keep each side's best.
    b1 = baseline()
    o1 = anyio.run(ours, backend="asyncio")
    b2 = baseline()
    o2 = anyio.run(ours, backend="asyncio")
    trio_side = anyio.run(ours, backend="trio")
    return _harness.row(
        "journal.append_durable",
        min(o1, o2) * 1e6,
        "us/event",
        "os.write + os.fdatasync (pre-opened fd)",
        min(b1, b2) * 1e6,
        1.25,
        fs_type=_harness.fs_type(directory),
        frame_bytes=len(frame),
        encode_us=round(
            _harness.best_of(lambda: [EVENT_CODEC.encode(event) for _ in range(1000)], 3) * 1e3, 2
        ),
        trio_us=round(trio_side * 1e6, 1),
    )


class _NoJournal:
    """An append that only yields to the event loop: the writers' choreography without a journal."""

    async def append(self, episode_id: str, event: Any) -> None:
        import anyio.lowlevel

        await anyio.lowlevel.checkpoint()


async def _group_appends(journal_dir: Path, no_journal: bool = False) -> float:
    """Seconds per event with ``GROUP`` writer tasks appending at once, best of ``GROUP_ROUNDS`` rounds."""
    import anyio

    from journal import JournalWriter
    from upgrade_core.codec import EVENT_CODEC

    event = _payload_event()
    # 64 long-lived writer tasks, released together each round: the time is the journal's, not the
    # cost of spawning tasks. With no_journal the same choreography runs around a no-op append, to
    # show what waking and counting 64 tasks costs by itself.
    async with await JournalWriter.open(journal_dir, EVENT_CODEC) as real_writer:
        w: Any = _NoJournal() if no_journal else real_writer
        best = float("inf")
        state: dict[str, Any] = {}

        async def writer(i: int) -> None:
            for _ in range(GROUP_ROUNDS):
                await state["go"].wait()
                await w.append(f"writer-{i:02d}", event)
                state["left"] -= 1
                if state["left"] == 0:
                    state["done"].set()
                await state["next"].wait()

        async with anyio.create_task_group() as tg:
            state.update(go=anyio.Event(), next=anyio.Event(), done=anyio.Event(), left=GROUP)
            for i in range(GROUP):
                tg.start_soon(writer, i)
            for _ in range(GROUP_ROUNDS):
                await anyio.sleep(0.002)  # all writers parked on "go"
                start = time.perf_counter()
                state["go"].set()
                await state["done"].wait()
                best = min(best, time.perf_counter() - start)
                nxt = state["next"]
                state.update(go=anyio.Event(), next=anyio.Event(), done=anyio.Event(), left=GROUP)
                nxt.set()
        return best / GROUP


def append_group() -> dict[str, Any]:
    """64 concurrent writers vs the same 64 frames joined, one ``os.write`` + one ``os.fdatasync``."""
    import anyio

    from journal import encode_records
    from upgrade_core.codec import EVENT_CODEC

    directory = _harness.disk_dir("append_group")
    event = _payload_event()
    syncs = [0]
    real = os.fdatasync

    def counting(fd: int) -> None:
        syncs[0] += 1
        real(fd)

    async def ours(no_journal: bool = False) -> float:
        return await _group_appends(directory / "journal", no_journal)

    def baseline() -> float:
        entries = [
            (f"writer-{i:02d}".encode(), time.time(), EVENT_CODEC.encode(event)) for i in range(GROUP)
        ]
        data, _chain = encode_records(1, entries, prev_chain=0)
        fd = os.open(directory / "baseline.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            best = float("inf")
            for _ in range(GROUP_ROUNDS):
                start = time.perf_counter()
                os.write(fd, data)
                os.fdatasync(fd)
                best = min(best, time.perf_counter() - start)
            return best / GROUP
        finally:
            os.close(fd)

    base = baseline()
    os.fdatasync = counting  # type: ignore[assignment]  # counts, still syncs
    try:
        mine = anyio.run(ours, backend="asyncio")
    finally:
        os.fdatasync = real
    choreography = anyio.run(ours, True, backend="asyncio")
    return _harness.row(
        "journal.append_group",
        mine * 1e6,
        "us/event",
        "64 frames joined: one os.write + one os.fdatasync",
        base * 1e6,
        2.5,
        fs_type=_harness.fs_type(directory),
        fdatasyncs_per_64=round(syncs[0] / GROUP_ROUNDS, 2),
        task_choreography_us=round(choreography * 1e6, 2),
        encode_us=round(
            _harness.best_of(lambda: [EVENT_CODEC.encode(event) for _ in range(1000)], 3) * 1e3, 2
        ),
    )


def _replay_entries(events: int = REPLAY_EVENTS) -> list[tuple[bytes, float, bytes]]:
    """``events`` (episode id, wall time, codec bytes) of successive successful upgrades
    (:func:`_episode`)."""
    from upgrade_core.codec import EVENT_CODEC

    entries: list[tuple[bytes, float, bytes]] = []
    n = 0
    while n < events:
        op = f"{n:032x}"
        for event in _episode(op):
            if n == events:
                break
            entries.append((op.encode(), 1.7e9 + n + 1, EVENT_CODEC.encode(event)))
            n += 1
    return entries


def _write_segment(directory: Path, entries: list[tuple[bytes, float, bytes]]) -> int:
    """The live segment of ``entries``, built with the writer's own framing (identical bytes, without one
    fsync per record), written and fsynced in ``directory``; its size in bytes."""
    from journal import encode_records

    segment, _chain = encode_records(1, entries)
    with open(directory / f"{1:020d}.jnl", "wb") as f:
        f.write(segment)
        os.fsync(f.fileno())
    return len(segment)


def replay_100k() -> dict[str, Any]:
    """Replay + decode + fold of a 100k-event journal vs ``json.loads`` of the same payloads from memory."""
    from journal import replay
    from upgrade_core import fold
    from upgrade_core.codec import EVENT_CODEC

    directory = _harness.disk_dir("replay") / "journal"
    directory.mkdir()
    entries = _replay_entries()
    payloads = [data for _op, _ts, data in entries]
    size = _write_segment(directory, entries)
    del entries

    def ours() -> None:
        result = replay(directory, EVENT_CODEC)
        assert len(result.records) == REPLAY_EVENTS and result.torn_tail is None
        fold(result.records)

    records = replay(directory, EVENT_CODEC).records

    def fold_only() -> None:
        fold(records)

    def baseline() -> None:
        loads = json.loads
        for p in payloads:
            loads(p)

    def codec_only() -> None:
        decode = EVENT_CODEC.decode
        for p in payloads:
            decode(p)

    # Interleaved rounds, best of each: a busy machine slows all three alike within a round.
    base = mine = codec = folding = float("inf")
    for _ in range(5):
        base = min(base, _harness.best_of(baseline, 1) / REPLAY_EVENTS)
        mine = min(mine, _harness.best_of(ours, 1) / REPLAY_EVENTS)
        codec = min(codec, _harness.best_of(codec_only, 1) / REPLAY_EVENTS)
        folding = min(folding, _harness.best_of(fold_only, 1) / REPLAY_EVENTS)
    return _harness.row(
        "journal.replay",
        mine * 1e6,
        "us/event",
        "json.loads of the same payloads from memory",
        base * 1e6,
        3.0,
        fs_type=_harness.fs_type(directory),
        journal_bytes=size,
        codec_decode_us=round(codec * 1e6, 3),
        fold_us=round(folding * 1e6, 3),
        journal_only_us=round((mine - codec - folding) * 1e6, 3),
    )


# -- the same jobs done by SQLite (stdlib sqlite3, WAL, synchronous=FULL) ------------------------------------
SQLITE_SCHEMA = ("CREATE TABLE events (seq INTEGER PRIMARY KEY, episode TEXT NOT NULL, ts REAL NOT NULL, "
                 "payload BLOB)")


def _sqlite(path: Path) -> Any:
    """A fresh SQLite database at ``path`` set up as a durable event log: WAL journal, ``synchronous=FULL``
    (each commit fsyncs the WAL: SQLite's documented durable setting in WAL mode), autocommit off."""
    import sqlite3

    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(SQLITE_SCHEMA)
    return db


def _sqlite_commits(db: Any, events_per_commit: int, commits: int, rounds: int) -> float:
    """Seconds per event: the best of ``rounds`` rounds (after one to warm up) of ``commits`` transactions,
    each ``events_per_commit`` encoded :func:`_payload_event` INSERTs and a COMMIT."""
    from upgrade_core.codec import EVENT_CODEC

    event = _payload_event()
    best = float("inf")
    for round_ in range(rounds + 1):
        start = time.perf_counter()
        for _ in range(commits):
            db.execute("BEGIN")
            rows = [(f"writer-{i:02d}", time.time(), EVENT_CODEC.encode(event))
                    for i in range(events_per_commit)]
            db.executemany("INSERT INTO events (episode, ts, payload) VALUES (?, ?, ?)", rows)
            db.execute("COMMIT")
        if round_:
            best = min(best, time.perf_counter() - start)
    return best / (commits * events_per_commit)


def append_durable_sqlite() -> dict[str, Any]:
    """``journal.append_durable.sqlite``: one durable event per commit, ours (the journal writer, as in
    ``journal.append_durable``) against SQLite doing the same: encode, ``INSERT``, ``COMMIT``."""
    import anyio


    directory = _harness.disk_dir("append_durable_sqlite")
    db = _sqlite(directory / "events.db")

    def sqlite_side() -> float:
        return _sqlite_commits(db, 1, APPENDS, 3)

    try:
        base1 = sqlite_side()
        ours1 = anyio.run(_durable_appends, directory / "journal1", backend="asyncio")
        base2 = sqlite_side()
        ours2 = anyio.run(_durable_appends, directory / "journal2", backend="asyncio")
    finally:
        db.close()
    return _harness.row(
        "journal.append_durable.sqlite", min(ours1, ours2) * 1e6, "us/event",
        "sqlite3 (WAL, synchronous=FULL): encode + INSERT + COMMIT per event", min(base1, base2) * 1e6,
        SQLITE_TARGET, fs_type=_harness.fs_type(directory),
    )


def append_group_sqlite() -> dict[str, Any]:
    """``journal.append_group.sqlite``: 64 events made durable together, ours (64 concurrent writers, as in
    ``journal.append_group``) against SQLite committing the same 64 encoded events in one transaction."""
    import anyio


    directory = _harness.disk_dir("append_group_sqlite")
    db = _sqlite(directory / "events.db")

    def sqlite_side() -> float:
        return _sqlite_commits(db, GROUP, 1, GROUP_ROUNDS)

    try:
        base = sqlite_side()
        mine = anyio.run(_group_appends, directory / "journal", backend="asyncio")
        base = min(base, sqlite_side())
    finally:
        db.close()
    return _harness.row(
        "journal.append_group.sqlite", mine * 1e6, "us/event",
        "sqlite3 (WAL, synchronous=FULL): 64 encoded INSERTs in one transaction", base * 1e6, SQLITE_TARGET,
        fs_type=_harness.fs_type(directory),
    )


def replay_sqlite() -> dict[str, Any]:
    """``journal.replay.sqlite``: replay, decode and fold of 100,000 events, ours (as in ``journal.replay``)
    against SQLite reading the same events in order (``SELECT ... ORDER BY seq``) from a database on the
    same disk, decoding each with the same codec into the same records and folding them the same way."""
    from journal import Record, replay
    from upgrade_core import fold
    from upgrade_core.codec import EVENT_CODEC

    base_dir = _harness.disk_dir("replay_sqlite")
    directory = base_dir / "journal"
    directory.mkdir()
    entries = _replay_entries()
    size = _write_segment(directory, entries)
    db = _sqlite(base_dir / "events.db")
    db.execute("BEGIN")
    db.executemany("INSERT INTO events (episode, ts, payload) VALUES (?, ?, ?)",
                   [(op.decode(), ts, data) for op, ts, data in entries])
    db.execute("COMMIT")
    del entries

    def ours() -> None:
        result = replay(directory, EVENT_CODEC)
        assert len(result.records) == REPLAY_EVENTS and result.torn_tail is None
        fold(result.records)

    def sqlite_side() -> None:
        decode = EVENT_CODEC.decode
        rows = db.execute("SELECT seq, episode, ts, payload FROM events ORDER BY seq")
        records = [Record(seq, episode, ts, decode(payload)) for seq, episode, ts, payload in rows]
        assert len(records) == REPLAY_EVENTS
        fold(records)

    base = mine = float("inf")
    try:
        for _ in range(5):  # interleaved rounds, best of each
            base = min(base, _harness.best_of(sqlite_side, 1) / REPLAY_EVENTS)
            mine = min(mine, _harness.best_of(ours, 1) / REPLAY_EVENTS)
    finally:
        db.close()
    return _harness.row(
        "journal.replay.sqlite", mine * 1e6, "us/event",
        "sqlite3: SELECT in order + the same decode into records + the same fold", base * 1e6, SQLITE_TARGET,
        fs_type=_harness.fs_type(directory), journal_bytes=size,
        sqlite_bytes=(base_dir / "events.db").stat().st_size,
    )


BENCHMARKS: dict[str, Callable[[], dict[str, Any]]] = {
    "journal.append_durable": append_durable,
    "journal.append_group": append_group,
    "journal.replay": replay_100k,
    "journal.append_durable.sqlite": append_durable_sqlite,
    "journal.append_group.sqlite": append_group_sqlite,
    "journal.replay.sqlite": replay_sqlite,
}

"""Real journals for the CLI tests, written by :class:`journal.JournalWriter` with ``EVENT_CODEC``.

The episodes are the event sequences the orchestrator writes (design §4.1): a committed upgrade blue -> green
and an upgrade aborted before its switch. The wall clock is injected, so the expected RFC 3339 times of
``history`` and ``journal dump`` are known exactly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import attrs

from journal import JournalWriter
from upgrade_core import EVENT_CODEC, Event, UpgradeResult
from upgrade_core import _events as ev

OLD_SHA = "1" * 64
NEW_SHA = "2" * 64
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def committed_episode(op: str, agent: str) -> list[Event]:
    """A committed upgrade blue 1.0.0 -> green 2.0.0, every event of design §4.3 in order."""
    result = UpgradeResult(op, "committed", "1.0.0", "2.0.0", "green", None)
    return [
        ev.EpisodeOpened(
            operation=op,
            kind="upgrade",
            source="https://releases.example/a-2.0.0.tar.gz",
            expected_sha256=None,
            expected_version="2.0.0",
            from_slot="blue",
            from_version="1.0.0",
            max_health_attempts=2,
            stability_s=0.5,
            health_timeout_s=2.0,
        ),
        ev.ArchiveFetched(4096, "a" * 64),
        ev.CandidateStaged("green", NEW_SHA, 8192, f"/R/lib/{agent}/.{agent}-green.stage-0a1b"),
        ev.CandidateVerified("2.0.0"),
        ev.LastGoodRepointed("blue"),
        ev.CandidateInstalled("green", NEW_SHA),
        ev.SwitchIntended("green", "blue", "blue"),
        ev.SwitchCommitted("green"),
        ev.MirrorsSynced(()),
        ev.HealthAttemptStarted(1, "candidate"),
        ev.RestartRequested(f"{agent}-restart-{op[:8]}-1-00aa", 10.0),
        ev.RestartObserved(4242, "f" * 32),
        ev.HealthPassed(1, "candidate"),
        ev.UpgradeCommitted("green", "2.0.0"),
        ev.ResultPublished(result),
        ev.EpisodeClosed("committed"),
    ]


def aborted_episode(op: str, reason: str = "candidate reported version 9.9.9, expected 3.0.0") -> list[Event]:
    """An upgrade from green aborted at verification, before any switch."""
    result = UpgradeResult(op, "aborted", "2.0.0", None, "green", reason)
    return [
        ev.EpisodeOpened(
            operation=op,
            kind="upgrade",
            source="http://127.0.0.1:1/a-3.0.0.tar.gz",
            expected_sha256=None,
            expected_version="3.0.0",
            from_slot="green",
            from_version="2.0.0",
            max_health_attempts=2,
            stability_s=0.5,
            health_timeout_s=2.0,
        ),
        ev.Aborted(reason),
        ev.ResultPublished(result),
        ev.EpisodeClosed("aborted"),
    ]


@attrs.frozen
class Written:
    """A journal on disk: its one live segment, the segment's size after open and after each record
    (``ends[i]`` is where record ``i`` ends, ``ends[i - 1]`` where it starts), and each record's time."""

    segment: Path
    header_end: int
    ends: tuple[int, ...]
    times: tuple[float, ...]

    def record_span(self, index: int) -> tuple[int, int]:
        """(start, end) byte offsets of record ``index`` (0-based) in the segment."""
        start = self.header_end if index == 0 else self.ends[index - 1]
        return start, self.ends[index]


def _clock(start: float, step: float) -> Iterator[float]:
    t = start
    while True:
        yield t
        t += step


def write_journal(
    directory: Path, episodes: Sequence[tuple[str, Sequence[Event]]], start: float = T0, step: float = 60.0
) -> Written:
    """Append every event of ``episodes`` (``(operation, events)``) in order; each record ``step`` s later.

    Appends to an existing journal too; the offsets returned are those in its live segment.
    """
    ticks = _clock(start, step)
    times: list[float] = []

    def wall() -> float:
        times.append(next(ticks))
        return times[-1]

    async def write() -> Written:
        writer = await JournalWriter.open(directory, EVENT_CODEC, wall_clock=wall)
        # The live segment is the newest plain ``.jnl`` (sealed ones are compressed, design §5).
        segments = sorted(p for p in directory.iterdir() if p.name.endswith(".jnl"))[-1:]
        header_end = os.path.getsize(segments[0])
        ends = []
        try:
            for op, events in episodes:
                for event in events:
                    await writer.append(op, event)
                    ends.append(os.path.getsize(segments[0]))
        finally:
            await writer.aclose()
        return Written(segments[0], header_end, tuple(ends), tuple(times))

    return anyio.run(write)

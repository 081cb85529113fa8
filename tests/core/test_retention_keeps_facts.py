"""Whatever compaction drops, the facts later decisions read are the same (design §5, docs/trust.md).

Random runs of closed episodes (a signed or unsigned upgrade that commits, one whose candidate fails its
own health checks and is rolled back, an operator rollback to last-good, a trust reset) are appended to a
real journal directory through :class:`journal.JournalWriter`, which compacts after each episode as the
session does (``compact(keep_episodes, ...)`` with :func:`upgrade_core.summarize_history`), for every
``keep_episodes`` from 0 to 4. The replayed, folded journal must then tell exactly what a model of the run
says, whatever was dropped:

- the anti-rollback watermark: the highest security version committed since the latest trust reset;
- the known-bad releases: each digest rolled back for its own failure since the latest reset, unless a later
  commit of it cleared it (an upgrade's, or an operator rollback's to last-good bytes of that digest), with
  the operation that condemned it;
- each slot's version (``status``, and the next episode's from-version);
- the order of the episodes (``history``: summaries of dropped ones first, oldest first);
- each operation's status as published (a republished status keeps its ``journalSeq`` and ``bootID``).

Before snapshots kept those facts, a short retention lost the slot versions, the sequence numbers and boot
ids, and a later snapshot that carried an older one's summaries put them after its own (history out of
order).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio
import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import JournalWriter, replay
from upgrade_core import EVENT_CODEC, UpgradeResult, fold, operation_status, summarize_history
from upgrade_core import _events as ev
from upgrade_core._events import Event, Slot, other_slot

SHAS = ("1" * 64, "2" * 64, "3" * 64)
"""Few digests, so that a release rolled back once is offered (and committed) again."""


@attrs.define
class Model:
    """What the run did, kept the plain way: the expected facts."""

    current: Slot = "blue"
    last_good: Slot = "blue"
    versions: dict[Slot, str] = attrs.Factory(dict)  # what the journal recorded, nothing at first
    digests: dict[Slot, str] = attrs.Factory(lambda: {"blue": "0" * 64, "green": "0" * 64})
    watermark: int | None = None
    known_bad: dict[str, str] = attrs.Factory(dict)
    operations: list[str] = attrs.Factory(list)
    n: int = 0


def _opened(m: Model, op: str, kind: ev.EpisodeKind, source: str, expected: str | None) -> ev.EpisodeOpened:
    return ev.EpisodeOpened(op, kind, source, expected, None, m.current, m.versions.get(m.current), 3, 1.0,
                            3.0, boot_id=f"{m.n:032x}")


def _health(n: int, outcome: str, target: ev.HealthTarget = "candidate") -> list[Event]:
    done: Event = (ev.HealthPassed(n, target) if outcome == "pass" else ev.HealthFailed(n, outcome, target))
    return [ev.HealthAttemptStarted(n, target), done]


def _closing(result: UpgradeResult) -> list[Event]:
    return [ev.ResultPublished(result), ev.EpisodeClosed(result.result)]


def upgrade(m: Model, op: str, sha: str, sv: int | None, healthy: bool) -> list[Event]:
    """An upgrade to the other slot that commits (``healthy``) or is rolled back after 3 own failures."""
    cur, cand = m.current, other_slot(m.current)
    version = f"2.{m.n}"
    events: list[Event] = [
        _opened(m, op, "upgrade", "https://example.invalid/a.tar.gz", None), ev.ArchiveFetched(10, "a" * 64),
        ev.CandidateStaged(cand, sha, 100, f"/R/.stage-{cand}"), ev.CandidateVerified(version),
    ]
    if sv is not None:
        events.append(ev.ReleaseTrusted("0123456789ABCDEF", "agent", version, sv))
    events += [ev.LastGoodRepointed(cur), ev.CandidateInstalled(cand, sha), ev.SwitchIntended(cand, cur, cur),
               ev.SwitchCommitted(cand)]
    m.versions[cand], m.digests[cand], m.last_good = version, sha, cur
    if healthy:
        events += [*_health(1, "pass"), ev.UpgradeCommitted(cand, version)]
        events += _closing(UpgradeResult(op, "committed", m.versions.get(cur), version, cand))
        m.current = cand
        m.known_bad.pop(sha, None)
        if sv is not None:
            m.watermark = sv if m.watermark is None else max(m.watermark, sv)
        return events
    reason = "candidate unhealthy after 3 attempt(s): exited"
    events += [*_health(1, "exited"), *_health(2, "exited"), *_health(3, "exited"),
               ev.RollbackStarted(reason, cur), *_health(1, "pass", "last_good"), ev.RolledBack(cur)]
    events += _closing(UpgradeResult(op, "rolled_back", m.versions.get(cur), version, cur, reason))
    m.known_bad[sha] = op
    return events


def operator_rollback(m: Model, op: str) -> list[Event]:
    """``rollback``: current back to last-good's slot, healthy (both links name it afterwards)."""
    cur, lg = m.current, m.last_good
    lg_version = m.versions.get(lg, "1.0")  # its version command answers, journaled or not
    events: list[Event] = [
        _opened(m, op, "rollback", f"last-good {lg}", m.digests[lg]), ev.CandidateVerified(lg_version),
        ev.SwitchIntended(lg, cur, lg), ev.SwitchCommitted(lg), *_health(1, "pass"),
        ev.UpgradeCommitted(lg, lg_version),
        *_closing(UpgradeResult(op, "committed", m.versions.get(cur), lg_version, lg)),
    ]
    m.current, m.versions[lg] = lg, lg_version
    m.known_bad.pop(m.digests[lg], None)  # the bytes committed healthy: known-bad no more (docs/trust.md)
    return events


def trust_reset(m: Model, op: str) -> list[Event]:
    """``trust reset``: the watermark and every known-bad mark before it stop counting."""
    events: list[Event] = [
        _opened(m, op, "trust-reset", "trust reset", None),
        ev.TrustReset(m.watermark, tuple(sorted(m.known_bad))),
        *_closing(UpgradeResult(op, "noop", m.versions.get(m.current), m.versions.get(m.current), m.current,
                                "reset")),
    ]
    m.watermark = None
    m.known_bad.clear()
    return events


STEP = st.one_of(
    st.tuples(st.just("upgrade"), st.sampled_from(SHAS), st.none() | st.integers(0, 9), st.booleans()),
    st.tuples(st.just("rollback")),
    st.tuples(st.just("reset")),
)


def _episodes(m: Model, steps: list[tuple[Any, ...]]) -> list[tuple[str, list[Event]]]:
    out: list[tuple[str, list[Event]]] = []
    for step in steps:
        m.n += 1
        op = f"op{m.n:02d}"
        if step[0] == "upgrade":
            events = upgrade(m, op, step[1], step[2], step[3])
        elif step[0] == "rollback":
            if m.last_good == m.current:
                continue  # nothing to roll back to
            events = operator_rollback(m, op)
        else:
            events = trust_reset(m, op)
        m.operations.append(op)
        out.append((op, events))
    return out


async def _run(directory: Path, episodes: list[tuple[str, list[Event]]], keep: int) -> dict[str, int]:
    """Append each episode, compacting after each as the session does; returns the seq of each result."""
    published: dict[str, int] = {}
    closed: set[str] = set()
    writer = await JournalWriter.open(directory, EVENT_CODEC)
    try:
        for op, events in episodes:
            for event in events:
                record = await writer.append(op, event)
                if isinstance(event, ev.ResultPublished):
                    published[op] = record.seq
            closed.add(op)
            await writer.compact(keep, lambda e: e in closed, summarize_history)
    finally:
        await writer.aclose()
    return published


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=1, max_size=9), keep=st.integers(0, 4))
def test_compaction_keeps_every_fact_for_any_retention(steps: list[tuple[Any, ...]], keep: int) -> None:
    m = Model()
    episodes = _episodes(m, steps)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "journal"
        published = anyio.run(_run, directory, episodes, keep)
        view = fold(replay(directory, EVENT_CODEC).records)
    assert view.security_watermark == m.watermark
    assert {sha: bad.operation for sha, bad in view.known_bad.items()} == m.known_bad
    assert view.slot_versions == m.versions
    assert [s.operation for s in view.history] + list(view.episodes) == m.operations
    for op, events in episodes:
        status = operation_status(view, op)
        assert status is not None, op
        opened = events[0]
        assert isinstance(opened, ev.EpisodeOpened)
        assert (status.journal_seq, status.boot_id) == (published[op], opened.boot_id), op


def test_a_later_snapshot_that_carries_an_older_one_keeps_history_in_order() -> None:
    """The run the field saw with ``keep_episodes = 1``: an upgrade, an operator rollback, then more
    episodes; the snapshot that drops the segment holding the first snapshot carries op01's summary after
    op02's, and ``history`` must still list op01 (the upgrade) before op02 (the rollback) before op03."""
    m = Model()
    steps: list[tuple[Any, ...]] = [
        ("upgrade", SHAS[0], 3, True), ("rollback",), ("upgrade", SHAS[1], 4, True),
        ("upgrade", SHAS[2], None, True), ("upgrade", SHAS[0], None, True),
    ]
    episodes = _episodes(m, steps)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "journal"
        anyio.run(_run, directory, episodes, 1)
        records = replay(directory, EVENT_CODEC).records
    view = fold(records)
    assert sum(isinstance(r.event, ev.HistorySnapshot) for r in records) >= 2  # two snapshots in the mix
    order = [s.operation for s in view.history] + list(view.episodes)
    assert order == ["op01", "op02", "op03", "op04", "op05"]
    assert view.slot_versions == m.versions == {"blue": "2.4", "green": "2.5"}
    assert view.security_watermark == 4

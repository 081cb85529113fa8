"""Issue 12 items 3 and 4: the anti-rollback watermark and the known-bad memory, derived from the journal
(across compaction) and enforced by the orchestrator before the switch (simulated host)."""

from __future__ import annotations

import attrs
import pytest

from upgrade_core import EVENT_CODEC, UpgradeRequest, fold, run_upgrade, summarize_history
from upgrade_core import _events as ev

from ..sim.host import SIM_POLICY, Behavior, SimRecord, World, make_candidate
from ..sim.invariants import check_settled, events_by_episode
from .journals import (
    COMMITTED_RESULT,
    FULL_COMMIT,
    FULL_ROLLBACK,
    OPENED,
    ROLLED_BACK_RESULT,
    records,
)

GOOD = Behavior("good")


def trusted(version: str, security_version: int) -> ev.ReleaseTrusted:
    return ev.ReleaseTrusted("0123456789ABCDEF", "agent", version, security_version)


def signed(events: list[ev.Event], security_version: int) -> list[ev.Event]:
    """``events`` with a ``ReleaseTrusted`` right after ``CandidateVerified`` (where the flow writes it)."""
    at = next(i for i, e in enumerate(events) if isinstance(e, ev.CandidateVerified)) + 1
    return [*events[:at], trusted("2.0.0", security_version), *events[at:]]


# -- item 3: the watermark, derived ---------------------------------------------------------------------
def test_no_signed_commit_means_no_watermark() -> None:
    assert fold(records(FULL_COMMIT)).security_watermark is None
    assert fold(records(signed(FULL_ROLLBACK, 9))).security_watermark is None  # never committed


def test_a_committed_signed_release_sets_the_watermark_and_a_lower_one_never_lowers_it() -> None:
    first = records(signed(FULL_COMMIT, 5))
    assert fold(first).security_watermark == 5
    second = signed([attrs.evolve(OPENED, operation="op2"), *FULL_COMMIT[1:]], 3)
    assert fold(first + records(second, "op2", len(first) + 1)).security_watermark == 5


def test_the_watermark_is_set_at_the_commit_not_at_the_close() -> None:
    events = signed(FULL_COMMIT, 7)
    cut = next(i for i, e in enumerate(events) if isinstance(e, ev.UpgradeCommitted))
    assert fold(records(events[:cut])).security_watermark is None
    assert fold(records(events[: cut + 1])).security_watermark == 7


def test_the_watermark_survives_compaction() -> None:
    """The snapshot's summaries keep each signed episode's security version; only committed ones count."""
    commit = records(signed(FULL_COMMIT, 5))
    rollback_events = signed([attrs.evolve(OPENED, operation="op2"), *FULL_ROLLBACK[1:]], 8)
    recs = commit + records(rollback_events, "op2", len(commit) + 1)
    snapshot = summarize_history(recs)
    assert [s.security_version for s in snapshot.episodes] == [5, 8]
    decoded = EVENT_CODEC.decode(EVENT_CODEC.encode(snapshot))
    view = fold([SimRecord(len(recs), ev.SNAPSHOT_EPISODE, 0.0, decoded)])
    assert view.security_watermark == 5
    # a snapshot of a snapshot carries the summaries over
    again = summarize_history([SimRecord(1, ev.SNAPSHOT_EPISODE, 0.0, decoded)])
    assert fold([SimRecord(1, ev.SNAPSHOT_EPISODE, 0.0, again)]).security_watermark == 5


def test_an_old_snapshot_without_security_versions_still_decodes_and_keeps_its_bytes() -> None:
    summary = ev.EpisodeSummary("old", ROLLED_BACK_RESULT, 1.0, 2.0, "d" * 64)
    payload = EVENT_CODEC.encode(ev.HistorySnapshot((summary,)))
    assert b"security_version" not in payload  # written only when set: older readers are not broken
    assert EVENT_CODEC.decode(payload) == ev.HistorySnapshot((summary,))
    signed_summary = ev.EpisodeSummary("new", COMMITTED_RESULT, 1.0, 2.0, "e" * 64, 4)
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(ev.HistorySnapshot((signed_summary,)))).episodes == (
        signed_summary,
    )


# -- item 3: the refusal, on the simulated host ---------------------------------------------------------
def signed_world() -> World:
    w = World(SIM_POLICY)
    w.install_bare(make_candidate("base", GOOD))
    return w


def offer(w: World, label: str, security_version: int, behavior: Behavior = GOOD) -> str:
    """Serve a signed release ``label`` at ``https://h/<label>.tar.gz``; returns that source."""
    cand = make_candidate(label, behavior)
    cand = attrs.evolve(cand, release=trusted(cand.version, security_version))
    source = f"https://h/{label}.tar.gz"
    w.add_archive(source, cand)
    return source


def host_facts(w: World) -> tuple[object, ...]:
    return (w.current, w.last_good, dict(w.files), w.unit_sha, w.unit_slot, w.unit_pid_base, w.unit_inv_n)


@pytest.mark.anyio
async def test_a_signed_release_below_the_watermark_is_refused_before_the_switch() -> None:
    w = signed_world()
    high = await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("op1", offer(w, "v5", 5), "v5"))
    assert high.result == "committed"
    assert fold(w.replay()).security_watermark == 5
    before = host_facts(w)
    source = offer(w, "v3", 3)
    result = await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("op2", source, source))
    assert result.result == "aborted"
    assert result.reason == "security version 3 is below this host's watermark 5"
    assert host_facts(w) == before  # links, slots (staging discarded), unit untouched
    tags = [e.TAG for e in events_by_episode(w)["op2"]]
    assert "ReleaseTrusted" not in tags and "SwitchIntended" not in tags and "Aborted" in tags
    assert check_settled(w).security_watermark == 5


@pytest.mark.anyio
async def test_a_signed_release_at_the_watermark_is_accepted_and_a_higher_one_raises_it() -> None:
    w = signed_world()
    for op, label, level in [("op1", "a", 5), ("op2", "b", 5), ("op3", "c", 6)]:
        source = offer(w, label, level)
        result = await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest(op, source, source))
        assert result.result == "committed"
    assert check_settled(w).security_watermark == 6

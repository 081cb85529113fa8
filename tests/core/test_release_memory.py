"""The anti-rollback watermark and the known-bad memory, derived from the journal
(across compaction) and enforced by the orchestrator before the switch (simulated host)."""

from __future__ import annotations

import attrs
import pytest

from upgrade_core import (
    EVENT_CODEC,
    UpgradeRequest,
    UpgradeResult,
    fold,
    run_rollback,
    run_upgrade,
    summarize_history,
)
from upgrade_core import _events as ev

from ..sim.host import SIM_POLICY, Behavior, SimRecord, World, make_candidate
from ..sim.invariants import check_settled, events_by_episode
from .journals import (
    CAND_SHA,
    COMMITTED_RESULT,
    FULL_COMMIT,
    FULL_ROLLBACK,
    OP,
    OPENED,
    PRE_SWITCH,
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


# -- the anti-rollback watermark, derived ---------------------------------------------------------------
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


def test_the_signed_level_of_each_digest_survives_compaction() -> None:
    """An operator rollback looks last-good's level up by digest: compaction must not turn a known level
    into an unknown one (which would demand ``--below-watermark`` for a rollback at the watermark)."""
    recs = records(signed(FULL_COMMIT, 5))
    assert fold(recs).signed_security_versions == {CAND_SHA: 5}
    decoded = EVENT_CODEC.decode(EVENT_CODEC.encode(summarize_history(recs)))
    assert fold([SimRecord(len(recs), ev.SNAPSHOT_EPISODE, 0.0, decoded)]).signed_security_versions == {
        CAND_SHA: 5
    }
    assert fold(records(FULL_COMMIT)).signed_security_versions == {}  # unsigned: no level known


def test_an_old_snapshot_without_security_versions_still_decodes_and_keeps_its_bytes() -> None:
    summary = ev.EpisodeSummary("old", ROLLED_BACK_RESULT, 1.0, 2.0, "d" * 64)
    payload = EVENT_CODEC.encode(ev.HistorySnapshot((summary,)))
    assert b"security_version" not in payload  # written only when set: older readers are not broken
    assert EVENT_CODEC.decode(payload) == ev.HistorySnapshot((summary,))
    signed_summary = ev.EpisodeSummary("new", COMMITTED_RESULT, 1.0, 2.0, "e" * 64, 4)
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(ev.HistorySnapshot((signed_summary,)))).episodes == (
        signed_summary,
    )


# -- the watermark's refusal, on the simulated host -----------------------------------------------------
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


@pytest.mark.anyio
async def test_an_unsigned_release_is_refused_on_a_host_with_a_watermark() -> None:
    """Stripping a release's signature must not get it past the watermark: an unsigned release carries no
    security version, so a host that has a watermark refuses it before the switch."""
    w = signed_world()
    unsigned = "https://h/unsigned.tar.gz"
    w.add_archive(unsigned, make_candidate("unsigned", GOOD))
    high = await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("op1", offer(w, "v5", 5), "v5"))
    assert high.result == "committed"
    before = host_facts(w)
    result = await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("op2", unsigned, unsigned))
    assert (result.result, result.reason) == (
        "aborted",
        "release is unsigned and this host's watermark is 5: only signed releases are accepted "
        "(upgrade-agent trust reset clears the watermark)",
    )
    assert host_facts(w) == before
    assert "SwitchIntended" not in [e.TAG for e in events_by_episode(w)["op2"]]
    assert check_settled(w).security_watermark == 5


async def two_signed_levels(low: int, high: int) -> World:
    """``low`` committed on green, then ``high`` on blue: current blue, last-good green."""
    w = signed_world()
    for op, label, level in [("op1", "low", low), ("op2", "high", high)]:
        result = await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest(op, offer(w, label, level), label))
        assert result.result == "committed"
    assert (w.current, w.last_good) == ("blue", "green")
    return w


@pytest.mark.anyio
async def test_a_rollback_below_the_watermark_is_refused_unless_below_watermark() -> None:
    w = await two_signed_levels(3, 5)
    assert fold(w.replay()).signed_security_versions == {w.slot_sha("green"): 3, w.slot_sha("blue"): 5}
    before = host_facts(w)
    refused = await run_rollback(w.ports(), SIM_POLICY, "rb1")
    assert (refused.result, refused.reason) == (
        "aborted",
        "last-good green has security version 3, below this host's watermark 5; --below-watermark to roll "
        "back anyway, or upgrade-agent trust reset clears the watermark",
    )
    assert host_facts(w) == before
    assert [e.TAG for e in events_by_episode(w)["rb1"]] == [
        "EpisodeOpened", "Aborted", "ResultPublished", "EpisodeClosed",
    ]
    done = await run_rollback(w.ports(), SIM_POLICY, "rb2", below_watermark=True)
    assert (done.result, w.current) == ("committed", "green")
    opened = events_by_episode(w)["rb2"][0]
    assert isinstance(opened, ev.EpisodeOpened) and opened.below_watermark is True
    view = check_settled(w)
    assert view.episodes["rb2"].below_watermark and not view.episodes["rb1"].below_watermark
    assert view.security_watermark == 5  # a rollback never lowers it
    decoded = EVENT_CODEC.decode(EVENT_CODEC.encode(opened))
    assert decoded == opened
    assert b"below_watermark" not in EVENT_CODEC.encode(events_by_episode(w)["rb1"][0])  # old bytes kept


@pytest.mark.anyio
async def test_a_rollback_to_a_last_good_of_unknown_level_needs_the_override_too() -> None:
    """The base release was installed unsigned: the journal knows no security version for it."""
    w = signed_world()
    high = await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("op1", offer(w, "v5", 5), "v5"))
    assert high.result == "committed"
    before = host_facts(w)
    refused = await run_rollback(w.ports(), SIM_POLICY, "rb1")
    assert refused.reason == (
        "last-good blue has no known security version and this host's watermark is 5; --below-watermark to "
        "roll back anyway, or upgrade-agent trust reset clears the watermark"
    )
    assert host_facts(w) == before


@pytest.mark.anyio
async def test_a_rollback_at_the_watermark_needs_no_override() -> None:
    """Nor is an override that overrode nothing journaled as one."""
    w = await two_signed_levels(5, 5)
    assert (await run_rollback(w.ports(), SIM_POLICY, "rb1", below_watermark=True)).result == "committed"
    assert not check_settled(w).episodes["rb1"].below_watermark


# -- the known-bad memory, derived ------------------------------------------------------------------------
def environment_only(events: list[ev.Event]) -> list[ev.Event]:
    """``events`` with every ``HealthFailed`` blamed on the environment."""
    return [attrs.evolve(e, cause="environment") if isinstance(e, ev.HealthFailed) else e for e in events]


def test_a_rolled_back_candidate_is_known_bad_with_its_operation() -> None:
    view = fold(records(FULL_ROLLBACK))
    assert {sha: bad.operation for sha, bad in view.known_bad.items()} == {CAND_SHA: "op1"}
    assert view.known_bad[CAND_SHA].refusal(CAND_SHA) == (
        f"release {CAND_SHA[:12]} was rolled back by operation op1; --retry-known-bad to try it again"
    )


def test_environment_health_failures_only_do_not_condemn() -> None:
    """Every candidate failure was the environment's (probe could not connect, interrupted attempts)."""
    view = fold(records(environment_only(FULL_ROLLBACK)))
    assert view.known_bad == {} and view.episodes["op1"].condemns_candidate is False
    assert view.failed_digests == {CAND_SHA}  # the rollback itself still happened


def test_a_verification_failure_condemns_other_aborts_do_not() -> None:
    pre = PRE_SWITCH[:3]  # opened, fetched, staged
    aborted_by = {
        "verification": ev.Aborted("version command exited 1", "verification"),
        None: ev.Aborted("fetch: connection reset"),
    }
    for cause, event in aborted_by.items():
        result = UpgradeResult(OP, "aborted", "1.0.0", None, "blue", event.reason)
        view = fold(records([*pre, event, ev.ResultPublished(result), ev.EpisodeClosed("aborted")]))
        assert (CAND_SHA in view.known_bad) is (cause == "verification")


def test_a_later_commit_of_the_same_digest_clears_it() -> None:
    first = records(FULL_ROLLBACK)
    again = records([attrs.evolve(OPENED, operation="op2"), *FULL_COMMIT[1:]], "op2", len(first) + 1)
    assert fold(first + again).known_bad == {}


def test_known_bad_survives_compaction_and_old_snapshots_keep_what_failed_digests_kept() -> None:
    snapshot = summarize_history(records(FULL_ROLLBACK))
    assert [s.known_bad for s in snapshot.episodes] == [True]
    decoded = EVENT_CODEC.decode(EVENT_CODEC.encode(snapshot))
    assert set(fold([SimRecord(1, ev.SNAPSHOT_EPISODE, 0.0, decoded)]).known_bad) == {CAND_SHA}
    old = ev.HistorySnapshot((ev.EpisodeSummary("old", ROLLED_BACK_RESULT, 1.0, 2.0, "d" * 64),))
    old_bad = fold([SimRecord(1, ev.SNAPSHOT_EPISODE, 0.0, old)]).known_bad
    assert {k: v.operation for k, v in old_bad.items()} == {"d" * 64: "old"}
    not_bad = summarize_history(records(environment_only(FULL_ROLLBACK)))
    assert [s.known_bad for s in not_bad.episodes] == [False]
    assert fold([SimRecord(1, ev.SNAPSHOT_EPISODE, 0.0, not_bad)]).known_bad == {}


# -- the known-bad memory, on the simulated host -----------------------------------------------------------
def bad_world(behavior: Behavior) -> tuple[World, str]:
    w = World(SIM_POLICY)
    w.install_bare(make_candidate("base", GOOD))
    source = "https://h/bad.tar.gz"
    w.add_archive(source, make_candidate("bad", behavior))
    return w, source


async def upgrade(w: World, op: str, source: str, *, retry: bool = False) -> UpgradeResult:
    return await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest(op, source, source, retry_known_bad=retry))


@pytest.mark.anyio
async def test_a_release_that_rolled_back_is_refused_then_accepted_with_retry_known_bad() -> None:
    w, source = bad_world(Behavior("exit", 0.3))
    assert (await upgrade(w, "op1", source)).result == "rolled_back"
    sha = w.archives[source].sha256
    before = host_facts(w)
    refused = await upgrade(w, "op2", source)
    assert refused.result == "aborted"
    assert refused.reason == (
        f"release {sha[:12]} was rolled back by operation op1; --retry-known-bad to try it again"
    )
    assert host_facts(w) == before
    tags = [e.TAG for e in events_by_episode(w)["op2"]]
    assert "CandidateStaged" in tags and "CandidateVerified" not in tags and "SwitchIntended" not in tags
    assert {k: v.operation for k, v in check_settled(w).known_bad.items()} == {sha: "op1"}  # not op2
    # The operator fixed what made it fail and retries: checked again, it commits and is known-bad no more.
    w.by_sha[sha] = attrs.evolve(w.by_sha[sha], behavior=GOOD)
    w.archives[source] = w.by_sha[sha]
    retried = await upgrade(w, "op3", source, retry=True)
    assert retried.result == "committed"
    assert check_settled(w).known_bad == {}


@pytest.mark.anyio
async def test_a_retried_release_that_fails_again_is_condemned_by_the_new_operation() -> None:
    w, source = bad_world(Behavior("exit", 0.3))
    assert (await upgrade(w, "op1", source)).result == "rolled_back"
    assert (await upgrade(w, "op2", source, retry=True)).result == "rolled_back"
    assert [bad.operation for bad in check_settled(w).known_bad.values()] == ["op2"]


@pytest.mark.anyio
async def test_a_release_whose_version_command_failed_is_refused_when_offered_again() -> None:
    w, source = bad_world(Behavior("verify_fail"))
    assert (await upgrade(w, "op1", source)).result == "aborted"
    refused = await upgrade(w, "op2", source)
    assert refused.reason is not None and "failed its verification in operation op1" in refused.reason
    assert (await upgrade(w, "op3", source, retry=True)).reason != refused.reason  # verified again


@pytest.mark.anyio
@pytest.mark.parametrize("behavior", [Behavior("verify_hang"), Behavior("unreachable")],
                         ids=["verify-timeout", "probe-cannot-connect"])
async def test_environment_failures_never_mark_a_release(behavior: Behavior) -> None:
    w, source = bad_world(behavior)
    first = await upgrade(w, "op1", source)
    assert first.result in ("aborted", "rolled_back")
    assert check_settled(w).known_bad == {}
    again = await upgrade(w, "op2", source)  # offered again: checked again, not refused
    assert again.result == first.result and "known-bad" not in (again.reason or "")


@pytest.mark.anyio
async def test_a_download_failure_never_marks_a_release() -> None:
    w, source = bad_world(GOOD)
    cand = w.archives.pop(source)
    assert (await upgrade(w, "op1", source)).result == "aborted"  # FetchError: no such archive
    assert check_settled(w).known_bad == {}
    w.add_archive(source, cand)
    assert (await upgrade(w, "op2", source)).result == "committed"

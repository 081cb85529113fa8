"""What the fold records from each event, and what it remembers across episodes and compaction.

The orchestrator and recovery read these facts from :class:`EpisodeView` instead of the host: whether the
mirrors were synced (a resumed episode syncs them again otherwise), the restart request's monotonic time (a
resumed attempt without a restart judges by it), the last-good slot, the version a commit recorded, why an
abort happened. Known-bad memory (docs/trust.md) and failed digests are kept per digest across episodes and
across ``HistorySnapshot`` records, so the order of summaries matters too.
"""

from __future__ import annotations

import attrs
import pytest

from upgrade_core import EpisodeContext, Folder, JournalView, UpgradeResult, fold
from upgrade_core import _events as ev
from upgrade_core._events import Event
from upgrade_core._fold import KnownBad
from upgrade_core.errors import IllegalTransitionError

from ..sim.host import SimRecord
from .journals import (
    CAND_SHA,
    COMMITTED,
    COMMITTED_RESULT,
    FULL_COMMIT,
    HEALTHY,
    LG_SHA,
    OPENED,
    PRE_SWITCH,
    RB_INTENDED,
    RB_VERIFIED,
    ROLLING_BACK,
    SWITCH_INTENDED,
    attempt,
    records,
)

OTHER_SHA = "e" * 64
INSTALL_OPENED = ev.EpisodeOpened("op1", "install", "file:///a", None, None, None, None, 2, 1.0, 3.0)
INSTALL_SWITCHED: list[Event] = [
    INSTALL_OPENED, ev.ArchiveFetched(1, "a" * 64), ev.CandidateStaged("blue", CAND_SHA, 1, "/s"),
    ev.CandidateVerified("2.0.0"), ev.CandidateInstalled("blue", CAND_SHA),
    ev.SwitchIntended("blue", None, None), ev.SwitchCommitted("blue"),
]


def test_each_fact_of_a_switched_episode_is_the_one_its_events_recorded() -> None:
    events = [
        *SWITCH_INTENDED, ev.SwitchCommitted("green"), ev.MirrorsSynced(("/usr/local/bin/agent",)),
        ev.HealthAttemptStarted(1), ev.RestartRequested("agent-restart-op1-1-0001", 812.5),
        ev.RestartObserved(4242, "f" * 32),
    ]
    ep = fold(records(events)).episodes["op1"]
    assert ep.switch_intended and ep.switch_landed
    assert (ep.candidate_slot, ep.candidate_sha256, ep.candidate_size) == ("green", CAND_SHA, 1000)
    assert ep.staging_path is None  # renamed onto the slot by CandidateInstalled
    assert (ep.mirrors_synced, ep.mirrors) == (True, ("/usr/local/bin/agent",))
    assert (ep.restart_unit, ep.restart_requested_monotonic) == ("agent-restart-op1-1-0001", 812.5)
    assert (ep.observed_pid, ep.observed_invocation) == (4242, "f" * 32)
    assert ep.last_good_slot == "blue"


def test_what_the_fetch_and_the_staging_recorded_until_the_install() -> None:
    ep = fold(records(PRE_SWITCH[:4])).episodes["op1"]
    assert (ep.archive_size, ep.archive_sha256) == (500, "a" * 64)
    assert (ep.staging_path, ep.installed) == ("/R/lib/agent/.agent-green.stage-01", False)
    installed = fold(records(PRE_SWITCH)).episodes["op1"]
    assert (installed.staging_path, installed.installed) == (None, True)


def test_each_recovery_that_took_the_episode_over_is_counted() -> None:
    recovered = [*PRE_SWITCH, ev.RecoveryStarted("boot"), ev.RecoveryStarted("manual")]
    assert [fold(records(recovered[:n])).episodes["op1"].recoveries for n in (6, 7, 8)] == [0, 1, 2]


def test_the_context_the_rules_see_follows_the_episodes_facts() -> None:
    """What :func:`next_state` is given for the next event of an episode, after each fact it needs."""
    events = [*SWITCH_INTENDED, ev.SwitchCommitted("green"), *attempt(1, "x"), *attempt(2, None)]
    folder = Folder()
    expected = {
        1: EpisodeContext("op1", "upgrade"),
        3: EpisodeContext("op1", "upgrade", "green", CAND_SHA),
        4: EpisodeContext("op1", "upgrade", "green", CAND_SHA, verified_version="2.0.0"),
        6: EpisodeContext("op1", "upgrade", "green", CAND_SHA, True, verified_version="2.0.0"),
        len(events): EpisodeContext("op1", "upgrade", "green", CAND_SHA, True, 2, verified_version="2.0.0"),
    }
    for n, record in enumerate(records(events), 1):
        folder.apply(record)
        if n in expected:
            assert folder.context_of("op1") == expected[n], n
    published = [*COMMITTED, ev.ResultPublished(COMMITTED_RESULT)]
    folder = Folder()
    folder.apply_all(records(published))
    assert folder.context_of("op1") == EpisodeContext(
        "op1", "upgrade", "green", CAND_SHA, True, 1, 0, "committed", None, False, "2.0.0", False)


def test_a_release_is_trusted_once_and_before_its_install_by_what_the_episode_already_did() -> None:
    """The same event in the same state is legal or not by the episode's history (docs/trust.md)."""
    trusted = ev.ReleaseTrusted("0123456789ABCDEF", "agent", "2.0.0", 3)
    once = [*PRE_SWITCH[:4], trusted]
    folder = Folder()
    folder.apply_all(records(once))
    assert folder.context_of("op1").release_trusted and folder.episode("op1").release == trusted
    with pytest.raises(IllegalTransitionError, match=r"ReleaseTrusted twice in one episode$"):
        fold(records([*once, trusted]))
    with pytest.raises(IllegalTransitionError, match=r"ReleaseTrusted after the candidate was installed$"):
        fold(records([*PRE_SWITCH, trusted]))


def test_before_the_mirrors_sync_the_view_says_they_were_not() -> None:
    ep = fold(records([*SWITCH_INTENDED, ev.SwitchCommitted("green")])).episodes["op1"]
    assert (ep.mirrors_synced, ep.mirrors) == (False, ())
    before = fold(records(PRE_SWITCH)).episodes["op1"]
    assert (before.switch_intended, before.switch_landed) == (False, False)


def test_last_good_is_the_episodes_own_repoint_and_the_switch_record_only_fills_a_gap() -> None:
    repointed = [*PRE_SWITCH[:4], ev.LastGoodRepointed("green"), PRE_SWITCH[5],
                 ev.SwitchIntended("green", "blue", "blue")]
    assert fold(records(repointed)).episodes["op1"].last_good_slot == "green"
    not_repointed = [*PRE_SWITCH[:4], PRE_SWITCH[5], ev.SwitchIntended("green", "blue", "blue")]
    assert fold(records(not_repointed)).episodes["op1"].last_good_slot == "blue"


def test_the_staging_file_is_forgotten_once_the_candidate_is_unchanged() -> None:
    staged = fold(records(PRE_SWITCH[:3])).episodes["op1"]
    assert staged.staging_path == "/R/lib/agent/.agent-green.stage-01"
    ep = fold(records([*PRE_SWITCH[:3], ev.CandidateUnchanged("blue", "1.0.0")])).episodes["op1"]
    assert ep.staging_path is None and ep.unchanged_version == "1.0.0"


def test_an_install_records_last_good_when_it_points_it_after_the_switch() -> None:
    ep = fold(records([*INSTALL_SWITCHED, ev.LastGoodRepointed("blue")])).episodes["op1"]
    assert ep.last_good_slot == "blue"
    assert fold(records(INSTALL_SWITCHED)).episodes["op1"].last_good_slot is None


def test_an_operator_rollback_knows_the_version_of_the_slot_it_switches_to() -> None:
    """A ``rollback``'s candidate is last-good's slot: its version is the one CandidateVerified just read."""
    view = fold(records(RB_INTENDED))
    ep = view.episodes["op1"]
    assert (ep.candidate_slot, ep.candidate_sha256, ep.candidate_version) == ("green", LG_SHA, "1.0.0")
    assert view.slot_versions == {"green": "1.0.0"}
    assert fold(records(RB_VERIFIED)).slot_versions == {}


def test_a_quarantine_records_what_the_host_showed() -> None:
    """design §10: a new journal's first episode says which slot holds which version and what last-good
    names."""
    opened = ev.EpisodeOpened("quarantine-1", "quarantine", "/q/journal", None, None, "blue", "2.0.0", 3, 1.0,
                              3.0)
    facts = ev.JournalQuarantined("/q/journal", "blue", CAND_SHA, "2.0.0", "green", OTHER_SHA, "1.0.0")
    view = fold(records([opened, facts], "quarantine-1"))
    ep = view.episodes["quarantine-1"]
    assert view.slot_versions == {"blue": "2.0.0", "green": "1.0.0"}
    assert (ep.unchanged_version, ep.last_good_slot) == ("2.0.0", "green")
    assert ep.terminal_result == UpgradeResult("quarantine-1", "noop", "2.0.0", "2.0.0", "blue", None)


def test_a_commit_publishes_the_version_the_commit_recorded() -> None:
    events = [*HEALTHY, ev.UpgradeCommitted("green", "2.0.0+build.7")]
    ep = fold(records(events)).episodes["op1"]
    assert ep.committed_version == "2.0.0+build.7"
    assert ep.terminal_result == UpgradeResult("op1", "committed", "1.0.0", "2.0.0+build.7", "green", None)
    # without a recorded version the candidate's own is published
    unversioned = fold(records([*HEALTHY, ev.UpgradeCommitted("green", None)])).episodes["op1"]
    assert unversioned.terminal_result == fold(records(COMMITTED)).episodes["op1"].terminal_result


def test_last_good_health_failures_are_counted_apart_from_the_candidates() -> None:
    events = [*ROLLING_BACK, *attempt(1, "unit failed", "last_good"), *attempt(2, None, "last_good")]
    ep = fold(records(events)).episodes["op1"]
    assert (ep.attempts_started, ep.attempts_failed) == (3, 3)
    assert (ep.rollback_attempts_started, ep.rollback_attempts_failed) == (2, 1)
    assert ep.health_failure == "start-limit-hit"  # the candidate's latest reason, not the last-good's


# -- known-bad memory from this journal's episodes ---------------------------------------------------------
def test_a_verification_abort_is_remembered_as_such() -> None:
    events = [*PRE_SWITCH[:3], ev.Aborted("version command exited 1", "verification")]
    view = fold(records(events))
    assert view.episodes["op1"].abort_cause == "verification"
    assert view.episodes["op1"].condemns_candidate
    assert view.known_bad == {CAND_SHA: KnownBad("op1", "verification")}
    assert view.known_bad[CAND_SHA].refusal(CAND_SHA) == (
        f"release {CAND_SHA[:12]} failed its verification in operation op1; "
        "--retry-known-bad to try it again")


@pytest.mark.parametrize(("cause", "condemned"), [(None, True), ("environment", False)])
def test_an_install_aborted_after_its_own_health_failures_is_known_bad(
    cause: str | None, condemned: bool
) -> None:
    """An install has nothing to roll back to; its candidate is condemned only for its own failures."""
    failed = [*attempt(1, "unit failed"), *attempt(2, "unit failed")]
    failed = [attrs.evolve(e, cause=cause) if isinstance(e, ev.HealthFailed) else e for e in failed]
    view = fold(records([*INSTALL_SWITCHED, *failed, ev.Aborted("candidate unhealthy")]))
    assert view.episodes["op1"].abort_cause is None
    assert view.known_bad == ({CAND_SHA: KnownBad("op1", "health")} if condemned else {})
    assert view.episodes["op1"].condemns_candidate is condemned


@pytest.mark.parametrize(("cause", "condemned"), [(None, True), ("environment", False)])
def test_a_rollback_that_needed_attention_condemns_the_candidate_for_its_own_failures(
    cause: str | None, condemned: bool
) -> None:
    events = [attrs.evolve(e, cause=cause) if isinstance(e, ev.HealthFailed) else e for e in ROLLING_BACK]
    last_good = attempt(1, "MainPID changed", "last_good")
    view = fold(records([*events, *last_good, ev.AttentionNeeded("both bad")]))
    assert view.failed_digests == {CAND_SHA}
    assert view.known_bad == ({CAND_SHA: KnownBad("op1", "health")} if condemned else {})


# -- known-bad memory from compaction summaries ------------------------------------------------------------
def summary(op: str, result: str, sha: str | None, known_bad: bool | None, security: int | None = None) -> (
        ev.EpisodeSummary):
    return ev.EpisodeSummary(op, UpgradeResult(op, result, "1.0.0", "2.0.0", "blue", None), 1.0, 2.0, sha,  # type: ignore[arg-type]
                             security, known_bad)


def fold_snapshot(*summaries: ev.EpisodeSummary) -> JournalView:
    return fold([SimRecord(1, ev.SNAPSHOT_EPISODE, 0.0, ev.HistorySnapshot(summaries))])


def test_a_summary_without_a_digest_does_not_hide_the_ones_after_it() -> None:
    view = fold_snapshot(summary("a", "aborted", None, False), summary("b", "rolled_back", CAND_SHA, True))
    assert view.known_bad == {CAND_SHA: KnownBad("b", "health")}
    assert view.failed_digests == {CAND_SHA}


@pytest.mark.parametrize(
    ("result", "failed"),
    [("rolled_back", "health"), ("needs_attention", "health"), ("aborted", "verification")],
)
def test_a_condemning_summary_keeps_why(result: str, failed: str) -> None:
    view = fold_snapshot(summary("a", result, CAND_SHA, True))
    assert view.known_bad == {CAND_SHA: KnownBad("a", failed)}  # type: ignore[arg-type]


@pytest.mark.parametrize("result", ["rolled_back", "needs_attention"])
def test_an_old_summary_without_the_known_bad_flag_condemns_what_failed_digests_kept(result: str) -> None:
    view = fold_snapshot(summary("a", result, CAND_SHA, None))
    assert view.failed_digests == {CAND_SHA}
    assert view.known_bad == {CAND_SHA: KnownBad("a", "health")}


def test_only_a_later_committed_summary_clears_a_condemned_digest() -> None:
    condemned = summary("a", "rolled_back", CAND_SHA, True)
    cleared = fold_snapshot(condemned, summary("b", "committed", CAND_SHA, False))
    assert cleared.known_bad == {}
    other_committed = summary("c", "committed", OTHER_SHA, False)
    kept = fold_snapshot(condemned, summary("b", "aborted", CAND_SHA, False), other_committed)
    assert kept.known_bad == {CAND_SHA: KnownBad("a", "health")}


def test_the_security_watermark_is_the_highest_committed_one() -> None:
    view = fold_snapshot(
        summary("a", "committed", CAND_SHA, False, 5), summary("b", "committed", OTHER_SHA, False, 5),
        summary("c", "rolled_back", "f" * 64, True, 9), summary("d", "committed", None, None, 3),
    )
    assert view.security_watermark == 5


# -- rules that depend on the journal's history, not only on the episode's state --------------------------
def test_an_episode_id_is_never_opened_again_not_even_after_compaction() -> None:
    again = records([OPENED], start=len(FULL_COMMIT) + 1)
    with pytest.raises(IllegalTransitionError) as info:
        fold([*records(FULL_COMMIT), *again])
    assert (info.value.state, info.value.seq) == ("closed", len(FULL_COMMIT) + 1)  # still in the journal
    summary_of_op1 = ev.EpisodeSummary("op1", COMMITTED_RESULT, 1.0, 2.0, CAND_SHA)
    compacted = [SimRecord(7, ev.SNAPSHOT_EPISODE, 0.0, ev.HistorySnapshot((summary_of_op1,)))]
    with pytest.raises(IllegalTransitionError) as info:  # compacted away: only its summary remembers it
        fold([*compacted, *records([OPENED], start=8)])
    assert (info.value.state, info.value.seq, info.value.reason) == (
        "new", 8, "episode 'op1' opened again after closing")
    folder = Folder()
    folder.apply_all(compacted)
    assert folder.context_of("op1") == EpisodeContext("op1", closed_before=True)
    assert folder.context_of("op2") == EpisodeContext("op2")


def test_an_event_for_an_episode_never_opened_is_refused_naming_its_record() -> None:
    with pytest.raises(IllegalTransitionError) as info:
        fold([*records(PRE_SWITCH[:2]), *records([ev.ArchiveFetched(1, "a" * 64)], "op9", start=3)])
    assert (info.value.state, info.value.seq) == ("new", 3)
    assert info.value.reason == "ArchiveFetched for unknown episode 'op9'"


def test_an_order_the_table_forbids_has_no_rule_to_name() -> None:
    """A transition missing from the table is refused as such: the error carries no rule beyond it."""
    with pytest.raises(IllegalTransitionError) as info:
        fold(records([OPENED, ev.SwitchCommitted("green")]))
    assert (info.value.state, info.value.event, info.value.seq, info.value.reason) == (
        "opened", "SwitchCommitted", 2, None)


def test_each_episode_knows_its_first_and_latest_record() -> None:
    second = attrs.evolve(OPENED, operation="op2")
    view = fold([*records(FULL_COMMIT), *records([second, ev.ArchiveFetched(1, "a" * 64)], "op2",
                                                  start=len(FULL_COMMIT) + 1)])
    first, latest = view.episodes["op1"], view.episodes["op2"]
    assert (first.opened_seq, first.last_seq) == (1, len(FULL_COMMIT))
    assert (latest.opened_seq, latest.last_seq) == (len(FULL_COMMIT) + 1, len(FULL_COMMIT) + 2)

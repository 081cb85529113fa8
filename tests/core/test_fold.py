"""fold(records) -> JournalView: facts, derived properties, and typed errors for illegal histories."""

from __future__ import annotations

import pytest

from upgrade_core import EpisodeState, Folder, UpgradeResult, fold
from upgrade_core import _events as ev
from upgrade_core._events import Event
from upgrade_core.errors import HistoryError, IllegalTransitionError

from ..sim.host import SimRecord
from .journals import (
    CAND_SHA,
    COMMITTED_RESULT,
    FAILED_3,
    FULL_COMMIT,
    FULL_ROLLBACK,
    OPENED,
    PRE_SWITCH,
    SWITCHED,
    attempt,
    records,
)

S = EpisodeState
OPENED_2 = ev.EpisodeOpened("op2", "upgrade", "x", None, None, "blue", None, 3, 1.0, 3.0)


def test_full_commit_folds_to_a_closed_episode_with_its_result() -> None:
    view = fold(records(FULL_COMMIT))
    assert view.open_episode is None
    assert view.result_of("op1") == COMMITTED_RESULT
    ep = view.episodes["op1"]
    assert ep.state is S.CLOSED and not ep.is_open
    assert (ep.candidate_slot, ep.candidate_sha256, ep.candidate_version) == ("green", CAND_SHA, "2.0.0")
    assert ep.switch_committed and ep.attempts_started == 1 and ep.health_attempts_left == 2
    assert view.slot_versions == {"green": "2.0.0"}
    assert view.failed_digests == frozenset()
    assert view.last_seq == len(FULL_COMMIT)


def test_full_rollback_records_the_failed_digest() -> None:
    view = fold(records(FULL_ROLLBACK))
    assert view.result_of("op1") is not None
    assert view.closed_results["op1"].result == "rolled_back"
    assert view.failed_digests == {CAND_SHA}
    ep = view.episodes["op1"]
    assert (ep.rollback_slot, ep.rollback_attempts_started, ep.attempts_failed) == ("blue", 1, 3)


def test_derived_properties_of_an_open_switched_episode() -> None:
    view = fold(records([*SWITCHED, *attempt(1, "MainPID changed"), *attempt(2, None)]))
    ep = view.open_episode
    assert ep is not None and ep.state is S.RESTARTED
    assert ep.candidate_active and ep.switch_committed
    assert ep.health_attempts_left == 1 and ep.health_attempt_open
    assert ep.health_failure == "MainPID changed"
    assert ep.terminal_result is None


def test_out_of_attempts_is_derived_not_stored() -> None:
    ep = fold(records(FAILED_3)).open_episode
    assert ep is not None and ep.health_attempts_left == 0 and not ep.health_attempt_open


def test_incremental_folder_equals_fold() -> None:
    folder = Folder()
    for i, rec in enumerate(records(FULL_ROLLBACK)):
        folder.apply(rec)
        assert folder.view() == fold(records(FULL_ROLLBACK)[: i + 1])


def test_two_episodes_in_a_row() -> None:
    second = ev.EpisodeOpened("op2", "upgrade", "x", None, None, "green", "2.0.0", 3, 1.0, 3.0)
    recs = records(FULL_COMMIT) + records([second], "op2", len(FULL_COMMIT) + 1)
    view = fold(recs)
    assert view.open_episode is not None and view.open_episode.episode_id == "op2"
    assert set(view.episodes) == {"op1", "op2"}


def test_history_snapshot_keeps_results_and_failed_digests() -> None:
    failed = UpgradeResult("old", "rolled_back", "1", "2", "blue", "unhealthy")
    snap = ev.HistorySnapshot((
        ev.EpisodeSummary("old", failed, 1.0, 2.0, "d" * 64),
        ev.EpisodeSummary("older", COMMITTED_RESULT, 0.5, 0.7, "e" * 64),
    ))
    view = fold([SimRecord(1, ev.SNAPSHOT_EPISODE, 0.0, snap), *records([OPENED], start=2)])
    assert view.result_of("old") == failed
    assert view.failed_digests == {"d" * 64}
    assert len(view.history) == 2 and view.open_episode is not None


@pytest.mark.parametrize(
    ("name", "recs", "message"),
    [
        ("gap", [*records([OPENED])[:1], SimRecord(3, "op1", 0.0, PRE_SWITCH[1])], "gap: record 3 follows 1"),
        ("duplicate seq", [*records([OPENED]), SimRecord(1, "op1", 0.0, PRE_SWITCH[1])],
         "record 1 follows 1"),
        ("unknown episode", records([PRE_SWITCH[1]]), "unknown episode"),
        ("second open episode",
         records([OPENED]) + records([OPENED_2], "op2", 2), "still open"),
        ("reopened after close", records([*FULL_COMMIT, OPENED]), "cannot follow state closed"),
        ("episode id differs from the operation", records([OPENED], "other"), "names 'op1'"),
        ("switch before install", records([*PRE_SWITCH[:4], ev.SwitchIntended("green", "blue", "blue")]),
         "before its candidate was installed"),
        ("installed bytes differ", records([*PRE_SWITCH[:4], ev.CandidateInstalled("green", "f" * 64)]),
         "does not match"),
        ("aborted after the switch of an upgrade", records([*SWITCHED, ev.Aborted("x")]), "after the switch"),
        ("committed published before a verdict",
         records([*PRE_SWITCH[:4], ev.ResultPublished(COMMITTED_RESULT)]), "cannot follow state verified"),
        ("committed published for an unchanged candidate",
         records([*PRE_SWITCH[:3], ev.CandidateUnchanged("blue", "1.0.0"),
                  ev.ResultPublished(COMMITTED_RESULT)]), "unchanged candidate"),
        ("closed with another result",
         records([*FULL_COMMIT[:-1], ev.EpisodeClosed("aborted")]), "closed as aborted"),
        ("attempt numbers skip", records([*SWITCHED, ev.HealthAttemptStarted(2)]), "attempt 2 where 1"),
        ("last-good check outside a rollback", records([*SWITCHED, ev.HealthAttemptStarted(1, "last_good")]),
         "before a rollback"),
    ],
)
def test_illegal_histories_raise_history_error(name: str, recs: list[SimRecord], message: str) -> None:
    with pytest.raises(HistoryError, match=message) as info:
        fold(recs)
    assert info.value.exit_code == 3


def test_illegal_transition_names_the_seq() -> None:
    events: list[Event] = [*SWITCHED, *attempt(1, "pass"), ev.UpgradeCommitted("green", "2"),
                           ev.RollbackStarted("late", "blue")]
    with pytest.raises(IllegalTransitionError) as info:
        fold(records(events))
    assert info.value.seq == len(events) and info.value.state == "committed"


def test_every_prefix_of_a_full_journal_folds() -> None:
    for full in (FULL_COMMIT, FULL_ROLLBACK):
        for cut in range(len(full) + 1):
            view = fold(records(full[:cut]))
            assert (view.open_episode is None) == (cut in (0, len(full)))

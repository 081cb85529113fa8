"""The lifecycle table (design §4.2): the machine agrees with the table, illegal orders raise typed errors."""

from __future__ import annotations

import pytest
import transitions

from upgrade_core import _events as ev
from upgrade_core._state import (
    MACHINE,
    TRANSITIONS,
    EpisodeState,
    advance,
    can_advance,
    diagram_mermaid,
    reachable_from,
)
from upgrade_core.errors import HistoryError, IllegalTransitionError

S = EpisodeState

HAPPY_PATH = [
    (ev.EpisodeOpened, S.OPENED),
    (ev.ArchiveFetched, S.FETCHED),
    (ev.CandidateStaged, S.STAGED),
    (ev.CandidateVerified, S.VERIFIED),
    (ev.LastGoodRepointed, S.VERIFIED),
    (ev.CandidateInstalled, S.VERIFIED),
    (ev.SwitchIntended, S.SWITCHING),
    (ev.SwitchCommitted, S.SWITCHED),
    (ev.MirrorsSynced, S.SWITCHED),
    (ev.HealthAttemptStarted, S.SWITCHED),
    (ev.RestartRequested, S.SWITCHED),
    (ev.RestartObserved, S.RESTARTED),
    (ev.HealthPassed, S.HEALTHY),
    (ev.UpgradeCommitted, S.COMMITTED),
    (ev.ResultPublished, S.PUBLISHED),
    (ev.EpisodeClosed, S.CLOSED),
]


def test_happy_path_walks_the_spec_order() -> None:
    state = S.NEW
    for event_type, expected in HAPPY_PATH:
        state = advance(state, event_type.TAG)
        assert state is expected


def test_nothing_after_upgrade_committed_reaches_a_rollback() -> None:
    after = reachable_from(S.COMMITTED)
    assert after == {S.COMMITTED, S.PUBLISHED, S.CLOSED}
    for state in after:
        assert not can_advance(state, ev.RollbackStarted.TAG)
        assert not can_advance(state, ev.Aborted.TAG)


def test_aborted_only_before_the_switch_or_for_an_install() -> None:
    """... or a host move whose exchange never landed (docs/host.md)."""
    sources = {src for (src, tag) in TRANSITIONS if tag == ev.Aborted.TAG}
    assert sources == {S.OPENED, S.FETCHED, S.STAGED, S.VERIFIED, S.SWITCHING, S.SWITCHED, S.RESTARTED,
                       S.MOVING}


def test_recovery_may_start_in_every_open_state_and_changes_nothing() -> None:
    for state in S:
        if state in (S.NEW, S.CLOSED):
            assert not can_advance(state, ev.RecoveryStarted.TAG)
        else:
            assert advance(state, ev.RecoveryStarted.TAG) is state


@pytest.mark.parametrize(
    ("state", "tag"),
    [
        (S.NEW, ev.SwitchIntended.TAG),
        (S.OPENED, ev.SwitchIntended.TAG),
        (S.COMMITTED, ev.RollbackStarted.TAG),
        (S.ABORTED, ev.EpisodeClosed.TAG),  # closed before published
        (S.CLOSED, ev.EpisodeOpened.TAG),
        (S.SWITCHED, ev.UpgradeCommitted.TAG),  # commit without a passed attempt
    ],
)
def test_illegal_orders_raise_a_typed_error_naming_state_event_and_seq(state: EpisodeState, tag: str) -> None:
    with pytest.raises(IllegalTransitionError) as info:
        advance(state, tag, seq=42)
    assert isinstance(info.value, HistoryError)
    assert info.value.exit_code == 3
    assert (info.value.state, info.value.event, info.value.seq) == (state.value, tag, 42)
    assert "seq 42" in str(info.value) and tag in str(info.value)


def test_machine_is_strict_and_agrees_with_the_table() -> None:
    model = transitions.Machine(model=None, states=[s.value for s in S], initial=S.OPENED.value,
                                auto_transitions=False, ignore_invalid_triggers=False)
    assert not hasattr(model, "to_closed")
    assert MACHINE.auto_transitions is False and MACHINE.ignore_invalid_triggers is False
    pairs = {(S(src), tag) for tag, event in MACHINE.events.items() for src in event.transitions}
    assert pairs == set(TRANSITIONS)


def test_every_event_class_appears_in_the_table_except_history() -> None:
    tags = {tag for (_src, tag) in TRANSITIONS}
    assert tags == {cls.TAG for cls in ev.ALL_EVENTS} - {ev.HistorySnapshot.TAG}


def test_diagram_is_generated_from_the_table() -> None:
    text = diagram_mermaid()
    assert text.startswith("stateDiagram-v2\n")
    assert "healthy --> committed: UpgradeCommitted" in text
    body = [line for line in text.splitlines() if "-->" in line and "[*]" not in line]
    assert len(body) == sum(1 for (_s, tag) in TRANSITIONS if tag != ev.RecoveryStarted.TAG)


def test_design_doc_shows_the_diagram_of_the_current_table() -> None:
    """The lifecycle diagram of docs/design.md (section 4.2) is generated from TRANSITIONS; regenerate it when
    the table changes."""
    from pathlib import Path

    from upgrade_core import diagram_mermaid

    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    assert diagram_mermaid().rstrip() in design

"""The lifecycle's own guards (design §4.2, 4.6 inv. 4) and the messages of the rules beyond the table.

``upgrade_core._state`` validates its table when it is imported: the ``transitions`` machine built from
it must be strict and deterministic, agree with the table, carry no callback, leave no state unreachable
and let nothing after ``committed`` reach a rollback. The module is imported once per process, so these
tests call the builders again, on the real table and on broken copies of it, and expect the broken ones
refused. They also pin that every rule of :func:`next_state` names itself in the
:class:`IllegalTransitionError` it raises (the operator reads it; ``recover`` exits 3 with it).
"""

from __future__ import annotations

import attrs
import pytest
import transitions

from upgrade_core import _events as ev
from upgrade_core import _state
from upgrade_core._state import TRANSITIONS, EpisodeContext, EpisodeState, next_state
from upgrade_core.errors import IllegalTransitionError

S = EpisodeState
OP = "op1"
SHA = "c" * 64


# -- the import-time validation, run again ---------------------------------------------------------------
def test_the_machine_built_from_the_table_is_strict_and_holds_every_transition_once() -> None:
    machine = _state._build_machine()
    assert isinstance(machine, transitions.Machine)
    assert machine.models == []  # a validator only: it drives no model, not even itself
    assert machine.auto_transitions is False and not hasattr(machine, "to_closed")
    assert machine.ignore_invalid_triggers is False and machine.send_event is False
    assert set(machine.states) == {s.value for s in S}
    assert machine.initial == S.NEW.value
    pairs = [(S(src), tag, S(t.dest)) for tag, event in machine.events.items()
             for src, trans in event.transitions.items() for t in trans]
    assert sorted(pairs, key=str) == sorted(((s, tag, d) for (s, tag), d in TRANSITIONS.items()), key=str)
    assert _state._compile(machine) == TRANSITIONS


def _machine_with(extra: dict[str, object] | None = None, *, duplicate: bool = False) -> transitions.Machine:
    machine = _state._build_machine()
    if duplicate:  # a second target for one (state, trigger): the table would no longer be a function
        machine.add_transition(trigger=ev.EpisodeOpened.TAG, source=S.NEW.value, dest=S.CLOSED.value)
    if extra is not None:
        machine.add_transition(trigger="Extra", source=S.CLOSED.value, dest=S.CLOSED.value, **extra)
    return machine


def test_a_nondeterministic_machine_is_refused() -> None:
    message = r"^lifecycle table: EpisodeOpened from new is not deterministic$"
    with pytest.raises(AssertionError, match=message):
        _state._compile(_machine_with(duplicate=True))


@pytest.mark.parametrize("hook", ["conditions", "before", "after", "prepare"])
def test_a_transition_with_any_callback_is_refused(hook: str) -> None:
    with pytest.raises(AssertionError, match=r"^lifecycle table: Extra from closed carries a callback$"):
        _state._compile(_machine_with({hook: lambda: True}))


def test_a_machine_that_differs_from_the_table_is_refused() -> None:
    with pytest.raises(AssertionError, match=r"^lifecycle table and its machine disagree$"):
        _state._compile(_machine_with({}))


def test_the_real_table_passes_the_one_way_door_check() -> None:
    _state._check_one_way_door()  # raises on a violation


@pytest.mark.parametrize(
    ("extra", "dst"),
    [
        # committed -> rolling_back (and from there rolled_back)
        (ev.RollbackStarted.TAG, S.ROLLING_BACK),
        # committed -> rolled_back directly: rolling_back itself is never reached
        (ev.RolledBack.TAG, S.ROLLED_BACK),
    ],
)
def test_a_table_with_a_path_from_committed_to_a_rollback_is_refused(
    monkeypatch: pytest.MonkeyPatch, extra: str, dst: EpisodeState
) -> None:
    table = {**TRANSITIONS, (S.COMMITTED, extra): dst}
    monkeypatch.setattr(_state, "TRANSITIONS", table)
    assert dst in _state.reachable_from(S.COMMITTED)
    with pytest.raises(AssertionError, match=r"^lifecycle table: a path from committed reaches a rollback$"):
        _state._check_one_way_door()


def test_a_table_that_leaves_a_state_unreachable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {k: v for k, v in TRANSITIONS.items() if v is not S.UNCHANGED or k[0] is S.UNCHANGED}
    monkeypatch.setattr(_state, "TRANSITIONS", table)
    with pytest.raises(AssertionError, match=r"^lifecycle table: unreachable states \['unchanged'\]$"):
        _state._check_one_way_door()


# -- every rule beyond the table names itself --------------------------------------------------------------
def _ctx(**kw: object) -> EpisodeContext:
    return EpisodeContext(OP, **kw)  # type: ignore[arg-type]


UPGRADE = _ctx(kind="upgrade", candidate_slot="green", candidate_sha256=SHA, verified_version="2.0.0")
RESULT = ev.UpgradeResult(OP, "committed", "1.0.0", "2.0.0", "green", None)
OPENED = ev.EpisodeOpened(OP, "upgrade", "file:///a", None, None, "blue", "1.0.0", 3, 1.0, 3.0)

# (what, state, context, event, the message)
REFUSALS: list[tuple[str, EpisodeState, EpisodeContext, ev.Event, str]] = [
    ("an event for an episode never opened", S.NEW, _ctx(), ev.ArchiveFetched(1, "a" * 64),
     "ArchiveFetched for unknown episode 'op1'"),
    ("another operation's opening", S.NEW, _ctx(), attrs.evolve(OPENED, operation="op2"),
     "EpisodeOpened names 'op2' in episode 'op1'"),
    ("an id reopened after closing", S.NEW, _ctx(closed_before=True), OPENED,
     "episode 'op1' opened again after closing"),
    ("a second open episode", S.NEW, _ctx(open_episode="op0"), OPENED,
     "episode 'op1' opened while 'op0' is still open"),
    ("a candidate attempt during the rollback", S.ROLLING_BACK, UPGRADE, ev.HealthAttemptStarted(1),
     "candidate health event during a rollback"),
    ("a last-good verdict before the rollback", S.RESTARTED, UPGRADE, ev.HealthPassed(1, "last_good"),
     "last-good health event before a rollback"),
    ("an attempt out of turn", S.SWITCHED, attrs.evolve(UPGRADE, attempts_started=1),
     ev.HealthAttemptStarted(3), "health attempt 3 where 2 was due"),
    ("other bytes installed", S.VERIFIED, UPGRADE, ev.CandidateInstalled("green", "f" * 64),
     "CandidateInstalled does not match the staged candidate"),
    ("a release trusted twice", S.VERIFIED, attrs.evolve(UPGRADE, release_trusted=True),
     ev.ReleaseTrusted("K", "agent", "2.0.0", 1), "ReleaseTrusted twice in one episode"),
    ("a release trusted after its install", S.VERIFIED, attrs.evolve(UPGRADE, installed=True),
     ev.ReleaseTrusted("K", "agent", "2.0.0", 1), "ReleaseTrusted after the candidate was installed"),
    ("a release trusted for another version", S.VERIFIED, UPGRADE, ev.ReleaseTrusted("K", "agent", "2.1", 1),
     "ReleaseTrusted for version 2.1, the candidate reported 2.0.0"),
    ("a rollback switching to the wrong slot", S.VERIFIED, _ctx(kind="rollback"),
     ev.SwitchIntended("blue", "blue", "blue"),
     "a rollback's SwitchIntended must go from current's slot to last-good's other slot"),
    ("a switch before the install", S.VERIFIED, UPGRADE, ev.SwitchIntended("green", "blue", "blue"),
     "SwitchIntended before its candidate was installed"),
    ("a switch that landed elsewhere", S.SWITCHING, UPGRADE, ev.SwitchCommitted("blue"),
     "SwitchCommitted names blue, not the candidate slot"),
    ("an upgrade aborted after its switch", S.SWITCHED, UPGRADE, ev.Aborted("x"),
     "Aborted after the switch of a upgrade episode"),
    ("an upgrade verifying before it staged", S.OPENED, UPGRADE, ev.CandidateVerified("2.0.0"),
     "CandidateVerified in state opened of a upgrade episode"),
    ("a rollback fetching", S.OPENED, _ctx(kind="rollback"), ev.ArchiveFetched(1, "a" * 64),
     "ArchiveFetched in a rollback episode"),
    ("a rollback moving last-good", S.VERIFIED, _ctx(kind="rollback"), ev.LastGoodRepointed("blue"),
     "LastGoodRepointed in a rollback episode"),
    ("a quarantine record in an upgrade", S.OPENED, UPGRADE,
     ev.JournalQuarantined("/q", "blue", SHA, "1.0.0", "green", SHA, "0.9.0"),
     "JournalQuarantined in a upgrade episode"),
    ("an unchanged candidate published as committed", S.UNCHANGED, UPGRADE, ev.ResultPublished(RESULT),
     "committed published for an unchanged candidate"),
    ("closed with another result", S.PUBLISHED, attrs.evolve(UPGRADE, published="committed"),
     ev.EpisodeClosed("aborted"), "closed as aborted but published committed"),
]


@pytest.mark.parametrize(("what", "state", "ctx", "event", "message"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_rule_refuses_with_its_own_message(
    what: str, state: EpisodeState, ctx: EpisodeContext, event: ev.Event, message: str
) -> None:
    with pytest.raises(IllegalTransitionError) as info:
        next_state(state, ctx, event, 7)
    assert (info.value.state, info.value.event, info.value.seq, info.value.reason) == (
        state.value, event.TAG, 7, message)


def test_a_quarantine_episode_records_its_quarantine() -> None:
    """The one kind allowed to journal ``JournalQuarantined`` (design §10): opened -> unchanged."""
    ctx = _ctx(kind="quarantine")
    record = ev.JournalQuarantined("/q", "blue", SHA, "1.0.0", "green", SHA, "0.9.0")
    assert next_state(S.OPENED, ctx, record) is S.UNCHANGED


def test_the_diagram_leaves_out_only_the_recovery_self_loops() -> None:
    lines = _state.diagram_mermaid().splitlines()
    edges = {line.strip() for line in lines if "-->" in line and "[*]" not in line}
    assert edges == {f"{s.value} --> {d.value}: {tag}" for (s, tag), d in TRANSITIONS.items()
                     if tag != ev.RecoveryStarted.TAG}
    assert lines[-1] == "    note right of opened: RecoveryStarted may occur in every open state"

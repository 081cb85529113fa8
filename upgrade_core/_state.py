"""The episode lifecycle (SPEC 4.2) as one literal table.

Rule 1: everything that decides which event may follow which episode state lives in this file, as data.
Nothing here performs I/O or calls back into anything.

- :data:`TRANSITIONS` maps ``(state, event tag) -> next state``. It is the only source of truth.
- At import a :class:`transitions.Machine` is built from the table (``auto_transitions=False``,
  ``ignore_invalid_triggers=False``, no callbacks) to validate it: every state reachable, every trigger
  deterministic. The hot path does not use the machine; it uses :data:`_NEXT`, a dict compiled from the
  machine's own transition list, so what ``advance`` accepts is exactly what the machine accepts.
- :func:`advance` raises :class:`~upgrade_core.errors.IllegalTransitionError`; ``MachineError`` never
  leaks.
- The one-way door (SPEC 4.6 inv. 4): no path starting at ``committed`` reaches ``rolling_back``; checked
  at import (:func:`_check_one_way_door`) and in ``tests/core/test_state.py``.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Final

import transitions

from . import _events as ev
from .errors import IllegalTransitionError


class EpisodeState(enum.Enum):
    """Where an episode stands, derived by folding its events (SPEC 4.2).

    ``new`` is the state before ``EpisodeOpened``; no journal ever shows an episode in it.
    """

    NEW = "new"
    OPENED = "opened"
    FETCHED = "fetched"
    STAGED = "staged"
    VERIFIED = "verified"
    SWITCHING = "switching"
    SWITCHED = "switched"
    RESTARTED = "restarted"
    HEALTHY = "healthy"
    COMMITTED = "committed"
    UNCHANGED = "unchanged"
    ABORTED = "aborted"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"
    NEEDS_ATTENTION = "needs_attention"
    PUBLISHED = "published"
    CLOSED = "closed"


S = EpisodeState

# Every state of an open episode: recovery may take any of them over.
_OPEN_STATES: Final = tuple(s for s in S if s not in (S.NEW, S.CLOSED))

_T: dict[tuple[EpisodeState, str], EpisodeState] = {
    # -- before the switch: links untouched, abort is always possible -------------------------------
    (S.NEW, ev.EpisodeOpened.TAG): S.OPENED,
    (S.OPENED, ev.ArchiveFetched.TAG): S.FETCHED,
    (S.FETCHED, ev.CandidateStaged.TAG): S.STAGED,
    (S.STAGED, ev.CandidateVerified.TAG): S.VERIFIED,
    (S.VERIFIED, ev.LastGoodRepointed.TAG): S.VERIFIED,
    (S.VERIFIED, ev.CandidateInstalled.TAG): S.VERIFIED,
    (S.OPENED, ev.Aborted.TAG): S.ABORTED,
    (S.FETCHED, ev.Aborted.TAG): S.ABORTED,
    (S.STAGED, ev.Aborted.TAG): S.ABORTED,
    (S.VERIFIED, ev.Aborted.TAG): S.ABORTED,
    # noop: the candidate's digest equals current's slot (SPEC 4.3 step 4); a fact, durable before publishing.
    (S.STAGED, ev.CandidateUnchanged.TAG): S.UNCHANGED,
    # -- the switch: intent, then completion; a switch that never landed is aborted ---------------------
    (S.VERIFIED, ev.SwitchIntended.TAG): S.SWITCHING,
    (S.SWITCHING, ev.SwitchCommitted.TAG): S.SWITCHED,
    (S.SWITCHING, ev.Aborted.TAG): S.ABORTED,
    # -- the candidate is active: mirrors, restarts and health attempts ---------------------------------
    (S.SWITCHED, ev.MirrorsSynced.TAG): S.SWITCHED,
    (S.RESTARTED, ev.MirrorsSynced.TAG): S.RESTARTED,
    (S.SWITCHED, ev.LastGoodRepointed.TAG): S.SWITCHED,  # install: last-good joins current on blue
    (S.SWITCHED, ev.HealthAttemptStarted.TAG): S.SWITCHED,
    (S.RESTARTED, ev.HealthAttemptStarted.TAG): S.SWITCHED,
    (S.SWITCHED, ev.RestartRequested.TAG): S.SWITCHED,
    (S.RESTARTED, ev.RestartRequested.TAG): S.SWITCHED,
    (S.SWITCHED, ev.RestartObserved.TAG): S.RESTARTED,
    (S.RESTARTED, ev.RestartObserved.TAG): S.RESTARTED,
    (S.SWITCHED, ev.HealthFailed.TAG): S.SWITCHED,
    (S.RESTARTED, ev.HealthFailed.TAG): S.SWITCHED,
    (S.SWITCHED, ev.HealthPassed.TAG): S.HEALTHY,
    (S.RESTARTED, ev.HealthPassed.TAG): S.HEALTHY,
    # install only (fold checks the kind): a bare host has no last-good to roll back to.
    (S.SWITCHED, ev.Aborted.TAG): S.ABORTED,
    (S.RESTARTED, ev.Aborted.TAG): S.ABORTED,
    # -- verdicts -----------------------------------------------------------------------------------------
    (S.HEALTHY, ev.UpgradeCommitted.TAG): S.COMMITTED,
    (S.SWITCHED, ev.RollbackStarted.TAG): S.ROLLING_BACK,
    (S.RESTARTED, ev.RollbackStarted.TAG): S.ROLLING_BACK,
    # -- rollback: health-check the last-good; it too is journaled attempt by attempt -------------------
    (S.ROLLING_BACK, ev.HealthAttemptStarted.TAG): S.ROLLING_BACK,
    (S.ROLLING_BACK, ev.RestartRequested.TAG): S.ROLLING_BACK,
    (S.ROLLING_BACK, ev.RestartObserved.TAG): S.ROLLING_BACK,
    (S.ROLLING_BACK, ev.HealthFailed.TAG): S.ROLLING_BACK,
    (S.ROLLING_BACK, ev.HealthPassed.TAG): S.ROLLING_BACK,
    (S.ROLLING_BACK, ev.RolledBack.TAG): S.ROLLED_BACK,
    (S.ROLLING_BACK, ev.AttentionNeeded.TAG): S.NEEDS_ATTENTION,
    # -- terminal results: published first, closed after (SPEC 4.6 inv. 5) ------------------------------
    (S.COMMITTED, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.ABORTED, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.UNCHANGED, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.ROLLED_BACK, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.NEEDS_ATTENTION, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.PUBLISHED, ev.EpisodeClosed.TAG): S.CLOSED,
}
# A recovery may take over an open episode in any state, any number of times (crashes inside recovery).
for _s in _OPEN_STATES:
    _T[(_s, ev.RecoveryStarted.TAG)] = _s

TRANSITIONS: Final[dict[tuple[EpisodeState, str], EpisodeState]] = _T
"""The lifecycle: ``(state, event TAG) -> next state``. Anything absent is illegal."""

TERMINAL_STATES: Final = frozenset({S.COMMITTED, S.UNCHANGED, S.ABORTED, S.ROLLED_BACK, S.NEEDS_ATTENTION})
"""States holding a terminal result that still has to be published."""


def _build_machine() -> transitions.Machine:
    """Build (and thereby validate) a ``transitions.Machine`` from :data:`TRANSITIONS`; no callbacks."""
    machine = transitions.Machine(
        model=None,
        states=[s.value for s in EpisodeState],
        initial=S.NEW.value,
        auto_transitions=False,
        ignore_invalid_triggers=False,
        send_event=False,
    )
    for (src, tag), dst in TRANSITIONS.items():
        machine.add_transition(trigger=tag, source=src.value, dest=dst.value)
    return machine


def _compile(machine: transitions.Machine) -> dict[tuple[EpisodeState, str], EpisodeState]:
    """The hot-path dict, read back from the machine's own events (so both agree by construction)."""
    compiled: dict[tuple[EpisodeState, str], EpisodeState] = {}
    for tag, event in machine.events.items():
        for src, trans_list in event.transitions.items():
            if len(trans_list) != 1:
                raise AssertionError(f"lifecycle table: {tag} from {src} is not deterministic")
            (trans,) = trans_list
            if trans.conditions or trans.before or trans.after or trans.prepare:
                raise AssertionError(f"lifecycle table: {tag} from {src} carries a callback")
            compiled[(EpisodeState(src), tag)] = EpisodeState(trans.dest)
    if compiled != TRANSITIONS:
        raise AssertionError("lifecycle table and its machine disagree")
    return compiled


def reachable_from(start: EpisodeState) -> frozenset[EpisodeState]:
    """Every state reachable from ``start`` (``start`` included) by legal transitions."""
    seen = {start}
    todo = deque([start])
    while todo:
        state = todo.popleft()
        for (src, _tag), dst in TRANSITIONS.items():
            if src is state and dst not in seen:
                seen.add(dst)
                todo.append(dst)
    return frozenset(seen)


def _check_one_way_door() -> None:
    """SPEC 4.6 inv. 4 and STYLE "catch-all rollback": nothing after ``committed`` rolls back."""
    after = reachable_from(S.COMMITTED)
    if S.ROLLING_BACK in after or S.ROLLED_BACK in after:
        raise AssertionError("lifecycle table: a path from committed reaches a rollback")
    unreachable = set(EpisodeState) - reachable_from(S.NEW)
    if unreachable:
        raise AssertionError(f"lifecycle table: unreachable states {sorted(s.value for s in unreachable)}")


MACHINE: Final = _build_machine()
_NEXT: Final = _compile(MACHINE)
_check_one_way_door()


def advance(state: EpisodeState, event_tag: str, seq: int | None = None) -> EpisodeState:
    """The state after an event with tag ``event_tag`` happens in ``state``.

    Args:
        state: the episode's state before the event.
        event_tag: the event's stable ``TAG`` (e.g. ``"SwitchIntended"``).
        seq: the record's sequence number, only to name it in the error.

    Returns:
        The next state, per :data:`TRANSITIONS`.

    Raises:
        IllegalTransitionError: the table has no such transition (an illegal order in a journal, or a
            bug in a flow that tried to journal it; SPEC 4.2).
    """
    try:
        return _NEXT[(state, event_tag)]
    except KeyError:
        raise IllegalTransitionError(state.value, event_tag, seq) from None


def can_advance(state: EpisodeState, event_tag: str) -> bool:
    """True when ``event_tag`` may follow ``state``."""
    return (state, event_tag) in _NEXT


def diagram_mermaid() -> str:
    """The lifecycle as a mermaid ``stateDiagram-v2``, generated from :data:`TRANSITIONS`.

    Self-loops of ``RecoveryStarted`` (legal in every open state) are folded into one note to keep the
    diagram readable.
    """
    lines = ["stateDiagram-v2", f"    [*] --> {S.NEW.value}"]
    for (src, tag), dst in TRANSITIONS.items():
        if tag == ev.RecoveryStarted.TAG:
            continue
        lines.append(f"    {src.value} --> {dst.value}: {tag}")
    lines.append(f"    {S.CLOSED.value} --> [*]")
    lines.append(f"    note right of {S.OPENED.value}: RecoveryStarted may occur in every open state")
    return "\n".join(lines) + "\n"

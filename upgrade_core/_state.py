"""The episode lifecycle (design §4.2) as one literal table.

Rule 1: everything that decides which event may follow which episode state lives in this file, as data.
Nothing here performs I/O or calls back into anything.

- :data:`TRANSITIONS` maps ``(state, event tag) -> next state``. It is the only source of truth.
- At import a :class:`transitions.Machine` is built from the table (``auto_transitions=False``,
  ``ignore_invalid_triggers=False``, no callbacks) to validate it: every state reachable, every trigger
  deterministic. The hot path does not use the machine; it uses :data:`_NEXT`, a dict compiled from the
  machine's own transition list, so what ``advance`` accepts is exactly what the machine accepts.
- :func:`advance` raises :class:`~upgrade_core.errors.IllegalTransitionError`; ``MachineError`` never
  leaks. It knows only the table.
- :func:`next_state` is THE rule: the table plus every rule that needs the episode's facts
  (:class:`EpisodeContext`): ``Aborted`` after the switch only for ``install``, a ``rollback`` episode's
  own order (verify, then switch to last-good's slot; no fetch, no last-good move), the health target and
  attempt number, the installed candidate, the published result, one open episode at a time. The fold
  replays with it and the orchestrator checks every event with it *before* the append
  (:class:`upgrade_core.CheckedJournal`), so an event that breaks a rule never becomes durable.
- The one-way door (design §4.6 inv. 4): no path starting at ``committed`` reaches ``rolling_back``; checked
  at import (:func:`_check_one_way_door`) and in ``tests/core/test_state.py``.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import attrs
import transitions

from . import _events as ev
from ._events import EpisodeKind, Slot
from .errors import IllegalTransitionError


class EpisodeState(enum.Enum):
    """Where an episode stands, derived by folding its events (design §4.2).

    ``new`` is the state before ``EpisodeOpened``; no journal ever shows an episode in it.
    """

    # Members are singletons compared by identity, so the identity hash is the right one; ``enum.Enum``'s
    # own ``__hash__`` is a Python-level function (it hashes the name), paid on every (state, tag) lookup
    # of the fold (design §9 ``journal.replay``: 100k records).
    __hash__ = object.__hash__

    NEW = "new"
    OPENED = "opened"
    FETCHED = "fetched"
    STAGED = "staged"
    VERIFIED = "verified"
    READY = "ready"
    LEFT_STOPPED = "left_stopped"
    MOVING = "moving"
    MOVED = "moved"
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
    # a signed release (docs/trust.md): once, after the version command, before last-good moves or the install
    (S.VERIFIED, ev.ReleaseTrusted.TAG): S.VERIFIED,
    (S.VERIFIED, ev.LastGoodRepointed.TAG): S.VERIFIED,
    (S.VERIFIED, ev.CandidateInstalled.TAG): S.VERIFIED,
    (S.OPENED, ev.Aborted.TAG): S.ABORTED,
    (S.FETCHED, ev.Aborted.TAG): S.ABORTED,
    (S.STAGED, ev.Aborted.TAG): S.ABORTED,
    (S.VERIFIED, ev.Aborted.TAG): S.ABORTED,
    # noop: the candidate's digest equals current's slot (design §4.3 step 4); a fact, durable before
    # publishing.
    (S.STAGED, ev.CandidateUnchanged.TAG): S.UNCHANGED,
    # ``journal quarantine`` (design §10): a new journal records what the host shows; nothing changed (noop).
    (S.OPENED, ev.JournalQuarantined.TAG): S.UNCHANGED,
    # ``trust reset`` (docs/trust.md): watermark and known-bad memory cleared; nothing on the host changed.
    (S.OPENED, ev.TrustReset.TAG): S.UNCHANGED,
    # rollback (operator, ``upgrade-agent rollback``): nothing is fetched or staged; the last-good slot's
    # version command is run (next_state: only a rollback episode verifies straight after opening).
    (S.OPENED, ev.CandidateVerified.TAG): S.VERIFIED,
    # ``upgrade --stage``: the installed candidate waits in its slot for ``activate``; the episode ends here
    # with the result ``staged`` (next_state: an ``upgrade`` episode, for the installed candidate).
    (S.VERIFIED, ev.StagedForActivation.TAG): S.READY,
    # ``activate``: the staged slot's bytes are hashed again; the episode then switches as an upgrade does
    # (next_state: an ``activate`` episode only; a mismatch can only abort, SwitchIntended needs a match).
    (S.OPENED, ev.StagedCandidateChecked.TAG): S.VERIFIED,
    # ``activate`` on a host whose agent unit was stopped on purpose (design §4.7): the observation, before
    # the switch (next_state: an ``activate`` whose staged bytes matched, ``inactive`` only, once).
    (S.VERIFIED, ev.UnitFoundStopped.TAG): S.VERIFIED,
    # ``host move`` (docs/host.md): the layout under the compatibility link is copied into a real host root
    # that takes the link's place in one exchange; an exchange that never landed is undone (aborted).
    (S.OPENED, ev.HostMoveIntended.TAG): S.MOVING,
    (S.MOVING, ev.HostMoved.TAG): S.MOVED,
    (S.MOVING, ev.Aborted.TAG): S.ABORTED,
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
    # design §4.7: an activate that found the unit stopped switches and leaves it stopped; no restart, no
    # health attempt and no mirror copy may precede this (next_state), so there is nothing to roll back.
    (S.SWITCHED, ev.LeftStopped.TAG): S.LEFT_STOPPED,
    # install only (next_state checks the kind): a bare host has no last-good to roll back to.
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
    # -- terminal results: published first, closed after (design §4.6 inv. 5) ------------------------------
    (S.COMMITTED, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.ABORTED, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.UNCHANGED, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.ROLLED_BACK, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.NEEDS_ATTENTION, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.READY, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.LEFT_STOPPED, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.MOVED, ev.ResultPublished.TAG): S.PUBLISHED,
    (S.PUBLISHED, ev.EpisodeClosed.TAG): S.CLOSED,
}
# A recovery may take over an open episode in any state, any number of times (crashes inside recovery).
for _s in _OPEN_STATES:
    _T[(_s, ev.RecoveryStarted.TAG)] = _s

TRANSITIONS: Final[dict[tuple[EpisodeState, str], EpisodeState]] = _T
"""The lifecycle: ``(state, event TAG) -> next state``. Anything absent is illegal."""

TERMINAL_STATES: Final = frozenset(
    {S.COMMITTED, S.UNCHANGED, S.ABORTED, S.ROLLED_BACK, S.NEEDS_ATTENTION, S.READY, S.LEFT_STOPPED, S.MOVED}
)
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
    """design §4.6 inv. 4 and STYLE "catch-all rollback": nothing after ``committed`` rolls back."""
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
            bug in a flow that tried to journal it; design §4.2).
    """
    try:
        return _NEXT[(state, event_tag)]
    except KeyError:
        raise IllegalTransitionError(state.value, event_tag, seq) from None


@attrs.frozen
class EpisodeContext:
    """The facts of one episode (and of the journal around it) that the rules of :func:`next_state` need.

    Built by :class:`upgrade_core.Folder` (:meth:`~upgrade_core.Folder.context_of`) from the episode's
    folded events; never stored in the journal.

    Attributes:
        episode_id: the episode the next event belongs to.
        kind: ``upgrade``, ``install``, ``self_upgrade``, ``quarantine``, ``rollback``, ``trust-reset``,
            ``activate`` or ``host-move``; None before ``EpisodeOpened``.
        candidate_slot / candidate_sha256: what ``CandidateStaged`` recorded (slot, 64 hex), or None; for a
            ``rollback`` episode the last-good slot its ``SwitchIntended`` names and the digest its
            ``EpisodeOpened`` expected; for an ``activate`` episode the staged slot and digest its
            ``StagedCandidateChecked`` names.
        installed: ``CandidateInstalled`` was journaled (an ``activate``: the staged bytes matched).
        attempts_started: candidate health attempts begun (``HealthAttemptStarted``, target candidate).
        rollback_attempts_started: last-good health attempts begun during the rollback.
        verified_version: the version ``CandidateVerified`` recorded, or None.
        release_trusted: ``ReleaseTrusted`` was journaled.
        published: the result value ``ResultPublished`` recorded (e.g. ``"committed"``), or None.
        open_episode: the journal's open episode, if another one is open (only consulted for
            ``EpisodeOpened``).
        closed_before: the journal already closed an episode with this id (compacted history included).
        unit_found_stopped: ``UnitFoundStopped`` was journaled (an ``activate`` that leaves the unit stopped).
    """

    episode_id: str
    kind: EpisodeKind | None = None
    candidate_slot: Slot | None = None
    candidate_sha256: str | None = None
    installed: bool = False
    attempts_started: int = 0
    rollback_attempts_started: int = 0
    published: str | None = None
    open_episode: str | None = None
    closed_before: bool = False
    verified_version: str | None = None
    release_trusted: bool = False
    unit_found_stopped: bool = False


# The states the rules compare with, read once: ``S.X`` goes through the enum metaclass's Python-level
# ``__getattr__`` hook on every read (about 70 ns), and the fold checks every record of a replay
# (design §9 ``journal.replay``).
_OPENED: Final = S.OPENED
_UNCHANGED: Final = S.UNCHANGED
_READY: Final = S.READY
_LEFT_STOPPED: Final = S.LEFT_STOPPED
_MOVED: Final = S.MOVED
_ROLLING_BACK: Final = S.ROLLING_BACK
_ACTIVE: Final = (S.SWITCHED, S.RESTARTED)


def _health_rule(
    state: EpisodeState,
    ctx: EpisodeContext,
    event: ev.HealthAttemptStarted | ev.HealthPassed | ev.HealthFailed,
) -> str | None:
    """A health event's target must fit the state; an attempt must be the one due (design §4.3 steps 7-8)."""
    if state is _ROLLING_BACK:
        if event.target != "last_good":
            return "candidate health event during a rollback"
        started = ctx.rollback_attempts_started
    else:
        if event.target != "candidate":
            return "last-good health event before a rollback"
        if ctx.unit_found_stopped:
            return "health event in an activate that found the unit stopped"
        started = ctx.attempts_started
    if isinstance(event, ev.HealthAttemptStarted) and event.attempt != started + 1:
        return f"health attempt {event.attempt} where {started + 1} was due"
    return None


def _opened_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.EpisodeOpened) -> str | None:
    """An episode id opens once, names its own operation, and only while no other episode is open
    (design §4.3 step 1, 4.6 inv. 7)."""
    if event.operation != ctx.episode_id:
        return f"EpisodeOpened names {event.operation!r} in episode {ctx.episode_id!r}"
    if ctx.closed_before:
        return f"episode {ctx.episode_id!r} opened again after closing"
    if ctx.open_episode is not None and ctx.open_episode != ctx.episode_id:
        return f"episode {ctx.episode_id!r} opened while {ctx.open_episode!r} is still open"
    return None


def _installed_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.CandidateInstalled) -> str | None:
    """design §4.3 step 3: the bytes renamed onto the slot are the ones staged and verified."""
    if event.slot != ctx.candidate_slot or event.sha256 != ctx.candidate_sha256:
        return "CandidateInstalled does not match the staged candidate"
    return None


def _release_trusted_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.ReleaseTrusted) -> str | None:
    """A release is trusted once, before its candidate is installed, for the version it reported
    (signed releases, docs/trust.md)."""
    if ctx.release_trusted:
        return "ReleaseTrusted twice in one episode"
    if ctx.installed:
        return "ReleaseTrusted after the candidate was installed"
    if event.version != ctx.verified_version:
        return f"ReleaseTrusted for version {event.version}, the candidate reported {ctx.verified_version}"
    return None


def _staged_for_activation_rule(
    state: EpisodeState, ctx: EpisodeContext, event: ev.StagedForActivation
) -> str | None:
    """``upgrade --stage`` (docs/cli.md): only an ``upgrade`` episode stages for a later ``activate``, and
    only the candidate it installed, with the version it reported."""
    if ctx.kind != "upgrade":
        return f"StagedForActivation in a {ctx.kind} episode"
    if not ctx.installed or event.slot != ctx.candidate_slot or event.sha256 != ctx.candidate_sha256:
        return "StagedForActivation does not match the installed candidate"
    if event.version != ctx.verified_version:
        return (f"StagedForActivation for version {event.version}, "
                f"the candidate reported {ctx.verified_version}")
    return None


def _staged_checked_rule(
    state: EpisodeState, ctx: EpisodeContext, event: ev.StagedCandidateChecked
) -> str | None:
    """Only an ``activate`` episode checks a staged candidate (docs/cli.md ``activate``)."""
    if ctx.kind != "activate":
        return f"StagedCandidateChecked in a {ctx.kind} episode"
    return None


def _unit_found_stopped_rule(
    state: EpisodeState, ctx: EpisodeContext, event: ev.UnitFoundStopped
) -> str | None:
    """design §4.7: only an ``activate`` whose staged bytes matched records a unit stopped on purpose, once,
    and only ``ActiveState=inactive`` (a ``failed`` unit was not stopped on purpose)."""
    if ctx.kind != "activate" or not ctx.installed:
        return f"UnitFoundStopped in a {ctx.kind} episode without a matching staged candidate"
    if ctx.unit_found_stopped:
        return "UnitFoundStopped twice in one episode"
    if event.active_state != "inactive":
        return f"UnitFoundStopped with ActiveState={event.active_state}, not inactive"
    return None


def _left_stopped_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.LeftStopped) -> str | None:
    """design §4.7: only an ``activate`` that found the unit stopped leaves it stopped, on its candidate."""
    if not ctx.unit_found_stopped:
        return "LeftStopped without UnitFoundStopped"
    if event.slot != ctx.candidate_slot:
        return f"LeftStopped names {event.slot}, not the candidate slot"
    return None


def _not_while_stopped_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.Event) -> str | None:
    """design §4.7: an ``activate`` that found the unit stopped neither restarts it, nor copies the
    unverified candidate to the mirrors, nor rolls back (it ends in ``LeftStopped``)."""
    if ctx.unit_found_stopped:
        return f"{event.TAG} in an activate that found the unit stopped"
    return None


def _switch_intended_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.SwitchIntended) -> str | None:
    """design §4.3 step 5: only an installed candidate is switched to, in its own slot. A ``rollback`` episode
    switches ``current`` to the slot ``last-good`` names, away from another slot (docs/recovery.md)."""
    if ctx.kind == "rollback":
        if event.candidate_slot != event.last_good or event.previous_slot in (None, event.candidate_slot):
            return "a rollback's SwitchIntended must go from current's slot to last-good's other slot"
        return None
    if event.candidate_slot != ctx.candidate_slot or not ctx.installed:
        return "SwitchIntended before its candidate was installed"
    return None


def _switch_committed_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.SwitchCommitted) -> str | None:
    """design §4.3 step 5: the flip that landed is the candidate's."""
    if event.slot != ctx.candidate_slot:
        return f"SwitchCommitted names {event.slot}, not the candidate slot"
    return None


def _aborted_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.Aborted) -> str | None:
    """design §4.2: ``aborted`` is a pre-switch verdict; after the switch only a bare-host install (nothing to
    roll back to) aborts; every other kind must roll back (design §4.3 step 8)."""
    if state in _ACTIVE and ctx.kind != "install":
        return f"Aborted after the switch of a {ctx.kind} episode"
    return None


def _verified_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.CandidateVerified) -> str | None:
    """Only a ``rollback`` verifies without staging (the last-good slot is already installed), and it never
    stages; an ``activate`` never runs the version command (staging ran it, and the digest check proves the
    bytes are those)."""
    if (state is _OPENED) != (ctx.kind == "rollback"):
        return f"CandidateVerified in state {state.value} of a {ctx.kind} episode"
    return None


def _rollback_kind_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.Event) -> str | None:
    """A ``rollback`` episode fetches nothing and never moves ``last-good`` (docs/recovery.md: a failed
    rollback leaves both links as they were; a committed one leaves both naming the rolled-back-to slot).
    An ``activate`` fetches nothing either: its candidate was staged by an earlier episode. A
    ``host-move`` episode only moves the host root (docs/host.md): from its opening only
    ``HostMoveIntended`` or an abort."""
    if ctx.kind in ("rollback", "host-move"):
        return f"{event.TAG} in a {ctx.kind} episode"
    if ctx.kind == "activate" and type(event) is ev.ArchiveFetched:
        return "ArchiveFetched in an activate episode"
    return None


def _quarantined_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.JournalQuarantined) -> str | None:
    """design §10: only a ``quarantine`` episode records a quarantine (and nothing else makes one
    unchanged)."""
    if ctx.kind != "quarantine":
        return f"JournalQuarantined in a {ctx.kind} episode"
    return None


def _trust_reset_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.TrustReset) -> str | None:
    """docs/trust.md: only a ``trust-reset`` episode clears the anti-rollback state."""
    if ctx.kind != "trust-reset":
        return f"TrustReset in a {ctx.kind} episode"
    return None


def _host_move_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.HostMoveIntended) -> str | None:
    """docs/host.md: only a ``host-move`` episode moves the host root (and it does nothing else)."""
    if ctx.kind != "host-move":
        return f"HostMoveIntended in a {ctx.kind} episode"
    return None


def _published_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.ResultPublished) -> str | None:
    """design §4.3 step 4: an unchanged candidate publishes ``noop``, nothing else; a host move that
    landed, ``committed``."""
    if state is _UNCHANGED and event.result.result != "noop":
        return f"{event.result.result} published for an unchanged candidate"
    if (state is _READY) != (event.result.result == "staged"):
        return f"{event.result.result} published in state {state.value}"
    if (state is _LEFT_STOPPED) != (event.result.result == "switched_stopped"):
        return f"{event.result.result} published in state {state.value}"
    if state is _MOVED and event.result.result != "committed":
        return f"{event.result.result} published in state {state.value}"
    return None


def _closed_rule(state: EpisodeState, ctx: EpisodeContext, event: ev.EpisodeClosed) -> str | None:
    """design §4.6 inv. 5: an episode closes with the one result it published."""
    if event.result != ctx.published:
        return f"closed as {event.result} but published {ctx.published}"
    return None


_Rule = Callable[[EpisodeState, EpisodeContext, Any], "str | None"]
_RULES: Final[dict[type[ev.Event], _Rule]] = {
    ev.EpisodeOpened: _opened_rule,
    ev.HealthAttemptStarted: _health_rule,
    ev.HealthPassed: _health_rule,
    ev.HealthFailed: _health_rule,
    ev.CandidateInstalled: _installed_rule,
    ev.ReleaseTrusted: _release_trusted_rule,
    ev.SwitchIntended: _switch_intended_rule,
    ev.SwitchCommitted: _switch_committed_rule,
    ev.Aborted: _aborted_rule,
    ev.ResultPublished: _published_rule,
    ev.EpisodeClosed: _closed_rule,
    ev.JournalQuarantined: _quarantined_rule,
    ev.TrustReset: _trust_reset_rule,
    ev.HostMoveIntended: _host_move_rule,
    ev.CandidateVerified: _verified_rule,
    ev.ArchiveFetched: _rollback_kind_rule,
    ev.LastGoodRepointed: _rollback_kind_rule,
    ev.StagedForActivation: _staged_for_activation_rule,
    ev.StagedCandidateChecked: _staged_checked_rule,
    ev.UnitFoundStopped: _unit_found_stopped_rule,
    ev.LeftStopped: _left_stopped_rule,
    ev.RestartRequested: _not_while_stopped_rule,
    ev.MirrorsSynced: _not_while_stopped_rule,
    ev.RollbackStarted: _not_while_stopped_rule,
}
"""The rules beyond the table, by event class: each returns why the event breaks it, or None."""


def next_state(
    state: EpisodeState, context: EpisodeContext, event: ev.Event, seq: int | None = None
) -> EpisodeState:
    """The state after ``event`` happens in an episode at ``state`` with facts ``context``: THE rule.

    Every transition rule of the lifecycle is checked here and nowhere else: the table
    (:data:`TRANSITIONS`, design §4.2) and the rules that need the episode's facts (see
    :class:`EpisodeContext`). Pure; the fold replays with it and the orchestrator checks with it before it
    appends.

    Args:
        state: the episode's state before the event (``new`` for an id never opened).
        context: the episode's facts (:meth:`upgrade_core.Folder.context_of`).
        event: the event about to be journaled (or being replayed).
        seq: the record's sequence number, only to name it in the error (None before an append).

    Returns:
        The next state.

    Raises:
        IllegalTransitionError: the event cannot follow ``state`` in this context; ``state``, ``event``
            (the tag) and ``seq`` are attributes, the message names the broken rule.
    """
    new = _NEXT.get((state, event.TAG))
    if new is None:
        why = None
        if state is S.NEW and type(event) is not ev.EpisodeOpened:
            why = f"{event.TAG} for unknown episode {context.episode_id!r}"
        raise IllegalTransitionError(state.value, event.TAG, seq, why)
    rule = _RULES.get(type(event))
    if rule is not None:
        why = rule(state, context, event)
        if why is not None:
            raise IllegalTransitionError(state.value, event.TAG, seq, why)
    return new


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

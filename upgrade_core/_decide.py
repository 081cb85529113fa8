"""``decide(view, facts) -> Plan``: the recovery decision of design §4.5, pure and exhaustive.

The fold *raises* on an illegal history; the decider *chooses* (python-tuf's split between the trusted set
and the updater). The decision never trusts a stored flag: it combines what the journal's durable prefix
says (:class:`~upgrade_core._fold.JournalView`) with what the host shows (:class:`HostFacts`). Every row of
the design §4.5 table maps to one branch below and to a row of ``tests/core/test_decide.py::RECOVERY_CASES``.
"""

from __future__ import annotations

import attrs

from ._events import Slot, UpgradeResult
from ._fold import EpisodeView, JournalView, LeftStoppedCandidate
from ._state import TERMINAL_STATES, EpisodeState
from .ports import LinkState

_S = EpisodeState


@attrs.frozen
class HostFacts:
    """What the host shows right now, as far as recovery needs it.

    Attributes:
        links: what ``current`` and ``last-good`` resolve to.
        candidate_slot_sha256: sha256 (64 hex) of the open episode's candidate slot, or None when unknown,
            missing or zero-length (C12). Only consulted for an intended but unconfirmed switch.
        unit_active_state: the agent unit's ``ActiveState`` (``systemctl show``), or None when it was not
            read (a boot recovery runs before the unit starts) or could not be. Only consulted when nothing
            is open and ``current`` names a candidate an ``activate`` left stopped (design §4.7).
    """

    links: LinkState
    candidate_slot_sha256: str | None = None
    unit_active_state: str | None = None


# -- plans (frozen values; the orchestrator executes them) ------------------------------------------
@attrs.frozen
class NoOp:
    """Nothing is open; the result is ``noop`` with no operation.

    Attributes:
        reason: one line for the result, or None (nothing at all to do).
    """

    reason: str | None = None


@attrs.frozen
class LeaveStopped:
    """An ``activate`` that found the unit stopped on purpose is switched (or, with ``confirm_switch``, its
    switch turns out to have landed): journal ``LeftStopped``, publish ``switched_stopped``, close; the unit
    is not started (design §4.7).

    Attributes:
        confirm_switch: as in :class:`ResumeHealth`.
    """

    confirm_switch: bool = False


@attrs.frozen
class CheckLeftStopped:
    """Nothing is open, ``current`` names a candidate an ``activate`` left stopped, and the unit is no longer
    ``inactive`` (started since; running or ``failed``): open an ``activate`` episode that checks that
    candidate as an activation would, commit or roll back to ``last-good`` (design §4.7).

    Attributes:
        candidate: the candidate left stopped.
    """

    candidate: LeftStoppedCandidate


@attrs.frozen
class Abort:
    """Stop before (or instead of) the switch: discard staging leftovers, never touch links, publish.

    Attributes:
        reason: one line for the result.
    """

    reason: str


@attrs.frozen
class ResumeHealth:
    """The candidate is (or, with ``confirm_switch``, turns out to be) active: spend its remaining attempts.

    Attributes:
        attempts_left: health attempts still allowed, >= 1.
        confirm_switch: ``SwitchIntended`` has no completion but ``current`` names the candidate: journal
            ``SwitchCommitted`` first ("treat as switched").
        close_open_attempt: an attempt was begun and never judged (crash or reboot inside it): journal it
            as failed first, so it stays spent.
    """

    attempts_left: int
    confirm_switch: bool = False
    close_open_attempt: bool = False


@attrs.frozen
class Commit:
    """A health attempt passed durably but ``UpgradeCommitted`` is missing: commit, publish, close."""


@attrs.frozen
class Rollback:
    """The active candidate is out of attempts (or failed): roll back to ``to_slot``.

    Attributes:
        reason: one line for ``RollbackStarted`` and the result.
        to_slot: the slot ``last-good`` named when the switch was intended (a ``rollback`` episode: the
            slot ``current`` named before, :attr:`EpisodeView.return_slot`).
        close_open_attempt: as in :class:`ResumeHealth`.
    """

    reason: str
    to_slot: Slot
    close_open_attempt: bool = False


@attrs.frozen
class FinishRollback:
    """``RollbackStarted`` has no completion: point ``current`` at ``to_slot`` again (idempotent), check it.

    Attributes:
        to_slot: the rollback's target slot.
        attempts_left: health attempts left for the last-good.
        close_open_attempt: a last-good attempt was begun and never judged.
    """

    to_slot: Slot
    attempts_left: int
    close_open_attempt: bool = False


@attrs.frozen
class PublishAndClose:
    """A terminal result is durable but unpublished: publish it, append ``ResultPublished``, close.

    Attributes:
        result: the result to publish.
    """

    result: UpgradeResult


@attrs.frozen
class SettleHostMove:
    """A ``host move`` cut after ``HostMoveIntended``: the host decides whether its exchange landed (finish
    and commit) or not (remove the copy and abort); see :func:`upgrade_core._hostmove.settle_host_move`."""


@attrs.frozen
class CloseOnly:
    """The result is published; only ``EpisodeClosed`` is missing."""

    result: UpgradeResult


Plan = (
    NoOp | Abort | ResumeHealth | Commit | Rollback | FinishRollback | PublishAndClose | CloseOnly
    | LeaveStopped | CheckLeftStopped | SettleHostMove
)
"""What recovery does; the orchestrator carries out the plan's fields as given."""


def decide(view: JournalView, facts: HostFacts) -> Plan:
    """Choose what recovery does, from the journal's durable prefix and the host (design §4.5).

    A journal unreadable in the middle never reaches here: reading it raises
    :class:`~upgrade_core.errors.JournalUnreadableError` (file and offset, exit 3) and nothing is touched.

    Args:
        view: the folded journal.
        facts: what the host shows.

    Returns:
        One plan. The rules, in design §4.5's order:

        - no open episode -> :class:`NoOp`, unless ``current`` names a candidate an ``activate`` left
          stopped (:attr:`JournalView.left_stopped`), ``current`` still names it and the unit is known to
          be neither ``inactive`` nor unread -> :class:`CheckLeftStopped` (design §4.7);
        - opened, never reached ``SwitchIntended`` -> :class:`Abort`;
        - ``SwitchIntended`` without ``SwitchCommitted``: ``current`` names the candidate slot and that
          slot holds the candidate -> treat as switched (:class:`ResumeHealth` with ``confirm_switch``, or
          :class:`Rollback` when no attempt is left); otherwise :class:`Abort` (never downgrade);
        - an ``activate`` that found the unit stopped, switched (or its switch landed) ->
          :class:`LeaveStopped`;
        - switched, not committed: a passed attempt -> :class:`Commit`; attempts left ->
          :class:`ResumeHealth`; none -> :class:`Rollback` (an install, with nothing to roll back to,
          -> :class:`Abort`);
        - a terminal state not published -> :class:`PublishAndClose` (after ``UpgradeCommitted``: never
          a rollback; after ``StagedForActivation``: ``staged``);
        - ``RollbackStarted`` without ``RolledBack`` -> :class:`FinishRollback`;
        - ``HostMoveIntended`` without ``HostMoved`` -> :class:`SettleHostMove` (the host decides);
        - published, not closed -> :class:`CloseOnly`.
    """
    ep = view.open_episode
    if ep is None:
        return _decide_closed(view.left_stopped, facts)
    return _decide_open(ep, facts)


def _decide_closed(left: LeftStoppedCandidate | None, facts: HostFacts) -> Plan:
    """Nothing open: a candidate left stopped is checked once the unit was started (design §4.7), and only
    while ``current`` still names it (recovery never moves ``current`` onto an unchecked candidate)."""
    if left is None:
        return NoOp()
    if facts.links.current != left.slot:
        return NoOp(
            f"current names {facts.links.current}, not {left.slot}, the candidate activate {left.operation} "
            "left stopped; nothing to check"
        )
    if left.changed:
        return NoOp(
            f"current names {left.slot}, whose bytes are no longer those activate {left.operation} switched "
            "to; run upgrade-agent rollback"
        )
    unit_state = facts.unit_active_state
    if unit_state is None or unit_state == "inactive":
        return NoOp(
            f"current names {left.slot} ({left.version}), switched to with the unit stopped by activate "
            f"{left.operation}; it is checked once the unit runs"
        )
    return CheckLeftStopped(left)


def _decide_open(ep: EpisodeView, facts: HostFacts) -> Plan:
    state = ep.state
    if state in (_S.OPENED, _S.FETCHED, _S.STAGED, _S.VERIFIED):
        return Abort("interrupted before the switch")
    if state is _S.SWITCHING:
        landed = facts.links.current == ep.candidate_slot and (
            facts.candidate_slot_sha256 is None or facts.candidate_slot_sha256 == ep.candidate_sha256
        )
        if not landed:
            return Abort("interrupted before the switch took effect")
        if ep.unit_found_stopped:
            return LeaveStopped(confirm_switch=True)
        return _active_candidate(ep, confirm_switch=True)
    if state is _S.SWITCHED and ep.unit_found_stopped:
        return LeaveStopped()
    if state in (_S.SWITCHED, _S.RESTARTED):
        return _active_candidate(ep, confirm_switch=False)
    if state is _S.HEALTHY:
        return Commit()
    if state is _S.MOVING:
        return SettleHostMove()
    if state is _S.ROLLING_BACK:
        assert ep.rollback_slot is not None
        open_attempt = ep.rollback_attempts_started > ep.rollback_attempts_failed
        return FinishRollback(ep.rollback_slot, ep.rollback_attempts_left, open_attempt)
    if state in TERMINAL_STATES:
        result = ep.terminal_result
        assert result is not None
        return PublishAndClose(result)
    if state is _S.PUBLISHED:
        assert ep.published is not None
        return CloseOnly(ep.published)
    # NEW and CLOSED are never the state of an open episode.
    raise AssertionError(f"decide: open episode {ep.episode_id} in state {state.value}")


def _active_candidate(ep: EpisodeView, *, confirm_switch: bool) -> Plan:
    open_attempt = ep.health_attempt_open
    if ep.health_attempts_left > 0:
        return ResumeHealth(ep.health_attempts_left, confirm_switch, open_attempt)
    reason = ep.unhealthy_reason(ep.health_failure or "out of health attempts")
    to_slot = ep.return_slot
    if ep.kind == "install" or to_slot is None:
        return Abort(reason)
    return Rollback(reason, to_slot, open_attempt)

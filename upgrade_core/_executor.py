"""The step executor: the checked append every flow uses, and the bracket around one effect.

:class:`CheckedJournal` is the one way to append: the event is checked with THE rule
(:func:`upgrade_core.next_state`, table and context) *before* the append, so an event that breaks a rule
never becomes durable. :class:`StepExecutor` runs one step as a bracket: an intent event (when recovery
must re-check the host for the effect) made durable first, then the effect, then its completion event,
checked before the effect (h11's "validate before send") and appended after it. Appends are shielded from
cancellation. No I/O of its own: the journal and the effects are the ports'.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from . import _events as ev
from ._events import Recorded
from ._fold import Folder
from ._state import EpisodeState, advance
from .ports import Journal

_R = TypeVar("_R")


class CheckedJournal:
    """The one way a flow appends: check with THE rule, append durably (shielded), fold the record.

    Holds the journal port and the :class:`Folder` that mirrors it. :meth:`append` checks the event with
    :func:`upgrade_core.next_state` against the folder's state and :class:`~upgrade_core.EpisodeContext`
    *before* anything reaches the journal (h11's "validate before send"), so an event breaking a lifecycle
    rule raises and the journal is left byte-identical and replayable.

    Args:
        journal: the journal port (the caller holds the host lock).
        folder: the folded journal; every append is applied to it.
    """

    def __init__(self, journal: Journal, folder: Folder) -> None:
        self.journal = journal
        self.folder = folder

    def check(self, episode_id: str, event: ev.Event) -> EpisodeState:
        """The state ``event`` would lead to; appends nothing.

        Raises:
            IllegalTransitionError: the event breaks a lifecycle rule (design §4.2) in this state and context.
        """
        return self.folder.check(episode_id, event)

    def check_kind(self, episode_id: str, event_type: type[ev.Event]) -> None:
        """The table allows an event of ``event_type`` next (used before an effect whose completion event
        depends on the effect's outcome; the full rule is checked again at :meth:`append`).

        Raises:
            IllegalTransitionError: the table has no such transition from the episode's state.
        """
        advance(self.folder.state_of(episode_id), event_type.TAG)

    async def append(self, episode_id: str, event: ev.Event) -> Recorded:
        """Check, append durably (shielded from cancellation), apply to the folder.

        Args:
            episode_id: the episode (= operation id).
            event: the event.

        Returns:
            The durable record.

        Raises:
            IllegalTransitionError: the event breaks a lifecycle rule; nothing was appended.
            JournalDurabilityError: the append failed (ENOSPC, poisoned journal); the journal port's error.
        """
        self.check(episode_id, event)
        with anyio.CancelScope(shield=True):
            record = await self.journal.append(episode_id, event)
        self.folder.apply(record)
        return record


class StepExecutor:
    """Runs a flow's steps over a :class:`CheckedJournal`: :meth:`emit` appends one event, :meth:`bracket`
    surrounds one effect with its intent and completion events.

    Args:
        journal: the checked journal every append goes through.
    """

    def __init__(self, journal: CheckedJournal) -> None:
        self.journal = journal

    async def emit(self, op: str, event: ev.Event) -> None:
        """Append ``event`` to episode ``op`` through the checked journal (checked, durable, folded)."""
        await self.journal.append(op, event)

    async def bracket(
        self,
        op: str,
        effect: Callable[[], Awaitable[_R]],
        completion: ev.Event | Callable[[_R], ev.Event],
        *,
        kind: type[ev.Event] | None = None,
        intent: ev.Event | None = None,
        shield: bool = False,
    ) -> _R:
        """intent (durable) -> effect -> completion, the completion checked before the effect.

        Args:
            op: the episode.
            effect: the side effect.
            completion: the completion event, or a function of the effect's outcome building it (then
                ``kind`` names its class, checked against the table before the effect).
            kind: the completion's class when ``completion`` is a function.
            intent: an event made durable before the effect (recovery re-checks the host for it).
            shield: shield the effect and the completion from cancellation.

        Returns:
            The effect's outcome.
        """
        if intent is not None:
            await self.emit(op, intent)
        if isinstance(completion, ev.Event):
            self.journal.check(op, completion)
        else:
            assert kind is not None, "bracket: a completion built from the outcome needs its kind"
            self.journal.check_kind(op, kind)
        with anyio.CancelScope(shield=shield):
            outcome = await effect()
            event = completion if isinstance(completion, ev.Event) else completion(outcome)
            await self.emit(op, event)
        return outcome


__all__ = ["CheckedJournal", "StepExecutor"]

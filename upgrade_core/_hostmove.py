"""``upgrade-agent host move``: a host root that ``install`` adopted as a link to the legacy root becomes a
real directory holding the layout, as one journaled episode of kind ``host-move`` (docs/host.md, "Moving a
linked host into a real root"; the seeds' ``hostroot_move.go``). Pure: the files are the :class:`HostMover`
port's.

The episode::

    EpisodeOpened(kind host-move) -> HostMoveIntended(root, legacy root, copy's directory, slots judged)
      -> [copy the layout beside the root; check the copy holds the bytes judged; exchange it with the
          link in one rename; remove the old link] -> HostMoved(root) -> ResultPublished(committed)
      -> EpisodeClosed

A failure before the exchange removes the copy and aborts (the link and the legacy layout as they were); a
crash anywhere is settled by recovery from what the host shows (:func:`settle_host_move`): the exchange
landed (the root is a real directory) -> finish and commit; it did not -> remove the copy and abort. The
unit's ``ExecStart`` names ``R/lib/NAME/NAME-current`` throughout, which resolves through the link before the
exchange and through the real directory after it, so the agent unit keeps running and restarts from either;
the legacy layout's files stay where they are (the agent did not make them, and a process started from them
keeps executing them).

**Predates.** The move is refused while a slot that ``current`` or ``last-good`` names *predates the host
root*: the bytes it holds now (its sha256, read from the host) are not the bytes an episode of this host last
installed in it (:attr:`~upgrade_core.JournalView.installed_digests`, from ``CandidateInstalled``, kept across
compaction and quarantine). A legacy layout adopted as it was holds such slots until upgrades replace them
(the seeds' reason: a binary of a release older than the host root writes its files under the legacy root, so
rolling back to it must find them there); a slot whose bytes changed by hand counts as predating too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from . import _events as ev
from ._events import Slot, UpgradeResult
from ._fold import EpisodeView, Folder, JournalView
from .errors import HostError
from .ports import HostMover, LinkState, Ports

__all__ = ["move_refusal", "open_host_move", "settle_host_move"]


class _Run(Protocol):
    """What the host move needs of :class:`upgrade_core._steps.FlowRun` (which imports this module)."""

    p: Ports
    folder: Folder

    def ep(self, op: str) -> EpisodeView: ...

    async def emit(self, op: str, event: ev.Event) -> Any: ...

    async def bracket(
        self, op: str, effect: Callable[[], Awaitable[Any]], completion: ev.Event, *,
        intent: ev.Event | None = None, shield: bool = False,
    ) -> Any: ...

    async def abort(self, op: str, reason: str) -> UpgradeResult: ...

    async def publish_close(self, op: str, result: UpgradeResult | None = None) -> UpgradeResult: ...


def move_refusal(view: JournalView, links: LinkState, digests: Mapping[Slot, str | None]) -> str | None:
    """Why a host move may not start now, or None (see the module doc for "predates").

    Args:
        view: the folded journal.
        links: what ``current`` and ``last-good`` name.
        digests: each slot's sha256 read from the host now (None: missing or empty).

    Returns:
        One line naming the slot and what is wrong, or None.
    """
    if view.open_episode is not None:
        return f"episode {view.open_episode.episode_id} is open; run recover-agent-upgrade first"
    if links.current is None or links.last_good is None:
        return "current or last-good names no slot; run upgrade-agent install first"
    for which, slot in (("current", links.current), ("last-good", links.last_good)):
        sha = digests.get(slot)
        if sha is None:
            return f"slot {slot} ({which}) is missing or empty"
        if view.installed_digests.get(slot) != sha:
            return (
                f"slot {slot} ({which}) predates the host root: its bytes ({sha[:12]}) were not installed by "
                "an episode of this host (the legacy layout held them when install adopted it, or they were "
                "changed by hand); an upgrade that replaces them lets the move go ahead"
            )
    return None


async def open_host_move(
    run: _Run, operation: str, intent: ev.HostMoveIntended, from_version: str | None,
) -> UpgradeResult:
    """Open the ``host-move`` episode and carry it out (the module doc); the caller checked
    :func:`move_refusal` under the host lock.

    Returns:
        ``committed`` (the root is a real directory) or ``aborted`` (a failure before the exchange; the copy
        was removed, the link kept).

    Raises:
        HostError: a failure after the exchange (the episode stays open; recovery finishes it).
        JournalError: an append failed.
    """
    mover = _mover(run)
    # A host move restarts and checks nothing: its health policy fields are nominal.
    opened = ev.EpisodeOpened(
        operation=operation, kind="host-move", source=f"host move {intent.legacy_root} -> {intent.root}",
        expected_sha256=None, expected_version=None, from_slot=intent.current_slot, from_version=from_version,
        max_health_attempts=1, stability_s=0.0, health_timeout_s=1.0, boot_id=run.p.clock.boot_id(),
    )
    await run.emit(operation, opened)
    staging = intent.staging_path

    async def effect() -> None:
        copied = await mover.copy(staging)
        for slot, want in ((intent.current_slot, intent.current_sha256),
                           (intent.last_good_slot, intent.last_good_sha256)):
            if copied.get(slot) != want:
                raise HostError(f"{staging}: the copy of slot {slot} does not hold the bytes checked "
                                f"({want[:12]}); not moved")
        await mover.swap(staging)
        await mover.finish(staging)

    try:
        await run.bracket(operation, effect, ev.HostMoved(intent.root), intent=intent, shield=True)
    except HostError as exc:
        if mover.landed(staging):
            raise  # the root is a real directory already: recovery finishes the episode
        await mover.undo(staging)
        return await run.abort(operation, f"host move undone before the exchange: {exc}")
    return await run.publish_close(operation)


async def settle_host_move(run: _Run, op: str) -> UpgradeResult:
    """Recovery of a ``host-move`` episode cut after ``HostMoveIntended`` (decide's ``SettleHostMove``): the
    host decides. The exchange landed -> remove the old link, ``HostMoved``, publish ``committed``; it did not
    -> remove the copy, publish ``aborted`` (the link and the legacy layout untouched).

    Raises:
        HostError: a step failed, or this process has no :class:`HostMover` (the episode stays open).
    """
    ep = run.ep(op)
    assert ep.move is not None
    mover = _mover(run)
    staging = ep.move.staging_path
    if mover.landed(staging):
        await run.bracket(op, lambda: mover.finish(staging), ev.HostMoved(ep.move.root), shield=True)
        return await run.publish_close(op)
    await mover.undo(staging)
    return await run.abort(op, "host move interrupted before the exchange: the copy was removed, the link "
                               "kept")


def _mover(run: _Run) -> HostMover:
    mover = run.p.mover
    if mover is None:
        raise HostError("a host move cannot be carried out here: no host mover is wired")
    return mover

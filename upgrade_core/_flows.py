"""The eight flows: upgrade (or its staging alone), activate, install, operator rollback, self-upgrade
(prepare, then resume in the new process), recovery and the quarantine record (design §4.3-4.5, 7, 10).
Against the ports of :mod:`upgrade_core.ports` only; no I/O of its own.

Each flow settles what an earlier run left open, checks its preconditions, then strings together the steps
of :class:`~upgrade_core._steps.FlowRun`. Every append goes through :mod:`upgrade_core._executor`, checked
with THE rule before it is made durable; an effect that recovery must re-check follows a durable intent
event.

Phases: once an episode is open and before ``SwitchIntended``, ANY exception aborts it (``Aborted``
published and closed): an :class:`~upgrade_core.errors.UpgradeError` then returns the ``aborted`` result, a
cancellation or another exception (a bug) is re-raised after the abort; only a
:class:`~upgrade_core.errors.JournalError` (nothing can be journaled) passes through untouched. After
``SwitchIntended`` the whole flow is shielded and carries on to a terminal state.

Each flow folds the journal once (or uses the caller's :class:`Folder`) and reads ``host.links()`` once at
its start, again only after a recovery may have changed the host.

The caller holds the host lock (design §4.3 step 1, 4.6 inv. 7); signals are the CLI's.
"""

from __future__ import annotations

import anyio

from . import _events as ev
from ._decide import Abort, FinishRollback, HostFacts, ResumeHealth, Rollback, decide
from ._events import EpisodeKind, Slot, Trigger, UpgradeResult, other_slot
from ._flow_types import HandedOff, Policy, RestartScheduled, ResumeOutcome, UpgradeRequest
from ._fold import Folder
from ._health import Failed, Passed
from ._hostmove import move_refusal, open_host_move
from ._steps import FlowRun
from .errors import (
    AlreadyInstalledError,
    HostMoveRefusedError,
    NothingStagedError,
    NothingToRollBackError,
    NotInstalledError,
    SecurityVersionError,
    UnverifiedCurrentError,
)
from .ports import Host, LinkState, Ports


def _installed_links(host: Host) -> LinkState:
    links = host.links()
    if links.current is None:
        raise NotInstalledError(f"not installed: {host.current_link_path()} does not exist")
    return links


async def _settle(run: FlowRun, op: str) -> UpgradeResult | None:
    """design §4.3 step 1: a closed ``op`` returns its result; an open episode is recovered first."""
    view = run.folder.view()
    prior = view.result_of(op)
    if prior is not None:
        return prior
    open_ep = view.open_episode
    if open_ep is not None:
        result = await run.recover_open("upgrade")
        assert isinstance(result, UpgradeResult)  # only a boot recovery hands off
        if open_ep.episode_id == op:
            return result
    return None


def _refuse_unverified_current(run: FlowRun, current: Slot) -> None:
    """design §4.7: while ``current`` names a candidate an ``activate`` left stopped, staging would overwrite
    the slot ``last-good`` names, the host's only verified binary; refused before any episode opens (not
    once ``current`` was pointed elsewhere by hand: the candidate's slot is then the inactive one).

    Raises:
        UnverifiedCurrentError: exit 2, naming the slot, the version and what to run.
    """
    left = run.folder.view().left_stopped
    if left is not None and left.slot == current:
        raise UnverifiedCurrentError(
            f"current names {left.slot} ({left.version}), switched to with the unit stopped by activate "
            f"{left.operation} and not checked yet: start the unit and run recover-agent-upgrade, or run "
            "upgrade-agent rollback"
        )


async def _settled_run(
    ports: Ports, policy: Policy, folder: Folder | None, op: str
) -> tuple[FlowRun, UpgradeResult | None]:
    """A flow's run over the folded journal, with :func:`_settle`'s answer for ``op`` (None: go on)."""
    run = FlowRun(ports, policy, folder)
    return run, await _settle(run, op)


async def run_upgrade(
    ports: Ports, policy: Policy, request: UpgradeRequest, *, folder: Folder | None = None
) -> UpgradeResult:
    """The supervised flow, design §4.3 steps 2-9 (the caller holds the host lock).

    Args:
        ports: the world.
        policy: agent name, unit and health policy.
        request: operation id, source, expected digest and version.
        folder: the caller's already-folded journal (it owns it; the flow applies its own appends to it, so
            ``folder.state_of(op)`` and ``folder.view()`` are current afterwards), or None to fold
            ``ports.journal.records()`` here.

    Returns:
        The terminal result: ``committed``, ``noop``, ``aborted`` (any error before the switch; the reason
        names the URL (redacted) or file), ``rolled_back`` or ``needs_attention``; for ``request.stage``
        (``upgrade --stage``) ``staged`` once the verified candidate is installed in the inactive slot,
        nothing switched (or ``noop``/``aborted``). A closed operation id returns its recorded result
        without doing anything.

    Raises:
        ValueError: ``folder`` does not end where the journal ends (caller misuse).
        NotInstalledError: ``current`` does not exist (exit 2), before any episode opened.
        LayoutConflictError: a link is a real file (exit 2), before anything changed.
        JournalError: an append failed (exit 3); the episode is left to ``recover``.
        HistoryError: the journal's history is illegal (exit 3); nothing was touched.
        Exception: a bug before the switch, re-raised after the episode was aborted; any error after
            ``SwitchIntended`` leaves the episode to ``recover``.
    """
    run = FlowRun(ports, policy, folder)
    settled = await _settle(run, request.operation)
    if settled is not None:
        return settled
    links = _installed_links(ports.host)
    current = links.current
    assert current is not None
    _refuse_unverified_current(run, current)
    await run.open_episode(request, "upgrade", current)
    done = await run.pre_switch(request, other_slot(current), links)
    if done is not None:
        return done
    with anyio.CancelScope(shield=True):
        await run.switch(request.operation, current)  # last-good names current by now (step 3)
        result = await run.after_switch(request.operation, run.ep(request.operation).health_attempts_left)
    return result


async def run_activate(
    ports: Ports, policy: Policy, operation: str, *, folder: Folder | None = None
) -> UpgradeResult:
    """``activate``: switch to the candidate ``upgrade --stage`` left in the inactive slot, then restart and
    health-check exactly as :func:`run_upgrade` does (the caller holds the host lock; docs/cli.md).

    The journal's staged candidate (:attr:`JournalView.staged`) is the one switched to: an episode of kind
    ``activate`` opens (source ``staged <slot> by <operation>``, the staged digest and version expected),
    the slot's bytes are hashed again and the fact journaled (``StagedCandidateChecked``); only when they
    still have the staged digest does the switch follow (``last-good`` joins ``current`` first should it
    have moved), then mirrors, restarts, health attempts, commit or rollback, as in design §4.3 steps 5-9.
    The version command is not run again: the digest proves the bytes are the ones staging verified.

    An agent unit found ``inactive`` (stopped on purpose) before the switch is journaled
    (``UnitFoundStopped``); the episode then switches ``current`` and ends there (``LeftStopped``, result
    ``switched_stopped``): the unit is not started, the mirrors are not written, ``last-good`` stays on the
    verified slot (design §4.7). A ``failed`` unit is started and checked as usual.

    Args:
        ports, policy, folder: as :func:`run_upgrade`.
        operation: the operation id.

    Returns:
        ``committed``, ``rolled_back`` or ``needs_attention`` as :func:`run_upgrade`; ``switched_stopped``
        when the unit was found stopped; ``aborted`` when the unit could not be read before the switch, when
        the staged bytes changed (the reason names the slot and both digests; nothing switched, the staged
        candidate forgotten) or on a signal before the switch. A closed operation id returns its recorded
        result.

    Raises:
        NotInstalledError: ``current`` does not exist (exit 2), before any episode opened.
        NothingStagedError: the journal knows no staged candidate, or a link names its slot (exit 2),
            before any episode opened.
        JournalError, HistoryError: as :func:`run_upgrade`.
    """
    run, settled = await _settled_run(ports, policy, folder, operation)
    if settled is not None:
        return settled
    host = ports.host
    links = _installed_links(host)
    current = links.current
    assert current is not None
    staged = run.folder.view().staged
    if staged is None:
        raise NothingStagedError("nothing staged: run upgrade --stage first")
    if staged.slot in (current, links.last_good):
        which = "current" if staged.slot == current else "last-good"
        raise NothingStagedError(f"nothing staged: {which} names slot {staged.slot}, where the staged "
                                 f"candidate of operation {staged.operation} was")
    label = f"staged {staged.slot} by {staged.operation}"
    request = UpgradeRequest(operation, label, label, expected_sha256=staged.sha256,
                             expected_version=staged.version)
    await run.open_episode(request, "activate", current)

    async def check() -> bool:
        checked = ev.StagedCandidateChecked(staged.operation, staged.slot, staged.sha256, None,
                                            staged.version)
        await run.recheck(operation, checked, "staged candidate", "staged", "stage it again")
        unit = await ports.service.snapshot()
        if unit.active_state == "inactive":  # stopped on purpose (design §4.7); ``failed`` is not
            await run.emit(operation, ev.UnitFoundStopped(unit.active_state, unit.sub_state))
        if links.last_good != current:
            await run.bracket(operation, lambda: host.point_last_good(current), ev.LastGoodRepointed(current),
                              shield=True)
        return True

    done = await run.guard_pre_switch(operation, check)
    if done is not None:
        return done
    with anyio.CancelScope(shield=True):
        await run.switch(operation, current)
        if run.ep(operation).unit_found_stopped:
            return await run.leave_stopped(operation)
        result = await run.after_switch(operation, run.ep(operation).health_attempts_left)
    return result


async def run_install(
    ports: Ports, policy: Policy, request: UpgradeRequest, *, folder: Folder | None = None
) -> UpgradeResult:
    """Install on a bare host (design §7 ``install``): stage into blue, point ``current`` AND ``last-good``
    at blue, health-check; on failure abort and report (the agent removes what it created).

    Args:
        ports, policy, request, folder: as :func:`run_upgrade`.

    Returns:
        ``committed``, or ``aborted`` (a bare host has nothing to roll back to).

    Raises:
        AlreadyInstalledError: ``current`` exists (use upgrade; the CLI turns an equal digest into noop).
        JournalError, HistoryError: as :func:`run_upgrade`.
    """
    run = FlowRun(ports, policy, folder)
    settled = await _settle(run, request.operation)
    if settled is not None:
        return settled
    links = ports.host.links()
    if links.current is not None:
        raise AlreadyInstalledError(f"already installed at {ports.host.current_link_path()}; use upgrade")
    op = request.operation
    await run.open_episode(request, "install", None)
    done = await run.pre_switch(request, "blue", links)
    if done is not None:
        return done
    with anyio.CancelScope(shield=True):
        await run.switch(op, links.last_good)
        await run.bracket(op, lambda: ports.host.point_last_good("blue"), ev.LastGoodRepointed("blue"))
        result = await run.after_switch(op, run.ep(op).health_attempts_left)
    return result


def rollback_target(links: LinkState, current_link: str) -> Slot:
    """The slot ``upgrade-agent rollback`` would switch ``current`` to: the one ``last-good`` names.

    Raises:
        NotInstalledError: ``current`` does not exist (exit 2).
        NothingToRollBackError: ``last-good`` is missing or names ``current``'s slot (exit 2).
    """
    if links.current is None:
        raise NotInstalledError(f"not installed: {current_link} does not exist")
    if links.last_good is None:
        raise NothingToRollBackError("nothing to roll back to: last-good does not exist")
    if links.last_good == links.current:
        raise NothingToRollBackError(
            f"nothing to roll back to: last-good names {links.last_good}, the slot current runs"
        )
    return links.last_good


async def run_rollback(
    ports: Ports,
    policy: Policy,
    operation: str,
    *,
    folder: Folder | None = None,
    below_watermark: bool = False,
) -> UpgradeResult:
    """Operator rollback (design §10 ``rollback``, docs/recovery.md): ``current`` to ``last-good``'s slot as
    an episode of kind ``rollback`` (the caller holds the host lock).

    The flow is the upgrade's from step 4 on, with the last-good slot as the candidate: ``EpisodeOpened``
    (source ``last-good <slot>``, the slot's digest expected) -> its version command
    (``CandidateVerified``) -> ``SwitchIntended``/``SwitchCommitted`` -> mirrors, restarts and health
    attempts (the same bracket and loop) -> ``UpgradeCommitted``. Out of attempts, ``RollbackStarted``
    returns ``current`` to the slot it named before, which is health-checked in turn. ``last-good`` never
    moves: after a commit both links name the rolled-back-to slot (the next upgrade overwrites the other);
    after a failure both links are as they were.

    On a host with an anti-rollback watermark, a last-good whose release is below it (or of no known
    security version) is refused before its version command (``aborted``, the reason names both numbers
    and the override) unless ``below_watermark``; an override that overrode a refusal is journaled in
    ``EpisodeOpened.below_watermark`` (docs/trust.md).

    Args:
        ports, policy, folder: as :func:`run_upgrade`.
        operation: the operation id.
        below_watermark: ``rollback --below-watermark``: roll back below the watermark all the same.

    Returns:
        ``committed`` (``current`` names the last-good slot, healthy; exit 0), ``aborted`` (its version
        command failed, or a signal before the switch: nothing changed; exit 1), ``rolled_back`` (the
        last-good was unhealthy; back on the previous current, healthy; exit 1; the reason names both
        slots and versions) or ``needs_attention`` (neither is healthy; exit 3). A closed operation id
        returns its recorded result.

    Raises:
        NotInstalledError, NothingToRollBackError: before any episode opened (exit 2), journal unchanged.
        JournalError, HistoryError: as :func:`run_upgrade`.
    """
    run, settled = await _settled_run(ports, policy, folder, operation)
    if settled is not None:
        return settled
    host = ports.host
    links = host.links()
    target = rollback_target(links, host.current_link_path())
    current = links.current
    assert current is not None
    sha = await host.slot_sha256(target)
    if sha is None:
        raise NothingToRollBackError(f"nothing to roll back to: slot {target} ({host.slot_path(target)}) "
                                     "is missing or empty")
    label = f"last-good {target}"
    request = UpgradeRequest(operation, label, label, expected_sha256=sha)
    view = run.folder.view()
    refusal = view.rollback_refusal(target, sha)
    # journaled only when it overrides a refusal: the episode says the operator went below the watermark
    overridden = refusal is not None and below_watermark
    await run.open_episode(request, "rollback", current, below_watermark=overridden)
    path = host.slot_path(target)

    async def verify() -> bool:
        if refusal is not None and not below_watermark:
            raise SecurityVersionError(refusal)
        await run.bracket(operation, lambda: ports.verifier.verify(path, None), ev.CandidateVerified,
                          kind=ev.CandidateVerified)
        return True

    done = await run.guard_pre_switch(operation, verify)
    if done is not None:
        return done
    with anyio.CancelScope(shield=True):
        await run.switch(operation, target, target)
        result = await run.after_switch(operation, run.ep(operation).health_attempts_left)
    return result


async def self_upgrade_prepare(
    ports: Ports, policy: Policy, request: UpgradeRequest, *, folder: Folder | None = None
) -> UpgradeResult | RestartScheduled:
    """The self-upgrade flow (design §4.4): steps 1-5 in the running daemon, then schedule its own restart.

    Args:
        ports, policy, request, folder: as :func:`run_upgrade`.

    Returns:
        :class:`RestartScheduled` (the new process must call :func:`resume_self_upgrade`), or a terminal
        result (aborted, noop, or a recorded result of this operation).

    Raises:
        As :func:`run_upgrade`.
    """
    run = FlowRun(ports, policy, folder)
    settled = await _settle(run, request.operation)
    if settled is not None:
        return settled
    links = _installed_links(ports.host)
    current = links.current
    assert current is not None
    _refuse_unverified_current(run, current)
    op = request.operation
    await run.open_episode(request, "self_upgrade", current)
    done = await run.pre_switch(request, other_slot(current), links)
    if done is not None:
        return done
    with anyio.CancelScope(shield=True):
        await run.switch(op, current)
        failure = await run.sync_mirrors(op)
        if failure is not None:
            return await run.out_of_attempts(op, failure)
        name = run.unit_name("restart", op, 0)
        await run.emit(op, ev.RestartRequested(name, ports.clock.monotonic()))
        await ports.service.restart(name)
    return RestartScheduled(op, name)


async def resume_self_upgrade(ports: Ports, policy: Policy, *, folder: Folder | None = None) -> ResumeOutcome:
    """The new process's start-up check (design §4.4): am I the candidate, healthy for the window? Commit.

    Spends one candidate attempt (journaled before it runs) through the same loop as every health check.
    Rollbacks are never run from here (this process lives inside the unit it would restart): on
    ``failed`` the daemon exits non-zero without serving, and ``OnFailure=`` recovery rolls back once the
    attempts are spent.

    Args:
        ports, policy, folder: as :func:`run_upgrade`.

    Returns:
        The :class:`ResumeOutcome`.

    Raises:
        JournalError, HistoryError: as :func:`run_upgrade`.
    """
    run = FlowRun(ports, policy, folder)
    open_ep = run.folder.view().open_episode
    if open_ep is None or open_ep.kind != "self_upgrade":
        return ResumeOutcome("none")
    op = open_ep.episode_id
    await run.emit(op, ev.RecoveryStarted("resume"))
    ep = run.ep(op)
    sha = await ports.host.slot_sha256(ep.candidate_slot) if ep.candidate_slot is not None else None
    plan = decide(run.folder.view(), HostFacts(ports.host.links(), sha))
    match plan:
        case ResumeHealth(attempts_left=left, confirm_switch=confirm, close_open_attempt=close):
            assert ep.candidate_slot is not None
            if confirm:
                await run.emit(op, ev.SwitchCommitted(ep.candidate_slot))
            if close:
                await run.close_attempt(op, "candidate")
            verdict = await run.health_attempts(op, "candidate", ep.candidate_slot, 1, restart=False)
            if isinstance(verdict, Passed):
                return ResumeOutcome("committed", await run.commit(op))
            assert isinstance(verdict, Failed)
            return ResumeOutcome("failed", None, verdict.reason, left - 1)
        case Rollback(reason=reason) | Abort(reason=reason) if ep.switch_landed:
            return ResumeOutcome("failed", None, reason, 0)
        case FinishRollback():
            return ResumeOutcome("none")
        case _:
            with anyio.CancelScope(shield=True):
                result = await run.execute(op, plan, "resume")
            assert isinstance(result, UpgradeResult)  # only a boot recovery hands off
            return ResumeOutcome("none", result)


async def recover(
    ports: Ports, policy: Policy, trigger: Trigger, *, folder: Folder | None = None
) -> UpgradeResult | HandedOff:
    """``recover-agent-upgrade`` (design §4.5): replay, look at the host, decide, act; crash-safe and
    repeatable.

    Args:
        ports: the world (the caller holds the lock).
        policy: agent name and polling; the health policy comes from the episode's own record.
        trigger: ``boot`` (never waits for the agent; hands any health check to a transient unit),
            ``on-failure``, ``manual``.
        folder: as :func:`run_upgrade`.

    Returns:
        The terminal result of the episode it closed; ``UpgradeResult(None, "noop")`` when nothing was
        open; :class:`HandedOff` when a ``boot`` recovery handed the health check to a transient unit (the
        episode stays open, owned by that unit).

    Raises:
        HistoryError: the journal's order is illegal: links untouched (exit 3).
        JournalError: an append failed, or the journal is unreadable (exit 3).
    """
    run = FlowRun(ports, policy, folder)
    return await run.recover_open(trigger)


async def record_quarantine(
    ports: Ports,
    policy: Policy,
    operation: str,
    facts: ev.JournalQuarantined,
    *,
    folder: Folder | None = None,
) -> UpgradeResult:
    """Record a quarantine (design §10 ``journal quarantine``) as the new journal's first episode.

    The caller holds the host lock, has moved the old journal directory aside and read ``facts`` from the
    host (links, slot digests, versions). One closed ``quarantine`` episode: ``EpisodeOpened`` ->
    ``JournalQuarantined`` -> ``ResultPublished(noop)`` -> ``EpisodeClosed``; every event checked by THE
    rule before its append. A crash part-way leaves an open episode that ``recover`` closes (aborted before
    the record, noop after it); nothing here touches links, slots or units.

    Args:
        ports: the world; only the journal and the result sink are used.
        policy: the health policy recorded at opening (unused by this kind, kept for recovery's sake).
        operation: the episode id (``quarantine-<UTC time>``).
        facts: what the host shows, with the quarantine path.
        folder: as :func:`run_upgrade`.

    Returns:
        ``noop`` from ``facts.current_slot`` at ``facts.current_version``, with the quarantine path as reason.

    Raises:
        IllegalTransitionError: another episode is open in this journal (it must be a fresh one).
        JournalError: an append failed.
    """
    result = UpgradeResult(
        operation, "noop", facts.current_version, facts.current_version, facts.current_slot,
        f"journal quarantined to {facts.quarantine_path}",
    )
    await _record_only(ports, policy, folder, "quarantine", facts.quarantine_path, facts, result)
    return result


async def record_trust_reset(
    ports: Ports,
    policy: Policy,
    operation: str,
    cleared: ev.TrustReset,
    *,
    current: Slot | None,
    current_version: str | None,
    folder: Folder | None = None,
) -> UpgradeResult:
    """Record ``trust reset`` (docs/trust.md): one closed ``trust-reset`` episode, ``EpisodeOpened`` ->
    ``TrustReset`` -> ``ResultPublished(noop)`` -> ``EpisodeClosed``, every event checked by THE rule.
    From the ``TrustReset`` record on, the watermark and the known-bad marks journaled before it no longer
    count. The caller holds the host lock; nothing here touches links, slots or units. A crash part-way
    leaves an open episode that ``recover`` closes (aborted before the record: nothing was cleared).

    Args:
        ports: the world; only the journal, the clock and the result sink are used.
        policy: recorded at opening (unused by this kind).
        operation: the episode id (``trust-reset-<UTC time>``).
        cleared: what it clears (the watermark and known-bad digests the journal holds now).
        current / current_version: the slot ``current`` names and its version, as the journal knows them.
        folder: as :func:`run_upgrade`.

    Returns:
        ``noop`` on ``current``, the reason naming what was cleared.

    Raises:
        IllegalTransitionError: another episode is open (recover it first).
        JournalError: an append failed.
    """
    what = "none" if cleared.security_watermark is None else str(cleared.security_watermark)
    result = UpgradeResult(
        operation, "noop", current_version, current_version, current,
        f"trust reset: watermark {what} and {len(cleared.known_bad)} known-bad release(s) cleared",
    )
    await _record_only(ports, policy, folder, "trust-reset", "trust reset", cleared, result)
    return result


async def run_host_move(
    ports: Ports,
    policy: Policy,
    operation: str,
    *,
    root: str,
    legacy_root: str,
    staging_path: str,
    digests: dict[Slot, str | None],
    folder: Folder | None = None,
) -> UpgradeResult:
    """``upgrade-agent host move`` (docs/host.md): refuse by :func:`~upgrade_core.move_refusal`, else open a
    ``host-move`` episode and move the host root (:mod:`upgrade_core._hostmove`). The caller holds the host
    lock and checked that ``root`` is a link to ``legacy_root``.

    Args:
        ports: the world; ``ports.mover`` does the files.
        policy: as :func:`run_upgrade`.
        operation: the episode id.
        root / legacy_root: ``host.root`` and what it links to.
        staging_path: the copy's directory beside ``root`` (absent).
        digests: each slot's sha256 read from the host now (None: missing or empty).
        folder: as :func:`run_upgrade`.

    Returns:
        ``committed`` or ``aborted`` (undone before the exchange).

    Raises:
        HostMoveRefusedError: :func:`~upgrade_core.move_refusal` says why (exit 2); nothing journaled.
        HostError: a failure after the exchange (the episode stays open for recovery).
        JournalError: an append failed.
    """
    run = FlowRun(ports, policy, folder)
    view = run.folder.view()
    links = ports.host.links()
    refusal = move_refusal(view, links, digests)
    if refusal is not None:
        raise HostMoveRefusedError(f"{root}: not moved: {refusal}")
    assert links.current is not None and links.last_good is not None  # move_refusal checked both
    current_sha, last_good_sha = digests[links.current], digests[links.last_good]
    assert current_sha is not None and last_good_sha is not None
    intent = ev.HostMoveIntended(root, legacy_root, staging_path, links.current, current_sha, links.last_good,
                                 last_good_sha)
    with anyio.CancelScope(shield=True):
        result = await open_host_move(run, operation, intent, view.slot_versions.get(links.current))
    return result


async def _record_only(
    ports: Ports,
    policy: Policy,
    folder: Folder | None,
    kind: EpisodeKind,
    source: str,
    fact: ev.Event,
    result: UpgradeResult,
) -> None:
    """An episode that only records ``fact`` (nothing on the host changes): open, fact, publish ``result``,
    close; shielded, so that a cancellation never leaves it half written by us."""
    assert result.operation is not None
    operation = result.operation
    run = FlowRun(ports, policy, folder)
    opened = ev.EpisodeOpened(
        operation=operation, kind=kind, source=source, expected_sha256=None,
        expected_version=None, from_slot=result.slot, from_version=result.from_version,
        max_health_attempts=policy.max_attempts, stability_s=policy.stability_s,
        health_timeout_s=policy.health_timeout_s, boot_id=ports.clock.boot_id(),
    )
    with anyio.CancelScope(shield=True):
        await run.emit(operation, opened)
        await run.emit(operation, fact)
        await run.publish_close(operation, result)


__all__ = [
    "record_quarantine",
    "record_trust_reset",
    "recover",
    "resume_self_upgrade",
    "rollback_target",
    "run_activate",
    "run_host_move",
    "run_install",
    "run_rollback",
    "run_upgrade",
    "self_upgrade_prepare",
]

"""The async flows of SPEC 4.3-4.5, against the ports of :mod:`upgrade_core.ports` only. No I/O of its own.

Every effect is bracketed: the transition of its completion event is checked with ``advance`` *before*
the effect (h11's "validate before send"), an intent event is durable before an effect that recovery must
re-check (``SwitchIntended``, ``RestartRequested``, ``HealthAttemptStarted``, ``RollbackStarted``), and a
completion event follows it. Journal appends and link flips are shielded from cancellation. After
``SwitchIntended`` the whole flow is shielded and carries on to a terminal state; before it, a
cancellation aborts cleanly (``Aborted`` published and closed) and is then re-raised.

The caller holds the host lock (SPEC 4.3 step 1, 4.6 inv. 7); signals are the CLI's.
"""

from __future__ import annotations

import re
from typing import Literal

import anyio
import attrs

from . import _events as ev
from ._decide import (
    Abort,
    CloseOnly,
    Commit,
    FinishRollback,
    HostFacts,
    NeedsAttention,
    NoOp,
    PublishAndClose,
    ResumeHealth,
    Rollback,
    decide,
)
from ._events import EpisodeKind, HealthTarget, Slot, Trigger, UpgradeResult, other_slot
from ._fold import EpisodeView, Folder
from ._health import Expectation, Failed, HealthJudge, Passed, Pending, Verdict
from ._state import EpisodeState, advance
from .errors import (
    AlreadyInstalledError,
    CandidateError,
    FetchError,
    HostError,
    JournalDurabilityError,
    NotInstalledError,
    ServiceError,
    UsageError,
)
from .ports import (
    ArchiveSource,
    Clock,
    HealthProbe,
    Host,
    IdSource,
    Journal,
    ResultSink,
    ServiceManager,
    Verifier,
)

_S = EpisodeState
OPERATION_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""Operation ids (SPEC 4.3 step 1)."""


@attrs.frozen
class Ports:
    """Everything the orchestrator may touch (SPEC 2). ``agent.wiring`` and ``tests/sim`` build one."""

    journal: Journal
    clock: Clock
    host: Host
    source: ArchiveSource
    verifier: Verifier
    service: ServiceManager
    probe: HealthProbe
    sink: ResultSink
    ids: IdSource


@attrs.frozen
class Policy:
    """The knobs the flows need (from the ``[agent]``, ``[health]`` and ``[journal]`` config sections).

    Attributes:
        agent: NAME, used in transient unit names.
        unit: the agent unit, e.g. ``demo-agent.service``.
        stability_s: seconds the new process must hold every health condition.
        health_timeout_s: seconds per health attempt.
        max_attempts: health attempts per episode (recorded in ``EpisodeOpened``).
        poll_interval_s: seconds between health samples (SPEC 4.3 step 7: 0.25).
        keep_episodes: closed episodes the journal keeps (compaction; informational here).
    """

    agent: str
    unit: str
    stability_s: float = 3.0
    health_timeout_s: float = 60.0
    max_attempts: int = 3
    poll_interval_s: float = 0.25
    keep_episodes: int = 50

    def __attrs_post_init__(self) -> None:
        if self.max_attempts < 1 or self.stability_s < 0 or self.health_timeout_s <= 0:
            raise ValueError("Policy: max_attempts >= 1, stability_s >= 0 and health_timeout_s > 0")


@attrs.frozen
class UpgradeRequest:
    """One upgrade (or install) request.

    Attributes:
        operation: the operation id, ``[A-Za-z0-9._-]{1,64}``.
        source: the archive URL or path as given; only :class:`ArchiveSource` sees it (it may hold secrets).
        source_redacted: the same without userinfo, query or fragment; the only form journaled (C08).
        expected_sha256: 64 lowercase hex of the compressed archive, or None.
        expected_version: ``--expect-version``, or None.

    Raises:
        UsageError: a malformed operation id.
    """

    operation: str
    source: str
    source_redacted: str
    expected_sha256: str | None = None
    expected_version: str | None = None

    def __attrs_post_init__(self) -> None:
        if not OPERATION_RE.fullmatch(self.operation):
            raise UsageError(f"operation id {self.operation!r} must match [A-Za-z0-9._-]{{1,64}}")


@attrs.frozen
class RestartScheduled:
    """The self-upgrade flow switched and scheduled its own restart (SPEC 4.4); the episode stays open.

    Attributes:
        operation: the episode.
        unit: the transient restart unit's name.
    """

    operation: str
    unit: str


@attrs.frozen
class ResumeOutcome:
    """What :func:`resume_self_upgrade` found.

    Attributes:
        status: ``none`` (nothing to resume: serve), ``committed`` (serve), or ``failed`` (exit non-zero
            without serving; systemd's restart and ``OnFailure=`` take it from there).
        result: the published result when the episode closed, else None.
        reason: one line for ``failed``.
        attempts_left: candidate attempts left after this one.
    """

    status: Literal["none", "committed", "failed"]
    result: UpgradeResult | None = None
    reason: str | None = None
    attempts_left: int = 0


_PRE_SWITCH_ERRORS = (CandidateError, FetchError, HostError)


class _Run:
    """One process's view of the journal plus the helpers every flow shares."""

    def __init__(self, ports: Ports, policy: Policy) -> None:
        self.p = ports
        self.policy = policy
        self.folder = Folder()
        self.folder.apply_all(ports.journal.records())

    # -- journal -----------------------------------------------------------------------------------------
    def ep(self, op: str) -> EpisodeView:
        return self.folder.episode(op)

    def check(self, op: str, event_type: type[ev.Event]) -> None:
        """Raise IllegalTransitionError unless ``event_type`` may follow ``op``'s state (before an effect)."""
        advance(self.folder.state_of(op), event_type.TAG)

    async def emit(self, op: str, event: ev.Event) -> None:
        """Check the transition, append durably (shielded), and fold the record."""
        advance(self.folder.state_of(op), event.TAG)
        with anyio.CancelScope(shield=True):
            record = await self.p.journal.append(op, event)
        self.folder.apply(record)

    # -- publishing ----------------------------------------------------------------------------------------
    async def publish_close(self, op: str) -> UpgradeResult:
        """Result to the sink, then ``ResultPublished``, then ``EpisodeClosed`` (SPEC 4.3 step 9, inv. 5)."""
        ep = self.ep(op)
        result = ep.terminal_result
        if result is None:
            raise AssertionError(f"publish_close: episode {op} in state {ep.state.value} has no result")
        with anyio.CancelScope(shield=True):
            if ep.state is not _S.PUBLISHED:
                self.check(op, ev.ResultPublished)
                await self.p.sink.publish(result)
                await self.emit(op, ev.ResultPublished(result))
            await self.emit(op, ev.EpisodeClosed(result.result))
        return result

    async def abort(self, op: str, reason: str) -> UpgradeResult:
        """Discard staging leftovers, never touch links, journal ``Aborted``, publish, close."""
        with anyio.CancelScope(shield=True):
            ep = self.ep(op)
            if ep.staging_path is not None and not ep.installed:
                await self.p.host.discard_staging(ep.staging_path)
            await self.p.host.sweep_staging()
            await self.emit(op, ev.Aborted(reason))
            result = await self.publish_close(op)
        return result

    # -- steps 2-5 ---------------------------------------------------------------------------------------
    async def open_episode(self, req: UpgradeRequest, kind: EpisodeKind, from_slot: Slot | None) -> None:
        view = self.folder.view()
        from_version = view.slot_versions.get(from_slot) if from_slot is not None else None
        await self.p.host.sweep_staging()  # leftovers of an earlier crash (C05); never a slot target
        await self.emit(req.operation, ev.EpisodeOpened(
            operation=req.operation, kind=kind, source=req.source_redacted,
            expected_sha256=req.expected_sha256, expected_version=req.expected_version,
            from_slot=from_slot, from_version=from_version, max_health_attempts=self.policy.max_attempts,
            stability_s=self.policy.stability_s, health_timeout_s=self.policy.health_timeout_s,
        ))

    async def stage_and_verify(self, req: UpgradeRequest, slot: Slot, current: Slot | None) -> bool:
        """Fetch + stage into ``slot``, noop check, verify, repoint last-good, install. False on noop."""
        op = req.operation
        host = self.p.host
        staging_path = await host.prepare_staging(slot)
        self.check(op, ev.ArchiveFetched)
        staged = await self.p.source.stage(req.source, req.expected_sha256, staging_path, slot)
        await self.emit(op, ev.ArchiveFetched(staged.archive_size, staged.archive_sha256))
        await self.emit(op, ev.CandidateStaged(staged.slot, staged.sha256, staged.size, staged.staging_path))
        if current is not None and staged.sha256 == await host.slot_sha256(current):
            with anyio.CancelScope(shield=True):
                await host.discard_staging(staged.staging_path)
                version = self.folder.view().slot_versions.get(current)
                await self.emit(op, ev.CandidateUnchanged(current, version))
                await self.publish_close(op)
            return False
        self.check(op, ev.CandidateVerified)
        version = await self.p.verifier.verify(staged.staging_path, req.expected_version)
        await self.emit(op, ev.CandidateVerified(version))
        if current is not None:
            links = host.links()
            if links.last_good != current:
                # The slot last-good names is about to be overwritten: last-good joins current first.
                self.check(op, ev.LastGoodRepointed)
                with anyio.CancelScope(shield=True):
                    await host.point_last_good(current)
                    await self.emit(op, ev.LastGoodRepointed(current))
        self.check(op, ev.CandidateInstalled)
        with anyio.CancelScope(shield=True):
            await host.install_staged(staged)
            await self.emit(op, ev.CandidateInstalled(staged.slot, staged.sha256))
        return True

    async def pre_switch(self, req: UpgradeRequest, slot: Slot, current: Slot | None) -> UpgradeResult | None:
        """Steps 3-4 with clean aborts: a terminal result (aborted/noop), or None to go on to the switch."""
        op = req.operation
        try:
            if not await self.stage_and_verify(req, slot, current):
                result = self.folder.view().result_of(op)
                assert result is not None
                return result
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self.abort(op, "interrupted before the switch")
            raise
        except JournalDurabilityError:
            raise
        except _PRE_SWITCH_ERRORS as exc:
            return await self.abort(op, str(exc))
        return None

    async def switch(self, op: str) -> None:
        """Step 5: ``SwitchIntended`` -> flip ``current`` -> ``SwitchCommitted`` (shielded by the caller)."""
        ep = self.ep(op)
        slot = ep.candidate_slot
        assert slot is not None
        links = self.p.host.links()
        await self.emit(op, ev.SwitchIntended(slot, ep.from_slot, links.last_good))
        self.check(op, ev.SwitchCommitted)  # (after the intent; the intent's state allows it)
        await self.p.host.point_current(slot)
        await self.emit(op, ev.SwitchCommitted(slot))

    async def sync_mirrors(self, op: str) -> str | None:
        """Mirrors get a copy checked by digest; returns a failure reason, or None."""
        ep = self.ep(op)
        assert ep.candidate_slot is not None and ep.candidate_sha256 is not None
        self.check(op, ev.MirrorsSynced)
        try:
            paths = await self.p.host.sync_mirrors(ep.candidate_slot, ep.candidate_sha256)
        except HostError as exc:
            return f"mirror sync failed: {exc}"
        await self.emit(op, ev.MirrorsSynced(paths))
        return None

    # -- steps 6-9 ---------------------------------------------------------------------------------------
    async def after_switch(self, op: str, *, close_open_attempt: bool = False) -> UpgradeResult:
        ep = self.ep(op)
        if not ep.mirrors_synced and ep.attempts_started == 0:
            failure = await self.sync_mirrors(op)
            if failure is not None:
                return await self.out_of_attempts(op, failure)
        if self.p.service.runs_inside_unit():
            # C15: a restart from inside the agent's cgroup would kill us; a transient unit runs 6-9.
            if close_open_attempt:
                await self.close_attempt(op, "candidate")
            return await self.hand_off_and_wait(op)
        return await self.health_phase(op, close_open_attempt=close_open_attempt)

    async def close_attempt(self, op: str, target: HealthTarget) -> None:
        ep = self.ep(op)
        n = ep.attempts_started if target == "candidate" else ep.rollback_attempts_started
        await self.emit(op, ev.HealthFailed(n, "attempt interrupted before its verdict", target))

    async def health_phase(self, op: str, *, close_open_attempt: bool = False) -> UpgradeResult:
        """Candidate attempts until one passes (commit) or none is left (rollback)."""
        if close_open_attempt:
            await self.close_attempt(op, "candidate")
        ep = self.ep(op)
        reason = ep.health_failure or "out of health attempts"
        while ep.health_attempts_left > 0:
            n = ep.attempts_started + 1
            await self.emit(op, ev.HealthAttemptStarted(n, "candidate"))
            assert ep.candidate_slot is not None
            verdict = await self.attempt(op, n, ep.candidate_slot, restart=True)
            if isinstance(verdict, Passed):
                await self.emit(op, ev.HealthPassed(n, "candidate"))
                return await self.commit(op)
            assert isinstance(verdict, Failed)
            await self.emit(op, ev.HealthFailed(n, verdict.reason, "candidate"))
            reason = verdict.reason
            ep = self.ep(op)
        return await self.out_of_attempts(
            op, f"candidate unhealthy after {ep.max_health_attempts} attempt(s): {reason}"
        )

    async def commit(self, op: str) -> UpgradeResult:
        ep = self.ep(op)
        assert ep.candidate_slot is not None
        await self.emit(op, ev.UpgradeCommitted(ep.candidate_slot, ep.candidate_version))
        return await self.publish_close(op)

    async def out_of_attempts(self, op: str, reason: str) -> UpgradeResult:
        ep = self.ep(op)
        if ep.kind == "install" or ep.switch_last_good is None:
            return await self.abort(op, reason)
        await self.start_rollback(op, reason, ep.switch_last_good)
        return await self.finish_rollback(op)

    async def start_rollback(self, op: str, reason: str, to_slot: Slot) -> None:
        await self.emit(op, ev.RollbackStarted(reason, to_slot))
        await self.p.host.point_current(to_slot)

    async def finish_rollback(self, op: str, *, close_open_attempt: bool = False) -> UpgradeResult:
        """Point ``current`` at the rollback slot (idempotent), health-check it, close the episode."""
        if close_open_attempt:
            await self.close_attempt(op, "last_good")
        ep = self.ep(op)
        to_slot = ep.rollback_slot
        assert to_slot is not None
        await self.p.host.point_current(to_slot)
        if ep.mirrors:
            # The mirrors got the candidate at the switch; they follow current back (idempotent copies
            # checked by digest), or an operator must look: a mirror must never keep a rolled-back binary.
            try:
                sha = await self.p.host.slot_sha256(to_slot)
                if sha is None:
                    raise HostError(f"rollback slot {to_slot} is missing or empty")
                await self.p.host.sync_mirrors(to_slot, sha)
            except HostError as exc:
                await self.emit(op, ev.AttentionNeeded(f"mirrors not restored to {to_slot}: {exc}"))
                return await self.publish_close(op)
        reason = "no attempt left for the last-good"
        while ep.rollback_attempts_left > 0:
            n = ep.rollback_attempts_started + 1
            await self.emit(op, ev.HealthAttemptStarted(n, "last_good"))
            verdict = await self.attempt(op, n, to_slot, restart=True)
            if isinstance(verdict, Passed):
                await self.emit(op, ev.HealthPassed(n, "last_good"))
                await self.emit(op, ev.RolledBack(to_slot))
                return await self.publish_close(op)
            assert isinstance(verdict, Failed)
            await self.emit(op, ev.HealthFailed(n, verdict.reason, "last_good"))
            reason = verdict.reason
            ep = self.ep(op)
        await self.emit(op, ev.AttentionNeeded(f"last-good {to_slot} failed its own health check: {reason}"))
        return await self.publish_close(op)

    async def attempt(self, op: str, n: int, slot: Slot, *, restart: bool) -> Verdict:
        """One health attempt (SPEC 4.3 steps 6-7): restart through a transient unit, then judge samples."""
        p = self.p
        ep = self.ep(op)
        baseline_pid: int | None = None
        baseline_inv: str | None = None
        requested = ep.restart_requested_monotonic or 0.0
        if restart:
            try:
                before = await p.service.snapshot()
                baseline_pid, baseline_inv = before.main_pid, before.invocation_id
            except ServiceError:
                pass  # no baseline: the new process is recognised by its start time instead
            name = f"{self.policy.agent}-restart-{op[:8]}-{n}-{p.ids.token_hex(2)}"
            requested = p.clock.monotonic()
            await self.emit(op, ev.RestartRequested(name, requested))
            try:
                await p.service.restart(name)
            except ServiceError as exc:
                return Failed(f"restart failed: {exc}")
        judge = HealthJudge(
            Expectation(
                slot_path=p.host.slot_path(slot), current_link_path=p.host.current_link_path(),
                restart_requested_monotonic=requested, baseline_pid=baseline_pid,
                baseline_invocation=baseline_inv, stability_s=ep.stability_s, timeout_s=ep.health_timeout_s,
            ),
            p.clock.monotonic(),
        )
        logged = False
        while True:
            try:
                snap = await p.service.snapshot()
            except ServiceError as exc:
                return Failed(f"cannot read the unit: {exc}")
            probe_failure = await p.probe.check()
            verdict = judge.observe(snap, probe_failure, p.clock.monotonic())
            seen = judge.observed
            if seen is not None and not logged:
                logged = True
                await self.emit(op, ev.RestartObserved(seen[0], seen[1]))
            if not isinstance(verdict, Pending):
                return verdict
            await p.clock.sleep(self.policy.poll_interval_s)

    async def hand_off_and_wait(self, op: str) -> UpgradeResult:
        """Hand steps 6-9 to a transient ``recover --trigger manual`` unit; poll until the episode closes."""
        p = self.p
        name = f"{self.policy.agent}-recover-{op[:8]}-{p.ids.token_hex(2)}"
        await p.journal.relinquish()
        await p.service.hand_off_recovery(name, after_unit=False)
        ep = self.ep(op)
        deadline = p.clock.monotonic() + 2 * ep.max_health_attempts * (ep.health_timeout_s + 5.0) + 60.0
        while True:
            records = await p.journal.reread()
            folder = Folder()
            folder.apply_all(records)
            result = folder.view().result_of(op)
            if result is not None:
                self.folder = folder  # the transient unit appended: continue from what is on disk
                return result
            if p.clock.monotonic() > deadline:
                raise ServiceError(f"handed-off recovery unit {name} did not close episode {op} in time")
            await p.clock.sleep(self.policy.poll_interval_s)

    # -- recovery (SPEC 4.5) -------------------------------------------------------------------------------
    async def recover_open(self, trigger: Trigger) -> UpgradeResult | None:
        view = self.folder.view()
        open_ep = view.open_episode
        if open_ep is None:
            return UpgradeResult(None, "noop")
        op = open_ep.episode_id
        with anyio.CancelScope(shield=True):
            result = await self._recover_episode(op, trigger)
        return result

    async def _recover_episode(self, op: str, trigger: Trigger) -> UpgradeResult | None:
        await self.emit(op, ev.RecoveryStarted(trigger))
        ep = self.ep(op)
        sha = None
        if ep.state is _S.SWITCHING and ep.candidate_slot is not None:
            sha = await self.p.host.slot_sha256(ep.candidate_slot)
        plan = decide(self.folder.view(), HostFacts(self.p.host.links(), sha))
        boot = trigger == "boot"
        match plan:
            case Abort(reason=reason):
                return await self.abort(op, reason)
            case ResumeHealth(confirm_switch=confirm, close_open_attempt=close):
                if confirm:
                    assert ep.candidate_slot is not None
                    await self.emit(op, ev.SwitchCommitted(ep.candidate_slot))
                if boot:
                    await self.boot_hand_off(op, close, "candidate")
                    return None
                return await self.after_switch(op, close_open_attempt=close)
            case Commit():
                return await self.commit(op)
            case Rollback(reason=reason, to_slot=to_slot, close_open_attempt=close):
                if close:
                    await self.close_attempt(op, "candidate")
                await self.start_rollback(op, reason, to_slot)
                if boot:
                    await self.boot_hand_off(op, False, "last_good")
                    return None
                return await self.finish_rollback(op)
            case FinishRollback(to_slot=to_slot, close_open_attempt=close):
                if boot:
                    await self.p.host.point_current(to_slot)
                    await self.boot_hand_off(op, close, "last_good")
                    return None
                return await self.finish_rollback(op, close_open_attempt=close)
            case PublishAndClose() | CloseOnly():
                return await self.publish_close(op)
            case NoOp() | NeedsAttention():
                pass
        raise AssertionError(f"recover: unexpected plan {plan!r} for open episode {op}")

    async def boot_hand_off(self, op: str, close: bool, target: HealthTarget) -> None:
        """Boot trigger: never wait for the agent; journal the spent attempt, hand the check off."""
        if close:
            await self.close_attempt(op, target)
        name = f"{self.policy.agent}-recover-{op[:8]}-{self.p.ids.token_hex(2)}"
        await self.p.service.hand_off_recovery(name, after_unit=True)


def _current_or_fail(host: Host) -> Slot:
    current = host.links().current
    if current is None:
        raise NotInstalledError(f"not installed: {host.current_link_path()} does not exist")
    return current


async def _settle(run: _Run, op: str) -> UpgradeResult | None:
    """SPEC 4.3 step 1: a closed ``op`` returns its result; an open episode is recovered first."""
    view = run.folder.view()
    prior = view.result_of(op)
    if prior is not None:
        return prior
    open_ep = view.open_episode
    if open_ep is not None:
        result = await run.recover_open("upgrade")
        if open_ep.episode_id == op:
            return result
    return None


async def run_upgrade(ports: Ports, policy: Policy, request: UpgradeRequest) -> UpgradeResult:
    """The supervised flow, SPEC 4.3 steps 2-9 (the caller holds the host lock).

    Args:
        ports: the world.
        policy: agent name, unit and health policy.
        request: operation id, source, expected digest and version.

    Returns:
        The terminal result: ``committed``, ``noop``, ``aborted`` (bad candidate, fetch error; the reason
        names the URL (redacted) or file), ``rolled_back`` or ``needs_attention``. A closed operation id
        returns its recorded result without doing anything.

    Raises:
        NotInstalledError: ``current`` does not exist (exit 2).
        JournalDurabilityError: an append failed (exit 3); the episode is left to ``recover``.
        HistoryError: the journal's history is illegal (exit 3); nothing was touched.
        LayoutConflictError: a link is a real file (exit 2), before anything changed.
    """
    run = _Run(ports, policy)
    settled = await _settle(run, request.operation)
    if settled is not None:
        return settled
    current = _current_or_fail(ports.host)
    await run.open_episode(request, "upgrade", current)
    done = await run.pre_switch(request, other_slot(current), current)
    if done is not None:
        return done
    with anyio.CancelScope(shield=True):
        await run.switch(request.operation)
        result = await run.after_switch(request.operation)
    return result


async def run_install(ports: Ports, policy: Policy, request: UpgradeRequest) -> UpgradeResult:
    """Install on a bare host (SPEC 7 ``install``): stage into blue, point ``current`` AND ``last-good``
    at blue, health-check; on failure abort and report (the agent removes what it created).

    Raises:
        AlreadyInstalledError: ``current`` exists (use upgrade; the CLI turns an equal digest into noop).
        JournalDurabilityError, HistoryError: as :func:`run_upgrade`.
    """
    run = _Run(ports, policy)
    settled = await _settle(run, request.operation)
    if settled is not None:
        return settled
    if ports.host.links().current is not None:
        raise AlreadyInstalledError(f"already installed at {ports.host.current_link_path()}; use upgrade")
    op = request.operation
    await run.open_episode(request, "install", None)
    done = await run.pre_switch(request, "blue", None)
    if done is not None:
        return done
    with anyio.CancelScope(shield=True):
        await run.switch(op)
        await ports.host.point_last_good("blue")
        await run.emit(op, ev.LastGoodRepointed("blue"))
        result = await run.after_switch(op)
    return result


async def self_upgrade_prepare(
    ports: Ports, policy: Policy, request: UpgradeRequest
) -> UpgradeResult | RestartScheduled:
    """The self-upgrade flow (SPEC 4.4): steps 1-5 in the running daemon, then schedule its own restart.

    Returns:
        :class:`RestartScheduled` (the new process must call :func:`resume_self_upgrade`), or a terminal
        result (aborted, noop, or a recorded result of this operation).

    Raises:
        As :func:`run_upgrade`.
    """
    run = _Run(ports, policy)
    settled = await _settle(run, request.operation)
    if settled is not None:
        return settled
    current = _current_or_fail(ports.host)
    op = request.operation
    await run.open_episode(request, "self_upgrade", current)
    done = await run.pre_switch(request, other_slot(current), current)
    if done is not None:
        return done
    with anyio.CancelScope(shield=True):
        outcome = await _switch_and_schedule(run, ports, policy, op)
    return outcome


async def _switch_and_schedule(
    run: _Run, ports: Ports, policy: Policy, op: str
) -> UpgradeResult | RestartScheduled:
    await run.switch(op)
    failure = await run.sync_mirrors(op)
    if failure is not None:
        return await run.out_of_attempts(op, failure)
    name = f"{policy.agent}-restart-{op[:8]}-0-{ports.ids.token_hex(2)}"
    await run.emit(op, ev.RestartRequested(name, ports.clock.monotonic()))
    await ports.service.restart(name)
    return RestartScheduled(op, name)


async def resume_self_upgrade(ports: Ports, policy: Policy) -> ResumeOutcome:
    """The new process's start-up check (SPEC 4.4): am I the candidate, healthy for the window? Commit.

    Spends one candidate attempt (journaled before it runs). Rollbacks are never run from here (this
    process lives inside the unit it would restart): on ``failed`` the daemon exits non-zero without
    serving, and ``OnFailure=`` recovery rolls back once the attempts are spent.

    Raises:
        JournalDurabilityError, HistoryError: as :func:`run_upgrade`.
    """
    run = _Run(ports, policy)
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
            if confirm:
                assert ep.candidate_slot is not None
                await run.emit(op, ev.SwitchCommitted(ep.candidate_slot))
            if close:
                await run.close_attempt(op, "candidate")
            n = ep.attempts_started + 1
            await run.emit(op, ev.HealthAttemptStarted(n, "candidate"))
            assert ep.candidate_slot is not None
            verdict = await run.attempt(op, n, ep.candidate_slot, restart=False)
            if isinstance(verdict, Passed):
                await run.emit(op, ev.HealthPassed(n, "candidate"))
                return ResumeOutcome("committed", await run.commit(op))
            assert isinstance(verdict, Failed)
            await run.emit(op, ev.HealthFailed(n, verdict.reason, "candidate"))
            return ResumeOutcome("failed", None, verdict.reason, left - 1)
        case Rollback(reason=reason) | Abort(reason=reason) if ep.switch_landed:
            return ResumeOutcome("failed", None, reason, 0)
        case FinishRollback():
            return ResumeOutcome("none")
        case _:
            result = await run.recover_open("resume")
            return ResumeOutcome("none", result)


async def recover(ports: Ports, policy: Policy, trigger: Trigger) -> UpgradeResult | None:
    """``recover-agent-upgrade`` (SPEC 4.5): replay, look at the host, decide, act; crash-safe and repeatable.

    Args:
        ports: the world (the caller holds the lock).
        policy: agent name and polling; the health policy comes from the episode's own record.
        trigger: ``boot`` (never waits for the agent; hands any health check to a transient unit),
            ``on-failure``, ``manual``.

    Returns:
        The terminal result of the episode it closed; ``UpgradeResult(None, "noop")`` when nothing was
        open; None when a ``boot`` recovery handed the health check to a transient unit (the episode stays
        open, owned by that unit).

    Raises:
        HistoryError: the journal's order is illegal: links untouched (exit 3).
        JournalDurabilityError: an append failed (exit 3).
    """
    run = _Run(ports, policy)
    return await run.recover_open(trigger)


__all__ = [
    "Policy",
    "Ports",
    "RestartScheduled",
    "ResumeOutcome",
    "UpgradeRequest",
    "recover",
    "resume_self_upgrade",
    "run_install",
    "run_upgrade",
    "self_upgrade_prepare",
]

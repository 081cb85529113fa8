"""The steps the flows of :mod:`upgrade_core._flows` are made of, as :class:`FlowRun`: one flow's ports,
policy and folded journal, and the steps of design §4.3-4.5 the flows share. No I/O of its own.

Opening an episode, staging and verifying a candidate, the switch, mirrors, the health phase, rollback,
publishing and closing, and carrying out a recovery plan. Every append goes through
:class:`~upgrade_core._executor.StepExecutor`, which :class:`FlowRun` extends, and most effects through its
bracket. One loop runs health attempts (candidate, rollback, self-upgrade resume); one builder names
transient units; recovery carries out the fields of the plan :func:`decide` returned;
:meth:`FlowRun.guard_pre_switch` is the one copy of the pre-switch phase rule described in
:mod:`upgrade_core._flows`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, Literal

import anyio
import attrs

from . import _events as ev
from ._decide import (
    Abort,
    CheckLeftStopped,
    CloseOnly,
    Commit,
    FinishRollback,
    HostFacts,
    LeaveStopped,
    NoOp,
    Plan,
    PublishAndClose,
    ResumeHealth,
    Rollback,
    SettleHostMove,
    decide,
)
from ._events import EpisodeKind, HealthTarget, Slot, Trigger, UpgradeResult
from ._executor import CheckedJournal, StepExecutor
from ._flow_types import HandedOff, Policy, UpgradeRequest
from ._fold import EpisodeView, Folder, LeftStoppedCandidate
from ._health import Expectation, Failed, HealthJudge, Passed, Pending, backoff_gap
from ._hostmove import settle_host_move
from ._state import EpisodeState
from ._watermark import release_refusal
from .errors import (
    HostError,
    JournalError,
    KnownBadError,
    SecurityVersionError,
    ServiceError,
    SignatureError,
    StagedCandidateChangedError,
    UpgradeError,
    VerifyError,
)
from .ports import LinkState, Ports

_S = EpisodeState
_PRE_SWITCH_STATES: Final = frozenset({_S.OPENED, _S.FETCHED, _S.STAGED, _S.VERIFIED})


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class FlowRun(StepExecutor):
    """One flow's view of the journal (folded once) plus the helpers every flow shares."""

    def __init__(self, ports: Ports, policy: Policy, folder: Folder | None) -> None:
        self.p = ports
        self.policy = policy
        records = ports.journal.records()
        if folder is None:
            folder = Folder()
            folder.apply_all(records)
        elif folder.last_seq != (records[-1].seq if records else 0):
            raise ValueError(
                f"the caller's folder stops at seq {folder.last_seq}, the journal does not: fold it first"
            )
        self.folder = folder
        super().__init__(CheckedJournal(ports.journal, folder))

    # -- journal -----------------------------------------------------------------------------------------
    def ep(self, op: str) -> EpisodeView:
        return self.folder.episode(op)

    def unit_name(self, purpose: Literal["restart", "recover"], op: str, attempt: int | None = None) -> str:
        """The one builder of transient unit names (design §4.3 step 6): ``NAME-restart-<op8>-<n>-<rand4>``,
        ``NAME-recover-<op8>-<rand4>``."""
        middle = f"{op[:8]}-{attempt}" if attempt is not None else op[:8]
        return f"{self.policy.agent}-{purpose}-{middle}-{self.p.ids.token_hex(2)}"

    # -- publishing ----------------------------------------------------------------------------------------
    async def publish_close(self, op: str, result: UpgradeResult | None = None) -> UpgradeResult:
        """Result to the sink, then ``ResultPublished``, then ``EpisodeClosed`` (design §4.3 step 9, inv. 5).

        ``result`` is the plan's (recovery), else the episode's terminal result.
        """
        ep = self.ep(op)
        if result is None:
            result = ep.terminal_result
        if result is None:
            raise AssertionError(f"publish_close: episode {op} in state {ep.state.value} has no result")
        with anyio.CancelScope(shield=True):
            if ep.state is not _S.PUBLISHED:
                await self.bracket(op, lambda: self.p.sink.publish(result), ev.ResultPublished(result))
            await self.emit(op, ev.EpisodeClosed(result.result))
        return result

    async def abort(
        self, op: str, reason: str, cause: Literal["verification"] | None = None
    ) -> UpgradeResult:
        """Discard staging leftovers, never touch links, journal ``Aborted`` (+ cause), publish, close."""
        ep = self.ep(op)

        async def clean() -> None:
            if ep.staging_path is not None and not ep.installed:
                await self.p.host.discard_staging(ep.staging_path)
            await self.p.host.sweep_staging()

        with anyio.CancelScope(shield=True):
            await self.bracket(op, clean, ev.Aborted(reason, cause), shield=True)
            result = await self.publish_close(op)
        return result

    # -- steps 2-5 ---------------------------------------------------------------------------------------
    async def open_episode(
        self, req: UpgradeRequest, kind: EpisodeKind, from_slot: Slot | None, *, below_watermark: bool = False
    ) -> None:
        view = self.folder.view()
        from_version = view.slot_versions.get(from_slot) if from_slot is not None else None
        opened = ev.EpisodeOpened(
            operation=req.operation, kind=kind, source=req.source_redacted,
            expected_sha256=req.expected_sha256, expected_version=req.expected_version,
            from_slot=from_slot, from_version=from_version, max_health_attempts=self.policy.max_attempts,
            stability_s=self.policy.stability_s, health_timeout_s=self.policy.health_timeout_s,
            boot_id=self.p.clock.boot_id(), below_watermark=below_watermark,
        )
        # leftovers of an earlier crash (C05); never a slot target
        await self.bracket(req.operation, self.p.host.sweep_staging, opened)

    async def stage_and_verify(self, req: UpgradeRequest, slot: Slot, links: LinkState) -> bool:
        """Fetch + stage into ``slot``, noop check, verify, repoint last-good, install. False on noop."""
        op = req.operation
        host = self.p.host
        current = links.current
        staging_path = await host.prepare_staging(slot)
        staged = await self.bracket(
            op, lambda: self.p.source.stage(req.source, req.expected_sha256, staging_path, slot),
            lambda s: ev.ArchiveFetched(s.archive_size, s.archive_sha256, s.delta_refused),
            kind=ev.ArchiveFetched,
        )
        await self.emit(op, ev.CandidateStaged(staged.slot, staged.sha256, staged.size, staged.staging_path))
        if current is not None and staged.sha256 == await host.slot_sha256(current):
            version = self.folder.view().slot_versions.get(current)
            with anyio.CancelScope(shield=True):
                await self.bracket(
                    op, lambda: host.discard_staging(staged.staging_path),
                    ev.CandidateUnchanged(current, version),
                )
                await self.publish_close(op)
            return False
        if staged.release is None:
            # an unsigned release carries no security version: on a host with a watermark it could be
            # anything, so it is refused (docs/trust.md)
            unsigned = release_refusal(self.folder.view().security_watermark, None)
            if unsigned is not None:
                raise SecurityVersionError(unsigned)
        known = self.folder.view().known_bad.get(staged.sha256)
        if known is not None and not req.retry_known_bad:
            raise KnownBadError(known.refusal(staged.sha256))
        version = await self.bracket(
            op, lambda: self.p.verifier.verify(staged.staging_path, req.expected_version),
            ev.CandidateVerified, kind=ev.CandidateVerified,
        )
        if staged.release is not None:
            await self.emit(op, self.trusted_release(staged.release, version))
        if current is not None and links.last_good != current:
            # The slot last-good names is about to be overwritten: last-good joins current first.
            await self.bracket(op, lambda: host.point_last_good(current), ev.LastGoodRepointed(current),
                               shield=True)
        installed = ev.CandidateInstalled(staged.slot, staged.sha256)
        await self.bracket(op, lambda: host.install_staged(staged), installed, shield=True)
        return True

    async def stage_for_activation(self, req: UpgradeRequest, slot: Slot, links: LinkState) -> bool:
        """``upgrade --stage``: steps 3-4 of :meth:`stage_and_verify`, then ``StagedForActivation`` and the
        result ``staged`` instead of the switch. Always False (the episode is closed: staged or noop)."""
        op = req.operation
        if not await self.stage_and_verify(req, slot, links):
            return False
        ep = self.ep(op)
        assert ep.candidate_slot is not None and ep.candidate_sha256 is not None
        assert ep.candidate_version is not None and ep.archive_sha256 is not None
        staged = ev.StagedForActivation(ep.candidate_slot, ep.candidate_sha256, ep.candidate_version,
                                        ep.archive_sha256, req.switch_in_window)
        with anyio.CancelScope(shield=True):
            await self.emit(op, staged)
            await self.publish_close(op)
        return False

    def trusted_release(self, release: ev.ReleaseTrusted, version: str) -> ev.ReleaseTrusted:
        """A signed release is for this agent and this version, or it is refused before the switch
        (docs/trust.md).

        Raises:
            SignatureError: the trusted comment names another agent, or another version than the candidate
                reported (the episode aborts: exit 1).
            SecurityVersionError: its ``security_version`` is below the host's watermark
                (:attr:`JournalView.security_watermark`; equal is accepted: a re-release at the same level).
        """
        if release.name != self.policy.agent:
            raise SignatureError(
                f"release signed by key {release.key_id} is for agent {release.name}, not {self.policy.agent}"
            )
        if release.version != version:
            raise SignatureError(
                f"release signed by key {release.key_id} is version {release.version}, "
                f"the candidate reports {version}"
            )
        below = release_refusal(self.folder.view().security_watermark, release.security_version)
        if below is not None:
            raise SecurityVersionError(below)
        return release

    async def pre_switch(self, req: UpgradeRequest, slot: Slot, links: LinkState) -> UpgradeResult | None:
        """Steps 3-4 under the phase rule: a terminal result (aborted/noop, or ``staged`` for a
        ``req.stage`` request), or None to go on to the switch.

        Before ``SwitchIntended`` any exception aborts the open episode (``Aborted`` published, closed): an
        :class:`UpgradeError` returns that result; a cancellation or a bug is re-raised after the abort. A
        :class:`JournalError` passes through (nothing can be journaled).
        """
        steps = self.stage_for_activation if req.stage else self.stage_and_verify
        return await self.guard_pre_switch(req.operation, lambda: steps(req, slot, links))

    async def guard_pre_switch(self, op: str, steps: Callable[[], Awaitable[bool]]) -> UpgradeResult | None:
        """Run the pre-switch ``steps`` of ``op`` under the phase rule of :meth:`pre_switch` (the one copy);
        ``steps`` returns False when it already closed the episode (noop)."""
        try:
            if not await steps():
                result = self.folder.view().result_of(op)
                assert result is not None
                return result
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self.abort(op, "interrupted before the switch")
            raise
        except JournalError:
            raise
        except Exception as exc:
            if self.folder.state_of(op) not in _PRE_SWITCH_STATES:
                raise  # the episode already reached its verdict (noop): nothing left to abort
            reason = str(exc) if isinstance(exc, UpgradeError) else f"{type(exc).__name__}: {_one_line(exc)}"
            # Only the candidate's own verification failure condemns its digest (known-bad, docs/trust.md).
            condemned = isinstance(exc, VerifyError) and exc.condemns_release
            result = await self.abort(op, reason, "verification" if condemned else None)
            if isinstance(exc, UpgradeError):
                return result
            raise
        return None

    async def switch(self, op: str, last_good: Slot | None, slot: Slot | None = None) -> None:
        """Step 5: ``SwitchIntended`` -> flip ``current`` -> ``SwitchCommitted`` (shielded by the caller).

        ``last_good`` is what ``last-good`` names now (the flow's one read of the links, plus its own
        repointing); ``slot`` the slot to switch to (default: the staged candidate's; a rollback names
        last-good's).
        """
        ep = self.ep(op)
        slot = slot or ep.candidate_slot
        assert slot is not None

        async def flip() -> None:
            await self.p.host.point_current(slot)

        await self.bracket(op, flip, ev.SwitchCommitted(slot),
                           intent=ev.SwitchIntended(slot, ep.from_slot, last_good))

    async def sync_mirrors(self, op: str) -> str | None:
        """Mirrors get a copy checked by digest; returns a failure reason, or None."""
        ep = self.ep(op)
        slot, sha = ep.candidate_slot, ep.candidate_sha256
        assert slot is not None and sha is not None
        try:
            await self.bracket(op, lambda: self.p.host.sync_mirrors(slot, sha), ev.MirrorsSynced,
                               kind=ev.MirrorsSynced)
        except HostError as exc:
            return f"mirror sync failed: {exc}"
        return None

    # -- steps 6-9 ---------------------------------------------------------------------------------------
    async def after_switch(
        self, op: str, attempts_left: int, *, close_open_attempt: bool = False
    ) -> UpgradeResult:
        """Mirrors (once), then the candidate's health phase here or in a handed-off transient unit."""
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
        return await self.health_phase(op, attempts_left, close_open_attempt=close_open_attempt)

    async def close_attempt(self, op: str, target: HealthTarget) -> None:
        """Journal a begun, never judged attempt as failed, so it stays spent."""
        ctx = self.folder.context_of(op)
        n = ctx.attempts_started if target == "candidate" else ctx.rollback_attempts_started
        interrupted = ev.HealthFailed(n, "attempt interrupted before its verdict", target, "environment")
        await self.emit(op, interrupted)

    async def health_attempts(
        self, op: str, target: HealthTarget, slot: Slot, budget: int, *, restart: bool = True
    ) -> Passed | Failed | None:
        """THE health-attempt loop (design §4.3 steps 6-8): up to ``budget`` attempts on ``slot``.

        Each attempt is journaled before it runs (``HealthAttemptStarted``, so a crash loop spends its
        attempts) and after its verdict (``HealthPassed``/``HealthFailed``).

        Returns:
            :class:`Passed` at the first passing attempt, the last :class:`Failed`, or None when
            ``budget`` is 0.
        """
        verdict: Passed | Failed | None = None
        for _ in range(budget):
            ctx = self.folder.context_of(op)
            n = (ctx.attempts_started if target == "candidate" else ctx.rollback_attempts_started) + 1
            await self.emit(op, ev.HealthAttemptStarted(n, target))
            verdict = await self.attempt(op, n, slot, restart=restart)
            if isinstance(verdict, Passed):
                await self.emit(op, ev.HealthPassed(n, target))
                return verdict
            verdict = self.pointed(verdict)
            cause: Literal["environment"] | None = "environment" if verdict.environment else None
            await self.emit(op, ev.HealthFailed(n, verdict.reason, target, cause))
        return verdict

    def pointed(self, verdict: Failed) -> Failed:
        """``verdict`` with where to read the service's own words: ``; see journalctl -u UNIT -n 50``
        (a failed attempt that says nothing about the environment only; journalctl(1))."""
        if verdict.environment:
            return verdict
        where = f"see journalctl -u {self.p.service.unit} -n 50"
        return attrs.evolve(verdict, reason=f"{verdict.reason}; {where}")

    async def health_phase(
        self, op: str, attempts_left: int, *, close_open_attempt: bool = False
    ) -> UpgradeResult:
        """Candidate attempts until one passes (commit) or none is left (rollback)."""
        if close_open_attempt:
            await self.close_attempt(op, "candidate")
        ep = self.ep(op)
        assert ep.candidate_slot is not None
        verdict = await self.health_attempts(op, "candidate", ep.candidate_slot, attempts_left)
        if isinstance(verdict, Passed):
            return await self.commit(op)
        reason = verdict.reason if verdict is not None else ep.health_failure or "out of health attempts"
        return await self.out_of_attempts(op, ep.unhealthy_reason(reason))

    async def leave_stopped(self, op: str) -> UpgradeResult:
        """design §4.7: the switch of an ``activate`` that found the unit stopped landed; ``LeftStopped``,
        publish ``switched_stopped``, close. Nothing is started, copied or repointed."""
        slot = self.ep(op).candidate_slot
        assert slot is not None
        await self.emit(op, ev.LeftStopped(slot))
        return await self.publish_close(op)

    async def check_left_stopped(self, left: LeftStoppedCandidate, trigger: Trigger) -> UpgradeResult:
        """design §4.7: the unit runs (or failed) on a candidate an ``activate`` left stopped: an episode of
        kind ``activate`` (id ``<operation>-check-<seq>``, source ``left stopped by <operation>: <slot>``)
        hashes ``current``'s slot again
        (``StagedCandidateChecked``), journals a switch to the slot ``current`` already names (so recovery
        knows the candidate and where it returns), then runs the activation's health phase: commit, or
        roll back to the slot ``last-good`` names. Bytes that changed abort it: nothing switched, and the
        candidate stays left stopped for an operator (``rollback``)."""
        # unique in this journal by construction: the seq its opening will have (an id never reused, even
        # by the next process after a crash)
        op = f"{left.operation[:32]}-check-{self.folder.last_seq + 1}"
        label = f"left stopped by {left.operation}: {left.slot}"
        request = UpgradeRequest(op, label, label, expected_sha256=left.sha256, expected_version=left.version)
        await self.open_episode(request, "activate", left.slot)
        await self.emit(op, ev.RecoveryStarted(trigger))

        async def check() -> bool:
            checked = ev.StagedCandidateChecked(left.staged_by, left.slot, left.sha256, None, left.version)
            await self.recheck(op, checked, "candidate", "activated", "run upgrade-agent rollback")
            return True

        done = await self.guard_pre_switch(op, check)
        if done is not None:
            return done
        with anyio.CancelScope(shield=True):
            await self.switch(op, left.last_good)
            result = await self.after_switch(op, self.ep(op).health_attempts_left)
        return result

    async def recheck(self, op: str, staged: ev.StagedCandidateChecked, what: str, recorded: str,
                      hint: str) -> None:
        """Hash ``staged.slot`` again and journal what it holds (``staged`` with the digest found now): the
        one check of an ``activate`` (docs/cli.md) and of the check of a candidate left stopped (design
        §4.7).

        Raises:
            StagedCandidateChangedError: the bytes no longer hash to ``staged.staged_sha256`` (or the slot is
                missing or empty); the message names ``what``, the slot, its path, both digests (the
                journal's as ``recorded``) and ``hint``.
        """
        p = self.p
        sha = await p.host.slot_sha256(staged.slot)
        checked = attrs.evolve(staged, sha256=sha)
        await self.emit(op, checked)
        if not checked.matches:
            now = sha[:12] if sha is not None else "missing or empty"
            raise StagedCandidateChangedError(
                f"{what} in slot {staged.slot} ({p.host.slot_path(staged.slot)}) changed: sha256 {now}, "
                f"{recorded} {staged.staged_sha256[:12]}; {hint}"
            )

    async def commit(self, op: str) -> UpgradeResult:
        ep = self.ep(op)
        assert ep.candidate_slot is not None
        await self.emit(op, ev.UpgradeCommitted(ep.candidate_slot, ep.candidate_version))
        return await self.publish_close(op)

    async def out_of_attempts(self, op: str, reason: str) -> UpgradeResult:
        ep = self.ep(op)
        to_slot = ep.return_slot
        if ep.kind == "install" or to_slot is None:
            return await self.abort(op, reason)
        await self.start_rollback(op, reason, to_slot)
        return await self.finish_rollback(op, to_slot, self.ep(op).rollback_attempts_left)

    async def start_rollback(self, op: str, reason: str, to_slot: Slot) -> None:
        await self.emit(op, ev.RollbackStarted(reason, to_slot))
        await self.p.host.point_current(to_slot)

    async def finish_rollback(
        self, op: str, to_slot: Slot, attempts_left: int, *, close_open_attempt: bool = False
    ) -> UpgradeResult:
        """Point ``current`` at ``to_slot`` (idempotent), health-check it, close the episode."""
        if close_open_attempt:
            await self.close_attempt(op, "last_good")
        await self.p.host.point_current(to_slot)
        if self.ep(op).mirrors:
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
        verdict = await self.health_attempts(op, "last_good", to_slot, attempts_left)
        if isinstance(verdict, Passed):
            await self.emit(op, ev.RolledBack(to_slot))
            return await self.publish_close(op)
        reason = verdict.reason if verdict is not None else "no attempt left for the last-good"
        ep = self.ep(op)
        what = f"last-good {to_slot}"
        if ep.kind == "rollback":
            what = f"{ep.rollback_reason}; but the previous current {to_slot}"
        await self.emit(op, ev.AttentionNeeded(f"{what} failed its own health check: {reason}"))
        return await self.publish_close(op)

    async def attempt(self, op: str, n: int, slot: Slot, *, restart: bool) -> Passed | Failed:
        """One health attempt (design §4.3 steps 6-7): restart through a transient unit, then judge
        samples."""
        p = self.p
        ep = self.ep(op)
        baseline_pid: int | None = None
        baseline_inv: str | None = None
        requested = ep.restart_requested_monotonic or 0.0
        started = p.clock.monotonic()  # the attempt's timeout counts from here, restart job included
        if restart:
            try:
                before = await p.service.snapshot()
                baseline_pid, baseline_inv = before.main_pid, before.invocation_id
            except ServiceError:
                pass  # no baseline: the new process is recognised by its start time instead
            name = self.unit_name("restart", op, n)
            requested = p.clock.monotonic()
            await self.emit(op, ev.RestartRequested(name, requested))
            try:
                await p.service.restart(name)
            except ServiceError as exc:
                return Failed(f"restart failed: {exc}", environment=True)
            # The restart job starts now. A restart that first waited out the unit's start limit (its
            # reset-failed refused, ServiceManager.restart) must not spend the attempt's timeout on that wait.
            started = p.clock.monotonic()
            waited = await self.restart_job_done(name, started + ep.health_timeout_s)
            if waited is not None:
                return waited
        judge = HealthJudge(
            Expectation(
                slot_path=p.host.slot_path(slot), current_link_path=p.host.current_link_path(),
                restart_requested_monotonic=requested, baseline_pid=baseline_pid,
                baseline_invocation=baseline_inv, stability_s=ep.stability_s, timeout_s=ep.health_timeout_s,
            ),
            started,
        )
        logged = False
        while True:
            try:
                snap = await p.service.snapshot()
            except ServiceError as exc:
                return Failed(f"cannot read the unit: {exc}", environment=True)
            probe_failure = await p.probe.check()
            verdict = judge.observe(snap, probe_failure, p.clock.monotonic())
            seen = judge.observed
            if seen is not None and not logged:
                logged = True
                await self.emit(op, ev.RestartObserved(seen[0], seen[1]))
            if not isinstance(verdict, Pending):
                return verdict
            await p.clock.sleep(judge.next_sample_in(p.clock.monotonic(), self.policy.poll_interval_s))

    async def restart_job_done(self, name: str, deadline: float) -> Failed | None:
        """Poll until the transient restart unit ``name`` is done (None), or a :class:`Failed` verdict
        (environment: the new binary never ran) at monotonic ``deadline`` or when the unit cannot be read.

        No health sample is taken before: the agent unit still shows the previous process, its auto-restart
        (``Restart=``), or the ``inactive/dead`` moment inside the restart job (see
        :meth:`~upgrade_core.ports.ServiceManager.restart_done`)."""
        p = self.p
        waited = 0
        while True:
            try:
                if await p.service.restart_done(name):
                    return None
            except ServiceError as exc:
                return Failed(f"cannot read the restart unit {name}: {exc}", environment=True)
            if p.clock.monotonic() >= deadline:
                return Failed(f"the restart job of {name} did not finish within the attempt's timeout",
                              environment=True)
            await p.clock.sleep(min(self.policy.poll_interval_s, backoff_gap(waited)))
            waited += 1

    async def hand_off_and_wait(self, op: str) -> UpgradeResult:
        """Hand steps 6-9 to a transient ``recover --trigger manual`` unit; poll until the episode closes.

        The folder is then refolded from disk (the same object: a caller's folder stays current).
        """
        p = self.p
        name = self.unit_name("recover", op)
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
                self.folder.reset(records)  # the unit appended (maybe compacted): refold the disk
                return result
            if p.clock.monotonic() > deadline:
                raise ServiceError(f"handed-off recovery unit {name} did not close episode {op} in time")
            await p.clock.sleep(self.policy.poll_interval_s)

    # -- recovery (design §4.5)
    # -------------------------------------------------------------------------------
    async def recover_open(self, trigger: Trigger) -> UpgradeResult | HandedOff:
        view = self.folder.view()
        open_ep = view.open_episode
        if open_ep is None:
            return await self.recover_closed(trigger)
        op = open_ep.episode_id
        with anyio.CancelScope(shield=True):
            await self.emit(op, ev.RecoveryStarted(trigger))
            plan = await self.decide_plan(op)
            result = await self.execute(op, plan, trigger)
        return result

    async def recover_closed(self, trigger: Trigger) -> UpgradeResult:
        """Nothing is open: ``noop``, unless a candidate an ``activate`` left stopped is to be checked now
        (design §4.7). The unit is read only then, and never at boot (the agent unit starts after the boot
        recovery) nor for an upgrade settling what came before it."""
        view = self.folder.view()
        unit_state = None
        if view.left_stopped is not None and trigger not in ("boot", "upgrade", "resume"):
            try:
                unit_state = (await self.p.service.snapshot()).active_state
            except ServiceError:
                unit_state = None  # unread: decide leaves it for the next recovery
        plan = decide(view, HostFacts(self.p.host.links(), None, unit_state))
        if isinstance(plan, CheckLeftStopped):
            return await self.check_left_stopped(plan.candidate, trigger)
        assert isinstance(plan, NoOp)
        return UpgradeResult(None, "noop", reason=plan.reason)

    async def decide_plan(self, op: str) -> Plan:
        """Look at the host (one read of the links) and :func:`decide` from the folded journal."""
        ep = self.ep(op)
        sha = None
        if ep.state is _S.SWITCHING and ep.candidate_slot is not None:
            sha = await self.p.host.slot_sha256(ep.candidate_slot)
        return decide(self.folder.view(), HostFacts(self.p.host.links(), sha))

    async def execute(self, op: str, plan: Plan, trigger: Trigger) -> UpgradeResult | HandedOff:
        """Carry out ``plan``'s fields as :func:`decide` returned them (never re-derived from the view)."""
        boot = trigger == "boot"
        match plan:
            case Abort(reason=reason):
                return await self.abort(op, reason)
            case ResumeHealth(attempts_left=left, confirm_switch=confirm, close_open_attempt=close):
                if confirm:
                    await self.confirm_switch(op)
                if boot:
                    return await self.boot_hand_off(op, close, "candidate")
                return await self.after_switch(op, left, close_open_attempt=close)
            case SettleHostMove():
                return await settle_host_move(self, op)
            case Commit():
                return await self.commit(op)
            case LeaveStopped(confirm_switch=confirm):
                if confirm:
                    await self.confirm_switch(op)
                return await self.leave_stopped(op)
            case Rollback(reason=reason, to_slot=to_slot, close_open_attempt=close):
                if close:
                    await self.close_attempt(op, "candidate")
                await self.start_rollback(op, reason, to_slot)
                if boot:
                    return await self.boot_hand_off(op, False, "last_good")
                return await self.finish_rollback(op, to_slot, self.ep(op).rollback_attempts_left)
            case FinishRollback(to_slot=to_slot, attempts_left=left, close_open_attempt=close):
                if boot:
                    await self.p.host.point_current(to_slot)
                    return await self.boot_hand_off(op, close, "last_good")
                return await self.finish_rollback(op, to_slot, left, close_open_attempt=close)
            case PublishAndClose(result=result) | CloseOnly(result=result):
                return await self.publish_close(op, result)
            case NoOp() | CheckLeftStopped():
                pass
        raise AssertionError(f"recover: unexpected plan {plan!r} for open episode {op}")

    async def confirm_switch(self, op: str) -> None:
        """The host shows the intended switch landed (design §4.5): journal ``SwitchCommitted``."""
        slot = self.ep(op).candidate_slot
        assert slot is not None
        await self.emit(op, ev.SwitchCommitted(slot))

    async def boot_hand_off(self, op: str, close: bool, target: HealthTarget) -> HandedOff:
        """Boot trigger: never wait for the agent; journal the spent attempt, hand the check off."""
        if close:
            await self.close_attempt(op, target)
        name = self.unit_name("recover", op)
        await self.p.service.hand_off_recovery(name, after_unit=True)
        return HandedOff(op, name)


__all__ = ["FlowRun"]

"""The embedding session: one object that owns load -> lock -> wire -> run -> close -> compaction.

The CLI, ``examples/selfupgrade_daemon.py`` and any daemon or integration that embeds upgrade-core ask a
:class:`Session` for work instead of assembling those steps by hand::

    async with open_session("/etc/upgrade-agent/demo-agent.toml") as s:
        result = await s.upgrade(s.request("https://releases.example/demo-agent-1.1.0.tar.gz",
                                           sha256="…"))
        print(result.result, result.to_version)

Rules it keeps for every caller:

- **Input first.** :meth:`Session.request` checks the source, digest, operation id and expected version
  (:mod:`agent.session.request`) before anything is locked, created or journaled (exit 2, journal unchanged).
- **One writer.** Every method that writes takes the host lock (non-blocking: :class:`LockBusyError`,
  exit 75) for exactly the duration of its episode, opens the journal, folds it once into a
  :class:`~upgrade_core.Folder` that the flow keeps up to date, and closes the journal and releases the lock
  on the way out, also when cancelled. A boot-time or in-unit hand-off releases both early (the transient
  unit owns the episode from then on).
- **Errors by phase.** A failure after ``SwitchIntended`` is re-raised as :class:`EpisodeLeftOpenError`
  (exit 3: the candidate may be active and ``recover`` finishes the episode), whatever its type; before it
  the orchestrator has already aborted the episode.
- **Compaction** (design §5) runs best effort after each closed episode, from the same fold.

Readers (:meth:`Session.status`, :meth:`Session.view`, the preflights, :meth:`Session.verify_journal`,
:meth:`Session.journal_records`) take no lock and never write or create anything.

The work is done by three parts the session holds: :class:`~agent.session.frame.EpisodeFrame` (the
locked-episode frame every writer runs in), :class:`~agent.session.setup.Setup` (install, units, reset,
uninstall) and :class:`~agent.session.readers.Readers`; this class is the one surface callers use, and
every rule applies the same way to the CLI, the operator and an embedding daemon.
Signals are the caller's: a CLI cancels the running method (before the switch the episode is aborted and
published) and reads :attr:`Session.switch_started` / :attr:`Session.handed_off` /
:attr:`Session.last_published` to decide what to say.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from agent.config.loader import AgentConfig, discover_config_path, load_config
from agent.errors import UsageError
from agent.host.adapter import AgentHost
from agent.host.install_record import Cleanup, InstallRecord
from agent.logline import log
from agent.session.converge import lock_holder
from agent.session.frame import EpisodeFrame, EventCallback, ProgressCallback, require_installed
from agent.session.quarantine import CarriedOver, carry_over, move_aside, read_host, utc_stamp
from agent.session.readers import JournalCheck, Readers
from agent.session.reports import (
    EpisodeInfo,
    KnownBad,
    Preflight,
    Quarantined,
    ServiceInfo,
    SlotInfo,
    Status,
    TrustCleared,
)
from agent.session.request import DeltaPlan, make_request, operation_id
from agent.session.setup import Setup
from agent.session.window import closed_window_text, window_now
from agent.session.wiring import JournalPort, journal_dir
from upgrade_core import (
    Folder,
    HandedOff,
    JournalQuarantined,
    JournalView,
    Policy,
    Ports,
    Recorded,
    RestartScheduled,
    ResumeOutcome,
    Trigger,
    TrustReset,
    UpgradeRequest,
    UpgradeResult,
    record_quarantine,
    record_trust_reset,
    recover,
    resume_self_upgrade,
    rollback_target,
    run_activate,
    run_rollback,
    run_upgrade,
    self_upgrade_prepare,
)
from upgrade_core.errors import (
    JournalDurabilityError,
    LockBusyError,
    NothingStagedError,
    NothingToRollBackError,
    UpgradeError,
)

__all__ = [
    "BUSY_REASON", "Cleanup", "EpisodeInfo", "JournalCheck", "KnownBad", "Preflight", "Quarantined",
    "ServiceInfo", "Session", "SlotInfo", "Status", "TrustCleared", "open_session",
]

BUSY_REASON = "busy: a live upgrade holds the lock"
"""The reason of the ``noop`` a ``recover --trigger timer`` returns at once when the host lock is held."""


# -- the session ------------------------------------------------------------------------------------------
class Session:
    """One configuration's upgrade-core, for a CLI command or an embedding daemon. Use :func:`open_session`.

    Attributes:
        config: the loaded configuration.
        config_path: its absolute path (units and hand-offs name it).
        host: the host layout (the ``Host`` port).
    """

    def __init__(
        self,
        config: AgentConfig,
        config_path: str,
        *,
        progress: ProgressCallback | None = None,
        on_event: EventCallback | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.host = AgentHost.from_config(config)
        self._frame = EpisodeFrame(config, config_path, self.host, progress=progress, on_event=on_event)
        self._setup = Setup(config, config_path, self.host, self._frame)
        self._readers = Readers(config, config_path, self.host, self._setup.units)

    @classmethod
    def load(
        cls,
        config_path: str | None = None,
        *,
        progress: ProgressCallback | None = None,
        on_event: EventCallback | None = None,
    ) -> Session:
        """Load the configuration (see :func:`open_session`); creates nothing, takes no lock.

        Raises:
            ConfigError: no, several, or an invalid configuration (exit 2).
        """
        path = discover_config_path(config_path)
        return cls(load_config(path), os.path.abspath(path), progress=progress, on_event=on_event)

    def request(
        self,
        archive: str,
        *,
        sha256: str | None = None,
        operation: str | None = None,
        expect_version: str | None = None,
        signature: str | None = None,
        retry_known_bad: bool = False,
        stage: bool = False,
    ) -> UpgradeRequest:
        """A checked request (see :func:`agent.session.request.make_request`); nothing is locked or created.

        Raises:
            UsageError: a bad source, digest, operation id or expected version (exit 2).
        """
        return make_request(
            archive,
            allow_http=self.config.download.allow_http,
            sha256=sha256,
            operation=operation,
            expect_version=expect_version,
            signature=signature,
            retry_known_bad=retry_known_bad,
            stage=stage,
        )

    # -- what a signal handler needs -------------------------------------------------------------------
    @property
    def switch_started(self) -> bool:
        """True while the running method's open episode has passed ``SwitchIntended`` (no abort possible)."""
        return self._frame.switch_started

    def running_view(self) -> JournalView | None:
        """The journal as the running method has folded it so far (its durable appends included), None
        before this session's first write; reads no file, so a caller may ask while an episode runs (the
        operator's step-by-step status). After a write it is that write's last view."""
        return self._frame.running_view()

    @property
    def handed_off(self) -> bool:
        """True once the running method handed its episode to a transient unit (and released the lock)."""
        return self._frame.handed_off

    @property
    def last_published(self) -> UpgradeResult | None:
        """The newest result this session published (e.g. ``aborted`` after a cancellation), or None."""
        return self._frame.last_published

    @property
    def progress(self) -> ProgressCallback | None:
        """The download progress callback this session was opened with."""
        return self._frame.progress

    @property
    def repaired(self) -> list[str] | None:
        """What the last :meth:`install` on an installed host repaired, None when it repaired nothing."""
        return self._setup.repaired

    @property
    def cleanup_errors(self) -> list[str]:
        """What the last failed :meth:`install`'s clean-up could not remove (one line each)."""
        return self._setup.cleanup_errors

    # -- writers -------------------------------------------------------------------------------------------

    async def upgrade(self, request: UpgradeRequest, delta: DeltaPlan | None = None) -> UpgradeResult:
        """The supervised flow (design §4.3): fetch, verify, switch, restart, health-check, commit or roll
        back. With ``delta`` (from :func:`agent.session.request.make_delta_request`), the candidate is
        rebuilt from the current slot and the delta the request names, the archive being the fall-back
        (docs/delta.md).

        Returns:
            The terminal result (``committed``, ``noop``, ``aborted``, ``rolled_back``, ``needs_attention``;
            for a ``request.stage`` request ``staged``: verified and installed in the inactive slot, nothing
            switched or restarted); a closed operation id returns its recorded result and does nothing.

        Raises:
            NotInstalledError, LayoutConflictError: checked before the lock (exit 2).
            UnverifiedCurrentError: ``current`` names a candidate an ``activate`` left stopped, not checked
                yet (exit 2, design §4.7), before any episode opens.
            LockBusyError: another process holds the host lock (exit 75).
            EpisodeLeftOpenError: a failure after the switch (exit 3; ``recover`` finishes the episode).
            JournalError: the journal is corrupt, newer or could not be written (exit 3).
        """
        require_installed(self.host)
        # The fetch code (httpx, the extraction pipeline) loads now, before the episode opens, so that the
        # download starts as soon as EpisodeOpened is durable rather than after the imports (~0.1 s).
        import agent.release.source  # noqa: F401

        return await self._frame.write(
            lambda p, pol, f: run_upgrade(p, pol, request, folder=f), operation=request.operation,
            signature=request.signature, fetches=True, delta=delta,
        )

    def rollback_operation(self, operation: str | None = None) -> str:
        """A checked operation id for :meth:`rollback` (a fresh uuid4 hex when None); nothing is touched.

        Raises:
            UsageError: not ``[A-Za-z0-9._-]{1,64}`` (exit 2).
        """
        return operation_id(operation)

    async def rollback(self, operation: str, *, below_watermark: bool = False) -> UpgradeResult:
        """Operator rollback (docs/recovery.md): ``current`` to ``last-good``'s slot as its own episode
        (kind ``rollback``), restart, health-check; an unhealthy last-good returns to the previous current.

        Args:
            operation: from :meth:`rollback_operation`.
            below_watermark: ``--below-watermark``: roll back to a last-good below the host's anti-rollback
                watermark (or of unknown security version); journaled in the episode (docs/trust.md).

        Returns:
            ``committed`` (on last-good's slot, healthy; both links name it; exit 0), ``aborted`` (its version
            command failed, last-good is below the watermark without ``below_watermark``, or a signal came
            before the switch: nothing changed; exit 1), ``rolled_back`` (back
            on the previous current, healthy; the reason names both slots and versions; exit 1) or
            ``needs_attention`` (neither healthy; exit 3); a closed operation id returns its recorded result.

        Raises:
            NotInstalledError, LayoutConflictError: checked before the lock (exit 2).
            NothingToRollBackError: ``last-good`` is missing or names ``current``'s slot (exit 2; checked
                before the lock: nothing locked, created or journaled), or (under the lock, before any
                episode opens) names a missing or empty slot.
            LockBusyError, EpisodeLeftOpenError, JournalError: as :meth:`upgrade`.
        """
        require_installed(self.host)
        # Before the lock, as upgrade's input checks: nothing to roll back to now is exit 2 with nothing
        # locked, created or journaled, unless ``operation`` already closed (the flow prints its recorded
        # result). The flow checks again under the lock (after any recovery).
        try:
            rollback_target(self.host.links(), self.host.current_link_path())
        except NothingToRollBackError:
            if self.view().result_of(operation) is None:
                raise
        return await self._frame.write(
            lambda p, pol, f: run_rollback(p, pol, operation, folder=f, below_watermark=below_watermark),
            operation=operation,
        )

    def activate_operation(self, operation: str | None = None) -> str:
        """A checked operation id for :meth:`activate` (a fresh uuid4 hex when None), refused when there is
        nothing to activate; reads the journal, takes no lock and touches nothing.

        Raises:
            UsageError: not ``[A-Za-z0-9._-]{1,64}``, or the id of the ``upgrade --stage`` episode itself
                (exit 2).
            NotInstalledError, LayoutConflictError: no ``current`` link, or a real file in its place (exit 2).
            NothingStagedError: the journal knows no staged candidate, no episode is open that a recovery
                might settle first, and ``operation`` did not close before (its result would be printed).
        """
        op = operation_id(operation)
        require_installed(self.host)
        view = self.view()
        recorded = view.result_of(op)
        if recorded is not None and recorded.result == "staged":
            # The id names the staging episode itself: replaying its recorded result would print "staged"
            # and exit 0 with nothing switched, so a person who typed the id status shows is told instead.
            raise UsageError(
                f"activate: operation {op} is the episode that staged the candidate; an activation is an "
                "episode of its own: leave --operation out, or give it a new id"
            )
        if view.staged is None and view.open_episode is None and recorded is None:
            raise NothingStagedError("nothing staged: run upgrade --stage first")
        return op

    async def activate(self, operation: str) -> UpgradeResult:
        """``activate`` (docs/cli.md): switch to the candidate ``upgrade --stage`` left in the inactive slot,
        after hashing its bytes again, then restart and health-check as :meth:`upgrade` does.

        Args:
            operation: from :meth:`activate_operation` (checked again here).

        Returns:
            ``committed``, ``rolled_back`` or ``needs_attention`` as :meth:`upgrade`; ``switched_stopped``
            when the agent unit was found ``inactive`` (stopped on purpose): ``current`` switched, the unit
            left stopped, nothing checked, ``last-good`` unmoved (design §4.7); ``aborted`` when the
            staged bytes changed (nothing switched; the journal forgets the staged candidate) or a signal came
            before the switch; a closed operation id returns its recorded result.

        Raises:
            NotInstalledError, LayoutConflictError: checked before the lock (exit 2).
            NothingStagedError: the journal knows no staged candidate (exit 2; checked before the lock from
                the journal as it stands, and again under it): nothing locked, created or journaled.
            LockBusyError, EpisodeLeftOpenError, JournalError: as :meth:`upgrade`.
        """
        self.activate_operation(operation)
        return await self._frame.write(
            lambda p, pol, f: run_activate(p, pol, operation, folder=f), operation=operation,
        )

    async def recover(self, trigger: Trigger = "manual") -> UpgradeResult | HandedOff:
        """``recover`` (design §4.5): replay, look at the host, finish or roll back the open episode.

        Args:
            trigger: ``boot`` (never waits for the agent: any health check is handed to a transient unit,
                returned as :class:`~upgrade_core.HandedOff`), ``on-failure``, ``manual`` or ``timer``
                (``NAME-recover.timer``: acts only when the host lock is free).

        Returns:
            The closed episode's result; ``UpgradeResult(None, "noop")`` when nothing was open (its reason
            naming a candidate an ``activate`` left stopped while the unit is still stopped); the result of
            the check of that candidate once the unit was started (design §4.7); with
            ``timer`` and the lock held, ``UpgradeResult(None, "noop", reason=BUSY_REASON + " (pid N)")`` at
            once (never waits, never 75). With ``timer`` and nothing open, a candidate
            ``upgrade --in-window`` staged outside the maintenance window (``switch_in_window``) is
            activated once the window is open: the activation's result, or a noop naming the next opening.

        Raises:
            LockBusyError: the holder owns the episode (exit 75), except with ``timer``.
            JournalError, HistoryError: the journal cannot be trusted; links untouched (exit 3).
            ConfigError: with ``timer``, ``systemd-analyze calendar`` cannot be run (exit 2).
        """
        try:
            result = await self._frame.write(lambda p, pol, f: recover(p, pol, trigger, folder=f))
            if trigger == "timer" and isinstance(result, UpgradeResult) and result.operation is None:
                repaired = await self._setup.converge()  # docs/recovery.md, "A damaged layout"
                return repaired if repaired is not None else await self._switch_in_window(result)
            return result
        except LockBusyError:
            if trigger != "timer":
                raise
        # The timer acts only when the host lock is free: a live upgrade (or recovery) owns its episode.
        pid = lock_holder(self.config.host.lock_path).pid
        return UpgradeResult(None, "noop", reason=BUSY_REASON + (f" (pid {pid})" if pid else ""))

    async def _switch_in_window(self, idle: UpgradeResult) -> UpgradeResult:
        """The recovery timer's follow-up (docs/configuration.md ``[schedule]``): activate the candidate
        ``upgrade --in-window`` staged outside the maintenance window once the window is open for this host;
        ``idle`` (the recovery's noop) when nothing waits, or a noop naming the next opening while it is
        closed.
        Recovery itself is never held back by a window: this runs only once nothing is open."""
        staged = self.view().staged
        if staged is None or not staged.switch_in_window:
            return idle
        verdict = window_now(self.config)
        if not verdict.open:
            closed = closed_window_text(self.config, verdict)
            reason = f"candidate {staged.version} staged by {staged.operation} waits: {closed}"
            return UpgradeResult(None, "noop", reason=reason)
        operation = operation_id(None)  # a fresh id; activate checks what is staged itself, under the lock
        log(f"recover: the maintenance window is open: activate {operation}: "
            f"the candidate {staged.operation} staged")
        return await self.activate(operation)

    async def self_upgrade(self, request: UpgradeRequest) -> UpgradeResult | RestartScheduled:
        """The self-upgrade flow, steps 1-5 in this process (design §4.4); the restart is scheduled.

        Returns:
            :class:`~upgrade_core.RestartScheduled` (the new process calls :meth:`resume_self_upgrade`), or a
            terminal result (``aborted``, ``noop``, or this operation's recorded result).

        Raises:
            As :meth:`upgrade`.
        """
        require_installed(self.host)
        return await self._frame.write(
            lambda p, pol, f: self_upgrade_prepare(p, pol, request, folder=f), operation=request.operation
        )

    async def resume_self_upgrade(self) -> ResumeOutcome:
        """The new process's start-up check (design §4.4): the candidate holds healthy for the window ->
        commit.

        Raises:
            LockBusyError: another process (a recovery) owns the episode; the caller just serves.
            JournalError, HistoryError: as :meth:`upgrade`.
        """
        return await self._frame.write(lambda p, pol, f: resume_self_upgrade(p, pol, folder=f))

    async def compact(self) -> int:
        """Seal closed episodes and keep ``journal.keep_episodes`` (design §5) under the host lock.

        Returns:
            The number of records left in the journal.

        Raises:
            JournalError: the compaction itself failed (a full file system, an I/O error: exit 3, naming the
                journal directory and the cause); nothing is reported as compacted (a step that failed is
                never reported as done).
        """

        async def nothing(_p: Ports, _pol: Policy, folder: Folder) -> int:
            return folder.last_seq

        await self._frame.write(nothing)
        failed = self._frame.compaction_error
        if isinstance(failed, UpgradeError):
            raise failed
        if failed is not None:
            why = failed.strerror if isinstance(failed, OSError) and failed.strerror else str(failed)
            raise JournalDurabilityError(f"{journal_dir(self.config)}: not compacted: {why}") from failed
        return self._frame.journal_records()

    async def quarantine(self) -> Quarantined:
        """``journal quarantine`` (design §10), under the host lock: verify both links' slots, move the
        journal
        directory to ``state_dir/quarantine/<UTC time>/journal``, and start a new journal whose first
        (closed) episode records what the host shows. Works on any journal, trusted or not.

        Raises:
            NotInstalledError, LayoutConflictError: as :meth:`upgrade`, before the lock (exit 2).
            UsageError: there is no journal to quarantine (exit 2).
            LockBusyError: the host lock is held (exit 75).
            QuarantineRefusedError: a link is missing or names a missing, empty or unverifiable slot; the
                message says what to check; nothing changed (exit 3).
        """
        require_installed(self.host)
        directory = journal_dir(self.config)
        if not os.path.isdir(directory):
            raise UsageError(f"{directory}: no journal to quarantine")
        found: dict[str, Any] = {}

        async def prepare() -> None:
            from agent.release.verify import VerifierImpl

            cfg = self.config.verify
            verifier = VerifierImpl(
                version_args=self.config.agent.version_args,
                timeout_s=cfg.timeout_s,
                max_output_bytes=cfg.max_output_bytes,
            )
            found["host"] = await read_host(self.host, verifier)
            found["carried"] = await anyio.to_thread.run_sync(
                carry_over, directory, self.config.host.state_dir
            )
            found["path"] = await anyio.to_thread.run_sync(move_aside, self.config.host.state_dir, directory)

        async def record(ports: Ports, policy: Policy, folder: Folder) -> UpgradeResult:
            host = found["host"]
            carried: CarriedOver = found["carried"]
            assert isinstance(ports.journal, JournalPort)
            folder.apply(await ports.journal.seed(carried.snapshot))
            cur, lg = host.current, host.last_good
            facts = JournalQuarantined(
                found["path"], cur.slot, cur.sha256, cur.version, lg.slot, lg.sha256, lg.version
            )
            stamp = os.path.basename(os.path.dirname(found["path"]))  # <UTC time>[-N]: unique per state_dir
            return await record_quarantine(ports, policy, f"quarantine-{stamp}", facts, folder=folder)

        result = await self._frame.write(record, before_wire=prepare)
        host = found["host"]
        slots = [SlotInfo(r.slot, r.path, r.sha256, r.version) for r in (host.current, host.last_good)]
        return Quarantined(found["path"], result, slots[0], slots[1], found["carried"])

    async def trust_reset(self) -> TrustCleared:
        """``trust reset`` (docs/trust.md), under the host lock: clear the anti-rollback watermark and the
        known-bad memory as a journaled ``trust-reset`` episode (its ``TrustReset`` record names what it
        cleared). The one way to clear them: compaction, retention and ``journal quarantine`` keep them.

        Returns:
            What was cleared (the watermark, the known-bad digests and who condemned them) and the result.

        Raises:
            NotInstalledError, LayoutConflictError: as :meth:`upgrade`, before the lock (exit 2).
            UsageError: an episode is open (``recover`` first); nothing was written (exit 2).
            LockBusyError, JournalError: as :meth:`upgrade`.
        """
        require_installed(self.host)
        found: dict[str, Any] = {}

        async def clear(ports: Ports, policy: Policy, folder: Folder) -> UpgradeResult:
            view = folder.view()
            if view.open_episode is not None:
                raise UsageError(
                    f"episode {view.open_episode.episode_id} is open; run `upgrade-agent recover` before "
                    "`upgrade-agent trust reset`"
                )
            bad = tuple(KnownBad(sha, mark.operation) for sha, mark in sorted(view.known_bad.items()))
            found["watermark"], found["known_bad"] = view.security_watermark, bad
            cleared = TrustReset(view.security_watermark, tuple(b.sha256 for b in bad))
            current = self.host.links().current
            operation = f"trust-reset-{utc_stamp()}-{ports.ids.token_hex(4)}"
            return await record_trust_reset(
                ports, policy, operation, cleared, current=current,
                current_version=view.slot_versions.get(current) if current else None, folder=folder,
            )

        result = await self._frame.write(clear)
        return TrustCleared(result, found["watermark"], found["known_bad"])

    # -- set-up and removal (agent.session.setup) -------------------------------------------------------
    async def install(
        self,
        request: UpgradeRequest | None = None,
        *,
        sha256: str | None = None,
        expect_version: str | None = None,
        allow_unstable_paths: bool = False,
    ) -> UpgradeResult:
        """``install``: see :meth:`agent.session.setup.Setup.install` (its rules, errors and exit codes)."""
        return await self._setup.install(
            request, sha256=sha256, expect_version=expect_version, allow_unstable_paths=allow_unstable_paths
        )

    async def host_move(self) -> UpgradeResult:
        """``host move``: see :meth:`agent.session.setup.Setup.host_move`."""
        return await self._setup.host_move()

    def units(self, *, bin_dir: str | None = None, config_path: str | None = None) -> dict[str, str]:
        """The rendered unit files: see :meth:`agent.session.setup.Setup.units`."""
        return self._setup.units(bin_dir=bin_dir, config_path=config_path)

    def unit_executables(self, bin_dir: str | None = None) -> list[str]:
        """The tool's executables the units run: see :meth:`agent.session.setup.Setup.unit_executables`."""
        return self._setup.unit_executables(bin_dir)

    async def reset(self) -> Cleanup:
        """``reset``: see :meth:`agent.session.setup.Setup.reset`."""
        return await self._setup.reset()

    async def uninstall(self) -> Cleanup:
        """``uninstall``: see :meth:`agent.session.setup.Setup.uninstall`."""
        return await self._setup.uninstall()

    def install_record(self) -> InstallRecord:
        """The install record: see :meth:`agent.session.setup.Setup.install_record`."""
        return self._setup.install_record()

    def refuse_foreign_units(self) -> None:
        """See :meth:`agent.session.setup.Setup.refuse_foreign_units`."""
        self._setup.refuse_foreign_units()

    async def remove_units(self, record: InstallRecord | None = None) -> Cleanup:
        """See :meth:`agent.session.setup.Setup.remove_units` (the caller holds the host lock)."""
        return await self._setup.remove_units(record)

    # -- readers (agent.session.readers) ---------------------------------------------------------------
    def view(self) -> JournalView:
        """The folded journal, read-only: see :meth:`agent.session.readers.Readers.view`."""
        return self._readers.view()

    async def status(self) -> Status:
        """``status``: see :meth:`agent.session.readers.Readers.status`."""
        return await self._readers.status()

    def preflight(self, request: UpgradeRequest) -> Preflight:
        """``upgrade --preflight``: see :meth:`agent.session.readers.Readers.preflight`."""
        return self._readers.preflight(request)

    def rollback_preflight(self, operation: str, *, below_watermark: bool = False) -> Preflight:
        """``rollback --preflight``: see :meth:`agent.session.readers.Readers.rollback_preflight`."""
        return self._readers.rollback_preflight(operation, below_watermark=below_watermark)

    def verify_journal(self) -> JournalCheck:
        """``journal verify``: see :meth:`agent.session.readers.Readers.verify_journal`."""
        return self._readers.verify_journal()

    def journal_records(self) -> list[Recorded]:
        """``journal dump``: see :meth:`agent.session.readers.Readers.journal_records`."""
        return self._readers.journal_records()

    def host_root(self) -> str:
        """The resolved host root (``host-root``); changes nothing."""
        return self._readers.host_root()


@asynccontextmanager
async def open_session(
    config_path: str | None = None,
    *,
    progress: ProgressCallback | None = None,
    on_event: EventCallback | None = None,
) -> AsyncIterator[Session]:
    """Open a :class:`Session` on one configuration (design §3): ``async with open_session(path) as s: ...``.

    Loading creates nothing and takes no lock; each writing method takes and releases the host lock itself.

    Args:
        config_path: the TOML file; None: ``$UPGRADE_AGENT_CONFIG``, else the only
            ``/etc/upgrade-agent/*.toml``.
        progress: ``progress(bytes_so_far, total_or_None)`` during downloads.
        on_event: called after each durable journal append (e.g. a log line).

    Raises:
        ConfigError: no, several, or an invalid configuration (exit 2, naming the file and key).
    """
    yield Session.load(config_path, progress=progress, on_event=on_event)

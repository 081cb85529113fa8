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

Readers (:meth:`Session.status`, :meth:`Session.view`) take no lock and never write or create anything.
Signals are the caller's: a CLI cancels the running method (before the switch the episode is aborted and
published) and reads :attr:`Session.switch_started` / :attr:`Session.handed_off` /
:attr:`Session.last_published` to decide what to say.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from agent.config.loader import AgentConfig, discover_config_path, load_config
from agent.errors import UsageError
from agent.host.adapter import AgentHost
from agent.logline import log
from agent.session.reports import EpisodeInfo, KnownBad, Preflight, Quarantined, ServiceInfo, SlotInfo, Status
from agent.session.request import make_request, operation_id
from agent.session.setup import SetupMixin
from upgrade_core import (
    Folder,
    HandedOff,
    JournalView,
    Policy,
    Ports,
    Recorded,
    RestartScheduled,
    ResultPublished,
    ResumeOutcome,
    Slot,
    Trigger,
    UpgradeRequest,
    UpgradeResult,
    fold,
    summarize_history,
)
from upgrade_core.errors import (
    EpisodeLeftOpenError,
    HistoryError,
    JournalError,
    JournalUnreadableError,
    NotInstalledError,
    UpgradeError,
)

__all__ = [
    "BUSY_REASON", "EpisodeInfo", "KnownBad", "Preflight", "Quarantined", "ServiceInfo", "Session",
    "SlotInfo", "Status", "open_session",
]

BUSY_REASON = "busy: a live upgrade holds the lock"
"""The reason of the ``noop`` a ``recover --trigger timer`` returns at once when the host lock is held."""

ProgressCallback = Callable[[int, int | None], None]
EventCallback = Callable[[Recorded], None]


# -- the session ------------------------------------------------------------------------------------------
class Session(SetupMixin):
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
        self.progress = progress
        self._on_event = on_event
        self._folder: Folder | None = None
        self._journal: Any = None
        self._last_published: UpgradeResult | None = None
        self._running = False
        self.cleanup_errors: list[str] = []
        self.repaired: list[str] | None = None

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

    # -- input -----------------------------------------------------------------------------------------
    def request(
        self,
        archive: str,
        *,
        sha256: str | None = None,
        operation: str | None = None,
        expect_version: str | None = None,
        signature: str | None = None,
        retry_known_bad: bool = False,
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
        )

    # -- what a signal handler needs -------------------------------------------------------------------
    @property
    def switch_started(self) -> bool:
        """True while the running method's open episode has passed ``SwitchIntended`` (no abort possible)."""
        if self._folder is None:
            return False
        ep = self._folder.view().open_episode
        return ep is not None and ep.switch_intended

    @property
    def handed_off(self) -> bool:
        """True once the running method handed its episode to a transient unit (and released the lock)."""
        return self._journal is not None and bool(self._journal.relinquished)

    @property
    def last_published(self) -> UpgradeResult | None:
        """The newest result this session published (e.g. ``aborted`` after a cancellation), or None."""
        return self._last_published

    # -- writers -----------------------------------------------------------------------------------------
    async def upgrade(self, request: UpgradeRequest) -> UpgradeResult:
        """The supervised flow (design §4.3): fetch, verify, switch, restart, health-check, commit or roll
        back.

        Returns:
            The terminal result (``committed``, ``noop``, ``aborted``, ``rolled_back``, ``needs_attention``);
            a closed operation id returns its recorded result and does nothing.

        Raises:
            NotInstalledError, LayoutConflictError: checked before the lock (exit 2).
            LockBusyError: another process holds the host lock (exit 75).
            EpisodeLeftOpenError: a failure after the switch (exit 3; ``recover`` finishes the episode).
            JournalError: the journal is corrupt, newer or could not be written (exit 3).
        """
        from upgrade_core import run_upgrade

        self._require_installed()
        return await self._write(
            lambda p, pol, f: run_upgrade(p, pol, request, folder=f), operation=request.operation,
            signature=request.signature,
        )

    def rollback_operation(self, operation: str | None = None) -> str:
        """A checked operation id for :meth:`rollback` (a fresh uuid4 hex when None); nothing is touched.

        Raises:
            UsageError: not ``[A-Za-z0-9._-]{1,64}`` (exit 2).
        """
        return operation_id(operation)

    async def rollback(self, operation: str) -> UpgradeResult:
        """Operator rollback (docs/recovery.md): ``current`` to ``last-good``'s slot as its own episode
        (kind ``rollback``), restart, health-check; an unhealthy last-good returns to the previous current.

        Args:
            operation: from :meth:`rollback_operation`.

        Returns:
            ``committed`` (on last-good's slot, healthy; both links name it; exit 0), ``aborted`` (its version
            command failed or a signal came before the switch: nothing changed; exit 1), ``rolled_back`` (back
            on the previous current, healthy; the reason names both slots and versions; exit 1) or
            ``needs_attention`` (neither healthy; exit 3); a closed operation id returns its recorded result.

        Raises:
            NotInstalledError, LayoutConflictError: checked before the lock (exit 2).
            NothingToRollBackError: ``last-good`` is missing or names ``current``'s slot (exit 2; checked
                before the lock: nothing locked, created or journaled), or (under the lock, before any
                episode opens) names a missing or empty slot.
            LockBusyError, EpisodeLeftOpenError, JournalError: as :meth:`upgrade`.
        """
        from upgrade_core import rollback_target, run_rollback
        from upgrade_core.errors import NothingToRollBackError

        self._require_installed()
        # Before the lock, as upgrade's input checks: nothing to roll back to now is exit 2 with nothing
        # locked, created or journaled, unless ``operation`` already closed (the flow prints its recorded
        # result). The flow checks again under the lock (after any recovery).
        try:
            rollback_target(self.host.links(), self.host.current_link_path())
        except NothingToRollBackError:
            if self.view().result_of(operation) is None:
                raise
        return await self._write(
            lambda p, pol, f: run_rollback(p, pol, operation, folder=f), operation=operation
        )

    def rollback_preflight(self, operation: str) -> Preflight:
        """``rollback --preflight``: the plan, from the links, the journal and a lock probe; changes nothing
        and runs no binary (as :meth:`preflight`).

        Raises:
            NotInstalledError, LayoutConflictError, NothingToRollBackError: as :meth:`rollback` (exit 2).
            JournalError, HistoryError: as :meth:`view` (exit 3).
        """
        from agent.host.lock import probe_lock
        from upgrade_core import rollback_target

        self._require_installed()
        links = self.host.links()
        view = self.view()
        open_ep = view.open_episode.episode_id if view.open_episode else None
        cfg = self.config
        plan = []
        if open_ep is not None:
            plan.append(f"recover the open episode {open_ep} first (the links may change)")
        prior = view.result_of(operation)
        if prior is not None:
            plan.append(f"operation {operation} already closed as {prior.result}: print it, do nothing")
            target = links.last_good or links.current
        else:
            target = rollback_target(links, self.host.current_link_path())
            current = links.current
            assert current is not None  # rollback_target refuses a host without current
            versions = view.slot_versions
            plan += [
                f"run the version command of last-good's slot {target} ({versions.get(target, '?')})",
                f"switch current from {current} ({versions.get(current, '?')}) to {target}; "
                f"last-good stays {target}",
                f"restart {cfg.agent.unit} through a transient unit and health-check it "
                f"({cfg.health.max_attempts} attempts, {cfg.health.stability_s} s stable)",
                f"commit (both links name {target}), or go back to {links.current} and health-check it",
            ]
        episode, drift, next_ = self._convergence(view, installed=True)
        assert target is not None
        return Preflight(tuple(plan), target, probe_lock(cfg.host.lock_path), open_ep, episode, drift.missing,
                         drift.drifted, next_)

    async def recover(self, trigger: Trigger = "manual") -> UpgradeResult | HandedOff:
        """``recover`` (design §4.5): replay, look at the host, finish or roll back the open episode.

        Args:
            trigger: ``boot`` (never waits for the agent: any health check is handed to a transient unit,
                returned as :class:`~upgrade_core.HandedOff`), ``on-failure``, ``manual`` or ``timer``
                (``NAME-recover.timer``: acts only when the host lock is free).

        Returns:
            The closed episode's result; ``UpgradeResult(None, "noop")`` when nothing was open; with
            ``timer`` and the lock held, ``UpgradeResult(None, "noop", reason=BUSY_REASON + " (pid N)")`` at
            once (never waits, never 75).

        Raises:
            LockBusyError: the holder owns the episode (exit 75), except with ``timer``.
            JournalError, HistoryError: the journal cannot be trusted; links untouched (exit 3).
        """
        from upgrade_core import recover
        from upgrade_core.errors import LockBusyError

        try:
            return await self._write(lambda p, pol, f: recover(p, pol, trigger, folder=f))
        except LockBusyError:
            if trigger != "timer":
                raise
        # The timer acts only when the host lock is free: a live upgrade (or recovery) owns its episode.
        from agent.session.converge import lock_holder

        pid = lock_holder(self.config.host.lock_path).pid
        return UpgradeResult(None, "noop", reason=BUSY_REASON + (f" (pid {pid})" if pid else ""))

    async def self_upgrade(self, request: UpgradeRequest) -> UpgradeResult | RestartScheduled:
        """The self-upgrade flow, steps 1-5 in this process (design §4.4); the restart is scheduled.

        Returns:
            :class:`~upgrade_core.RestartScheduled` (the new process calls :meth:`resume_self_upgrade`), or a
            terminal result (``aborted``, ``noop``, or this operation's recorded result).

        Raises:
            As :meth:`upgrade`.
        """
        from upgrade_core import self_upgrade_prepare

        self._require_installed()
        return await self._write(
            lambda p, pol, f: self_upgrade_prepare(p, pol, request, folder=f), operation=request.operation
        )

    async def resume_self_upgrade(self) -> ResumeOutcome:
        """The new process's start-up check (design §4.4): the candidate holds healthy for the window ->
        commit.

        Raises:
            LockBusyError: another process (a recovery) owns the episode; the caller just serves.
            JournalError, HistoryError: as :meth:`upgrade`.
        """
        from upgrade_core import resume_self_upgrade

        return await self._write(lambda p, pol, f: resume_self_upgrade(p, pol, folder=f))

    async def compact(self) -> int:
        """Seal closed episodes and keep ``journal.keep_episodes`` (design §5) under the host lock.

        Returns:
            The number of records left in the journal.
        """

        async def nothing(_p: Ports, _pol: Policy, folder: Folder) -> int:
            return folder.last_seq

        await self._write(nothing)
        assert self._journal is not None
        return len(self._journal.records())

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
        from agent.session.quarantine import move_aside, read_host
        from agent.session.wiring import journal_dir
        from upgrade_core import JournalQuarantined, record_quarantine

        self._require_installed()
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
            found["path"] = await anyio.to_thread.run_sync(move_aside, self.config.host.state_dir, directory)

        async def record(ports: Ports, policy: Policy, folder: Folder) -> UpgradeResult:
            host = found["host"]
            cur, lg = host.current, host.last_good
            facts = JournalQuarantined(
                found["path"], cur.slot, cur.sha256, cur.version, lg.slot, lg.sha256, lg.version
            )
            stamp = os.path.basename(os.path.dirname(found["path"]))  # <UTC time>[-N]: unique per state_dir
            return await record_quarantine(ports, policy, f"quarantine-{stamp}", facts, folder=folder)

        result = await self._write(record, before_wire=prepare)
        host = found["host"]
        slots = [SlotInfo(r.slot, r.path, r.sha256, r.version) for r in (host.current, host.last_good)]
        return Quarantined(found["path"], result, slots[0], slots[1])

    def _require_installed(self) -> None:
        """Raise before the lock: LayoutConflictError (a file where a link must be), NotInstalledError."""
        self.host.links()
        if not self.host.is_installed():
            raise NotInstalledError(
                f"{self.host.current_link_path()}: not installed; run `upgrade-agent install`"
            )

    async def _write(
        self,
        flow: Callable[[Ports, Policy, Folder], Awaitable[Any]],
        *,
        source_override: Any = None,
        operation: str | None = None,
        before_wire: Callable[[], Awaitable[None]] | None = None,
        signature: str | None = None,
    ) -> Any:
        """Check the state paths, lock, open the journal, fold once, run ``flow``, compact, close, unlock (see
        the module doc).

        Before the host lock is taken, ``state_dir`` (and its ancestors, ``journal/``, ``results/``, the
        result file of ``operation``, the lock's directory) and the journal's owner are checked (design §10):
        a refusal (exit 4) or a foreign journal (exit 2) leaves the host untouched. ``before_wire`` runs
        under the lock before the journal is opened (``journal quarantine`` moves an untrusted journal
        aside there).
        """
        from agent.host.lock import HostLock
        from agent.host.ownership import check_result, check_state
        from agent.session.wiring import wire

        if self._running:
            raise RuntimeError("Session: one write at a time")
        check_state(self.config)
        if operation is not None:
            check_result(self.config, operation)
        self._running = True
        self._folder, self._journal, self._last_published = None, None, None
        try:
            with HostLock(self.config.host.lock_path) as lock:
                if before_wire is not None:
                    await before_wire()
                try:
                    wired = await wire(
                        self.config,
                        self.config_path,
                        progress=self.progress,
                        on_event=self._seen,
                        source_override=source_override,
                        lock=lock,
                        signature=signature,
                    )
                except JournalError as exc:
                    raise _untrusted(exc) from None
                self._journal = wired.journal
                try:
                    folder = Folder()
                    try:
                        folder.apply_all(wired.journal.records())
                    except HistoryError as exc:
                        raise _untrusted(exc) from None
                    self._folder = folder
                    try:
                        out = await flow(wired.ports, wired.policy, folder)
                    except Exception as exc:
                        raise self._by_phase(exc) from exc
                    await self._compact(wired, folder)
                    return out
                finally:
                    with anyio.CancelScope(shield=True):
                        await wired.journal.writer.aclose()
        finally:
            self._running = False

    def _by_phase(self, exc: Exception) -> Exception:
        """Errors by phase: after ``SwitchIntended`` any failure but a journal one leaves the
        episode to ``recover`` (exit 3), whatever its type; before it the orchestrator has aborted."""
        from agent.groups import sole_error
        from journal import JournalError as StoreError

        error = sole_error(exc)
        if isinstance(error, JournalError | StoreError) or not self.switch_started or self.handed_off:
            return error if isinstance(error, Exception) else exc
        return EpisodeLeftOpenError(
            f"{error}; the episode is left open after its switch: run recover-agent-upgrade"
        )

    def _seen(self, record: Recorded) -> None:
        if isinstance(record.event, ResultPublished):
            self._last_published = record.event.result
        if self._on_event is not None:
            self._on_event(record)

    async def _compact(self, wired: Any, folder: Folder) -> None:
        """Best effort after a close (design §5): the episode is already closed and published."""
        if wired.journal.relinquished:  # a handed-off recovery unit owns the journal now
            return
        view = folder.view()

        def is_closed(episode_id: str) -> bool:
            ep = view.episodes.get(episode_id)
            return ep is None or not ep.is_open

        try:
            keep = self.config.journal.keep_episodes
            await wired.journal.writer.compact(keep, is_closed, summarize_history)
        except Exception as exc:  # best effort: report, never fail a finished command
            log(f"journal compaction skipped: {exc}")

    def view(self) -> JournalView:
        """The folded journal, read-only: no lock, nothing written or created (design §5 readers).

        Raises:
            HostRefusedError: ``state_dir``, the journal or a file in it is not ours (exit 4).
            ConfigError: the journal belongs to another configuration (exit 2, naming both).
            JournalError: the journal is corrupt or of a newer format (exit 3, naming file and offset).
            HistoryError: its order of events is illegal (exit 3).
        """
        from agent.errors import journal_error
        from agent.host.ownership import check_state
        from agent.session.wiring import journal_dir
        from journal import JournalError as StoreError
        from journal import replay
        from upgrade_core import EVENT_CODEC

        check_state(self.config)  # design §10: the same checks as a writer; creates nothing
        directory = journal_dir(self.config)
        try:
            rep = replay(directory, EVENT_CODEC)
        except StoreError as exc:
            raise _untrusted(journal_error(exc, directory)) from None
        try:
            return fold(rep.records)
        except HistoryError as exc:
            raise _untrusted(exc) from None

    def preflight(self, request: UpgradeRequest) -> Preflight:
        """``upgrade --preflight`` (design §7): the plan, from the links, the journal and a lock probe.

        No fetch, no directory, no lock file created (an existing lock is tested with a shared flock on
        an ``O_RDONLY`` open).

        Raises:
            NotInstalledError, LayoutConflictError: as :meth:`upgrade` (exit 2).
            JournalError, HistoryError: as :meth:`view` (exit 3).
        """
        from agent.host.lock import probe_lock
        from upgrade_core import other_slot

        self._require_installed()
        links = self.host.links()
        assert links.current is not None
        inactive = other_slot(links.current)
        lock = probe_lock(self.config.host.lock_path)
        view = self.view()
        open_ep = view.open_episode.episode_id if view.open_episode else None
        episode, drift, next_ = self._convergence(view, installed=True)
        cfg = self.config
        plan = []
        if open_ep is not None:
            plan.append(f"recover the open episode {open_ep} first")
        prior = view.result_of(request.operation)
        if prior is not None:
            plan.append(
                f"operation {request.operation} already closed as {prior.result}: print it, do nothing"
            )
        else:
            plan += [
                f"fetch {request.source_redacted}"
                + (" and check its sha256" if request.expected_sha256 else ""),
                f"extract {cfg.agent.member} into a staging file for the inactive slot {inactive}",
                "run its version command"
                + (f", expect {request.expected_version}" if request.expected_version else ""),
                f"switch current from {links.current} to {inactive} (last-good stays {links.current})",
                f"restart {cfg.agent.unit} through a transient unit and health-check it "
                f"({cfg.health.max_attempts} attempts, {cfg.health.stability_s} s stable)",
                "commit, or roll back to last-good",
            ]
        return Preflight(
            tuple(plan), inactive, lock, open_ep, episode, drift.missing, drift.drifted, next_
        )

    def _convergence(
        self, view: JournalView, *, installed: bool
    ) -> tuple[EpisodeInfo | None, Any, str | None]:
        """The open episode with its upgrader's pid, the unit drift and the next step (docs/cli.md);
        reads only (no lock taken, nothing created)."""
        from agent.session.converge import lock_holder, next_step, unit_drift
        from agent.systemd.units import recover_timer_name

        holder = lock_holder(self.config.host.lock_path)
        ep = view.open_episode
        episode = None
        if ep is not None:
            episode = EpisodeInfo(ep.episode_id, ep.state.value, holder.pid, not holder.busy)
        drift = unit_drift(self.config.host.unit_dir, self.units())
        next_ = next_step(
            installed=installed,
            episode=None if ep is None else ep.episode_id,
            holder=holder,
            drift=drift,
            timer=recover_timer_name(self.config.agent.name),
        )
        return episode, drift, next_

    async def status(self) -> Status:
        """Slots, links, service and open episode (design §7 ``status``); never runs a binary, never writes.

        Raises:
            LayoutConflictError: a real file stands where a link must be (exit 2).
            JournalError, HistoryError: as :meth:`view`.
        """
        from agent.session.wiring import service_manager

        view = self.view()
        links = self.host.links()
        slots = {slot for slot in (links.current, links.last_good) if slot is not None}
        digests = {slot: await self.host.slot_sha256(slot) for slot in slots}

        def info(slot: Slot | None) -> SlotInfo | None:
            if slot is None:
                return None
            return SlotInfo(slot, self.host.slot_path(slot), digests[slot], view.slot_versions.get(slot))

        service, error = ServiceInfo(), None
        try:
            snap = await service_manager(self.config, self.config_path).snapshot()
            service = ServiceInfo(snap.active_state, snap.sub_state, snap.main_pid or None, snap.exe)
        except UpgradeError as exc:
            error = str(exc)
        episode, drift, next_ = self._convergence(view, installed=links.current is not None)
        return Status(
            agent=self.config.agent.name,
            current=info(links.current),
            last_good=info(links.last_good),
            service=service,
            episode=episode,
            missing_units=drift.missing,
            drifted_units=drift.drifted,
            next=next_,
            service_error=error,
            security_watermark=view.security_watermark,
            known_bad=tuple(KnownBad(sha, bad.operation) for sha, bad in sorted(view.known_bad.items())),
        )


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





def _untrusted(exc: UpgradeError) -> UpgradeError:
    """A journal that cannot be trusted (corrupt, undecodable, an illegal order) names the way out, design §10
    ``journal quarantine``; a newer format or a failed append does not (another tool version or the disk
    is the fix)."""
    from agent.session.quarantine import HINT

    if isinstance(exc, JournalUnreadableError):
        return JournalUnreadableError(exc.path, exc.offset, f"{exc.reason}; {HINT}")
    if isinstance(exc, HistoryError):
        return HistoryError(f"{exc}; {HINT}")
    return exc

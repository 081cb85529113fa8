"""The embedding session: one object that owns load -> lock -> wire -> run -> close -> compaction.

The CLI, ``examples/selfupgrade_daemon.py`` and any daemon or integration that embeds upgrade-core ask a
:class:`Session` for work instead of assembling those steps by hand::

    async with open_session("/etc/upgrade-agent/demo-agent.toml") as s:
        result = await s.upgrade(s.request("https://releases.example/demo-agent-1.1.0.tar.gz",
                                           sha256="…"))
        print(result.result, result.to_version)

Rules it keeps for every caller:

- **Input first.** :meth:`Session.request` checks the source, digest, operation id and expected version
  (:mod:`agent.request`) before anything is locked, created or journaled (exit 2, journal unchanged).
- **One writer.** Every method that writes takes the host lock (non-blocking: :class:`LockBusyError`,
  exit 75) for exactly the duration of its episode, opens the journal, folds it once into a
  :class:`~upgrade_core.Folder` that the flow keeps up to date, and closes the journal and releases the lock
  on the way out, also when cancelled. A boot-time or in-unit hand-off releases both early (the transient
  unit owns the episode from then on).
- **Errors by phase.** A failure after ``SwitchIntended`` is re-raised as :class:`EpisodeLeftOpenError`
  (exit 3: the candidate may be active and ``recover`` finishes the episode), whatever its type; before it
  the orchestrator has already aborted the episode.
- **Compaction** (SPEC 5) runs best effort after each closed episode, from the same fold.

Readers (:meth:`Session.status`, :meth:`Session.view`) take no lock and never write or create anything.
Signals are the caller's: a CLI cancels the running method (before the switch the episode is aborted and
published) and reads :attr:`Session.switch_started` / :attr:`Session.handed_off` /
:attr:`Session.last_published` to decide what to say.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import attrs

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
    AlreadyInstalledError,
    EpisodeLeftOpenError,
    HistoryError,
    JournalError,
    JournalUnreadableError,
    NotInstalledError,
    UpgradeError,
)

from .config import AgentConfig, discover_config_path, load_config
from .errors import UsageError
from .host import AgentHost
from .install_record import RECORD_NAME, Cleanup, InstallRecord, Remover, missing_dirs
from .logline import log
from .request import make_request, operation_id

__all__ = [
    "BUSY_REASON", "EpisodeInfo", "Preflight", "Quarantined", "ServiceInfo", "Session", "SlotInfo", "Status",
    "open_session",
]

BUSY_REASON = "busy: a live upgrade holds the lock"
"""The reason of the ``noop`` a ``recover --trigger timer`` returns at once when the host lock is held."""

ProgressCallback = Callable[[int, int | None], None]
EventCallback = Callable[[Recorded], None]


# -- typed read results ---------------------------------------------------------------------------------
@attrs.frozen
class SlotInfo:
    """One slot as ``status`` shows it (SPEC 7).

    Attributes:
        slot: ``blue`` or ``green``.
        path: the slot file's absolute path.
        sha256: 64 lowercase hex of the slot's bytes, None when missing or empty (C12).
        version: the version its binary reported when installed, as far as the journal knows.
    """

    slot: Slot
    path: str
    sha256: str | None
    version: str | None


@attrs.frozen
class ServiceInfo:
    """The agent unit as systemd shows it; every field None when systemd could not be asked.

    Attributes:
        active_state / sub_state: ``ActiveState`` / ``SubState``.
        main_pid: ``MainPID``, None when there is no main process.
        exe: ``/proc/<MainPID>/exe`` resolved.
    """

    active_state: str | None = None
    sub_state: str | None = None
    main_pid: int | None = None
    exe: str | None = None


@attrs.frozen
class EpisodeInfo:
    """The open episode, if any (SPEC 7 ``status``, issue 10 item 4).

    Attributes:
        operation / state: its operation id and lifecycle state (SPEC 4.2).
        upgrader_pid: the pid holding the host lock (the upgrader or recovery running it), None when the
            lock is free or the pid is unknown.
        abandoned: True when no process holds the host lock: its upgrader died (``recover`` finishes it;
            so does ``NAME-recover.timer`` within its period).
    """

    operation: str
    state: str
    upgrader_pid: int | None = None
    abandoned: bool = False


@attrs.frozen
class KnownBad:
    """A release digest the journal condemned (issue 12 item 4).

    Attributes:
        sha256: the candidate's member digest (64 lowercase hex).
        operation: the operation whose candidate failed its health check or its verification.
    """

    sha256: str
    operation: str


@attrs.frozen
class Status:
    """What ``status`` reports (SPEC 7), from the journal and the links; no binary is run.

    Attributes:
        agent: NAME.
        current / last_good: the slots the links name, None on a bare host.
        service: the agent unit.
        episode: the open episode, None when every episode is closed.
        missing_units / drifted_units: rendered unit files absent from ``unit_dir`` / present there with
            other contents (issue 10 item 4).
        next: what to run next (one line), None when nothing is needed
            (:func:`agent.converge.next_step`).
        service_error: why ``service`` is empty, when systemd could not be asked.
        security_watermark: the highest ``security_version`` of a signed release ever committed on this host
            (issue 12 item 3), None when none was.
        known_bad: release digests refused when offered again, each with the operation that condemned it
            (issue 12 item 4), sorted by digest.
    """

    agent: str
    current: SlotInfo | None
    last_good: SlotInfo | None
    service: ServiceInfo
    episode: EpisodeInfo | None
    missing_units: tuple[str, ...] = ()
    drifted_units: tuple[str, ...] = ()
    next: str | None = None
    service_error: str | None = None
    security_watermark: int | None = None
    known_bad: tuple[KnownBad, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The SPEC 7 ``status`` JSON object (SPEC 10 adds ``security_watermark`` and ``known_bad``)."""
        doc = attrs.asdict(self)
        doc.pop("service_error")
        return doc


@attrs.frozen
class Preflight:
    """What ``upgrade --preflight`` reports (SPEC 7).

    Attributes:
        plan: the steps an upgrade would take, one line each.
        inactive_slot: the slot the candidate would be staged into.
        lock: ``free`` or ``busy``.
        open_episode: the operation id of an open episode that would be recovered first, or None.
        episode: that episode with its upgrader's pid / abandoned (as in :class:`Status`), or None.
        missing_units / drifted_units / next: as in :class:`Status`.
    """

    plan: tuple[str, ...]
    inactive_slot: Slot
    lock: Literal["free", "busy"]
    open_episode: str | None
    episode: EpisodeInfo | None = None
    missing_units: tuple[str, ...] = ()
    drifted_units: tuple[str, ...] = ()
    next: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The SPEC 7 ``upgrade --preflight`` JSON object, plus the issue 10 keys."""
        return {"preflight": True, "plan": list(self.plan), "inactive_slot": self.inactive_slot,
                "lock": self.lock, "open_episode": self.open_episode,
                "episode": None if self.episode is None else attrs.asdict(self.episode),
                "missing_units": list(self.missing_units), "drifted_units": list(self.drifted_units),
                "next": self.next}


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
        """A checked request (see :func:`agent.request.make_request`); nothing is locked or created.

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
        """The supervised flow (SPEC 4.3): fetch, verify, switch, restart, health-check, commit or roll back.

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
        """Operator rollback (issue 12 item 5): ``current`` to ``last-good``'s slot as its own episode
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
        from upgrade_core import rollback_target

        from .lock import probe_lock

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
        """``recover`` (SPEC 4.5): replay, look at the host, finish or roll back the open episode.

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
        from .converge import lock_holder

        pid = lock_holder(self.config.host.lock_path).pid
        return UpgradeResult(None, "noop", reason=BUSY_REASON + (f" (pid {pid})" if pid else ""))

    async def self_upgrade(self, request: UpgradeRequest) -> UpgradeResult | RestartScheduled:
        """The self-upgrade flow, steps 1-5 in this process (SPEC 4.4); the restart is scheduled.

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
        """The new process's start-up check (SPEC 4.4): the candidate holds healthy for the window -> commit.

        Raises:
            LockBusyError: another process (a recovery) owns the episode; the caller just serves.
            JournalError, HistoryError: as :meth:`upgrade`.
        """
        from upgrade_core import resume_self_upgrade

        return await self._write(lambda p, pol, f: resume_self_upgrade(p, pol, folder=f))

    async def compact(self) -> int:
        """Seal closed episodes and keep ``journal.keep_episodes`` (SPEC 5) under the host lock.

        Returns:
            The number of records left in the journal.
        """

        async def nothing(_p: Ports, _pol: Policy, folder: Folder) -> int:
            return folder.last_seq

        await self._write(nothing)
        assert self._journal is not None
        return len(self._journal.records())

    async def quarantine(self) -> Quarantined:
        """``journal quarantine`` (SPEC 10), under the host lock: verify both links' slots, move the journal
        directory to ``state_dir/quarantine/<UTC time>/journal``, and start a new journal whose first
        (closed) episode records what the host shows. Works on any journal, trusted or not.

        Raises:
            NotInstalledError, LayoutConflictError: as :meth:`upgrade`, before the lock (exit 2).
            UsageError: there is no journal to quarantine (exit 2).
            LockBusyError: the host lock is held (exit 75).
            QuarantineRefusedError: a link is missing or names a missing, empty or unverifiable slot; the
                message says what to check; nothing changed (exit 3).
        """
        from upgrade_core import JournalQuarantined, record_quarantine

        from .quarantine import move_aside, read_host
        from .wiring import journal_dir

        self._require_installed()
        directory = journal_dir(self.config)
        if not os.path.isdir(directory):
            raise UsageError(f"{directory}: no journal to quarantine")
        found: dict[str, Any] = {}

        async def prepare() -> None:
            from .verify import VerifierImpl

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
        result file of ``operation``, the lock's directory) and the journal's owner are checked (SPEC 10):
        a refusal (exit 4) or a foreign journal (exit 2) leaves the host untouched. ``before_wire`` runs
        under the lock before the journal is opened (``journal quarantine`` moves an untrusted journal
        aside there).
        """
        from .lock import HostLock
        from .ownership import check_result, check_state
        from .wiring import wire

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
        """Errors by phase (issue 9): after ``SwitchIntended`` any failure but a journal one leaves the
        episode to ``recover`` (exit 3), whatever its type; before it the orchestrator has aborted."""
        from journal import JournalError as StoreError

        from ._groups import sole_error

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
        """Best effort after a close (SPEC 5): the episode is already closed and published."""
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

    async def install(
        self,
        request: UpgradeRequest | None = None,
        *,
        sha256: str | None = None,
        expect_version: str | None = None,
    ) -> UpgradeResult:
        """``install`` (SPEC 7): a bare host -> blue, both links, the units, start and health-check.

        Without ``request``: adopt what is there (a plain executable at ``R/bin/NAME`` or under
        ``host.legacy_root``, or a legacy layout, SPEC 3), checked against ``sha256`` (of the binary) and
        ``expect_version`` as an archive would be. On an installed host: the same member digest as
        ``current`` is ``noop``. A failed install (any result but ``committed``/``noop``, or an error)
        removes the units and layout it made; the journal keeps the episode.

        Raises:
            UsageError: nothing to adopt (exit 2).
            LayoutConflictError: the host is not bare and not installed (exit 2), before the lock.
            AlreadyInstalledError: installed with another binary; use upgrade (exit 2).
            LockBusyError: the host lock is held (exit 75).
        """
        from .provision import Provisioner

        provision = Provisioner(self.host)
        source_override: Any = None
        legacy = False
        if request is None:
            found = provision.find_adoptable()
            if found is None:
                if self.host.is_installed():
                    self.refuse_foreign_units()
                    return await self._write(lambda p, pol, f: self._repair(p.service))
                raise UsageError(
                    f"nothing to adopt at {self.host.layout.bin_link} or under host.legacy_root; "
                    "pass --archive"
                )
            legacy = found.kind == "legacy_layout"
            request = self.request(found.source, sha256=sha256, expect_version=expect_version)
            source_override = _PlainFileSource()
        self.refuse_foreign_units()  # before the lock file too: a refusal leaves the host untouched
        if legacy:
            return await self._write(lambda p, pol, f: self._adopt_legacy(provision))
        if self.host.is_installed():
            return await self._write(
                lambda p, pol, f: self._install_again(p, request), source_override=source_override,
                signature=request.signature,
            )
        provision.check_bare()  # before the lock file too: a refusal leaves the host untouched
        return await self._write(
            lambda p, pol, f: self._install_bare(p, pol, f, request, provision),
            source_override=source_override,
            operation=request.operation,
            signature=request.signature,
        )

    async def _install_bare(
        self, ports: Ports, policy: Policy, folder: Folder, request: UpgradeRequest, provision: Any
    ) -> UpgradeResult:
        from upgrade_core import run_install

        provision.check_bare()
        record = self.install_record()
        lay = self.host.layout
        done = False
        try:
            # Intent before effect: each thing is listed in the install record before it is created.
            record.intend("dir", missing_dirs(lay.agent_dir) + missing_dirs(lay.bin_dir))
            provision.create_layout_dirs()
            record.intend("file", [lay.slot_path("blue")])
            record.intend("link", [lay.current_link, lay.last_good_link, lay.bin_link])
            await self._install_units(ports.service, record)
            result = await run_install(ports, policy, request, folder=folder)
            if result.result == "committed":
                provision.ensure_compat_link()
            done = result.result in ("committed", "noop")
            return result
        except BaseException as exc:
            # SPEC 7: a failed install removes what it created (the journal keeps the episode). The first
            # error stays the result; what the clean-up could not do goes with it as ``cleanup_errors``.
            with anyio.CancelScope(shield=True):
                await self._clean_up_failed_install(record)
            if self.cleanup_errors and isinstance(exc, Exception):
                with contextlib.suppress(AttributeError):
                    exc.cleanup_errors = list(self.cleanup_errors)  # type: ignore[attr-defined]
            done = True
            raise
        finally:
            if not done:  # an aborted or rolled-back result: clean up, keep the result
                with anyio.CancelScope(shield=True):
                    await self._clean_up_failed_install(record)

    async def _clean_up_failed_install(self, record: InstallRecord) -> None:
        """Remove what the record lists, by the rules of :mod:`agent.install_record`; never raises.

        Anything listed but not removed, and any removal that failed, goes to :attr:`cleanup_errors`.
        """
        try:
            out = await self.remove_units(record)
            out.extend(self._remover().remove(record.entries))
            self._forget(record, out)
            problems = out.kept + out.errors
        except Exception as exc:  # a clean-up never replaces the install's own result
            problems = [f"clean-up stopped: {exc}"]
        self.cleanup_errors = problems
        for line in problems:
            log(f"clean-up: {line}")

    async def _install_again(self, ports: Ports, request: UpgradeRequest) -> UpgradeResult:
        """Already installed: the same member digest as ``current`` -> noop; else AlreadyInstalledError."""
        from upgrade_core import other_slot

        current = self.host.links().current
        assert current is not None
        inactive = other_slot(current)
        path = await self.host.prepare_staging(inactive)
        try:
            staged = await ports.source.stage(request.source, request.expected_sha256, path, inactive)
        finally:
            await self.host.discard_staging(path)
        if staged.sha256 == await self.host.slot_sha256(current):
            return await self._repair(ports.service)
        raise AlreadyInstalledError(f"{self.host.current_link_path()}: already installed; use upgrade")

    async def _repair(self, service: Any) -> UpgradeResult:
        """Installed with the same binary: rewrite missing or drifted unit files (re-enable them and start
        the agent) and recreate a missing or drifted ``R/bin/NAME`` link; :attr:`repaired` says what.

        Raises:
            ConfigError: a unit file another service or agent owns stands where one of ours goes (exit 2).
            ServiceError, HostError: a unit or the link could not be written or started.
        """
        from .provision import Provisioner

        record = self.install_record()
        self.repaired = []
        units = self.units()
        drifted = {n: t for n, t in units.items() if _read_text(self._unit_path(n)) != t}
        if drifted:
            await self._install_units(service, record, only=drifted)
            self.repaired += [self._unit_path(n) for n in drifted]
        lay = self.host.layout
        if not os.path.lexists(lay.bin_link) or (
            os.path.islink(lay.bin_link) and not _is_link_to(lay.bin_link, lay.bin_link_target)
        ):
            record.intend("dir", missing_dirs(lay.bin_dir))
            record.intend("link", [lay.bin_link])
            Provisioner(self.host).create_layout_dirs()
            Provisioner(self.host).ensure_compat_link()
            self.repaired.append(lay.bin_link)
        if drifted:
            await service.start()
        current = self.host.links().current
        reason = f"repaired {', '.join(self.repaired)}" if self.repaired else None
        return UpgradeResult(None, "noop", slot=current, reason=reason)

    async def _adopt_legacy(self, provision: Any) -> UpgradeResult:
        record = self.install_record()
        record.intend("dir", missing_dirs(os.path.dirname(self.host.root)))
        record.intend("link", [self.host.root])
        provision.adopt()
        service = self._service()
        await self._install_units(service, record)
        await service.start()
        return UpgradeResult(None, "noop", slot=self.host.links().current, reason="adopted legacy layout")

    # -- units -------------------------------------------------------------------------------------------
    def units(self) -> dict[str, str]:
        """The rendered unit files, file name -> text (SPEC 6, 10): the agent unit, both recovery units,
        ``NAME-recover.timer`` and its ``NAME-recover-timer.service``."""
        from .units import render_units
        from .wiring import recover_executable

        cfg = self.config
        return render_units(
            name=cfg.agent.name,
            unit=cfg.agent.unit,
            current_link=self.host.current_link_path(),
            exec_args=cfg.agent.exec_args,
            max_attempts=cfg.health.max_attempts,
            recover_exe=recover_executable(),
            config_path=self.config_path,
        )

    async def reset(self) -> Cleanup:
        """``reset``: stop, disable and remove the agent's units, daemon-reload, under the host lock.

        Only unit files the install record lists (with no record: the rendered names) whose first line is
        this agent's header are stopped, disabled and removed; any other is kept and reported.

        Returns:
            What was removed and kept, and the removals that failed.

        Raises:
            LockBusyError: the host lock is held (exit 75).
            HostRefusedError, HostError: the install record cannot be trusted; nothing was changed.
        """
        from .lock import HostLock

        with HostLock(self.config.host.lock_path):
            record = self.install_record()
            out = await self.remove_units(record)
            self._forget(record, out)
            return out

    # -- ownership: the install record and the unit files ------------------------------------------------
    def install_record(self) -> InstallRecord:
        """The install record in ``state_dir`` (empty, ``exists`` False, when there is none); creates nothing.

        Raises:
            HostRefusedError: a symlink, FIFO or other non-regular file stands where it goes (exit 4).
            HostError: it is unreadable or belongs to another agent.
        """
        from upgrade_core.errors import HostError, HostRefusedError

        from .install_record import RecordError

        cfg = self.config
        try:
            return InstallRecord.load(cfg.host.state_dir, cfg.agent.name, cfg.agent.unit, self.config_path)
        except RecordError as exc:
            path = os.path.join(cfg.host.state_dir, RECORD_NAME)
            if exc.refused:
                raise HostRefusedError(path, str(exc).removeprefix(f"{path}: ")) from None
            raise HostError(str(exc)) from None

    def _remover(self) -> Remover:
        return Remover(self.host.layout, self.config.host.unit_dir, self.host.legacy_root)

    def _unit_path(self, name: str) -> str:
        return os.path.join(self.config.host.unit_dir, name)

    def refuse_foreign_units(self) -> None:
        """Refuse to write over a unit file this agent did not write (issue 10 item 3).

        Raises:
            ConfigError: one of :meth:`units` exists without this agent's header line: another service's
                unit, or one another configuration's install wrote (exit 2, naming the key and the owner).
        """
        from .errors import ConfigError

        remover = self._remover()
        for name in self.units():
            path = self._unit_path(name)
            if not os.path.lexists(path):
                continue
            ours, why = remover.unit_is_ours(path)
            if not ours:
                key = "agent.unit" if name == self.config.agent.unit else "agent.name"
                raise ConfigError(
                    f"{key}: {path} already exists and is not this agent's ({why}); refusing to overwrite "
                    "it: choose another unit name, or remove that unit first"
                )

    @staticmethod
    def _forget(record: InstallRecord, out: Cleanup) -> None:
        """Drop from the record what is gone (removed, or absent); keep what was kept or failed."""
        gone = [e.path for e in record.entries if not os.path.lexists(e.path)]  # lstat decides
        try:
            record.forget(gone)
        except OSError as exc:
            out.errors.append(f"{record.path}: cannot update the install record: {exc.strerror or exc}")

    def _service(self) -> Any:
        from .wiring import service_manager

        return service_manager(self.config, self.config_path)

    async def _install_units(
        self, service: Any, record: InstallRecord, only: dict[str, str] | None = None
    ) -> None:
        """Write the units (``only`` those, default all of :meth:`units`), each listed in the install record
        first; daemon-reload; enable the agent, the boot-time recovery unit and the recovery timer, and
        start the timer (it recovers an abandoned episode without waiting for a reboot).

        Raises:
            ConfigError: a unit file this agent did not write stands in the way (nothing written).
        """
        from .units import recover_boot_unit_name, recover_timer_name

        name = self.config.agent.name
        self.refuse_foreign_units()
        units = self.units() if only is None else only
        record.intend("unit", [self._unit_path(n) for n in units])
        await service.write_units(units)
        await service.daemon_reload()
        await service.enable(self.config.agent.unit, recover_boot_unit_name(name), recover_timer_name(name))
        await service.start(recover_timer_name(name))

    async def remove_units(self, record: InstallRecord | None = None) -> Cleanup:
        """Stop, disable and remove this agent's unit files; the caller holds the host lock.

        Candidates are the unit files the install record lists (with no record: the names :meth:`units`
        renders, and the result's ``notes`` say so); of those only a regular file whose first line is
        this agent's header is stopped, disabled and removed. Stop/disable failures are logged; a failed
        removal or daemon-reload is reported in ``errors``. Never raises for a host condition.

        Returns:
            What was removed (unit files) and kept (with the reason), and what failed.
        """
        record = record if record is not None else self.install_record()
        out = Cleanup()
        unit_dir = os.path.normpath(self.config.host.unit_dir)
        if record.exists:
            paths = [e.path for e in record.entries if e.kind == "unit"]
        else:
            paths = [self._unit_path(n) for n in self.units()]
            out.notes.append("no install record: only unit files and layout files carrying this agent's "
                             "marker are removed")
        remover = self._remover()
        owned: list[str] = []
        for path in paths:
            if not os.path.lexists(path):
                continue
            ours, why = remover.unit_is_ours(path)
            if not ours:
                out.kept.append(f"{path}: kept: {why}")
            elif os.path.dirname(path) != unit_dir:
                out.kept.append(f"{path}: kept: not in host.unit_dir {unit_dir}")
            else:
                owned.append(os.path.basename(path))
        if not owned:
            return out
        service = self._service()
        for unit in owned:
            try:
                await service.stop(unit)
            except UpgradeError as exc:
                log(f"stop {unit}: {exc}")
        try:
            await service.disable(*owned)
        except UpgradeError as exc:
            log(f"disable: {exc}")
        try:
            out.removed += await service.remove_units(owned)
        except UpgradeError as exc:
            out.errors.append(str(exc))
        try:
            await service.daemon_reload()
        except UpgradeError as exc:
            out.errors.append(f"daemon-reload: {exc}")
        return out

    # -- readers -----------------------------------------------------------------------------------------
    def view(self) -> JournalView:
        """The folded journal, read-only: no lock, nothing written or created (SPEC 5 readers).

        Raises:
            HostRefusedError: ``state_dir``, the journal or a file in it is not ours (exit 4).
            ConfigError: the journal belongs to another configuration (exit 2, naming both).
            JournalError: the journal is corrupt or of a newer format (exit 3, naming file and offset).
            HistoryError: its order of events is illegal (exit 3).
        """
        from journal import JournalError as StoreError
        from journal import replay
        from upgrade_core import EVENT_CODEC

        from .ownership import check_state
        from .wiring import journal_dir, journal_error

        check_state(self.config)  # SPEC 10: the same checks as a writer; creates nothing
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
        """``upgrade --preflight`` (SPEC 7): the plan, from the links, the journal and a lock probe.

        No fetch, no directory, no lock file created (an existing lock is tested with a shared flock on
        an ``O_RDONLY`` open).

        Raises:
            NotInstalledError, LayoutConflictError: as :meth:`upgrade` (exit 2).
            JournalError, HistoryError: as :meth:`view` (exit 3).
        """
        from upgrade_core import other_slot

        from .lock import probe_lock

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
        """The open episode with its upgrader's pid, the unit drift and the next step (issue 10 item 4);
        reads only (no lock taken, nothing created)."""
        from .converge import lock_holder, next_step, unit_drift
        from .units import recover_timer_name

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
        """Slots, links, service and open episode (SPEC 7 ``status``); never runs a binary, never writes.

        Raises:
            LayoutConflictError: a real file stands where a link must be (exit 2).
            JournalError, HistoryError: as :meth:`view`.
        """
        from .wiring import service_manager

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
    """Open a :class:`Session` on one configuration (SPEC 3): ``async with open_session(path) as s: ...``.

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





def _read_text(path: str) -> str | None:
    """A unit file's text, None when absent or not a regular file (never follows a link or opens a FIFO)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _is_link_to(path: str, target: str) -> bool:
    try:
        return os.readlink(path) == target
    except OSError:
        return False


def _untrusted(exc: UpgradeError) -> UpgradeError:
    """A journal that cannot be trusted (corrupt, undecodable, an illegal order) names the way out, SPEC 10
    ``journal quarantine``; a newer format or a failed append does not (another tool version or the disk
    is the fix)."""
    from .quarantine import HINT

    if isinstance(exc, JournalUnreadableError):
        return JournalUnreadableError(exc.path, exc.offset, f"{exc.reason}; {HINT}")
    if isinstance(exc, HistoryError):
        return HistoryError(f"{exc}; {HINT}")
    return exc


@attrs.frozen
class Quarantined:
    """What ``journal quarantine`` did (SPEC 10).

    Attributes:
        quarantine_path: where the old journal directory is now.
        result: the new journal's first episode's result (``noop``, reason naming the path).
        current / last_good: the slots recorded (slot, path, sha256, version).
    """

    quarantine_path: str
    result: UpgradeResult
    current: SlotInfo
    last_good: SlotInfo

    def to_json(self) -> dict[str, Any]:
        """``{"quarantined": path, "operation", "current": {...}, "last_good": {...}}``."""
        return {"quarantined": self.quarantine_path, "operation": self.result.operation,
                "current": attrs.asdict(self.current), "last_good": attrs.asdict(self.last_good)}


class _PlainFileSource:
    """An :class:`~upgrade_core.ports.ArchiveSource` for adoption: the "archive" is a plain executable."""

    async def stage(self, source: str, expected_sha256: str | None, staging_path: str, slot: Slot) -> Any:
        """Copy ``source`` into ``staging_path`` durably; its digest is computed from the copy."""
        from upgrade_core.ports import StagedCandidate

        from . import durable

        def copy() -> tuple[str, int]:
            durable.copy_file_durable(source, staging_path, 0o755)
            return durable.file_sha256(staging_path), os.stat(staging_path).st_size

        sha, size = await anyio.to_thread.run_sync(copy)
        return StagedCandidate(slot, staging_path, sha, size, sha, size)

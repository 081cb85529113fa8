"""Set-up and removal: ``install`` (bare host, adoption, repair), the unit files, ``reset``, ``uninstall`` and
the install record, by which the agent removes only what it made (docs/design.md §7, §10).

:class:`Setup` is what :class:`agent.session.session.Session` asks for this work; it writes through the
session's :class:`~agent.session.frame.EpisodeFrame` (check, lock, wire, fold, run, compact, close).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import anyio
import attrs

from agent.config.loader import AgentConfig
from agent.errors import ConfigError, UsageError
from agent.fs import durable
from agent.fs.statefile import read_regular
from agent.host.adapter import AgentHost
from agent.host.hostmove import RootMover
from agent.host.install_record import (
    RECORD_NAME,
    Cleanup,
    InstallRecord,
    RecordError,
    Remover,
    missing_dirs,
    remove_state_files,
)
from agent.host.lock import HostLock
from agent.host.ownership import check_host_root, check_socket_path, check_state
from agent.host.provision import Provisioner
from agent.host.selinux import restore_labels
from agent.logline import log
from agent.release.sources import parse_sha256
from agent.session.frame import EpisodeFrame, require_installed
from agent.session.quarantine import utc_stamp
from agent.session.request import make_request
from agent.session.wiring import recover_executable, service_manager
from agent.systemd.searchpath import SYSTEM_UNIT_DIRS
from agent.systemd.stable_paths import check_stable_executables
from agent.systemd.units import (
    operator_unit_name,
    recover_boot_unit_name,
    recover_timer_name,
    render_units,
    socket_unit_name,
)
from upgrade_core import (
    SLOTS,
    Folder,
    Policy,
    Ports,
    Slot,
    UpgradeRequest,
    UpgradeResult,
    other_slot,
    run_host_move,
    run_install,
)
from upgrade_core.errors import AlreadyInstalledError, HostError, HostRefusedError, UpgradeError
from upgrade_core.ports import StagedCandidate


class Setup:
    """``install``, ``units``, ``reset``, ``uninstall``, the install record and unit removal for one
    configuration (see the module doc).

    Attributes:
        cleanup_errors: what the last failed install's clean-up could not remove (one line each).
        repaired: what the last install on an installed host repaired, None when it repaired nothing.
    """

    def __init__(self, config: AgentConfig, config_path: str, host: AgentHost, frame: EpisodeFrame) -> None:
        self.config = config
        self.config_path = config_path
        self.host = host
        self._frame = frame
        self.cleanup_errors: list[str] = []
        self.repaired: list[str] | None = None

    async def install(
        self,
        request: UpgradeRequest | None = None,
        *,
        sha256: str | None = None,
        expect_version: str | None = None,
        allow_unstable_paths: bool = False,
    ) -> UpgradeResult:
        """``install`` (design §7): a bare host -> blue, both links, the units, start and health-check.

        Without ``request``: adopt what is there (a plain executable at ``R/bin/NAME`` or under
        ``host.legacy_root``, or a legacy layout, design §3), checked against ``sha256`` (of the binary) and
        ``expect_version`` as an archive would be. On an installed host: the same member digest as
        ``current`` is ``noop``. A failed install (any result but ``committed``/``noop``, or an error)
        removes the units and layout it made; the journal keeps the episode.

        Args:
            allow_unstable_paths: let the units run the tool from a temporary, per-user or checkout path
                (``install --allow-unstable-paths``; see :mod:`agent.systemd.stable_paths`).

        Raises:
            UsageError: a malformed ``sha256``; nothing to adopt; the units would run the tool from a
                temporary or per-user path (recovery at boot would break later) (exit 2), before the lock.
            LayoutConflictError: the host is not bare and not installed (exit 2), before the lock.
            AlreadyInstalledError: installed with another binary; use upgrade (exit 2).
            LockBusyError: the host lock is held (exit 75).
        """
        if request is None:
            parse_sha256(sha256)  # a malformed digest is refused before the host is looked at
        check_stable_executables(self.unit_executables(), allow=allow_unstable_paths)
        check_socket_path(self.config)  # systemd would bind (and unlink) that path on the agent's word
        provision = Provisioner(self.host)
        source_override: Any = None
        adopting_slot = False
        if request is None:
            found = provision.find_adoptable()
            if found is None:
                if self.host.is_installed():
                    self.refuse_foreign_units()
                    return await self._frame.write(lambda p, pol, f: self._repair(p.service))
                raise UsageError(
                    f"nothing to adopt at {self.host.layout.bin_link} or under host.legacy_root; "
                    "pass --archive"
                )
            adopting_slot = found.kind == "slot"
            if found.kind != "legacy_layout":  # a legacy layout is linked as it is: no file to stage
                request = make_request(found.source, allow_http=self.config.download.allow_http,
                                       sha256=sha256, expect_version=expect_version)
                source_override = _PlainFileSource()
        self.refuse_foreign_units()  # before the lock file too: a refusal leaves the host untouched
        if request is None:  # a legacy layout found to adopt
            return await self._frame.write(lambda p, pol, f: self._adopt_legacy(provision))
        if self.host.is_installed():
            return await self._frame.write(
                lambda p, pol, f: self._install_again(p, request), source_override=source_override,
                signature=request.signature, fetches=source_override is None,
            )
        provision.check_bare(adopting_slot=adopting_slot)  # before the lock file: a refusal touches nothing
        return await self._frame.write(
            lambda p, pol, f: self._install_bare(p, pol, f, request, provision, adopting_slot),
            source_override=source_override,
            operation=request.operation,
            signature=request.signature,
            fetches=source_override is None,
        )

    async def _install_bare(
        self, ports: Ports, policy: Policy, folder: Folder, request: UpgradeRequest, provision: Any,
        adopting_slot: bool = False,
    ) -> UpgradeResult:
        provision.check_bare(adopting_slot=adopting_slot)
        record = self.install_record()
        lay = self.host.layout
        done = False
        try:
            # Intent before effect: each thing is listed in the install record before it is created.
            record.intend("dir", missing_dirs(lay.agent_dir) + missing_dirs(lay.bin_dir))
            await restore_labels(provision.create_layout_dirs(), recursive=True)
            # a slot an adoption starts from was there before: a failed install's clean-up must not take it
            record.intend("file", [p for p in [lay.slot_path("blue")] if not os.path.lexists(p)])
            record.intend("link", [lay.current_link, lay.last_good_link, lay.bin_link])
            await self._install_units(ports.service, record, start_operator=False)
            result = await run_install(ports, policy, request, folder=folder)
            if result.result == "committed":
                provision.ensure_compat_link()
            done = result.result in ("committed", "noop")
            if done:  # the operator takes upgrades of an installed agent only
                await self._start_operator(ports.service)
                return result
            # An aborted or rolled-back install: clean up, keep the result, and report the slot the host
            # shows after the clean-up (the slot the episode pointed at is gone with it).
            with anyio.CancelScope(shield=True):
                await self._clean_up_failed_install(record)
            done = True
            return attrs.evolve(result, slot=self._current_after_cleanup())
        except BaseException as exc:
            # design §7: a failed install removes what it created (the journal keeps the episode). The first
            # error stays the result; what the clean-up could not do goes with it as ``cleanup_errors``.
            with anyio.CancelScope(shield=True):
                await self._clean_up_failed_install(record)
            if self.cleanup_errors and isinstance(exc, Exception):
                with contextlib.suppress(AttributeError):
                    exc.cleanup_errors = list(self.cleanup_errors)  # type: ignore[attr-defined]
            done = True
            raise
        finally:
            if not done:  # cancelled on the way: clean up all the same
                with anyio.CancelScope(shield=True):
                    await self._clean_up_failed_install(record)

    def _current_after_cleanup(self) -> Slot | None:
        """The slot ``current`` names now (None when the clean-up removed it or it cannot be read)."""
        try:
            return self.host.links().current
        except UpgradeError:  # a layout conflict or an unreadable link: the summary names no slot
            return None

    async def _clean_up_failed_install(self, record: InstallRecord) -> None:
        """Remove what the record lists, by the rules of :mod:`agent.host.install_record`; never raises.

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
        the agent), remove a ``NAME.socket`` the configuration no longer asks for
        (:meth:`_drop_unwanted_socket`), and recreate a missing or drifted ``R/bin/NAME`` link;
        :attr:`repaired` says what.

        Raises:
            ConfigError: a unit file another service or agent owns stands where one of ours goes (exit 2).
            ServiceError, HostError: a unit or the link could not be written or started.
        """
        record = self.install_record()
        self.repaired = []
        units = self.units()
        drifted = {n: t for n, t in units.items() if _read_text(self._unit_path(n)) != t}
        if drifted:
            await self._install_units(service, record, only=drifted)
            self.repaired += [self._unit_path(n) for n in drifted]
        dropped = await self._drop_unwanted_socket(service, record)
        self.repaired += dropped
        lay = self.host.layout
        if not os.path.lexists(lay.bin_link) or (
            os.path.islink(lay.bin_link) and not _is_link_to(lay.bin_link, lay.bin_link_target)
        ):
            record.intend("dir", missing_dirs(lay.bin_dir))
            record.intend("link", [lay.bin_link])
            Provisioner(self.host).create_layout_dirs()
            Provisioner(self.host).ensure_compat_link()
            self.repaired.append(lay.bin_link)
        if drifted or dropped:
            if socket_unit_name(self.config.agent.name) in drifted:
                # A new or changed NAME.socket binds its address only once nothing holds it: stop the socket
                # (Requires= stops the agent with it) and the agent (which may have bound the address
                # itself); starting the agent starts the socket first (After=).
                await service.stop(socket_unit_name(self.config.agent.name))
                await service.stop()
            await service.start()
        current = self.host.links().current
        reason = f"repaired {', '.join(self.repaired)}" if self.repaired else None
        return UpgradeResult(None, "noop", slot=current, reason=reason)

    async def _drop_unwanted_socket(self, service: Any, record: InstallRecord) -> list[str]:
        """Without ``[agent] socket``: stop, disable and remove a ``NAME.socket`` an earlier install wrote
        (the install record lists it and its first line is this agent's header), and stop the agent unit,
        which :meth:`_repair` then starts binding its address itself; daemon-reload. A socket left running
        would hold the address, and the agent's next start would fail to bind it.

        Returns:
            The removed unit file's path, or nothing.

        Raises:
            ServiceError: a stop, the removal or the daemon-reload failed.
        """
        sock = socket_unit_name(self.config.agent.name)
        path = self._unit_path(sock)
        listed = any(e.kind == "unit" and e.path == path for e in record.entries)
        if self.config.agent.socket or not listed or not self._remover().unit_is_ours(path)[0]:
            return []
        await service.stop(sock)
        await service.stop()
        await service.disable(sock)
        removed = await service.remove_units([sock])
        await service.daemon_reload()
        record.forget(removed)
        return [path] if path in removed else []

    async def _adopt_legacy(self, provision: Any) -> UpgradeResult:
        record = self.install_record()
        record.intend("dir", missing_dirs(os.path.dirname(self.host.root)))
        record.intend("link", [self.host.root])
        provision.adopt()
        service = self._service()
        await self._install_units(service, record)
        await service.start()
        return UpgradeResult(None, "noop", slot=self.host.links().current, reason="adopted legacy layout")

    async def converge(self) -> UpgradeResult | None:
        """The recovery timer's converge step (docs/recovery.md, "A damaged layout"): a host whose
        ``current`` link is gone (damaged or reset by hand after install) is adopted again exactly as
        ``install`` without ``--archive`` would (:meth:`install`: a journaled ``install`` episode from the
        slot holding a plain executable, blue first, or from a legacy single binary; units, start, health
        check). A slot holding a verified binary is never overwritten: blue is re-installed from itself
        (the same bytes) or, when blue holds no executable, from green or the legacy binary.

        Returns:
            The install's result, or None when there is nothing to repair (``current`` names a slot, or
            nothing can be adopted; a legacy layout to link is left to ``install``).

        Raises:
            As :meth:`install`.
        """
        if self.host.is_installed():
            return None
        found = Provisioner(self.host).find_adoptable()
        if found is None or found.kind == "legacy_layout":
            return None
        log(f"recover: {self.host.current_link_path()} is missing; adopting {found.source} as install would")
        return await self.install()

    async def host_move(self) -> UpgradeResult:
        """``host move`` (docs/host.md, "Moving a linked host into a real root"): a host root that is a link
        to the legacy root becomes a real directory holding the layout, as one journaled ``host-move`` episode
        (:func:`upgrade_core.run_host_move`), under the host lock. A committed move then lists the real
        layout in the install record (after the old link entry, so a removal takes it away before the root).

        Returns:
            ``committed`` (moved), ``aborted`` (undone before the exchange: exit 1), or ``noop`` when the host
            root is a real directory already.

        Raises:
            NotInstalledError, LayoutConflictError: before the lock (exit 2).
            HostMoveRefusedError: the root is a link to somewhere else, an episode is open, or a slot
                ``current`` or ``last-good`` names predates the host root (exit 2; nothing changed).
            LockBusyError: the host lock is held (exit 75).
            EpisodeLeftOpenError, HostError: a failure after the exchange (exit 3; recovery finishes it).
        """
        require_installed(self.host)
        mover = RootMover(self.host)
        if mover.state() == "real":
            return UpgradeResult(None, "noop", slot=self.host.links().current,
                                 reason=f"{self.host.root} is a real directory already; nothing to move")

        async def move(ports: Ports, policy: Policy, folder: Folder) -> UpgradeResult:
            mover.state()  # again under the lock
            digests = {slot: await self.host.slot_sha256(slot) for slot in SLOTS}
            token = ports.ids.token_hex(4)
            return await run_host_move(
                ports, policy, f"host-move-{utc_stamp()}-{token}", root=self.host.root,
                legacy_root=self.host.legacy_root, staging_path=mover.staging_path(token), digests=digests,
                folder=folder,
            )

        result: UpgradeResult = await self._frame.write(move)
        if result.result == "committed":
            lay = self.host.layout
            record = self.install_record()
            record.intend("dir", [self.host.root, lay.lib_dir, lay.agent_dir, lay.bin_dir])
            record.intend("file", [lay.slot_path(s) for s in SLOTS])
            record.intend("link", [lay.current_link, lay.last_good_link, lay.bin_link])
        return result

    def unit_executables(self, bin_dir: str | None = None) -> list[str]:
        """Absolute paths of the tool's executables the rendered units run: ``recover-agent-upgrade``, and
        ``upgrade-agent`` beside it when ``[operations] source`` is set (``NAME-operator.service``).

        Args:
            bin_dir: the directory holding both on the host the units are for; None: where this process's
                own ``recover-agent-upgrade`` is installed (see :meth:`units`).
        """
        recover = recover_executable() if bin_dir is None else os.path.join(bin_dir, "recover-agent-upgrade")
        if not self.config.operations.source:
            return [recover]
        return [recover, os.path.join(os.path.dirname(recover), "upgrade-agent")]

    def units(self, *, bin_dir: str | None = None, config_path: str | None = None) -> dict[str, str]:
        """The rendered unit files, file name -> text (design §6, 10, 11): the agent unit, both recovery
        units, ``NAME-recover.timer`` and its ``NAME-recover-timer.service``; ``NAME-operator.service`` too
        when ``[operations] source`` is set (docs/managed.md), ``NAME.socket`` when ``[agent] socket`` is.

        Args:
            bin_dir: absolute directory holding ``upgrade-agent`` and ``recover-agent-upgrade`` on the host
                the units are for; None: where this process's own ``recover-agent-upgrade`` is installed
                (``upgrade-agent ignition`` names the runtime unpacked on the new host instead).
            config_path: absolute configuration path the units pass as ``--config``; None: this session's.

        Raises:
            ConfigError: a relative path or a bad name (see :func:`agent.systemd.units.render_units`).
        """
        cfg = self.config
        recover_exe, *upgrade_exe = self.unit_executables(bin_dir)
        operator = None
        if upgrade_exe:  # [operations] source is set: NAME-operator.service runs upgrade-agent
            exe = upgrade_exe[0]
            health = cfg.health
            budget = health.max_attempts * (health.stability_s + health.timeout_s)
            operator = (exe, cfg.operations.source, int(budget) + 120)
        return render_units(
            name=cfg.agent.name,
            unit=cfg.agent.unit,
            current_link=self.host.current_link_path(),
            exec_args=cfg.agent.exec_args,
            max_attempts=cfg.health.max_attempts,
            recover_exe=recover_exe,
            config_path=self.config_path if config_path is None else config_path,
            operator=operator,
            socket=cfg.agent.socket,
        )

    async def reset(self) -> Cleanup:
        """``reset``: stop, disable and remove the agent's units, daemon-reload, under the host lock.

        Only unit files the install record lists (with no record: the rendered names) whose first line is
        this agent's header are stopped, disabled and removed; any other is kept and reported.

        Returns:
            What was removed and kept, and the removals that failed.

        Raises:
            LockBusyError: the host lock is held (exit 75).
            HostRefusedError, HostError: ``state_dir`` or the install record cannot be trusted; nothing was
                changed (exit 4).
            ConfigError: the journal in ``state_dir`` belongs to another configuration (exit 2).
        """
        check_state(self.config)  # the writer's checks, before the lock file or anything else is touched
        check_host_root(self.host)
        self.install_record()  # a record that cannot be trusted is refused before the lock file too
        with HostLock(self.config.host.lock_path):
            record = self.install_record()  # read again under the lock: the one acted on
            out = await self.remove_units(record)
            self._forget(record, out)
            return out

    async def uninstall(self) -> Cleanup:
        """``uninstall``, under the host lock: :meth:`reset`, then what the install record lists (with no
        record, only the layout files carrying the agent's marker), the files the agent wrote in
        ``state_dir``, and the lock file. Never the legacy root, the configuration, a mount point, a
        non-empty directory, or anything else in ``state_dir``.

        Returns:
            What was removed and kept, and the removals that failed.

        Raises:
            HostRefusedError: the host layout or ``state_dir`` is on a read-only mount, or the install record
                cannot be trusted (exit 4); nothing was stopped or removed.
            LockBusyError: the host lock is held (exit 75).
        """
        cfg = self.config
        check_state(cfg)  # the writer's checks, before the lock file or anything else is touched
        check_host_root(self.host)
        self.install_record()  # a record that cannot be trusted is refused before the lock file too
        _refuse_read_only(self.host.layout.agent_dir, cfg.host.state_dir)
        with HostLock(cfg.host.lock_path):
            record = self.install_record()  # refused (a symlink, another agent's) before anything changes
            out = await self.remove_units(record)
            remover = self._remover()
            out.extend(remover.remove(record.entries) if record.exists else remover.remove_marked_layout())
            if record.exists:
                try:
                    record.forget([e.path for e in record.entries if not os.path.lexists(e.path)])
                except OSError as e:
                    out.errors.append(f"{record.path}: cannot update the install record: {e.strerror}")
            out.extend(remove_state_files(cfg.host.state_dir, keep_record=bool(record.entries)))
        try:
            if durable.remove_regular(cfg.host.lock_path):
                out.removed.append(cfg.host.lock_path)
        except (OSError, HostError) as e:
            out.errors.append(f"{cfg.host.lock_path}: cannot remove: {getattr(e, 'strerror', None) or e}")
        return out

    def install_record(self) -> InstallRecord:
        """The install record in ``state_dir`` (empty, ``exists`` False, when there is none); creates nothing.

        Raises:
            HostRefusedError: a symlink, FIFO or other non-regular file stands where it goes (exit 4).
            HostError: it is unreadable or belongs to another agent.
        """
        cfg = self.config
        try:
            return InstallRecord.load(cfg.host.state_dir, cfg.agent.name, cfg.agent.unit, self.config_path,
                                      allowed=self._record_scope())
        except RecordError as exc:
            path = os.path.join(cfg.host.state_dir, RECORD_NAME)
            if exc.refused:
                raise HostRefusedError(path, str(exc).removeprefix(f"{path}: ")) from None
            raise HostError(str(exc)) from None

    def _record_scope(self) -> tuple[str, ...]:
        """Where the install record's entries may lie: the host root, the unit directory, ``state_dir``."""
        cfg = self.config
        return tuple(os.path.normpath(p) for p in (self.host.root, cfg.host.unit_dir, cfg.host.state_dir))

    def _remover(self) -> Remover:
        return Remover(self.host.layout, self.config.host.unit_dir, self.host.legacy_root)

    def _unit_path(self, name: str) -> str:
        return os.path.join(self.config.host.unit_dir, name)

    def refuse_foreign_units(self) -> None:
        """Refuse to write over, or in front of, a unit file this agent did not write (docs/host.md, case
        C24).

        A unit file in ``host.unit_dir`` must carry this agent's header line. A unit of the same name in any
        other directory systemd loads units from (:data:`~agent.systemd.searchpath.SYSTEM_UNIT_DIRS`: a
        vendor unit in ``/usr/lib/systemd/system``, a runtime or generated one) would be silently
        overridden by the file ``install`` writes, so it is refused too.

        Raises:
            ConfigError: one of :meth:`units` exists without this agent's header line: another service's
                unit, or one another configuration's install wrote, or one systemd loads from another unit
                directory (exit 2, naming the key and the file that owns the name).
        """
        remover = self._remover()
        unit_dir = os.path.normpath(self.config.host.unit_dir)
        for name in self.units():
            key = "agent.unit" if name == self.config.agent.unit else "agent.name"
            for directory in SYSTEM_UNIT_DIRS:
                other = os.path.join(directory, name)
                if os.path.normpath(directory) != unit_dir and os.path.lexists(other):
                    raise ConfigError(
                        f"{key}: {other} already defines {name}; the file install writes in {unit_dir} "
                        "would override it: choose another unit name"
                    )
            path = self._unit_path(name)
            if not os.path.lexists(path):
                continue
            ours, why = remover.unit_is_ours(path)
            if not ours:
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
        return service_manager(self.config, self.config_path)

    async def _install_units(
        self, service: Any, record: InstallRecord, only: dict[str, str] | None = None, *,
        start_operator: bool = True,
    ) -> None:
        """Write the units (``only`` those, default all of :meth:`units`), each listed in the install record
        first; daemon-reload; enable the agent, the boot-time recovery unit, the recovery timer, (with
        ``[agent] socket``) ``NAME.socket`` and (with ``[operations]``) ``NAME-operator.service``; start the
        timer (it recovers an abandoned episode, an interrupted install's too, without waiting for a reboot)
        and, with ``start_operator``, the operator (a bare install starts it only once it committed).
        ``NAME.socket`` is not started here: the agent unit's start starts it first (``Requires=``,
        ``After=``), so no connection can start an agent whose binary is not in place yet.

        Raises:
            ConfigError: a unit file this agent did not write stands in the way (nothing written).
        """
        name = self.config.agent.name
        self.refuse_foreign_units()
        units = self.units() if only is None else only
        record.intend("unit", [self._unit_path(n) for n in units])
        await service.write_units(units)
        await service.daemon_reload()
        enabled = [self.config.agent.unit, recover_boot_unit_name(name), recover_timer_name(name)]
        rendered = self.units()
        enabled += [u for u in (socket_unit_name(name), operator_unit_name(name)) if u in rendered]
        await service.enable(*enabled)
        await service.start(recover_timer_name(name))
        if start_operator:
            await self._start_operator(service)

    async def _start_operator(self, service: Any) -> None:
        """Start ``NAME-operator.service`` when ``[operations]`` is configured (docs/managed.md)."""
        if operator_unit_name(self.config.agent.name) in self.units():
            await service.start(operator_unit_name(self.config.agent.name))

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
        for unit in owned:  # a unit stopped mid-run stays loaded as "failed" until this; leave no residue
            try:
                await service.reset_failed(unit)
            except UpgradeError as exc:
                log(f"reset-failed {unit}: {exc}")
        return out


def _refuse_read_only(*paths: str) -> None:
    """Refuse, before stopping anything, to uninstall from a read-only mount (case C14: rescue views).

    Raises:
        HostRefusedError: the nearest existing ancestor of one of ``paths`` is on a read-only mount (exit 4).
    """
    for path in paths:
        probe = path
        while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        if os.statvfs(probe).f_flag & os.ST_RDONLY:
            raise HostRefusedError(path, "on a read-only mount; nothing was stopped or removed")


def _read_text(path: str) -> str | None:
    """A unit file's text, None when absent or not a regular file (never follows a link or opens a FIFO)."""
    data = read_regular(path, follow=False)
    return None if data is None else data.decode("utf-8", errors="replace")


def _is_link_to(path: str, target: str) -> bool:
    try:
        return os.readlink(path) == target
    except OSError:
        return False


class _PlainFileSource:
    """An :class:`~upgrade_core.ports.ArchiveSource` for adoption: the "archive" is a plain executable."""

    async def stage(
        self, source: str, expected_sha256: str | None, staging_path: str, slot: Slot
    ) -> StagedCandidate:
        """Copy ``source`` into ``staging_path`` durably; its digest is computed from the copy."""

        def copy() -> tuple[str, int]:
            durable.copy_file_durable(source, staging_path, 0o755)
            return durable.file_sha256(staging_path), os.stat(staging_path).st_size

        sha, size = await anyio.to_thread.run_sync(copy)
        return StagedCandidate(slot, staging_path, sha, size, sha, size)

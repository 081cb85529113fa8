"""The agent unit under systemd: the ``ServiceManager`` port (design §4.3 steps 6-7, 4.5, 6).

The unit files it writes are rendered by :mod:`agent.systemd.units` (pure text).

- **SystemdServiceManager**: every call is ``systemctl``/``systemd-run`` behind ``host.systemctl_prefix``
  (empty on a real host; ``nsenter -t PID -m -p -u -i --`` for the private test systemd), each with a
  timeout; every call that starts a job uses ``--no-block`` and then polls (design §4.5). We drive the
  ``systemctl`` CLI rather than D-Bus: it is what an operator types, needs no bus library, and works
  through an ``nsenter`` prefix unchanged.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, final

import anyio

from agent.fs import durable
from agent.fs.regular import list_names, read_regular_file, read_text
from agent.process import BoundedRunTimeout, Finished, run_bounded
from agent.systemd.units import check_abs, check_unit
from upgrade_core.errors import ServiceError
from upgrade_core.ports import ServiceManager, UnitSnapshot

__all__ = ["SystemdServiceManager"]

_TRANSIENT_RE: Final = re.compile(r"[A-Za-z0-9:_.@-]{1,240}(\.service)?")
_SNAPSHOT_PROPS: Final = (
    "ActiveState", "SubState", "Result", "MainPID", "InvocationID", "NRestarts",
    "ExecMainStartTimestampMonotonic",
)
_TRANSITIONAL: Final = frozenset({"activating", "deactivating", "reloading", "refreshing"})
# readlink -z prints the exe then NUL; an unreadable exe prints a lone NUL; then the raw cmdline follows.
_PROC_READ_SH: Final = 'exec 2>/dev/null; readlink -z "/proc/$1/exe" || printf "\\0"; cat "/proc/$1/cmdline"'


def _parse_show(text: str) -> dict[str, str]:
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key] = value
    return props


def _int_prop(props: Mapping[str, str], key: str, unit: str) -> int:
    raw = props.get(key, "")
    if raw in ("", "[not set]"):
        return 0
    try:
        return int(raw)
    except ValueError:
        raise ServiceError(f"systemctl show {unit}: {key}={raw!r} is not an integer") from None


def _own_cgroup_paths() -> list[str]:
    """Our cgroup paths from /proc/self/cgroup: the unified (``0::``) line and the v1 ``name=systemd`` one."""
    paths = []
    with contextlib.suppress(OSError):
        for line in (read_text("/proc/self/cgroup") or "").splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers in ("", "name=systemd"):
                paths.append(path)
    return paths


# ----------------------------------------------------------------------------------------------- manager
@final
class SystemdServiceManager:
    """``upgrade_core.ports.ServiceManager`` over ``systemctl``/``systemd-run`` (design §4.3 steps 6-7, 6).

    Args:
        unit: the agent unit, e.g. ``demo-agent.service``.
        unit_dir: where unit files live (``host.unit_dir``; the sandbox's :attr:`unit_dir` in tests).
        recover_exe: absolute path of the installed ``recover-agent-upgrade`` (for :meth:`hand_off_recovery`).
        config_path: absolute path of the configuration file passed as ``--config``.
        prefix: ``host.systemctl_prefix``, an argv put before every ``systemctl``/``systemd-run`` and before
            the ``/proc`` reads of :meth:`snapshot` (PIDs are namespace-local behind ``nsenter``).
        command_timeout_s: timeout of each subprocess, in seconds.
        poll_interval_s: seconds between polls after a ``--no-block`` job.

    Raises:
        ConfigError: a bad unit name, or a relative path.
    """

    def __init__(
        self,
        unit: str,
        *,
        unit_dir: str | os.PathLike[str],
        recover_exe: str,
        config_path: str,
        prefix: Sequence[str] = (),
        command_timeout_s: float = 30.0,
        poll_interval_s: float = 0.1,
    ) -> None:
        check_unit(unit)
        check_abs(recover_exe, "recover-agent-upgrade path")
        check_abs(config_path, "--config")
        self._unit = unit
        self.unit_dir = Path(unit_dir)
        self.recover_exe = recover_exe
        self.config_path = config_path
        self.prefix = tuple(prefix)
        self.command_timeout_s = command_timeout_s
        self.poll_interval_s = poll_interval_s

    @property
    def unit(self) -> str:
        """The agent unit's name, e.g. ``demo-agent.service``."""
        return self._unit

    # ------------------------------------------------------------------ subprocess plumbing
    async def _run(
        self, argv: Sequence[str], *, check: bool = True, timeout_s: float | None = None
    ) -> Finished:
        full = [*self.prefix, *argv]
        timeout = self.command_timeout_s if timeout_s is None else timeout_s
        try:
            done = await run_bounded(full, timeout_s=timeout)
        except BoundedRunTimeout:
            raise ServiceError(f"`{shlex.join(full)}` timed out after {timeout:g} s") from None
        except OSError as exc:
            raise ServiceError(f"`{shlex.join(full)}` could not run: {exc}") from exc
        if check and done.returncode != 0:
            raise ServiceError(f"`{shlex.join(full)}` exited {done.returncode}: {_last_line(done.stderr)}")
        return done

    async def _systemctl(self, *args: str, check: bool = True) -> Finished:
        return await self._run(["systemctl", *args], check=check)

    async def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show UNIT -p A,B,...`` as a dict (values verbatim; a unit never loaded shows defaults).

        Raises:
            ServiceError: the command failed or timed out.
        """
        done = await self._systemctl("show", unit, "-p", ",".join(props))
        return _parse_show(done.stdout.decode(errors="replace"))

    # ------------------------------------------------------------------ the port
    async def snapshot(self) -> UnitSnapshot:
        """Read the agent unit's state and its main process (``/proc/<MainPID>/exe`` and ``cmdline``).

        A unit that is not loaded reads as ``inactive/dead`` with MainPID 0 (what ``systemctl show`` says).
        The exe is resolved by the kernel, so a process started through the ``current`` link shows the slot
        file; for an interpreted agent it is the interpreter and ``cmdline`` names the script.

        Raises:
            ServiceError: ``systemctl show`` failed or timed out, or printed a non-integer number.
        """
        props = await self.show(self._unit, *_SNAPSHOT_PROPS)
        main_pid = _int_prop(props, "MainPID", self._unit)
        exe, cmdline = await self._read_proc(main_pid) if main_pid > 0 else (None, ())
        return UnitSnapshot(
            active_state=props.get("ActiveState", ""),
            sub_state=props.get("SubState", ""),
            result=props.get("Result", ""),
            main_pid=main_pid,
            invocation_id=props.get("InvocationID", ""),
            n_restarts=_int_prop(props, "NRestarts", self._unit),
            main_start_monotonic_s=_int_prop(props, "ExecMainStartTimestampMonotonic", self._unit) / 1e6,
            exe=exe,
            cmdline=cmdline,
        )

    async def _read_proc(self, pid: int) -> tuple[str | None, tuple[str, ...]]:
        if self.prefix:
            # PIDs behind the prefix are namespace-local: read /proc through it, in one subprocess.
            try:
                done = await self._run(["sh", "-c", _PROC_READ_SH, "proc-read", str(pid)], check=False)
            except ServiceError:
                return None, ()
            raw_exe, _, raw_cmd = done.stdout.partition(b"\0")
            exe = os.fsdecode(raw_exe) or None
        else:
            def read() -> tuple[str | None, bytes]:
                try:
                    found: str | None = os.readlink(f"/proc/{pid}/exe")
                except OSError:
                    found = None
                try:
                    return found, read_regular_file(f"/proc/{pid}/cmdline")
                except OSError:
                    return found, b""

            exe, raw_cmd = await anyio.to_thread.run_sync(read)
        cmdline = tuple(os.fsdecode(part) for part in raw_cmd.split(b"\0")[:-1]) if raw_cmd else ()
        return exe, cmdline

    async def restart(self, transient_name: str) -> None:
        """``reset-failed`` the agent unit, then restart it from a transient unit (design §4.3 step 6).

        Runs ``systemd-run --unit=TRANSIENT --collect --no-block --quiet systemctl restart UNIT``. The
        transient unit lives outside the agent's cgroup, so the restart survives the caller being killed by
        it (C15). Its ``systemctl restart`` blocks on purpose: the transient unit then stays active until
        the restart job finishes and its exit status records the job's outcome in the journal; the caller
        is not blocked (``--no-block``) and ``--collect`` unloads it afterwards even when it failed.

        Raises:
            ServiceError: a command failed or timed out (e.g. a transient unit of that name exists).

        Cancellation: may have partly happened; health observation tells.
        """
        _check_transient(transient_name)
        await self.reset_failed(self._unit)
        await self._run([
            "systemd-run", f"--unit={transient_name}", "--collect", "--no-block", "--quiet",
            f"--description=restart {self._unit} (upgrade-agent)",
            "systemctl", "restart", self._unit,
        ])

    async def restart_done(self, transient_name: str) -> bool:
        """True when the transient restart unit has no job and is neither active nor in transition
        (``systemctl show -p Job,ActiveState``; a collected unit reads ``inactive`` with no job).

        Raises:
            ServiceError: ``systemctl show`` failed or timed out.
        """
        _check_transient(transient_name)
        props = await self.show(transient_name, "Job", "ActiveState")
        state = props.get("ActiveState", "")
        return not props.get("Job") and state != "active" and state not in _TRANSITIONAL

    def runs_inside_unit(self) -> bool:
        """True when this process lives in the agent unit's cgroup (or below it), case C15.

        Compares ``/proc/self/cgroup`` with the unit's ``ControlGroup`` property. When that cannot be read
        (systemctl failing), falls back to the unit name as a path component of our cgroup, since systemd
        always names a unit's cgroup after the unit. Blocking (one short subprocess): the orchestrator
        calls it once per episode.
        """
        ours = _own_cgroup_paths()
        control_group = ""
        try:
            done = subprocess.run(
                [*self.prefix, "systemctl", "show", self._unit, "-p", "ControlGroup", "--value"],
                capture_output=True, timeout=min(self.command_timeout_s, 10.0), check=False,
                stdin=subprocess.DEVNULL,
            )
            if done.returncode == 0:
                control_group = done.stdout.decode(errors="replace").strip()
            else:
                return any(self._unit in path.split("/") for path in ours)
        except (OSError, subprocess.TimeoutExpired):
            return any(self._unit in path.split("/") for path in ours)
        if not control_group:
            return False  # the unit has no cgroup: it runs nothing, so we cannot be in it
        return any(path == control_group or path.startswith(control_group + "/") for path in ours)

    async def hand_off_recovery(self, transient_name: str, after_unit: bool) -> None:
        """Start ``recover-agent-upgrade --config CFG --trigger manual`` in a transient unit (design §4.3,
        4.5).

        Args:
            transient_name: the transient unit's name (unique; systemd refuses a name in use).
            after_unit: add ``-p After=<agent unit>``, so boot recovery's health check starts only once the
                agent's start job is done.

        Raises:
            ServiceError: ``systemd-run`` failed or timed out.

        Cancellation: may have partly happened; the transient unit may be running.
        """
        _check_transient(transient_name)
        argv = ["systemd-run", f"--unit={transient_name}", "--collect", "--no-block", "--quiet",
                f"--description=recover {self._unit} upgrade (upgrade-agent)"]
        if after_unit:
            argv += ["-p", f"After={self._unit}"]
        # systemd substitutes $VAR in a transient unit's arguments too (systemd-run has no way to turn that
        # off before v254's --expand-environment=no); "$$" passes one literal "$". % is not expanded here.
        argv += [self.recover_exe, "--config", self.config_path.replace("$", "$$"), "--trigger", "manual"]
        await self._run(argv)

    # ------------------------------------------------------------------ unit lifecycle
    async def daemon_reload(self) -> None:
        """``systemctl daemon-reload`` (synchronous in systemd: returns once units are reloaded).

        Raises:
            ServiceError: it failed or timed out.
        """
        await self._systemctl("daemon-reload")

    async def enable(self, *units: str) -> None:
        """``systemctl enable UNIT...``: the ``[Install]`` symlinks, in ``unit_dir``; starts nothing.

        Raises:
            ServiceError: a unit file is missing, or the command failed or timed out.
        """
        for unit in units:
            check_unit(unit, "unit")
        await self._systemctl("enable", "--quiet", *units)

    async def disable(self, *units: str) -> None:
        """``systemctl disable`` for those of ``units`` whose file is in ``unit_dir`` (others: nothing to do).

        Raises:
            ServiceError: the command failed or timed out.
        """
        for unit in units:
            check_unit(unit, "unit")
        present = [u for u in units if os.path.lexists(self.unit_dir / u)]
        if present:
            await self._systemctl("disable", "--quiet", *present)

    async def is_enabled(self, unit: str) -> bool:
        """True when ``systemctl is-enabled`` says ``enabled`` or ``enabled-runtime``.

        Raises:
            ServiceError: it timed out (a missing unit file is simply False).
        """
        done = await self._systemctl("is-enabled", unit, check=False)
        return done.stdout.decode(errors="replace").strip() in ("enabled", "enabled-runtime")

    async def reset_failed(self, unit: str | None = None) -> None:
        """``systemctl reset-failed`` (the agent unit by default); a unit that is not loaded is not failed.

        Raises:
            ServiceError: it failed while the unit is still ``failed``, or a command timed out.
        """
        unit = unit or self._unit
        done = await self._systemctl("reset-failed", unit, check=False)
        if done.returncode != 0:
            state = (await self.show(unit, "ActiveState")).get("ActiveState")
            if state == "failed":
                raise ServiceError(f"systemctl reset-failed {unit} exited {done.returncode}: "
                                   f"{_last_line(done.stderr)}")

    async def start(self, unit: str | None = None, *, timeout_s: float = 90.0) -> str:
        """``systemctl start --no-block`` then poll until the job is done and the state has settled.

        Args:
            unit: default the agent unit.
            timeout_s: seconds to wait for the start job to finish.

        Returns:
            The settled ``ActiveState``: ``active``, ``failed``, ``inactive`` (a oneshot that ran), or
            ``activating`` when the process already died and ``Restart=`` is pending (SubState
            ``auto-restart``). Judging it is the caller's business (design §4.3 step 7, case C16).

        Raises:
            ServiceError: the unit cannot be started (not found, bad unit file), or it did not settle
                within ``timeout_s`` (the message gives the last state seen).
        """
        unit = unit or self._unit
        await self._systemctl("start", "--no-block", unit)
        return await self._settle(unit, "start", timeout_s)

    async def stop(self, unit: str | None = None, *, timeout_s: float = 90.0) -> str:
        """``systemctl stop --no-block`` then poll until the job is done; a unit not loaded is stopped.

        Returns:
            The settled ``ActiveState`` (``inactive`` or ``failed``).

        Raises:
            ServiceError: the command failed, or the stop did not settle within ``timeout_s``.
        """
        unit = unit or self._unit
        done = await self._systemctl("stop", "--no-block", unit, check=False)
        if done.returncode != 0:
            state = (await self.show(unit, "ActiveState", "LoadState"))
            if state.get("ActiveState") in ("inactive", "failed") and state.get("LoadState") != "loaded":
                return state.get("ActiveState", "inactive")
            raise ServiceError(f"systemctl stop --no-block {unit} exited {done.returncode}: "
                               f"{_last_line(done.stderr)}")
        return await self._settle(unit, "stop", timeout_s)

    async def _settle(self, unit: str, what: str, timeout_s: float) -> str:
        props: dict[str, str] = {}
        with anyio.move_on_after(timeout_s):
            while True:
                props = await self.show(unit, "ActiveState", "SubState", "Job")
                if not props.get("Job") and (
                    props.get("ActiveState") not in _TRANSITIONAL
                    # a failed start waiting for Restart=: the job is over; do not wait out a crash loop
                    or props.get("SubState") == "auto-restart"
                ):
                    return props.get("ActiveState", "")
                await anyio.sleep(self.poll_interval_s)
        raise ServiceError(
            f"{what} of {unit} did not settle within {timeout_s:g} s "
            f"(ActiveState={props.get('ActiveState')}, SubState={props.get('SubState')}, "
            f"Job={props.get('Job')})"
        )

    # ------------------------------------------------------------------ unit files
    async def write_units(self, units: Mapping[str, str]) -> list[str]:
        """Write unit files into ``unit_dir`` durably: temp + fsync + rename each, then one directory fsync.

        Identical files are left alone. Call :meth:`daemon_reload` afterwards.

        Args:
            units: file name -> text, e.g. from :func:`agent.systemd.units.render_units`.

        Returns:
            Absolute paths of the files whose content changed.

        Raises:
            ConfigError: a name is not a plain unit file name.
            ServiceError: ``unit_dir`` is missing or a write failed (the message names the file).
        """
        for name in units:
            check_unit(name, "unit file name")

        def write() -> list[str]:
            changed = []
            for name, text in units.items():
                path = str(self.unit_dir / name)
                try:
                    if durable.atomic_write_bytes(path, text.encode(), 0o644):
                        changed.append(path)
                except OSError as exc:
                    raise ServiceError(f"cannot write unit file {path}: {exc}") from exc
            return changed

        with anyio.CancelScope(shield=True):
            paths = await anyio.to_thread.run_sync(write)
        return paths

    async def remove_units(self, names: Iterable[str]) -> list[str]:
        """Remove unit files and their ``*.wants``/``*.requires`` symlinks from ``unit_dir``; fsync the dirs.

        Missing files are fine (idempotent; EROFS-safe: ``lstat`` decides). Call :meth:`daemon_reload` after.

        Returns:
            Absolute paths removed.

        Raises:
            ConfigError: a name is not a plain unit file name.
            ServiceError: a removal failed (the message names the file).
        """
        wanted = list(names)
        for name in wanted:
            check_unit(name, "unit file name")

        def remove() -> list[str]:
            removed: list[str] = []
            dirs = {self.unit_dir}
            candidates = [self.unit_dir / n for n in wanted]
            with contextlib.suppress(OSError):
                for sub in list_names(str(self.unit_dir)):
                    if sub.endswith((".wants", ".requires")) and (self.unit_dir / sub).is_dir():
                        candidates += [self.unit_dir / sub / n for n in wanted]
            for path in candidates:
                try:
                    if durable.remove_if_present(str(path), sync_dir=False):
                        removed.append(str(path))
                        dirs.add(path.parent)
                except OSError as exc:
                    raise ServiceError(f"cannot remove unit file {path}: {exc}") from exc
            for d in dirs if removed else ():
                durable.fsync_dir(str(d))
            return removed

        with anyio.CancelScope(shield=True):
            paths = await anyio.to_thread.run_sync(remove)
        return paths


def _check_transient(name: str) -> None:
    if not _TRANSIENT_RE.fullmatch(name):
        raise ServiceError(f"transient unit name {name!r} is not a valid unit name")


def _last_line(stderr: bytes) -> str:
    lines = [ln.strip() for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


if TYPE_CHECKING:  # mypy proves the class satisfies the port it implements

    def _is_a_service_manager(manager: SystemdServiceManager) -> ServiceManager:
        return manager

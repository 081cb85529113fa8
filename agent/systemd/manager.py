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
import stat
import subprocess
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, final

import anyio

from agent.crashhook import crash_point
from agent.fs import durable
from agent.fs.regular import read_regular_file, read_text
from agent.fs.tree import Dir, open_dir
from agent.logline import log
from agent.process import BoundedRunTimeout, Finished, run_bounded
from agent.systemd.units import check_abs, check_unit
from upgrade_core.errors import ServiceError, UpgradeError
from upgrade_core.ports import ServiceManager, UnitSnapshot

__all__ = ["SystemdServiceManager", "write_order"]

_TRANSIENT_RE: Final = re.compile(r"[A-Za-z0-9:_.@-]{1,240}(\.service)?")
_SNAPSHOT_PROPS: Final = (
    "ActiveState", "SubState", "Result", "MainPID", "InvocationID", "NRestarts",
    "ExecMainStartTimestampMonotonic", "ExecMainCode", "ExecMainStatus", "ExecStart",
)
_TRANSITIONAL: Final = frozenset({"activating", "deactivating", "reloading", "refreshing"})
START_LIMIT_MARGIN_S: Final = 2.0
"""Seconds added to the unit's start-limit interval before the one start after a refused ``reset-failed``."""
START_LIMIT_WAIT_MAX_S: Final = 300.0
"""The longest start-limit interval (seconds) the agent waits out; longer, zero or infinite is refused."""
# systemd's format_timespan() units, as `systemctl show` prints a USec property ("1min 30s", "2.500000s").
_TIMESPAN_UNITS_S: Final = {
    "y": 31_557_600.0, "month": 2_629_800.0, "w": 604_800.0, "d": 86_400.0, "h": 3_600.0, "min": 60.0,
    "s": 1.0, "ms": 1e-3, "us": 1e-6, "\u00b5s": 1e-6,
}
_TIMESPAN_PART_RE: Final = re.compile(r"(\d+(?:\.\d+)?)(y|month|w|d|h|min|s|ms|us|\u00b5s)")
# readlink -z prints the exe then NUL; an unreadable exe prints a lone NUL; then the raw cmdline follows.
_PROC_READ_SH: Final = 'exec 2>/dev/null; readlink -z "/proc/$1/exe" || printf "\\0"; cat "/proc/$1/cmdline"'


def _parse_show(text: str) -> dict[str, str]:
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key] = value
    return props


def _exec_start_path(value: str) -> str:
    """The ``path=`` field of ``systemctl show -p ExecStart`` (``{ path=/x ; argv[]=/x serve ; ... }``, the
    first command when there are several), "" when absent."""
    for field in value.split(";"):
        key, sep, path = field.strip(" {}").partition("=")
        if sep and key.strip() == "path":
            return path.strip()
    return ""


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
        selection: what selects the binary the agent unit runs, as one comparable string (the ``current``
            link's target and that slot's sha256; :func:`agent.session.wiring.service_manager` passes it):
            read before and after waiting out a start limit (:meth:`restart`). None: not compared.
        start_limit_margin_s: seconds added to the start-limit interval that :meth:`restart` waits out.

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
        selection: Callable[[], Awaitable[str]] | None = None,
        start_limit_margin_s: float = START_LIMIT_MARGIN_S,
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
        self.selection = selection
        self.start_limit_margin_s = start_limit_margin_s

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
            exec_main_code=_int_prop(props, "ExecMainCode", self._unit),
            exec_main_status=_int_prop(props, "ExecMainStatus", self._unit),
            exec_start=_exec_start_path(props.get("ExecStart", "")),
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

        When ``systemctl reset-failed`` is refused while the unit is ``failed`` (an SELinux policy that
        denies it prints ``Failed to reset failed state of unit UNIT: ...`` and exits 1), the start-limit
        counter it would have cleared is waited out instead (:meth:`wait_out_start_limit`): the unit's
        ``StartLimitIntervalUSec`` plus :attr:`start_limit_margin_s`, after which systemd accepts one more
        start. The health attempt that follows every restart then requires ``MainPID``'s executable to be
        the expected slot (``last-good`` in a rollback) for the whole stability window (design §4.3 step 7).

        Runs ``systemd-run --unit=TRANSIENT --collect --no-block --quiet systemctl restart UNIT``. The
        transient unit lives outside the agent's cgroup, so the restart survives the caller being killed by
        it (C15). Its ``systemctl restart`` blocks on purpose: the transient unit then stays active until
        the restart job finishes and its exit status records the job's outcome in the journal; the caller
        is not blocked (``--no-block``) and ``--collect`` unloads it afterwards even when it failed.

        Raises:
            ServiceError: a command failed or timed out (e.g. a transient unit of that name exists); the
                start limit could not be waited out (see :meth:`wait_out_start_limit`).

        Cancellation: may have partly happened; health observation tells.
        """
        _check_transient(transient_name)
        refusal = await self._reset_failed_refusal(self._unit)
        if refusal is not None:
            await self.wait_out_start_limit(refusal)
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
        refusal = await self._reset_failed_refusal(unit)
        if refusal is not None:
            raise ServiceError(refusal)

    async def _reset_failed_refusal(self, unit: str) -> str | None:
        """``systemctl reset-failed UNIT``; None when it worked or the unit is not ``failed`` anyway, else
        one line saying how it was refused (the command's exit status and last stderr line)."""
        done = await self._systemctl("reset-failed", unit, check=False)
        if done.returncode == 0:
            return None
        if (await self.show(unit, "ActiveState")).get("ActiveState") != "failed":
            return None
        return f"systemctl reset-failed {unit} exited {done.returncode}: {_last_line(done.stderr)}"

    async def wait_out_start_limit(self, refusal: str) -> None:
        """Wait until systemd accepts one more start of the agent unit without ``reset-failed``.

        systemd counts starts within ``StartLimitIntervalSec=`` from the first one and forgets them once
        that interval has passed (systemd.unit(5)), so after the unit's ``StartLimitIntervalUSec`` (read
        from the loaded unit: drop-ins count) plus :attr:`start_limit_margin_s` a start is accepted even
        after ``start-limit-hit``. The binary the unit would run (:attr:`selection`) is read before and after
        the wait: a change meanwhile (another upgrade, an operator's hand) is refused rather than started.

        Args:
            refusal: the line saying how ``reset-failed`` was refused (it starts every error message).

        Raises:
            ServiceError: the interval is zero (no start limit: the refusal has another cause), infinite or
                over :data:`START_LIMIT_WAIT_MAX_S`; the selected binary changed during the wait; or
                ``systemctl show`` failed.
        """
        unit = self._unit
        raw = (await self.show(unit, "StartLimitIntervalUSec")).get("StartLimitIntervalUSec", "")
        interval_s = _timespan_s(raw)
        if interval_s is None or not 0 < interval_s <= START_LIMIT_WAIT_MAX_S:
            raise ServiceError(
                f"{refusal}; not waiting out the start limit of {unit}: StartLimitIntervalUSec={raw or '?'} "
                f"is zero, infinite or over {START_LIMIT_WAIT_MAX_S:g} s"
            )
        before = await self._selected(refusal)
        wait_s = interval_s + self.start_limit_margin_s
        log(f"{refusal}; waiting out the start limit of {unit} ({interval_s:g} s + "
            f"{self.start_limit_margin_s:g} s) before starting it once more")
        await anyio.sleep(wait_s)
        after = await self._selected(refusal)
        if after != before:
            raise ServiceError(
                f"{refusal}; the binary {unit} runs changed while its start limit was waited out "
                f"({before} -> {after}): not starting it"
            )

    async def _selected(self, refusal: str) -> str | None:
        """:attr:`selection`'s answer (None without one); a failure to read it is a ``ServiceError``."""
        if self.selection is None:
            return None
        try:
            return await self.selection()
        except (UpgradeError, OSError) as exc:
            raise ServiceError(f"{refusal}; cannot tell which binary {self._unit} runs: {exc}") from exc

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

        Identical files are left alone. Call :meth:`daemon_reload` afterwards. The order is
        :func:`write_order`: a unit named by another's ``OnFailure=``, ``Requires=`` or ``Sockets=`` (or a
        timer's ``Unit=``) is on disk before the unit that names it, so a crash between two writes never
        leaves a unit whose failure handler or socket is missing (systemd would then start no recovery at
        all, or not start the agent).

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
            for name in write_order(units):
                path = str(self.unit_dir / name)
                try:
                    if durable.atomic_write_bytes(path, units[name].encode(), 0o644):
                        changed.append(path)
                except OSError as exc:
                    raise ServiceError(f"cannot write unit file {path}: {exc}") from exc
                crash_point("unit-file")
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

        def remove_in(d: Dir, removed: list[str]) -> None:
            """Each wanted name in the checked directory ``d``, with ``unlinkat``; ``d`` fsynced after."""
            before = len(removed)
            for name in wanted:
                try:
                    if d.remove(name, sync=False):
                        removed.append(d.join(name))
                except OSError as exc:
                    raise ServiceError(f"cannot remove unit file {d.join(name)}: {exc}") from exc
            if len(removed) > before:
                d.fsync()

        def remove() -> list[str]:
            removed: list[str] = []
            # One checked handle of unit_dir; its *.wants/*.requires directories are opened through it and
            # never followed when they are links (agent/fs/tree.py).
            top = open_dir(str(self.unit_dir))
            if top is None:
                return removed
            with top:
                remove_in(top, removed)
                for sub in top.names():
                    st = top.lstat(sub)
                    if not (sub.endswith((".wants", ".requires")) and st is not None
                            and stat.S_ISDIR(st.st_mode)):
                        continue
                    d = top.child(sub)
                    if d is not None:
                        with d:
                            remove_in(d, removed)
            return removed

        with anyio.CancelScope(shield=True):
            paths = await anyio.to_thread.run_sync(remove)
        return paths


_REFERENCE_RE: Final = re.compile(r"^(?:OnFailure|Unit|Requires|Sockets)=(.*)$", re.MULTILINE)


def write_order(units: Mapping[str, str]) -> list[str]:
    """The names of ``units`` in the order they must reach the disk: every unit that another one of them
    names in ``OnFailure=`` or ``Requires=`` (systemd.unit(5)), for a service ``Sockets=``
    (systemd.service(5)) or, for a timer, ``Unit=`` (systemd.timer(5)) comes before the unit naming it;
    otherwise the mapping's order is kept (e.g. ``NAME-recover.service`` and ``NAME.socket`` before the agent
    unit, ``NAME-recover-timer.service`` before ``NAME-recover.timer``). A socket's ``Service=`` is not a
    reference here: the service names its socket, so the socket goes first (a service requiring a missing
    socket would not start; a socket naming a missing service only fails when traffic arrives).

    A referenced unit that is not in ``units`` is taken to be on disk already (a repair rewrites only
    what drifted). A reference cycle keeps the mapping's order inside the cycle.
    """
    named = {
        name: [ref for line in _REFERENCE_RE.findall(text) for ref in line.split() if ref in units]
        for name, text in units.items()
    }
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for ref in named[name]:
            visit(ref)
        order.append(name)

    for name in units:
        visit(name)
    return order


def _timespan_s(text: str) -> float | None:
    """Seconds in a time span as ``systemctl show`` prints it (``1min 30s``, ``2.500000s``, ``0``); None for
    ``infinity`` or text that is not a time span."""
    text = text.strip()
    if text == "0":
        return 0.0
    parts = text.split()
    matches = [_TIMESPAN_PART_RE.fullmatch(part) for part in parts]
    if not parts or not all(matches):
        return None
    return sum(float(m.group(1)) * _TIMESPAN_UNITS_S[m.group(2)] for m in matches if m)


def _check_transient(name: str) -> None:
    if not _TRANSIENT_RE.fullmatch(name):
        raise ServiceError(f"transient unit name {name!r} is not a valid unit name")


def _last_line(stderr: bytes) -> str:
    lines = [ln.strip() for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


if TYPE_CHECKING:  # mypy proves the class satisfies the port it implements

    def _is_a_service_manager(manager: SystemdServiceManager) -> ServiceManager:
        return manager

"""A private, real systemd system manager for tests and ``make demo`` (design §8, "Real systemd").

:class:`PrivateSystemd` boots the host's own ``systemd`` binary as PID 1 of fresh pid, mount, uts, ipc and
cgroup namespaces, in about 0.2 s, and tears it down leaving no process, cgroup, mount or directory behind.
Callers drive it from the host: every ``systemctl``/``systemd-run`` goes through :attr:`PrivateSystemd.prefix`
(``nsenter -t PID -m -p -u -i --``) and unit files are written into :attr:`PrivateSystemd.unit_dir`, which the
sandbox sees as its ``/etc/systemd/system``. That is exactly how the agent is configured for these tests
(``host.systemctl_prefix`` and ``host.unit_dir``, design §3).

What the sandboxed manager can never touch (the isolation the whole harness exists for):

- the host's processes: its own pid namespace; ``systemctl`` inside can only signal sandbox processes;
- the host's cgroups: it mounts a pure cgroup2 hierarchy rooted at a dedicated subtree and lives in its own
  cgroup namespace. A systemd that sees the host's cgroup root would move every host process into its
  ``init.scope``; :meth:`PrivateSystemd.start` compares the host's cgroup membership before and after boot;
- the host's units: ``SYSTEMD_UNIT_PATH`` holds only the sandbox's directories and a few stub targets,
  generators are disabled, ``/etc/systemd/system`` is a bind of a private directory. The host's
  ``systemd-tmpfiles-setup.service`` in particular would wipe the shared ``/tmp``;
- the host's ``/run`` and ``/dev`` (private tmpfs), ``/proc/sys`` (read-only), and shutdown: ``container=``
  is set, so ``systemd-shutdown`` only ends the namespace.

Shared on purpose: the root filesystem (a unit may run a script from a test's ``tmp_path``), the network
(a probe on the host reaches a daemon inside on 127.0.0.1) and the root user.

The boot scripts are constant text, parametrized through the environment, written into the work directory
so that a failed boot can be read and rerun by hand. Needs root, util-linux (``unshare``, ``nsenter``,
``mount``) and the ``systemd`` package; no ``script``, image or container runtime.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import json
import os
import pty
import secrets
import shutil
import signal
import socket
import subprocess
import termios
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, final

from agent.fs.mounts import read_mounts
from upgrade_core.errors import HostError

__all__ = ["PrivateSystemd", "SandboxError", "agent_config_toml", "free_port", "mounts_under", "python_paths"]

_SYSTEMD_CANDIDATES: Final = ("/usr/lib/systemd/systemd", "/lib/systemd/systemd")
_JOURNALD_CANDIDATES: Final = ("/usr/lib/systemd/systemd-journald", "/lib/systemd/systemd-journald")
_PR_SET_PDEATHSIG: Final = 1
_POLL_S: Final = 0.02


class SandboxError(HostError):
    """The private systemd could not boot, or did not stop cleanly.

    Attributes:
        console_log: path of the sandbox console log (PID 1's and journald's output), or None when the
            failure came before the sandbox existed. Kept on disk after a failure.
    """

    def __init__(self, message: str, console_log: Path | None = None) -> None:
        where = ""
        if console_log is not None:
            where = f" (console log: {console_log}{_console_tail(console_log)})"
        super().__init__(f"private systemd: {message}{where}")
        self.console_log = console_log


def _console_tail(path: Path, lines: int = 8) -> str:
    """The last non-empty console lines, joined on one line, so a CI log shows why a boot failed."""
    try:
        text = path.read_bytes()[-4096:].decode(errors="replace")
    except OSError:
        return ""
    tail = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return "; last lines: " + " | ".join(tail) if tail else ""


# Stage 1 runs as PID 1 of the new pid namespace, still in the host's cgroup namespace: it creates and joins
# a dedicated cgroup2 subtree, then unshares the cgroup namespace so that subtree becomes the root systemd
# will see. The cgroup2 mount is made in the new mount namespace and removed again at once.
_STAGE1: Final = """\
#!/bin/sh
# stage 1 of the private systemd boot (written by agent/testing/sandbox.py)
set -eu
mount -t cgroup2 cgroup2 "$SDS_DIR/cgmnt"
mkdir "$SDS_DIR/cgmnt/$SDS_CGROUP"
echo 0 > "$SDS_DIR/cgmnt/$SDS_CGROUP/cgroup.procs"
umount "$SDS_DIR/cgmnt"
exec unshare --cgroup /bin/sh "$SDS_DIR/boot/stage2.sh"
"""

# Stage 2: private /sys/fs/cgroup (pure cgroup2 at our subtree), /run, /dev; read-only /proc/sys; the
# sandbox's /etc/systemd/system; then exec the real systemd as PID 1 with a clean environment.
#
# With SDS_ROOT set (a host root of its own, e.g. a sysroot Ignition wrote), everything is mounted under that
# directory instead: the host's /usr read-only with every path in SDS_HIDE covered (an empty read-only tmpfs
# over a directory, an empty mode-0000 file over a file: Python hidden from everything that runs inside), a
# fresh /proc, the host's /sys, a private /tmp; the sysroot's own /etc/systemd/system is the unit directory,
# and its /etc/machine-id is left as the image has it (absent: systemd's first boot, which applies presets).
# Then pivot_root(2) makes it the namespace's root, so `nsenter -m` lands there too.
_STAGE2: Final = """\
#!/bin/sh
# stage 2 of the private systemd boot (written by agent/testing/sandbox.py)
set -eu
console=$(tty 2>/dev/null || echo /dev/null)
R=${SDS_ROOT:-}
units="$SDS_DIR/units" empty="$SDS_DIR/empty"
if [ -n "$R" ]; then
    mount --bind "$R" "$R"
    mount --bind /usr "$R/usr"
    set -f  # SDS_HIDE is split on whitespace only, never globbed
    for p in $SDS_HIDE; do
        if [ -d "$R$p" ]; then
            mount -t tmpfs -o ro,nosuid,nodev,noexec,mode=755,size=4k tmpfs "$R$p"
        else
            mount --bind "$SDS_DIR/hidden" "$R$p"
            mount -o remount,bind,ro,nosuid,nodev,noexec "$R$p"
        fi
    done
    set +f
    mount -o remount,bind,ro "$R/usr"
    mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
    mount --rbind /sys "$R/sys"
    mount -o remount,bind,ro "$R/sys"
    mount -t tmpfs -o mode=1777,nosuid,nodev,size=256m tmpfs "$R/tmp"
fi
umount -R "$R/sys/fs/cgroup" 2>/dev/null || true
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"
mount -t tmpfs -o mode=755,nosuid,nodev,size=256m tmpfs "$R/run"
mkdir -p "$R/run/systemd/journald.conf.d" "$R/run/lock"
printf '[Journal]\\nStorage=volatile\\nReadKMsg=no\\nForwardToWall=no\\n' \\
    > "$R/run/systemd/journald.conf.d/sandbox.conf"
printf 'ForwardToConsole=yes\\nMaxLevelConsole=info\\n' >> "$R/run/systemd/journald.conf.d/sandbox.conf"
if [ -n "$R" ]; then
    mkdir -p "$R/run/sandbox/units" "$R/run/sandbox/empty" "$R/run/sandbox/oldroot"
    mount --bind "$units" "$R/run/sandbox/units"
    units=/run/sandbox/units empty=/run/sandbox/empty
else
    mount --bind "$SDS_DIR/etc-system" /etc/systemd/system
fi
mount --bind "$R/proc/sys" "$R/proc/sys"
mount -o remount,bind,ro "$R/proc/sys"
if [ -e "$R/proc/sysrq-trigger" ]; then
    mount --bind "$R/proc/sysrq-trigger" "$R/proc/sysrq-trigger"
    mount -o remount,bind,ro "$R/proc/sysrq-trigger"
fi
d="$SDS_DIR/newdev"
mount -t tmpfs -o mode=755,nosuid,size=16m tmpfs "$d"
for n in null zero full random urandom tty; do
    touch "$d/$n"; mount --bind "/dev/$n" "$d/$n"
done
touch "$d/console"; mount --bind "$console" "$d/console"
mkdir -p "$d/pts" "$d/shm" "$d/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$d/pts"
ln -s pts/ptmx "$d/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$d/shm"
ln -s /proc/self/fd "$d/fd"; ln -s /proc/self/fd/0 "$d/stdin"
ln -s /proc/self/fd/1 "$d/stdout"; ln -s /proc/self/fd/2 "$d/stderr"
mount --move "$d" "$R/dev"
if [ -n "$R" ]; then
    cd "$R"
    pivot_root . run/sandbox/oldroot
    cd /
    LIBMOUNT_UTAB=/run/sandbox/utab umount -l /run/sandbox/oldroot
    rmdir /run/sandbox/oldroot
elif [ ! -s /etc/machine-id ]; then
    # an uninitialized (empty) machine-id: give the sandbox its own, never write the host's
    tr -d '-' < /proc/sys/kernel/random/uuid > /run/machine-id
    mount --bind /run/machine-id /etc/machine-id
fi
exec env -i container=upgrade-core-sandbox LANG=C.UTF-8 \\
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    SYSTEMD_UNIT_PATH="/etc/systemd/system.control:/run/systemd/system.control:/run/systemd/transient:\
/etc/systemd/system:/run/systemd/system:$units" \\
    SYSTEMD_GENERATOR_PATH="$empty" SYSTEMD_ENVIRONMENT_GENERATOR_PATH="$empty" \\
    "$SDS_SYSTEMD" --system --unit=sandbox.target --log-target=console --log-level=info \\
        --log-color=no --log-time=yes --show-status=no
"""

# Removing the sandbox's cgroup needs a cgroup2 mount; it is made in a throw-away mount namespace so the
# host's mount table never changes. Exit 0: removed or never existed; 3: could not be removed.
_CGROUP_CLEANUP: Final = """\
set -u
mount -t cgroup2 cgroup2 "$1" || exit 0
cg="$1/$2"
status=0
if [ -d "$cg" ]; then
    if [ -n "$(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)" ] && [ -e "$cg/cgroup.kill" ]; then
        echo 1 > "$cg/cgroup.kill"
    fi
    i=0
    while [ -d "$cg" ] && [ $i -lt 100 ]; do
        find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
        [ -d "$cg" ] && sleep 0.05
        i=$((i + 1))
    done
    [ -d "$cg" ] && status=3
fi
umount "$1"
exit $status
"""

# A sandbox whose owner was SIGKILLed dies with it (PR_SET_PDEATHSIG), but its empty cgroup stays. Before each
# boot, remove such leftovers: named for an owner PID that no longer exists and holding no process. A live
# sandbox's cgroups are never touched (its owner exists). Prints each name removed.
_SWEEP_STALE: Final = """\
set -u
mount -t cgroup2 cgroup2 "$1" || exit 0
for cg in "$1"/upgrade-core-sandbox-*; do
    [ -d "$cg" ] || continue
    owner=${cg##*/upgrade-core-sandbox-}
    owner=${owner%%-*}
    [ -e "/proc/$owner" ] && continue
    [ -n "$(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)" ] && continue
    find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
    [ -d "$cg" ] || echo "${cg##*/}"
done
umount "$1"
"""


def _in_private_mount_ns(script: str, *args: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """Run a cgroup2 maintenance ``script`` in a throw-away mount namespace (host mounts never change)."""
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "cgroup-maint", *args],
        capture_output=True, text=True, timeout=30.0, check=False,
        env={**os.environ, "LIBMOUNT_UTAB": str(workdir / "utab")},
    )


def _stub(name: str, *lines: str) -> tuple[str, str]:
    body = "\n".join(("[Unit]", f"Description=sandbox stub {name}", "DefaultDependencies=no", *lines))
    return name, body + "\n"


_MACHINE_ID_COMMIT: Final = "systemd-machine-id-commit.service"
_SYSTEM_UNIT_DIRS: Final = ("/usr/lib/systemd/system", "/lib/systemd/system")


def _base_units(journald: str | None, own_root: bool = False) -> dict[str, str]:
    """The only units besides the test's own: empty stub targets, slices, the exit path, journald; with a
    root of its own also the host's ``systemd-machine-id-commit.service``, which on a first boot writes the
    machine id systemd made up onto the root's ``/etc`` (without it every boot would be a first boot again).

    Raises:
        SandboxError: ``own_root`` and the systemd package has no machine-id commit unit.
    """
    units: dict[str, str] = {}
    for target in (
        "sysinit", "basic", "multi-user", "graphical", "sockets", "timers", "paths", "slices", "local-fs",
        "local-fs-pre", "remote-fs", "remote-fs-pre", "network", "network-pre", "network-online",
        "nss-lookup", "nss-user-lookup", "time-sync", "time-set", "getty", "swap", "cryptsetup",
        "emergency", "rescue", "rpcbind", "umount", "final",
    ):
        units.update([_stub(f"{target}.target")])
    wants = "multi-user.target"
    if journald is not None:
        wants = f"systemd-journald.socket systemd-journald-dev-log.socket {wants}"
    if own_root:
        found = [p for p in (Path(d) / _MACHINE_ID_COMMIT for d in _SYSTEM_UNIT_DIRS) if p.is_file()]
        if not found:
            raise SandboxError(f"no {_MACHINE_ID_COMMIT} in {' or '.join(_SYSTEM_UNIT_DIRS)}")
        units[_MACHINE_ID_COMMIT] = found[0].read_text()
        units.update([_stub("first-boot-complete.target")])
        wants = f"{_MACHINE_ID_COMMIT} {wants}"
    units.update([
        _stub("default.target", "Requires=multi-user.target", "After=multi-user.target", "AllowIsolate=yes"),
        _stub("shutdown.target", "RefuseManualStart=yes"),
        _stub("sandbox.target", f"Wants={wants}", f"After={wants}", "AllowIsolate=yes"),
        # `systemctl exit` ends the manager: in container mode systemd-shutdown only ends the namespace.
        _stub("exit.target", "Requires=systemd-exit.service", "After=systemd-exit.service",
              "AllowIsolate=yes"),
    ])
    for target in ("halt", "poweroff", "reboot", "kexec", "ctrl-alt-del"):
        units.update([_stub(f"{target}.target", "Requires=systemd-exit.service",
                            "After=systemd-exit.service", "AllowIsolate=yes")])
    units["system.slice"] = "[Unit]\nDescription=System Slice\nDefaultDependencies=no\n"
    units["user.slice"] = "[Unit]\nDescription=User and Session Slice\nDefaultDependencies=no\n"
    units["systemd-exit.service"] = (
        "[Unit]\nDescription=Exit the sandbox\nDefaultDependencies=no\n"
        "Requires=shutdown.target final.target\nAfter=shutdown.target final.target\n"
        "SuccessAction=exit-force\n"
    )
    if journald is not None:
        units["systemd-journald.socket"] = (
            "[Unit]\nDescription=Journal Socket\nDefaultDependencies=no\nBefore=sockets.target\n"
            "IgnoreOnIsolate=yes\n[Socket]\nListenDatagram=/run/systemd/journal/socket\n"
            "ListenStream=/run/systemd/journal/stdout\nPassCredentials=yes\nPassSecurity=yes\n"
            "ReceiveBuffer=8M\nService=systemd-journald.service\nSocketMode=0666\nTimestamping=us\n"
        )
        units["systemd-journald-dev-log.socket"] = (
            "[Unit]\nDescription=Journal Socket (/dev/log)\nDefaultDependencies=no\nBefore=sockets.target\n"
            "IgnoreOnIsolate=yes\n[Socket]\nListenDatagram=/run/systemd/journal/dev-log\n"
            "PassCredentials=yes\nPassSecurity=yes\nService=systemd-journald.service\nSocketMode=0666\n"
            "Symlinks=/dev/log\nReceiveBuffer=8M\n"
        )
        units["systemd-journald.service"] = (
            "[Unit]\nDescription=Journal Service (sandbox)\nDefaultDependencies=no\n"
            "Requires=systemd-journald.socket\n"
            "After=systemd-journald.socket systemd-journald-dev-log.socket\nIgnoreOnIsolate=yes\n"
            f"[Service]\nType=notify\nExecStart={journald}\n"
            "Sockets=systemd-journald.socket systemd-journald-dev-log.socket\n"
            "FileDescriptorStoreMax=4224\nRestart=always\nRestartSec=0\n"
            "RuntimeDirectory=systemd/journal\nRuntimeDirectoryPreserve=yes\nStandardOutput=null\n"
        )
    return units


_SYSROOT_MOUNT_POINTS: Final = ("usr", "proc", "sys", "dev", "run", "tmp")


_GLOB_CHARS: Final = frozenset("*?[]\\")


def _check_sysroot(root: str | os.PathLike[str] | None, hide: Sequence[str]) -> Path | None:
    """``root`` resolved, after checking it and ``hide`` (see :meth:`PrivateSystemd.start`).

    Raises:
        SandboxError: ``root`` is the machine's own root (under any name), lacks a mount point, or has an
            ``etc`` or ``var`` that is a symbolic link (the sandbox's writes would land outside it); ``hide``
            without ``root``; a ``hide`` path that is not an existing, normalised, link-free path under
            ``/usr`` without whitespace or glob characters (the boot script splits on whitespace, and a
            link would be followed on the machine's root, hiding nothing), or one inside another.
    """
    if root is None:
        if hide:
            raise SandboxError("hide needs root (paths are hidden in the sandbox's own /usr)")
        return None
    sysroot = Path(root).resolve()
    if sysroot.is_dir() and os.path.samefile(sysroot, "/"):
        raise SandboxError(f"root {root}: is this machine's own root; give a sysroot of the sandbox's own")
    missing = [m for m in _SYSROOT_MOUNT_POINTS
               if not (sysroot / m).is_dir() or (sysroot / m).is_symlink()]
    if missing:
        raise SandboxError(f"root {sysroot}: no directory {', '.join(missing)} to mount on")
    linked = [d for d in ("etc", "var") if (sysroot / d).is_symlink()]
    if linked:
        raise SandboxError(f"root {sysroot}: {', '.join(linked)}: a symbolic link (the sandbox writes there)")
    for path in hide:
        if (os.path.normpath(path) != path or not path.startswith("/usr/") or not os.path.lexists(path)
                or os.path.realpath(path) != path or any(c.isspace() or c in _GLOB_CHARS for c in path)):
            raise SandboxError(f"hide: {path!r} is not an existing, normalised, link-free path under /usr "
                               "without spaces or glob characters")
        if any(path.startswith(other + "/") for other in hide):
            raise SandboxError(f"hide: {path!r} is inside another hidden path")
    return sysroot


def python_paths() -> list[str]:
    """Every Python interpreter and library directory of the host's ``/usr``: what
    :meth:`PrivateSystemd.start` hides (``hide=``) to boot a host that has no Python (docs/ignition.md).

    Regular files named ``*python*`` in ``/usr/bin``, ``/usr/sbin``, ``/usr/local/bin``, ``libpython*`` in
    ``/usr/lib``, ``/usr/lib64`` (Fedora's layout), ``/usr/local/lib`` and ``/usr/lib/<triplet>`` (Debian's),
    and the directories ``python3*`` in those library directories. Symbolic links are left: each names one
    of those (``python3 -> python3.11``) and so leads to a hidden file; a path inside a returned directory
    is not listed again.
    """
    import glob

    libs = ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/local/lib64", "/usr/lib/*")
    files = [p for pattern in ("/usr/bin/*python*", "/usr/sbin/*python*", "/usr/local/bin/*python*",
                               *(f"{lib}/libpython*" for lib in libs))
             for p in glob.glob(pattern) if os.path.isfile(p) and not os.path.islink(p)]
    dirs = [p for lib in libs for p in glob.glob(f"{lib}/python3*")
            if os.path.isdir(p) and not os.path.islink(p)]
    return sorted({p for p in files + dirs if not any(p.startswith(d + "/") for d in dirs)})


def _first_executable(candidates: tuple[str, ...]) -> str | None:
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def _ns_inode(pid: int, ns: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{ns}")
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out.extend(int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _pids_in_pidns(pidns: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ns_inode(int(entry), "pid") == pidns:
            found.append(int(entry))
    return found


def _host_cgroups() -> str:
    return Path("/proc/1/cgroup").read_text() + Path("/proc/self/cgroup").read_text()


def _child_setup() -> None:  # pragma: no cover - runs in the forked child
    """Tie the launcher's life to this thread (PR_SET_PDEATHSIG, prctl(2)) and adopt the pty as ctty."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@final
class PrivateSystemd:
    """A running private systemd (PID 1 of its own namespaces); see the module docstring.

    Build one with :meth:`start`; stop it with :meth:`stop` or by leaving a ``with`` block.

    Attributes:
        workdir: the sandbox's work directory (removed by a clean :meth:`stop`).
        root: the sandbox's own host root (``start(root=...)``; kept by :meth:`stop`), or None when it
            shares the host's root filesystem.
        pid: host PID of the sandbox's PID 1 (``systemd``).
        pidns: ``pid:[inode]`` of its pid namespace; used to recognize its processes, never a PID alone.
        cgroup: name of its cgroup2 subtree, directly under the host's cgroup2 root.
        console_log: where PID 1's console (and journald's forwarded output) is written.
        boot_seconds: wall time :meth:`start` took, in seconds.
        swept_cgroups: stale cgroups of dead sandboxes (owner killed) removed before this boot.
    """

    def __init__(
        self,
        *,
        workdir: Path,
        launcher: subprocess.Popen[bytes],
        console: threading.Thread,
        console_fd: int,
        cgroup: str,
        pidns_before: str,
        comm: str,
        root: Path | None = None,
    ) -> None:
        """Internal: use :meth:`start`."""
        self.workdir = workdir
        self.root = root
        self.cgroup = cgroup
        self.console_log = workdir / "console.log"
        self.pid = 0
        self.pidns = ""
        self.boot_seconds = 0.0
        self.swept_cgroups: list[str] = []
        self._launcher = launcher
        self._console = console
        self._console_fd = console_fd
        self._host_pidns = pidns_before
        self._stopped = False
        self._comm = comm

    # ------------------------------------------------------------------ properties
    @property
    def prefix(self) -> list[str]:
        """The argv prefix that runs a command inside: ``nsenter -t PID -m -p -u -i --`` as a list."""
        return ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "--"]

    @property
    def unit_dir(self) -> Path:
        """Host-side path of the sandbox's ``/etc/systemd/system`` (write unit files here)."""
        if self.root is not None:
            return self.root / "etc" / "systemd" / "system"
        return self.workdir / "etc-system"

    def write_prefix_script(self, path: Path) -> Path:
        """Write an executable ``host.systemctl_prefix`` that works from the host and from inside.

        :attr:`prefix` (``nsenter -t HOSTPID ...``) is right for a CLI run on the host, wrong for what runs
        inside the sandbox with the same configuration (``NAME-recover.service``, transient recovery units,
        a self-upgrading daemon), where that PID does not exist. The script compares its own pid namespace
        with the sandbox's (``pid:[inode]``) and runs the command directly when it is already inside.

        Returns:
            ``path``, to be used as the one-element prefix ``[str(path)]``.
        """
        path.write_text(
            "#!/bin/sh\n"
            f'[ "$(readlink /proc/self/ns/pid)" = "{self.pidns}" ] && exec "$@"\n'
            f'exec {" ".join(self.prefix)} "$@"\n'
        )
        path.chmod(0o755)
        return path

    # ------------------------------------------------------------------ start
    @classmethod
    def start(
        cls,
        workdir: str | os.PathLike[str],
        *,
        journald: bool = True,
        boot_timeout_s: float = 30.0,
        systemd: str | None = None,
        root: str | os.PathLike[str] | None = None,
        hide: Sequence[str] = (),
    ) -> PrivateSystemd:
        """Boot a private systemd whose state lives in ``workdir`` and wait until it is ``running``.

        Call it from the thread that will own the sandbox (normally the main thread): the launcher is tied
        to that thread with ``PR_SET_PDEATHSIG``, so a killed test process takes the sandbox down with it.

        Args:
            workdir: an absent or empty directory; created 0700. Holds the boot scripts, stub units, the
                sandbox's ``/etc/systemd/system`` (:attr:`unit_dir`) and ``console.log``.
            journald: also run ``systemd-journald`` inside (volatile; unit output then reaches
                ``console.log`` and ``journalctl`` inside works).
            boot_timeout_s: seconds to wait for ``systemctl is-system-running`` to say ``running``.
            systemd: the manager binary to boot; default the host's ``/usr/lib/systemd/systemd``.
            root: a host root of the sandbox's own (a sysroot, e.g. one Ignition wrote) instead of the
                shared root filesystem. It must hold the mount points ``usr``, ``proc``, ``sys``, ``dev``,
                ``run`` and ``tmp`` and the ``bin``/``lib``... links an image has; the host's ``/usr`` is
                mounted on its ``usr`` read-only, it becomes the namespace's root (``pivot_root(2)``), its
                ``etc/systemd/system`` is :attr:`unit_dir`, and its ``etc/machine-id`` is used as it is
                (absent or empty: a first boot, on which systemd applies the presets). Nothing of the host
                outside ``/usr``, ``/sys`` and ``/dev`` is visible inside.
            hide: with ``root``: absolute paths under ``/usr`` covered inside (a directory by an empty
                read-only tmpfs, a file by an empty mode-0000 file), e.g. :func:`python_paths`.

        Returns:
            The running sandbox.

        Raises:
            SandboxError: not root; no ``systemd``/``unshare``/``nsenter``; no cgroup2 in the kernel;
                ``workdir`` not empty; the host has no ``/etc/machine-id`` (systemd would create one on the
                host); boot failed or timed out, or the host's cgroup membership changed (everything
                started is torn down; the console log is kept and named in the message); ``root`` lacks a
                mount point, or a ``hide`` path is not a plain absolute path under ``/usr``.
        """
        if os.geteuid() != 0:
            raise SandboxError("needs root (it mounts, unshares namespaces and creates a cgroup)")
        systemd = systemd or _first_executable(_SYSTEMD_CANDIDATES)
        if systemd is None:
            raise SandboxError(f"no systemd binary at {' or '.join(_SYSTEMD_CANDIDATES)}; install systemd")
        journald_bin = _first_executable(_JOURNALD_CANDIDATES) if journald else None
        if journald and journald_bin is None:
            raise SandboxError(f"no journald at {' or '.join(_JOURNALD_CANDIDATES)}")
        for tool in ("unshare", "nsenter", "mount", "umount"):
            if shutil.which(tool) is None:
                raise SandboxError(f"{tool} not found on PATH (util-linux/mount)")
        if "cgroup2" not in Path("/proc/filesystems").read_text():
            raise SandboxError("the kernel has no cgroup2 filesystem")
        sysroot = _check_sysroot(root, hide)
        if sysroot is None and not os.path.isfile("/etc/machine-id"):
            raise SandboxError("/etc/machine-id is missing; systemd would create it on the host "
                               "(run systemd-machine-id-setup first)")
        units = _base_units(journald_bin, own_root=sysroot is not None)  # may refuse: before anything is made
        wd = Path(workdir).absolute()
        wd.mkdir(mode=0o700, parents=True, exist_ok=True)
        if any(wd.iterdir()):
            raise SandboxError(f"work directory {wd} is not empty")
        for sub in ("units", "etc-system", "empty", "cgmnt", "newdev", "boot"):
            (wd / sub).mkdir()
        for name, text in units.items():
            (wd / "units" / name).write_text(text)
        (wd / "boot" / "stage1.sh").write_text(_STAGE1)
        (wd / "boot" / "stage2.sh").write_text(_STAGE2)
        cgroup = f"upgrade-core-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "LANG": "C.UTF-8",
            "SDS_DIR": str(wd),
            "SDS_CGROUP": cgroup,
            "SDS_SYSTEMD": systemd,
            # keep libmount's utab and lock files out of the host's /run (it would create /run/mount)
            "LIBMOUNT_UTAB": str(wd / "utab"),
            "SDS_ROOT": str(sysroot or ""),
            "SDS_HIDE": " ".join(hide),
        }
        if hide:
            (wd / "hidden").touch(mode=0)
        swept = _in_private_mount_ns(_SWEEP_STALE, str(wd / "cgmnt"), workdir=wd)
        host_cg_before = _host_cgroups()
        t0 = time.monotonic()
        # A pty becomes the sandbox's /dev/console; a thread copies it into console.log. (The reference
        # recipe uses script(1) for this; owning the pty here keeps the launcher our direct child, so it is
        # reaped by us and never lingers as a zombie.)
        master, slave = pty.openpty()
        try:
            launcher = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--uts", "--ipc", "--mount-proc",
                 "--propagation", "private", "--", "/bin/sh", str(wd / "boot" / "stage1.sh")],
                stdin=slave, stdout=slave, stderr=slave, env=env, cwd="/",
                start_new_session=True, preexec_fn=_child_setup,
            )
        except OSError as exc:
            os.close(master)
            raise SandboxError(f"cannot run unshare: {exc}") from exc
        finally:
            os.close(slave)
        console = threading.Thread(
            target=_copy_console, args=(master, wd / "console.log"), name="sandbox-console", daemon=True
        )
        console.start()
        self = cls(workdir=wd, launcher=launcher, console=console, console_fd=master, cgroup=cgroup,
                   pidns_before=_ns_inode(os.getpid(), "pid") or "", comm=Path(systemd).name[:15],
                   root=sysroot)
        try:
            self._await_boot(t0 + boot_timeout_s)
            if _host_cgroups() != host_cg_before:
                raise SandboxError("the host's cgroup membership changed during boot", self.console_log)
        except BaseException:
            with contextlib.suppress(SandboxError):
                self._teardown(stop_timeout_s=1.0)
            raise
        self.boot_seconds = time.monotonic() - t0
        self.swept_cgroups = swept.stdout.split()
        return self

    def _await_boot(self, deadline: float) -> None:
        """Find PID 1 (our launcher's child once it has exec'd systemd), then wait for ``running``."""
        launcher_pid = self._launcher.pid
        while True:
            self._refuse_if_launcher_exited()
            kids = _children(launcher_pid)
            if kids and _comm(kids[0]) == self._comm:
                pidns = _ns_inode(kids[0], "pid")
                if pidns is not None and pidns != self._host_pidns:
                    self.pid, self.pidns = kids[0], pidns
                    break
            if time.monotonic() > deadline:
                raise SandboxError("timed out waiting for systemd to become PID 1", self.console_log)
            time.sleep(_POLL_S)
        state = ""
        while time.monotonic() < deadline:
            try:
                done = self.run("systemctl", "is-system-running", check=False,
                                timeout_s=max(0.5, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
            except SandboxError:
                # PID 1 vanished between finding it and asking it: a manager that died at boot. Its launcher
                # is reaped within moments; report that (with its status), not the failed systemctl.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._launcher.wait(timeout=2.0)
                self._refuse_if_launcher_exited()
                raise
            state = done.stdout.strip()
            # "offline" and "unknown" also mean "not reachable yet" (no private socket): keep polling
            if state in ("running", "degraded", "maintenance", "stopping"):
                break
            time.sleep(_POLL_S)
        if state == "running":
            return
        detail = ""
        if state == "degraded":
            detail = ": " + self.run("systemctl", "--failed", "--plain", "--no-legend", "--no-pager",
                                     check=False).stdout.strip().replace("\n", "; ")
        raise SandboxError(f"not running (state {state or 'unknown'!r}){detail}", self.console_log)

    def _refuse_if_launcher_exited(self) -> None:
        """Raise SandboxError naming the launcher's status once it has exited (the manager died early)."""
        if self._launcher.poll() is not None:
            raise SandboxError(f"the launcher exited early (status {self._launcher.returncode})",
                               self.console_log)

    # ------------------------------------------------------------------ use
    def run(
        self, *argv: str, check: bool = True, timeout_s: float = 30.0, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the sandbox (through :attr:`prefix`); capture text stdout/stderr.

        Args:
            argv: the command, e.g. ``("systemctl", "daemon-reload")``.
            check: raise on a non-zero exit.
            timeout_s: seconds before the command is killed.
            input_text: sent on stdin.

        Raises:
            SandboxError: the sandbox is not running, or ``check`` and the command exited non-zero (the
                message names the command, its status and stderr).
            subprocess.TimeoutExpired: it ran longer than ``timeout_s``.
        """
        if self._stopped or _ns_inode(self.pid, "pid") != self.pidns:
            raise SandboxError(f"not running; cannot run {' '.join(argv)}", self.console_log)
        done = subprocess.run(
            [*self.prefix, *argv], capture_output=True, text=True, errors="replace", timeout=timeout_s,
            check=False,
            input=input_text, stdin=None if input_text is not None else subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise SandboxError(
                f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}", self.console_log
            )
        return done

    # ------------------------------------------------------------------ stop
    def stop(self, stop_timeout_s: float = 15.0) -> None:
        """Stop the sandbox and prove nothing is left; idempotent.

        Graceful first (``systemctl --no-block exit``: every unit is stopped, ``ExecStop=`` runs), SIGKILL to
        its PID 1 after ``stop_timeout_s`` (the kernel then kills every process of the namespace). Then its
        cgroup is removed (``cgroup.kill`` if anything is left), and the work directory is deleted.

        Raises:
            SandboxError: a process of its pid namespace, its cgroup, or a host mount under the work
                directory is still there; the work directory is then kept and named.
        """
        if self._stopped:
            return
        self._teardown(stop_timeout_s=stop_timeout_s)
        shutil.rmtree(self.workdir)

    def crash(self) -> None:
        """Stop the sandbox the way a kernel panic or a hard reset stops a host's processes: SIGKILL to its
        PID 1 (the kernel then kills every process of the namespace at once; no unit is stopped, no
        ``ExecStop=`` runs), then the same clean-up and proof as :meth:`stop`. What was written stays in the
        sysroot (``root``), to be booted again. Unlike a power cut it loses nothing that was written but not
        yet synced (the page cache is this machine's): durability is what the journal's own crash tests
        (a cut at every byte) and the simulated host's power cuts (``tests/sim``) test.

        Raises:
            SandboxError: as :meth:`stop`.
        """
        if self._stopped:
            return
        if self._ours():
            os.kill(self.pid, signal.SIGKILL)
        self._teardown(stop_timeout_s=5.0, graceful=False)
        shutil.rmtree(self.workdir)

    def _ours(self) -> bool:
        return self.pid > 0 and _ns_inode(self.pid, "pid") == self.pidns

    def _teardown(self, stop_timeout_s: float, graceful: bool = True) -> None:
        self._stopped = True
        if graceful and self._ours():
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run(["nsenter", "-t", str(self.pid), "-m", "-p", "--", "systemctl", "--no-block",
                                "exit", "0"], capture_output=True, timeout=stop_timeout_s, check=False)
        # PID 1 never found (boot failed early): nothing graceful to wait for
        graceful_s = stop_timeout_s if self.pid > 0 else 0.0
        try:
            self._launcher.wait(timeout=graceful_s)
        except subprocess.TimeoutExpired:
            if self._ours():
                os.kill(self.pid, signal.SIGKILL)  # the kernel then kills every process of the namespace
            else:
                self._launcher.kill()  # our own child; unshare --kill-child takes its PID 1 down with it
            try:
                self._launcher.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self._launcher.kill()
                self._launcher.wait(timeout=5.0)
        self._console.join(timeout=5.0)
        with contextlib.suppress(OSError):
            os.close(self._console_fd)
        problems = []
        cleanup = _in_private_mount_ns(_CGROUP_CLEANUP, str(self.workdir / "cgmnt"), self.cgroup,
                                       workdir=self.workdir)
        if cleanup.returncode != 0:
            problems.append(f"cgroup {self.cgroup} left (status {cleanup.returncode}): "
                            f"{cleanup.stderr.strip()}")
        if self.pidns:
            deadline = time.monotonic() + 5.0
            while (left := _pids_in_pidns(self.pidns)) and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            if left:
                problems.append(f"processes left in {self.pidns}: {left}")
        for top in (self.workdir, self.root):
            if top is not None and (mounts := mounts_under(top)):
                problems.append(f"host mounts left under {top}: {mounts}")
        if problems:
            raise SandboxError("; ".join(problems), self.console_log)

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> PrivateSystemd:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def mounts_under(top: Path) -> list[str]:
    """Mount points of this process's mount namespace at or under ``top`` (:mod:`agent.fs.mounts`)."""
    return [m.point for m in read_mounts() if m.point == str(top) or m.point.startswith(f"{top}/")]


def _copy_console(fd: int, path: Path) -> None:
    """Copy the sandbox console (pty master ``fd``) into ``path`` until every slave end is closed (EIO)."""
    with path.open("ab", buffering=0) as out:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            out.write(chunk)


def main(argv: list[str] | None = None) -> int:
    """``python -m agent.testing.sandbox [--no-journald] [--workdir DIR] -- CMD...``: boot, run CMD, stop.

    CMD runs on the host's terminal through the sandbox's ``nsenter`` prefix (e.g. ``systemctl status``);
    its exit status is returned. Without CMD an interactive ``sh`` is started inside.
    """
    import argparse
    import sys
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m agent.testing.sandbox", description=main.__doc__)
    parser.add_argument("--no-journald", action="store_true", help="do not run systemd-journald inside")
    parser.add_argument("--workdir", help="an absent or empty directory (default: a fresh temp dir)")
    parser.add_argument("command", nargs="*", help="the command to run inside (default: sh)")
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="upgrade-core-sandbox-")
    try:
        sd = PrivateSystemd.start(workdir, journald=not args.no_journald)
    except SandboxError as exc:
        print(exc, file=sys.stderr)
        return 1
    with sd:
        print(f"private systemd up in {sd.boot_seconds:.3f} s: host pid {sd.pid}, unit dir {sd.unit_dir}",
              file=sys.stderr)
        return subprocess.run([*sd.prefix, *(args.command or ["sh"])], check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())


# -- agents managed inside a private systemd (make demo, the benchmarks, the real-systemd tests) ---------
_PORT_RANGE_FILE: Final = "/proc/sys/net/ipv4/ip_local_port_range"
_PORTS_LOCK = threading.Lock()
_PORTS_GIVEN: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range, ``(low, high)`` inclusive (ip-sysctl: ``ip_local_port_range``);
    Linux's default ``(32768, 60999)`` when it cannot be read."""
    try:
        low, high = (int(part) for part in Path(_PORT_RANGE_FILE).read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


@functools.cache
def _port_pool() -> tuple[int, ...]:
    """The ports :func:`free_port` chooses from, in order: 10000-65535 without the ephemeral range (read
    once per process)."""
    low, high = _ephemeral_range()
    return tuple(port for port in range(10000, 65536) if not low <= port <= high)


def free_port() -> int:
    """A TCP port for a sample agent to serve on 127.0.0.1: free when checked, never handed out twice by
    this process, and outside the kernel's ephemeral range.

    The agent restarts its daemon many times on one port, so the port is unbound for moments between
    runs. A port from the ephemeral range (what ``bind(port 0)`` returns) can be taken in such a moment as
    the local end of any outbound loopback connection, or handed to another caller's ``bind(0)``; the
    daemon then fails to start with EADDRINUSE and its health check fails for a reason that has nothing to
    do with the upgrade (seen once in CI: a healthy 1.0.5 failed both attempts of its install). The kernel
    never picks a port outside ``ip_local_port_range`` on its own, and this process hands each one out
    once, from a random start so that two processes seldom try the same ports.

    Raises:
        SandboxError: no port in 10000-65535 outside the ephemeral range is free.
    """
    pool = _port_pool()
    start = secrets.randbelow(len(pool)) if pool else 0
    with _PORTS_LOCK:
        for i in range(len(pool)):
            port = pool[(start + i) % len(pool)]
            if port in _PORTS_GIVEN:
                continue
            with socket.socket() as probe:  # no SO_REUSEADDR: a port still in TIME_WAIT is passed over too
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _PORTS_GIVEN.add(port)
            return port
    low, high = _ephemeral_range()
    raise SandboxError(f"no free TCP port on 127.0.0.1 in 10000-65535 outside the ephemeral range "
                       f"{low}-{high}")


def agent_config_toml(
    *,
    name: str,
    root: Path | str,
    state_dir: Path | str,
    lock_path: Path | str,
    unit_dir: Path | str,
    systemctl_prefix: Sequence[str],
    port: int,
    exec_args: Sequence[str] | None = None,
    member: str | None = None,
    stability_s: float = 0.5,
    timeout_s: float = 10.0,
    max_attempts: int = 2,
    socket: str = "",
) -> str:
    """The TOML configuration (design §3) of a sample agent served on ``127.0.0.1:port``, in a sandbox.

    Every path is the caller's (under a temporary directory); ``unit_dir`` and ``systemctl_prefix`` point
    at the private systemd (:attr:`PrivateSystemd.unit_dir`, and :attr:`PrivateSystemd.prefix` or
    :meth:`PrivateSystemd.write_prefix_script`). The health probe is the agent's ``/healthz``.

    Args:
        exec_args: ``agent.exec_args``; default ``["serve", "--port", PORT]`` (the sample agents).
        member: ``agent.member``; default the design §3 default (``{name}-linux-{arch}``).
        stability_s, timeout_s: the ``[health]`` window and attempt timeout, seconds.
        max_attempts: ``health.max_attempts``.
        socket: ``agent.socket`` (e.g. ``127.0.0.1:PORT``: ``NAME.socket`` listens for the agent); "" none.
    """

    def q(value: object) -> str:  # JSON strings and arrays are valid TOML basic strings and arrays
        return json.dumps(value if not isinstance(value, Path) else str(value))

    args = list(exec_args) if exec_args is not None else ["serve", "--port", str(port)]
    member_line = f"member = {q(member)}\n" if member is not None else ""
    member_line += f"socket = {q(socket)}\n" if socket else ""
    return (
        f"[agent]\nname = {q(name)}\nexec_args = {q(args)}\n{member_line}\n"
        f"[host]\nroot = {q(str(root))}\nstate_dir = {q(str(state_dir))}\nlock_path = {q(str(lock_path))}\n"
        f"unit_dir = {q(str(unit_dir))}\nsystemctl_prefix = {q(list(systemctl_prefix))}\n\n"
        f"[health]\nstability_s = {stability_s}\ntimeout_s = {timeout_s}\nmax_attempts = {max_attempts}\n"
        f'http_probe = "http://127.0.0.1:{port}/healthz"\n'
    )

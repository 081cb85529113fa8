"""First boot of a host that Ignition provisioned, with a read-only ``/usr`` and no Python (docs/ignition.md).

One host's life, end to end, with the real tools and nothing of the project's Python visible to it:

1. An administrator renders the host's Ignition config (``upgrade-agent ignition``, the runtime built by
   ``make bundle`` and a release archive, both served on loopback); Debian's real ``ignition`` writes it into
   a sysroot that looks like a Flatcar-family image before first boot (empty ``/etc`` but for the accounts,
   no ``machine-id``, the ``bin``/``lib`` links, an empty ``/usr`` mount point).
2. The private systemd boots that sysroot as its root (``PrivateSystemd.start(root=...)``): the host's
   ``/usr`` read-only with every Python interpreter and library hidden (``python_paths``). First boot:
   systemd applies Ignition's presets, the bootstrap unit unpacks the runtime into the host root, installs
   the release from the local archive, writes its marker and disables itself; the daemon is a native binary
   (``native_agent.c``), so nothing on the host needs an interpreter.
3. An upgrade through the bundle's ``upgrade-agent`` commits; a candidate that dies at start rolls back.
4. The whole host crashes (``PrivateSystemd.crash``: SIGKILL to PID 1, every process dies at once) right after
   the daemon was restarted onto a new candidate, then a reboot:
   boot recovery takes the open episode over and (through the transient unit it hands the health check to)
   commits the candidate on its second attempt; the bootstrap does not run again (the machine id was
   committed on the first boot, so the second is no first boot).
5. ``/usr`` is unchanged: every entry's metadata (path, type, mode, owner, size, mtime, ctime, link target)
   before Ignition ran and after the last shutdown (5 GiB of bytes are not re-read: any write, create,
   delete, rename or chmod changes it). The services could not have written it anyway (the
   mount is read-only, which the test reads from ``/proc/1/mountinfo``).

Outcomes are read from the host: links and slot bytes in the sysroot, MainPID's ``/proc/PID/exe``,
``/healthz`` on loopback, the journal (``journal dump`` through the bundle), unit state (``systemctl show``).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import attrs
import pytest

from agent.config.boot import machine_arch
from agent.crashhook import KILL_HOOK_ENV  # the documented test-only crash hook
from agent.testing.releases import ReleaseServer, sha256_file
from agent.testing.sandbox import PrivateSystemd, free_port, python_paths

from ..bundle import runtime_archive
from ..cli._rig import run_cli
from ..ignition import Ignition, assert_only_relabel_failed

pytestmark = pytest.mark.systemd

NAME = "fb-agent"
ARCH = machine_arch() or "amd64"
R = "/opt/upgrade-agent"
CONFIG = f"/etc/upgrade-agent/{NAME}.toml"
AGENT = f"{R}/runtime/upgrade-agent"
LIB = f"{R}/lib/{NAME}"
NATIVE_SOURCE = Path(__file__).with_name("native_agent.c")
BOOT_TIMEOUT_S = 180.0  # the first boot's start-up includes the bootstrap install (health window, restarts)
CC_TIMEOUT_S = 60
CLI_TIMEOUT_S = 120.0


@attrs.frozen
class Release:
    """A release archive of the native daemon: its file, version, and the sha256 of archive and member."""

    path: Path
    version: str
    sha256: str
    member_sha256: str


def native_release(out: Path, build: Path, version: str, behaviour: str = "good") -> Release:
    """Compile ``native_agent.c`` with ``version``/``behaviour`` baked in and pack it as a release archive
    (``NAME-VERSION.tar.gz`` holding ``NAME-linux-ARCH``, 0755)."""
    binary = build / f"{NAME}-{version}"
    compiler = shutil.which("cc") or pytest.fail("cc missing: run scripts/bootstrap.sh (apt-get install gcc)")
    cc = subprocess.run(
        [compiler, "-O2", "-Wall", f'-DVERSION="{version}"', f'-DBEHAVIOUR="{behaviour}"',
         "-o", str(binary), str(NATIVE_SOURCE)],
        capture_output=True, text=True, timeout=CC_TIMEOUT_S, check=False,
    )
    assert cc.returncode == 0, cc.stderr
    data = binary.read_bytes()
    member = tarfile.TarInfo(f"{NAME}-linux-{ARCH}")
    member.size, member.mode, member.mtime = len(data), 0o755, 1_700_000_000
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(member, io.BytesIO(data))
    path = out / f"{NAME}-{version}.tar.gz"
    path.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
    return Release(path, version, sha256_file(path), hashlib.sha256(data).hexdigest())


def image_sysroot(sysroot: Path) -> Path:
    """A sysroot as a read-only-``/usr`` image leaves it before its first boot: mount points, the merged-usr
    links, the accounts in ``/etc``, ``os-release`` from ``/usr``; no ``machine-id`` (first boot)."""
    for d in ("usr", "proc", "sys", "dev", "run", "tmp", "etc", "var", "root", "opt"):
        (sysroot / d).mkdir(parents=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        (sysroot / link).symlink_to(f"usr/{link}")
    for accounts in ("passwd", "group"):
        shutil.copyfile(f"/etc/{accounts}", sysroot / "etc" / accounts)
    (sysroot / "etc" / "os-release").symlink_to("../usr/lib/os-release")
    return sysroot


def usr_entries() -> dict[str, str]:
    """Every entry of ``/usr`` (what the sandbox mounts) -> its type and mode, owner, size, mtime and ctime
    (ns) and a link's target: any write, create, delete, rename or chmod changes it."""
    entries = {}
    for dirpath, dirnames, filenames in os.walk("/usr"):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
            entries[path] = (f"{st.st_mode:o} {st.st_uid}:{st.st_gid} {st.st_size} {st.st_mtime_ns} "
                             f"{st.st_ctime_ns} {target}")
    return entries


def assert_usr_unchanged(before: dict[str, str]) -> None:
    """``/usr`` as it was: same entries, same metadata; else the changed paths are named (the test's own
    host, the machine, is shared with whatever else runs on it: a package installed meanwhile shows here)."""
    after = usr_entries()
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert not changed, f"{len(changed)} entries of /usr changed, e.g. {changed[:10]}"


@attrs.define
class Host:
    """The booted host: the private systemd whose root is ``sysroot``, and the daemon's port."""

    sandbox: PrivateSystemd
    sysroot: Path
    port: int

    def at(self, path: str) -> Path:
        """Where the host's ``path`` is on this machine (under the sysroot)."""
        return self.sysroot / path.lstrip("/")

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.sandbox.run("systemctl", "show", unit, "-p", ",".join(props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def agent(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any] | None, str]:
        """The bundle's ``upgrade-agent --config CONFIG --json ARGS`` run on the host (inside its namespaces):
        exit status, the JSON object on stdout (None if none), stderr."""
        prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
        done = self.sandbox.run(*prefix, AGENT, "--config", CONFIG, "--json", *args, check=False,
                                timeout_s=CLI_TIMEOUT_S)
        try:
            obj = json.loads(done.stdout) if done.stdout.strip() else None
        except json.JSONDecodeError:
            obj = None
        return done.returncode, obj, done.stderr

    def assert_serving(self, slot: str, release: Release) -> int:
        """``NAME.service`` runs the native binary of ``slot`` (MainPID's exe), ``current`` names ``slot``,
        whose bytes are ``release``'s, and ``/healthz`` answers with its version. Returns the MainPID."""
        shown = self.show(f"{NAME}.service", "ActiveState", "SubState", "MainPID")
        assert (shown["ActiveState"], shown["SubState"]) == ("active", "running"), shown
        pid = int(shown["MainPID"])
        exe = self.sandbox.run("readlink", f"/proc/{pid}/exe").stdout.strip()
        assert exe == f"{LIB}/{NAME}-{slot}", exe  # the binary itself, no interpreter in between
        assert os.readlink(self.at(f"{LIB}/{NAME}-current")) == f"{NAME}-{slot}"
        slot_bytes = self.at(f"{LIB}/{NAME}-{slot}").read_bytes()
        assert hashlib.sha256(slot_bytes).hexdigest() == release.member_sha256
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as resp:
            assert resp.read().decode().split() == ["ok", release.version]
        return pid

    def episode_when_closed(self, operation: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """``operation``'s journal records once its ``EpisodeClosed`` is there (polled every 0.2 s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            episode = [r for r in self.journal() if r["episode"] == operation]
            if episode and episode[-1]["event"]["_type"] == "EpisodeClosed":
                return episode
            if time.monotonic() > deadline:
                pytest.fail(f"{operation} not closed after {timeout_s} s: "
                            f"{[r['event']['_type'] for r in episode]}")
            time.sleep(0.2)

    def journal(self) -> list[dict[str, Any]]:
        code, out, err = self.agent("journal", "dump")
        assert code == 0 and out is not None, err
        records: list[dict[str, Any]] = out["records"]
        return records


def _boot(base: Path, sysroot: Path, port: int) -> Host:
    """Boot ``sysroot`` as a host with no Python (its state in ``base``); returns once systemd is running,
    i.e. every start job of the boot, the first boot's bootstrap install included, has finished."""
    sandbox = PrivateSystemd.start(base, root=sysroot, hide=python_paths(), boot_timeout_s=BOOT_TIMEOUT_S)
    return Host(sandbox, sysroot, port)


def _wait_gone(port: int, timeout_s: float = 10.0) -> None:
    """Until nothing answers on the daemon's port (the previous boot's daemon is dead)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=0.5).close()
        except OSError:
            return
        time.sleep(0.05)
    pytest.fail(f"something still answers on 127.0.0.1:{port} after the host went down")


def test_an_ignition_host_without_python_boots_installs_upgrades_and_recovers(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the private systemd harness needs root (unshare, mount, cgroup2)")
    port = free_port()
    srv, build, admin = tmp_path / "srv", tmp_path / "build", tmp_path / "admin"
    for d in (srv, build, admin):
        d.mkdir()
    runtime = srv / "upgrade-core-runtime.tar.gz"
    shutil.copyfile(runtime_archive(), runtime)
    v1, v2 = native_release(srv, build, "1.0.0"), native_release(srv, build, "2.0.0")
    bad = native_release(srv, build, "3.0.0", "exit-after:0")
    v4 = native_release(srv, build, "4.0.0")
    toml = (
        f'[agent]\nname = "{NAME}"\nexec_args = ["serve", "--port", "{port}"]\n\n'
        f'[health]\nstability_s = 1.0\ntimeout_s = 10.0\nmax_attempts = 2\n'
        f'http_probe = "http://127.0.0.1:{port}/healthz"\n'
    )
    (admin / f"{NAME}.toml").write_text(toml)
    sysroot = image_sysroot(tmp_path / "sysroot")
    with contextlib.ExitStack() as stack:
        server = ReleaseServer.start(srv)
        stack.callback(server.close)

        def boot(base: Path) -> Host:
            with socket.socket() as probe:  # no one else listens on the port the rendered config names
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemon binds it
                probe.bind(("127.0.0.1", port))
            host = _boot(base, sysroot, port)
            stack.callback(host.sandbox.stop)
            return host

        # 1. the administrator renders the config; the real Ignition writes it into the sysroot
        rendered = run_cli(["--config", str(admin / f"{NAME}.toml"), "ignition",
                            "--archive", server.url(v1.path), "--sha256", v1.sha256,
                            "--runtime", server.url(runtime), "--runtime-sha256", sha256_file(runtime)])
        assert rendered.code == 0, rendered.stderr
        (admin / "config.ign").write_text(rendered.stdout)
        usr_before = usr_entries()
        assert_only_relabel_failed(Ignition(tmp_path, sysroot, admin / "config.ign").apply())
        assert not (sysroot / "etc" / "machine-id").exists()

        # 2. first boot: presets, the bootstrap install from the local archive, the daemon on blue
        host = boot(tmp_path / "boot1")
        console = host.sandbox.console_log.read_text(errors="replace")
        assert "Populated /etc with preset unit settings" in console, console[-3000:]
        no_python = host.sandbox.run("sh", "-c", "command -v python3 python3.11 python", check=False)
        assert no_python.returncode != 0 and no_python.stdout == "", no_python
        assert host.sandbox.run("ls", "-A", "/usr/lib/python3").stdout == ""
        usr_mount = [line.split() for line in host.sandbox.run("cat", "/proc/1/mountinfo").stdout.splitlines()
                     if line.split()[4] == "/usr"]
        assert len(usr_mount) == 1 and "ro" in usr_mount[0][5].split(","), usr_mount
        bootstrap = host.show(f"{NAME}-bootstrap.service", "ActiveState", "Result", "ExecMainStatus")
        assert bootstrap == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}, bootstrap
        assert host.at(f"{R}/bootstrap/done").is_file()
        assert host.sandbox.run("systemctl", "is-enabled", f"{NAME}-bootstrap.service",
                                check=False).stdout.strip() == "disabled"
        machine_id = host.sandbox.run("cat", "/etc/machine-id").stdout
        host.sandbox.run("systemctl", "is-active", "systemd-machine-id-commit.service")
        # committed to the disk: the next boot is not a first boot
        assert (sysroot / "etc" / "machine-id").read_text() == machine_id
        assert server.requests.count("/" + v1.path.name) == 1  # Ignition's fetch; install read it locally
        pid1 = host.assert_serving("blue", v1)
        recover = host.show(f"{NAME}-recover-boot.service", "ExecStart", "UnitFileState")
        assert f"path={R}/runtime/recover-agent-upgrade " in recover["ExecStart"], recover
        assert recover["UnitFileState"] == "enabled", recover

        # 3. an upgrade commits; a candidate that dies at start rolls back
        code, out, err = host.agent("upgrade", "--archive", server.url(v2.path), "--sha256", v2.sha256,
                                    "--operation", "to-2")
        assert code == 0 and out is not None and out["result"] == "committed", (code, out, err)
        pid2 = host.assert_serving("green", v2)
        assert pid2 != pid1
        code, out, err = host.agent("upgrade", "--archive", server.url(bad.path), "--sha256", bad.sha256,
                                    "--operation", "to-bad")
        assert code == 1 and out is not None and out["result"] == "rolled_back", (code, out, err)
        host.assert_serving("green", v2)

        # 4. the host crashes right after the daemon was restarted onto 4.0.0, then a reboot
        code, out, err = host.agent("upgrade", "--archive", server.url(v4.path), "--sha256", v4.sha256,
                                    "--operation", "to-4", env={KILL_HOOK_ENV: "RestartObserved#1"})
        assert code == -9 or code == 137, (code, out, err)
        host.sandbox.crash()
        _wait_gone(port)
        assert os.readlink(host.at(f"{LIB}/{NAME}-current")) == f"{NAME}-blue"  # switched, not committed

        host = boot(tmp_path / "boot2")
        recovered = host.show(f"{NAME}-recover-boot.service", "Result", "ExecMainStatus")
        assert recovered == {"Result": "success", "ExecMainStatus": "0"}, recovered
        # boot recovery never waits for the daemon: it counts the attempt the crash interrupted as failed
        # and hands the next one (of health.max_attempts = 2) to a transient unit (``recover --trigger
        # manual``), which restarts the daemon on the candidate, sees it healthy and commits it
        episode = host.episode_when_closed("to-4")
        steps = [(r["event"]["_type"], r["event"].get("trigger")) for r in episode]
        after_cut = steps[steps.index(("RestartObserved", None)) + 1:]
        assert after_cut == [
            ("RecoveryStarted", "boot"), ("HealthFailed", None), ("RecoveryStarted", "manual"),
            ("HealthAttemptStarted", None), ("RestartRequested", None), ("RestartObserved", None),
            ("HealthPassed", None), ("UpgradeCommitted", None), ("ResultPublished", None),
            ("EpisodeClosed", None),
        ], steps
        assert json.loads(host.at(f"/var/lib/upgrade-agent/{NAME}/results/to-4.json").read_text())["result"] \
            == "committed"
        host.assert_serving("blue", v4)
        # the second boot is not a first boot: same machine id, no presets, the bootstrap stayed done
        assert host.sandbox.run("cat", "/etc/machine-id").stdout == machine_id
        console = host.sandbox.console_log.read_text(errors="replace")
        assert "Populated /etc with preset unit settings" not in console
        again = host.show(f"{NAME}-bootstrap.service", "ExecMainStartTimestampMonotonic", "UnitFileState")
        assert again == {"ExecMainStartTimestampMonotonic": "0", "UnitFileState": "disabled"}, again

    # 5. /usr as it was before Ignition ran
    assert_usr_unchanged(usr_before)

"""The private systemd harness itself: isolation, and a stop that leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.testing.sandbox import PrivateSystemd, SandboxError, mounts_under, python_paths

pytestmark = pytest.mark.systemd


def _pids_in(pidns: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == pidns:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _cgroup_exists(name: str, scratch: Path) -> bool:
    """Look for a top-level cgroup2 directory from a throw-away mount namespace (host mounts untouched)."""
    scratch.mkdir(exist_ok=True)
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t cgroup2 cgroup2 "$1" && test -d "$1/$2"; s=$?; umount "$1" 2>/dev/null; exit $s',
         "probe", str(scratch), name],
        capture_output=True, timeout=10, check=False,
    )
    return done.returncode == 0


def _host_mounts_under(path: Path) -> list[str]:
    return [ln for ln in Path("/proc/self/mountinfo").read_text().splitlines() if str(path) in ln]


@pytest.fixture
def root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("the private systemd harness needs root")


@pytest.mark.usefixtures("root_only")
def test_boot_then_stop_leaves_no_process_cgroup_mount_or_workdir(tmp_path: Path) -> None:
    workdir = tmp_path / "sd"
    host_cgroups = Path("/proc/self/cgroup").read_text()
    with PrivateSystemd.start(workdir, journald=False) as sd:
        assert sd.boot_seconds < 10
        assert sd.prefix == ["nsenter", "-t", str(sd.pid), "-m", "-p", "-u", "-i", "--"]
        assert sd.pidns != os.readlink("/proc/self/ns/pid")
        assert sd.run("cat", "/proc/1/comm").stdout.strip() == "systemd"
        assert sd.run("systemctl", "is-system-running").stdout.strip() == "running"
        # PID 1 sits in its own cgroup subtree and sees it as its root
        assert f"0::/{sd.cgroup}/init.scope" in Path(f"/proc/{sd.pid}/cgroup").read_text()
        assert _cgroup_exists(sd.cgroup, tmp_path / "cg")
        # the unit dir is the sandbox's /etc/systemd/system, and only there
        (sd.unit_dir / "probe.txt").write_text("x")
        assert sd.run("cat", "/etc/systemd/system/probe.txt").stdout == "x"
        assert not Path("/etc/systemd/system/probe.txt").exists()
        pidns, cgroup, pid = sd.pidns, sd.cgroup, sd.pid
    assert _pids_in(pidns) == []
    assert not os.path.exists(f"/proc/{pid}") or os.readlink(f"/proc/{pid}/ns/pid") != pidns
    assert not _cgroup_exists(cgroup, tmp_path / "cg")
    assert _host_mounts_under(workdir) == []
    assert not workdir.exists()
    assert Path("/proc/self/cgroup").read_text() == host_cgroups
    sd.stop()  # idempotent


@pytest.mark.usefixtures("root_only")
def test_stop_kills_units_that_ignore_sigterm(tmp_path: Path) -> None:
    sd = PrivateSystemd.start(tmp_path / "sd", journald=False)
    stubborn = tmp_path / "stubborn"
    stubborn.write_text("#!/bin/sh\ntrap '' TERM\nwhile :; do sleep 0.1; done\n")
    stubborn.chmod(0o755)
    (sd.unit_dir / "stubborn.service").write_text(f"[Service]\nExecStart={stubborn}\nTimeoutStopSec=60\n")
    sd.run("systemctl", "daemon-reload")
    sd.run("systemctl", "start", "stubborn.service")
    pidns = sd.pidns
    sd.stop(stop_timeout_s=0.5)  # graceful exit would wait 60 s for the unit: SIGKILL to PID 1 instead
    assert _pids_in(pidns) == []
    assert not (tmp_path / "sd").exists()


def test_sandbox_isolation_hides_host_units(sandbox: PrivateSystemd) -> None:
    # the host's units (tmpfiles would wipe the shared /tmp) are not even loadable inside
    for unit in ("systemd-tmpfiles-setup.service", "getty@tty1.service", "systemd-udevd.service"):
        show = sandbox.run("systemctl", "show", unit, "-p", "LoadState", "--value").stdout.strip()
        assert show == "not-found", unit
    env = sandbox.run("cat", "/proc/1/environ").stdout.split("\0")
    assert "container=upgrade-core-sandbox" in env
    assert sandbox.run("findmnt", "-n", "-o", "FSTYPE", "/run").stdout.strip() == "tmpfs"
    assert sandbox.run("findmnt", "-n", "-o", "FSTYPE", "/sys/fs/cgroup").stdout.strip() == "cgroup2"
    assert sandbox.run("cat", "/proc/self/cgroup").stdout  # reachable through the prefix


@pytest.mark.usefixtures("root_only")
def test_boot_timeout_is_an_error_naming_the_console_log(tmp_path: Path) -> None:
    workdir = tmp_path / "sd"
    with pytest.raises(SandboxError, match="console log") as caught:
        PrivateSystemd.start(workdir, journald=False, boot_timeout_s=0.0)
    assert caught.value.console_log == workdir / "console.log"
    assert caught.value.console_log.exists()  # kept for the post-mortem
    assert _host_mounts_under(workdir) == []
    assert caught.value.exit_code == 1


@pytest.mark.usefixtures("root_only")
def test_a_non_empty_workdir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "stale").write_text("x")
    with pytest.raises(SandboxError, match=f"work directory {tmp_path} is not empty"):
        PrivateSystemd.start(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["stale"]


@pytest.mark.usefixtures("root_only")
def test_a_killed_owner_takes_its_sandbox_down_and_the_next_boot_sweeps_its_cgroup(tmp_path: Path) -> None:
    worktree = Path(__file__).resolve().parents[2]
    code = (
        "import sys, time\n"
        "from agent.testing.sandbox import PrivateSystemd\n"
        "sd = PrivateSystemd.start(sys.argv[1], journald=False)\n"
        "print(sd.pidns, sd.cgroup, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "doomed")], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(worktree)})
    assert owner.stdout is not None
    pidns, cgroup = owner.stdout.readline().split()
    assert _pids_in(pidns)
    owner.kill()  # no stop(): PR_SET_PDEATHSIG takes the launcher, hence PID 1, hence the namespace down
    owner.wait()
    deadline = time.monotonic() + 10
    while _pids_in(pidns):
        assert time.monotonic() < deadline, "sandbox processes outlived their killed owner"
        time.sleep(0.02)
    # Its (empty) cgroup is the one thing a SIGKILL leaves behind. Not asserted here: a concurrent test
    # session's boot may already have swept it.
    with PrivateSystemd.start(tmp_path / "next", journald=False) as sd:
        # ... and is swept by the next boot (ours, or a concurrent session's that booted first)
        assert not _cgroup_exists(cgroup, tmp_path / "cg")
        assert all(name.startswith("upgrade-core-sandbox-") for name in sd.swept_cgroups)
    shutil.rmtree(tmp_path / "doomed")


@pytest.mark.usefixtures("root_only")
def test_a_manager_that_dies_at_boot_is_an_error_with_its_console_output(tmp_path: Path) -> None:
    fake = tmp_path / "systemd"
    fake.write_text("#!/bin/sh\necho 'fake manager: refusing to boot' >&2\nexit 7\n")
    fake.chmod(0o755)
    workdir = tmp_path / "sd"
    with pytest.raises(SandboxError) as caught:
        PrivateSystemd.start(workdir, journald=False, systemd=str(fake))
    message = str(caught.value)
    assert message.startswith("private systemd: the launcher exited early")
    assert "fake manager: refusing to boot" in message  # the console tail, for the CI log
    assert caught.value.console_log == workdir / "console.log"
    assert _host_mounts_under(workdir) == []


@pytest.mark.usefixtures("root_only")
def test_module_cli_runs_a_command_inside_and_returns_its_status(tmp_path: Path) -> None:
    worktree = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "agent.testing.sandbox", "--no-journald", "--workdir", str(tmp_path / "sd"),
         "--", "sh", "-c", "cat /proc/1/comm; exit 3"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(worktree)},
    )
    assert (done.returncode, done.stdout) == (3, "systemd\n")
    assert "private systemd up in" in done.stderr
    assert not (tmp_path / "sd").exists()


def _image(sysroot: Path) -> Path:
    for d in ("usr", "proc", "sys", "dev", "run", "tmp", "etc/systemd/system", "var"):
        (sysroot / d).mkdir(parents=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        (sysroot / link).symlink_to(f"usr/{link}")
    return sysroot


@pytest.mark.usefixtures("root_only")
def test_a_root_of_its_own_with_python_hidden_then_a_crash_leaves_nothing(tmp_path: Path) -> None:
    sysroot = _image(tmp_path / "sysroot")
    workdir = tmp_path / "sd"
    hidden = python_paths()
    python3 = shutil.which("python3", path="/usr/local/bin:/usr/bin") or "/usr/bin/python3"
    interpreter = os.path.realpath(python3)
    assert interpreter in hidden and "/usr/bin/python3" not in hidden, hidden  # the file, not the link
    sd = PrivateSystemd.start(workdir, journald=False, root=sysroot, hide=hidden)
    try:
        assert sd.root == sysroot and sd.unit_dir == sysroot / "etc/systemd/system"
        (sd.unit_dir / "probe.txt").write_text("x\n")
        seen = sd.run("sh", "-c", "cat /etc/systemd/system/probe.txt; ls -A /; command -v python3",
                      check=False)
        assert seen.returncode != 0 and seen.stdout.split() == [
            "x", "bin", "dev", "etc", "lib", "lib64", "proc", "run", "sbin", "sys", "tmp", "usr", "var"]
        empty = 'if [ -d "$1" ]; then [ -z "$(ls -A "$1")" ]; else [ ! -s "$1" ] && [ ! -x "$1" ]; fi'
        for path in hidden:  # an empty directory, or an empty file nobody may execute
            assert sd.run("sh", "-c", empty, "-", path, check=False).returncode == 0, path
        # a cover is no writable spot in the read-only /usr
        for target in ("/usr/upgrade-core-probe", interpreter, f"{interpreter}.d"):
            write = sd.run("sh", "-c", 'echo "#!/bin/sh" > "$1"', "-", target, check=False)
            assert write.returncode != 0 and "Read-only file system" in write.stderr, (target, write)
        # the first boot wrote a machine id onto the root's /etc, never the host's
        machine_id = sd.run("cat", "/etc/machine-id").stdout
        assert (sysroot / "etc/machine-id").read_text() == machine_id and len(machine_id) == 33
        assert sd.run("systemctl", "is-system-running").stdout.strip() == "running"
        pidns = sd.pidns
    finally:
        sd.crash()
    assert _pids_in(pidns) == []
    assert mounts_under(workdir) == [] and mounts_under(sysroot) == []
    assert not workdir.exists() and (sysroot / "etc/machine-id").is_file()
    assert not Path("/usr/upgrade-core-probe").exists()


@pytest.mark.usefixtures("root_only")
def test_a_root_without_its_mount_points_or_a_bad_hide_path_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    (bare / "usr").mkdir(parents=True)
    with pytest.raises(SandboxError, match=r"no directory proc, sys, dev, run, tmp to mount on"):
        PrivateSystemd.start(tmp_path / "sd1", root=bare)
    with pytest.raises(SandboxError, match="hide needs root"):
        PrivateSystemd.start(tmp_path / "sd2", hide=["/usr/bin/python3.11"])
    with pytest.raises(SandboxError, match="is this machine's own root"):
        PrivateSystemd.start(tmp_path / "sd4", root=Path("/usr/.."))
    linked = _image(tmp_path / "linked")
    (linked / "etc").rename(linked / "etc.real")
    (linked / "etc").symlink_to("/etc")  # unit files would land in this machine's /etc/systemd/system
    with pytest.raises(SandboxError, match="etc: a symbolic link"):
        PrivateSystemd.start(tmp_path / "sd5", root=linked)
    image = _image(tmp_path / "image")
    usr_link = next(str(p) for p in Path("/usr/bin").iterdir() if p.is_symlink() and p.resolve().is_file())
    for bad in ("/etc/passwd", "/usr/../etc/passwd", "/usr/no such file", "/usr/bin/*", usr_link):
        with pytest.raises(SandboxError, match="hide: "):
            PrivateSystemd.start(tmp_path / "sd3", root=image, hide=[bad])
    with pytest.raises(SandboxError, match="inside another hidden path"):
        PrivateSystemd.start(tmp_path / "sd3", root=image, hide=["/usr/lib", "/usr/lib/os-release"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("sd")]


def test_mounts_under_reads_escaped_mount_points(tmp_path: Path) -> None:
    """A mount point with a space is written ``\\040`` in mountinfo (proc(5)); the teardown's proof that
    nothing is left must still see it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount (in a private mount namespace)")
    target = tmp_path / "a dir" / "x"
    target.mkdir(parents=True)
    code = (f"from pathlib import Path; from agent.testing.sandbox import mounts_under; "
            f"print(mounts_under(Path({str(tmp_path)!r})))")
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs tmpfs "$1" && exec "$2" -c "$3"', "-", str(target), sys.executable, code],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr([str(target)])
    assert mounts_under(tmp_path) == []  # and nothing of it in this namespace

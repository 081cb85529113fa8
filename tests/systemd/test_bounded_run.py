"""Subprocess plumbing without a sandbox: timeouts, bounded output, process groups, /proc reads, errors."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest

from agent.errors import ConfigError
from agent.process import BoundedRunTimeout, run_bounded
from agent.systemd.manager import SystemdServiceManager
from tests._proc import wait_dead
from upgrade_core.errors import ServiceError

from .conftest import write_script

pytestmark = pytest.mark.anyio


def _manager(tmp_path: Path, prefix: list[str], timeout_s: float = 5.0) -> SystemdServiceManager:
    return SystemdServiceManager("x.service", unit_dir=tmp_path, recover_exe="/bin/true",
                                 config_path="/etc/x.toml", prefix=prefix, command_timeout_s=timeout_s)


async def test_output_is_bounded_but_fully_drained() -> None:
    done = await run_bounded(["sh", "-c", "head -c 300000 /dev/zero; echo err >&2; exit 4"], timeout_s=10,
                             max_output_bytes=1000)
    assert (done.returncode, len(done.stdout), done.stderr) == (4, 1000, b"err\n")


async def test_timeout_raises_and_kills_the_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with pytest.raises(BoundedRunTimeout, match=r"timed out after 0.3 s"):
        await run_bounded(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout_s=0.3)
    assert wait_dead(int(pidfile.read_text())), "a process survived the kill of its process group"


async def test_cancellation_kills_the_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with anyio.move_on_after(0.3):
        await run_bounded(["sh", "-c", f"echo $$ > {pidfile}; sleep 60"], timeout_s=30)
    assert wait_dead(int(pidfile.read_text())), "a process survived the kill of its process group"


async def test_missing_program_is_an_oserror() -> None:
    with pytest.raises(OSError):
        await run_bounded(["/nonexistent/x"], timeout_s=1)


async def test_a_hanging_systemctl_is_a_service_error_and_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    hang = write_script(tmp_path / "hang", f"sleep 60 &\necho $! > {pidfile}\nwait\n")
    with pytest.raises(ServiceError, match=r"`.*/hang systemctl show x.service .*` timed out after 0.5 s"):
        await _manager(tmp_path, [str(hang)], timeout_s=0.5).snapshot()
    assert wait_dead(int(pidfile.read_text())), "a process survived the kill of its process group"


async def test_a_failing_systemctl_names_the_command_and_its_stderr(tmp_path: Path) -> None:
    fail = write_script(tmp_path / "fail", "echo 'Failed to connect to bus: No such file' >&2\nexit 1\n")
    with pytest.raises(ServiceError, match=r"systemctl daemon-reload` exited 1: Failed to connect to bus"):
        await _manager(tmp_path, [str(fail)]).daemon_reload()


async def test_garbage_from_systemctl_show_is_a_service_error(tmp_path: Path) -> None:
    liar = write_script(tmp_path / "liar", "echo ActiveState=active\necho MainPID=abc\n")
    with pytest.raises(ServiceError, match=r"MainPID='abc' is not an integer"):
        await _manager(tmp_path, [str(liar)]).snapshot()


async def test_snapshot_without_prefix_reads_proc_directly(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        # Popen returns once execve passed its point of no return, possibly before the kernel set up the
        # new argv: a fresh process can briefly read as an empty cmdline. Poll, with a deadline.
        with anyio.fail_after(5):
            while not (found := await _manager(tmp_path, [])._read_proc(proc.pid))[1]:
                await anyio.sleep(0.01)
        exe, cmdline = found
        assert exe == os.path.realpath(shutil.which("sleep") or "")
        assert cmdline == ("sleep", "30")
        assert await _manager(tmp_path, [])._read_proc(2**22 + 7) == (None, ())  # beyond pid_max: no process
    finally:
        proc.kill()
        proc.wait()


async def test_unit_files_refuse_path_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a valid systemd unit name"):
        await _manager(tmp_path, []).write_units({"../x.service": ""})
    with pytest.raises(ConfigError, match="not a valid systemd unit name"):
        await _manager(tmp_path, []).remove_units(["sub/x.service"])
    assert list(tmp_path.iterdir()) == []


async def test_removing_units_never_follows_a_wants_directory_that_is_a_link(tmp_path: Path) -> None:
    """A ``*.wants`` entry that is a symlink to another directory (planted, or an administrator's) is not
    entered: the same-named file in the directory it names keeps its bytes; the real ``*.wants`` link and
    the unit file are removed through the checked handle of the unit directory."""
    units = tmp_path / "units"
    (units / "multi-user.target.wants").mkdir(parents=True)
    (units / "x.service").write_text("[Service]\n")
    os.symlink("../x.service", units / "multi-user.target.wants" / "x.service")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.service").write_text("someone else's\n")
    os.symlink(elsewhere, units / "timers.target.wants")
    removed = await _manager(units, []).remove_units(["x.service"])
    assert sorted(removed) == [str(units / "multi-user.target.wants" / "x.service"), str(units / "x.service")]
    assert (elsewhere / "x.service").read_text() == "someone else's\n"
    assert os.path.islink(units / "timers.target.wants")

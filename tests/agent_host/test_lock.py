"""agent.host.lock: exclusive non-blocking flock, kernel release on SIGKILL, a probe that creates nothing."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.host.lock import HostLock, probe_lock
from upgrade_core.errors import LockBusyError

ROOT = Path(__file__).resolve().parents[2]
HOLDER = (
    "import sys\n"
    "from agent.host.lock import HostLock\n"
    "lock = HostLock(sys.argv[1]); lock.acquire()\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


def start_holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30.0)
    assert ready, "holder did not take the lock within 30 s"
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_lock_creates_file_and_parents_with_modes(tmp_path: Path) -> None:
    path = tmp_path / "run" / "upgrade-agent" / "demo.lock"
    old = os.umask(0o077)
    try:
        with HostLock(str(path)) as lock:
            assert lock.held
            assert path.stat().st_mode & 0o777 == 0o600
            assert (tmp_path / "run").stat().st_mode & 0o777 == 0o755
            assert (tmp_path / "run" / "upgrade-agent").stat().st_mode & 0o777 == 0o755
            assert probe_lock(str(path)) == "busy"
        assert not lock.held
    finally:
        os.umask(old)
    assert probe_lock(str(path)) == "free"


def test_second_holder_gets_busy_and_kernel_releases_on_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "demo.lock"
    proc = start_holder(path)
    try:
        busy = rf"{path}: host lock held by another process \(pid {proc.pid}\)"
        with pytest.raises(LockBusyError, match=busy) as info:
            HostLock(str(path)).acquire()
        assert info.value.exit_code == 75
        assert probe_lock(str(path)) == "busy"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10.0
    while probe_lock(str(path)) != "free":
        assert time.monotonic() < deadline, "the kernel never released the flock of a killed holder"
        time.sleep(0.01)
    with HostLock(str(path)):
        pass


def test_lock_is_not_inherited_by_children(tmp_path: Path) -> None:
    path = tmp_path / "demo.lock"
    with HostLock(str(path)):
        child = subprocess.Popen(["sleep", "30"])
    try:
        assert probe_lock(str(path)) == "free"  # a child of the holder does not prolong the lock
    finally:
        child.kill()
        child.wait()


def test_probe_never_creates_anything(tmp_path: Path) -> None:
    assert probe_lock(str(tmp_path / "missing" / "demo.lock")) == "free"
    assert probe_lock(str(tmp_path / "demo.lock")) == "free"
    assert os.listdir(tmp_path) == []


def test_acquire_twice_in_one_object_is_misuse(tmp_path: Path) -> None:
    lock = HostLock(str(tmp_path / "l"))
    lock.acquire()
    try:
        with pytest.raises(RuntimeError):
            lock.acquire()
    finally:
        lock.release()


def test_lock_module_stays_lean_for_the_noop_recovery() -> None:
    code = (
        "import sys\n"
        "import agent.host.lock, agent.config.boot\n"
        "heavy = ('attr', 'attrs', 'cattrs', 'upgrade_core')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

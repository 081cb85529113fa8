"""Fixtures for the real-systemd tests: one private systemd per session
(agent.testing.sandbox.PrivateSystemd).

As non-root every test that needs it is skipped with the reason; as root a boot failure is an error of the
test (the harness must work, design §8), never a skip. Tests drive the sandbox from the host, through its
``nsenter`` prefix and its unit directory, exactly as the agent is configured against it.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from agent.systemd.manager import SystemdServiceManager
from agent.systemd.units import render_units
from agent.testing.sandbox import PrivateSystemd


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSystemd]:
    """The session's private systemd (journald on, so unit output lands in its console log)."""
    if os.geteuid() != 0:
        pytest.skip("the private systemd harness needs root (unshare, mount, cgroup2)")
    sd = PrivateSystemd.start(tmp_path_factory.mktemp("sandbox") / "sd")
    try:
        yield sd
    finally:
        sd.stop()


def wait_for(predicate: Callable[[], bool], timeout_s: float = 8.0, what: str = "condition") -> None:
    """Poll ``predicate`` every 20 ms until true; fail the test after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def write_script(path: Path, body: str) -> Path:
    """A small executable shell script (the "agent binary" of a test)."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@attrs.define
class Rig:
    """One test's agent: a unique name, a host root with a blue slot and a current link, and a manager.

    Attributes:
        sandbox: the private systemd.
        name: ``agent.name`` (unique per test).
        unit: ``NAME.service``.
        root: the test's host root (under tmp_path).
        current: ``R/lib/NAME/NAME-current`` (relative symlink to ``NAME-blue``).
        blue: the blue slot file.
        recover_exe: a stub ``recover-agent-upgrade`` that appends its argv to ``recover.log``.
        recover_log: where the stub writes.
        config: the (absolute, never read) config path passed as ``--config``.
        manager: a SystemdServiceManager through the sandbox's prefix.
    """

    sandbox: PrivateSystemd
    name: str
    unit: str
    root: Path
    current: Path
    blue: Path
    recover_exe: Path
    recover_log: Path
    config: Path
    manager: SystemdServiceManager

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show`` inside the sandbox, synchronously."""
        out = self.sandbox.run("systemctl", "show", unit, "-p", ",".join(props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def units(self, max_attempts: int = 3, exec_args: tuple[str, ...] = ()) -> dict[str, str]:
        """The three rendered units for this rig."""
        return render_units(
            name=self.name, unit=self.unit, current_link=str(self.current), exec_args=exec_args,
            max_attempts=max_attempts, recover_exe=str(self.recover_exe), config_path=str(self.config),
        )


@pytest.fixture
def rig(sandbox: PrivateSystemd, tmp_path: Path) -> Iterator[Rig]:
    """A fresh agent layout and manager; afterwards its units are stopped, removed and reloaded away."""
    name = f"sdt-{secrets.token_hex(4)}"
    lib = tmp_path / "root" / "lib" / name
    lib.mkdir(parents=True)
    blue = write_script(lib / f"{name}-blue", "while :; do sleep 0.2; done\n")
    current = lib / f"{name}-current"
    current.symlink_to(blue.name)
    recover_log = tmp_path / "recover.log"
    recover_exe = write_script(tmp_path / "recover-agent-upgrade",
                               f'printf "%s\\n" "$*" >> {recover_log}\nsleep "${{STUB_SLEEP:-0}}"\n')
    config = tmp_path / "etc $HOME 100%" / "agent.toml"  # both kinds of expansion must be escaped
    manager = SystemdServiceManager(
        f"{name}.service", unit_dir=sandbox.unit_dir, recover_exe=str(recover_exe), config_path=str(config),
        prefix=sandbox.prefix, command_timeout_s=10.0, poll_interval_s=0.05,
    )
    r = Rig(sandbox, name, f"{name}.service", tmp_path / "root", current, blue, recover_exe, recover_log,
            config, manager)
    try:
        yield r
    finally:
        mine = sorted(p.name for p in sandbox.unit_dir.iterdir() if p.name.startswith(name))
        for unit in mine:
            sandbox.run("systemctl", "stop", unit, check=False)
        if mine:
            sandbox.run("systemctl", "disable", *mine, check=False)
        for unit in mine:
            (sandbox.unit_dir / unit).unlink(missing_ok=True)
        sandbox.run("systemctl", "daemon-reload")
        sandbox.run("systemctl", "reset-failed", check=False)


# Interpreter for units that run Python with this worktree's code (runs_inside_unit).
PYTHON = sys.executable

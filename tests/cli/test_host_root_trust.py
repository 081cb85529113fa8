"""The host root is the agent's like ``state_dir`` (docs/host.md, case C30): every command that acts on it
checks it, and what the agent keeps under it, before anything else.

Each case prepares the host root as another user could have left it (owned by another uid, writable by group
or others, a symlink of another uid's, the agent directory swapped for a symlink, a parent anyone may write)
and runs the real CLI. Expected outcome, every case and command: exit 4 with one line naming the path and what
is wrong, and nothing under the test's directory changed (no lock file, no state, no unit, links and slots
as they were). ``host.systemctl_prefix`` is ``/bin/false``: no case reaches a service manager.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ._rig import Rig, snapshot, version_script

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="ownership attacks need root and another uid")


def _foreign_owner(rig: Rig, tmp_path: Path) -> Path:
    os.chown(rig.root, NOBODY, NOBODY)
    return rig.root


def _world_writable(rig: Rig, tmp_path: Path) -> Path:
    os.chmod(rig.root, 0o777)
    return rig.root


def _agent_dir_swapped(rig: Rig, tmp_path: Path) -> Path:
    elsewhere = tmp_path / "swapped-in"
    os.rename(rig.agent_dir, elsewhere)
    os.symlink(elsewhere, rig.agent_dir)
    return rig.agent_dir


def _parent_writable(rig: Rig, tmp_path: Path) -> Path:
    os.chmod(rig.root.parent, 0o777)
    return rig.root.parent


def _lib_of_another_user(rig: Rig, tmp_path: Path) -> Path:
    os.chown(rig.root / "lib", NOBODY, NOBODY)
    return rig.root / "lib"


ATTACKS: dict[str, Callable[[Rig, Path], Path]] = {
    "foreign owner": _foreign_owner,
    "world-writable": _world_writable,
    "agent dir swapped": _agent_dir_swapped,
    "parent writable by others": _parent_writable,
    "lib of another user": _lib_of_another_user,
}


def _archive(tmp_path: Path) -> Path:
    binary = tmp_path / "candidate"
    binary.write_bytes(version_script("2.0.0"))
    binary.chmod(0o755)
    return binary


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("command", ["upgrade", "rollback", "reset", "uninstall", "status"])
def test_an_installed_host_whose_root_is_not_the_agents_is_refused(
    tmp_path: Path, attack: str, command: str
) -> None:
    rig = Rig(tmp_path / "host", "root-check")
    rig.install_by_hand()
    bad = ATTACKS[attack](rig, tmp_path)
    argv = {"upgrade": ["upgrade", "--archive", str(_archive(tmp_path))], "rollback": ["rollback"],
            "reset": ["reset"], "uninstall": ["uninstall"], "status": ["status"]}[command]
    before = snapshot(tmp_path)
    err = rig.cli(*argv).error_payload(4)
    assert err["error"].startswith(f"{bad}: "), err
    assert err["error"].endswith("nothing was changed"), err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("attack", ["foreign owner", "world-writable", "parent writable by others"])
def test_install_on_a_root_another_user_prepared_is_refused(tmp_path: Path, attack: str) -> None:
    rig = Rig(tmp_path / "host", "root-install")
    rig.root.mkdir(mode=0o755)
    (rig.root / "lib").mkdir(mode=0o755)
    bad = ATTACKS[attack](rig, tmp_path)
    archive = _archive(tmp_path)
    before = snapshot(tmp_path)
    err = rig.cli("install", "--archive", str(archive)).error_payload(4)
    assert err["error"].startswith(f"{bad}: "), err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("key", ["host.root", "host.state_dir", "host.lock_path"])
def test_an_agent_path_directly_in_a_world_writable_directory_is_a_configuration_error(
    tmp_path: Path, key: str
) -> None:
    """Another user can create a path directly in ``/tmp`` first (here a real unprivileged child does, for
    the state directory), after which the ownership checks would refuse every command forever, the boot
    recovery included. Expected: exit 2 naming the key, the path and ``/tmp``; nothing created."""
    rig = Rig(tmp_path / "host", "squat")
    squat = Path("/tmp") / f"upgrade-core-squat-{os.getpid()}-{key.split('.')[1]}"
    text = rig.config.read_text()
    old = {"host.root": rig.root, "host.state_dir": rig.state_dir, "host.lock_path": rig.lock_path}[key]
    rig.config.write_text(text.replace(f'"{old}"', f'"{squat}"'))
    try:
        if key == "host.state_dir":  # squatted: another user made it first
            code = f"import os; os.setgid({NOBODY}); os.setuid({NOBODY}); os.mkdir({str(squat)!r}, 0o755)"
            subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
        before = snapshot(tmp_path)
        commands = [["status"]] + ([] if key == "host.root" else [["recover", "--trigger", "manual"]])
        for argv in commands:  # (the boot path's recover reads no host root: nothing open, nothing touched)
            err = rig.cli(*argv).error_payload(2)
            assert err["error"].startswith(f"{key}: {squat} sits directly in /tmp"), err
        assert snapshot(tmp_path) == before
        assert not squat.exists() or (key == "host.state_dir" and os.listdir(squat) == [])
    finally:
        if squat.is_dir():
            squat.rmdir()
        elif squat.exists():
            squat.unlink()

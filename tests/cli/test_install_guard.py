"""``install`` never starts over a layout it did not create, and a file where a link must be is refused
before anything changes (design §6 "Switch", design §7 ``install``): exit 2, one line, the host
byte-identical.

Found by breaking the CLI by hand: an install over a layout whose ``current`` link was missing went ahead,
failed, and its clean-up removed the existing slots, links and units.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ._rig import Rig, snapshot


@pytest.fixture
def rig(installed_rig: Rig) -> Rig:
    """Every case here starts from an installed host."""
    return installed_rig


def _current(rig: Rig) -> Path:
    return rig.agent_dir / f"{rig.name}-current"


def _never_read(tmp_path: Path) -> str:
    """An archive path that exists (bad input is refused before the layout is looked at) and is never read."""
    path = tmp_path / "never-read.tar.gz"
    path.write_bytes(b"")
    return str(path)


def test_install_over_a_layout_without_its_current_link_is_refused(rig: Rig, tmp_path: Path) -> None:
    _current(rig).unlink()
    (rig.agent_dir / "operator-notes.txt").write_text("keep\n")
    archive = _never_read(tmp_path)
    before = snapshot(tmp_path)
    run = rig.cli("install", "--archive", archive)
    err = run.error_payload(2)
    assert "partial layout" in err["error"] and str(rig.agent_dir) in err["error"]
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["install", "upgrade"])
def test_a_regular_file_where_current_must_be_is_refused(rig: Rig, tmp_path: Path, command: str) -> None:
    current = _current(rig)
    current.unlink()
    shutil.copy(rig.slot("blue"), current)
    archive = _never_read(tmp_path)
    before = snapshot(tmp_path)
    run = rig.cli(command, "--archive", archive)
    err = run.error_payload(2)
    assert str(current) in err["error"], err
    assert snapshot(tmp_path) == before
    assert os.path.isfile(current) and not os.path.islink(current)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a private read-only bind mount (unshare -m)")
def test_uninstall_on_a_read_only_root_refuses_before_changing_anything(rig: Rig, tmp_path: Path) -> None:
    """C14: a rescue view mounts the host root read-only; uninstall says so and stops nothing."""
    import json
    import subprocess
    import sys

    from ._rig import REPO, cli_env

    before = snapshot(tmp_path)
    script = (
        f"mount --bind {rig.root} {rig.root} && mount -o remount,bind,ro {rig.root} && "
        f"exec {sys.executable} -m agent.cli.main --config {rig.config} --json uninstall"
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 4, (done.stdout, done.stderr)  # the host refused; nothing was changed
    payload = json.loads(done.stdout)
    assert "read-only" in payload["error"] and "Traceback" not in done.stderr
    assert snapshot(tmp_path) == before

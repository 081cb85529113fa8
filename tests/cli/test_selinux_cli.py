"""SELinux labels through the whole CLI (docs/host.md, "SELinux labels"): an upgrade whose ``restorecon``
fails on the new slot stops before the switch, one line naming the slot; one that succeeds labels the slot.

No SELinux kernel here: "enabled" is presented by the test-only mount table variable, and ``restorecon`` is
a recording script on ``PATH`` (``tests/agent_host/_selinux.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.agent_host._selinux import fake_selinux

from ._rig import Rig
from .test_signed_releases import release


def test_a_failing_restorecon_stops_the_upgrade_before_the_switch(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    fake = fake_selinux(tmp_path / "se", exit_code=1)
    archive = release(rig, tmp_path, "2.0.0")
    run = rig.cli("upgrade", "--archive", str(archive), "--operation", "labels", env=fake.env)
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    green = str(rig.slot("green"))
    assert out["result"] == "aborted" and out["slot"] == "blue"
    assert out["reason"].startswith(f"{green}: ") and "exited 1" in out["reason"], out
    assert [line for line in run.error_lines() if green in line], run.stderr
    assert os.readlink(rig.agent_dir / f"{rig.name}-current") == f"{rig.name}-blue"
    assert os.readlink(rig.agent_dir / f"{rig.name}-last-good") == f"{rig.name}-blue"
    assert fake.runs() == [["--", green]]


def test_staging_labels_the_new_slot(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    fake = fake_selinux(tmp_path / "se")
    run = rig.cli("upgrade", "--stage", "--archive", str(release(rig, tmp_path, "2.0.0")), env=fake.env)
    assert run.code == 0, run
    assert run.payload()["result"] == "staged"
    assert fake.runs() == [["--", str(rig.slot("green"))]]

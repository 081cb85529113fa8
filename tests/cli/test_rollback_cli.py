"""``upgrade-agent rollback`` without systemd (docs/recovery.md): what is refused before anything is
touched, and ``--preflight``. The flow itself runs under the private systemd
(``tests/systemd/test_rollback_real.py``) and on the simulated host (``tests/core/test_rollback.py``)."""

from __future__ import annotations

import os

from agent.host.lock import HostLock

from ._rig import Rig, snapshot


def _last_good_on_green(rig: Rig) -> None:
    link = rig.agent_dir / f"{rig.name}-last-good"
    link.unlink()
    os.symlink(f"{rig.name}-green", link)


def test_preflight_prints_the_plan_and_changes_nothing(rig: Rig) -> None:
    rig.install_by_hand()
    _last_good_on_green(rig)
    before = snapshot(rig.base)
    run = rig.cli("rollback", "--preflight", "--operation", "rb1")
    assert run.code == 0, run
    plan = run.payload()
    assert plan["preflight"] is True and plan["lock"] == "free" and plan["inactive_slot"] == "green"
    assert plan["open_episode"] is None
    assert any("switch current from blue" in step and "to green" in step for step in plan["plan"]), plan
    assert snapshot(rig.base) == before  # no lock file, no state_dir, no journal
    human = rig.cli("rollback", "--preflight", json_out=False)
    assert human.code == 0 and "switch current from blue" in human.stdout and "None" not in human.stdout
    with HostLock(str(rig.lock_path)):
        busy = rig.cli("rollback", "--preflight")
    assert busy.code == 75 and busy.payload()["lock"] == "busy", busy


def test_nothing_to_roll_back_to_is_exit_2_before_anything_is_touched(rig: Rig) -> None:
    rig.install_by_hand()  # current and last-good both name blue
    before = snapshot(rig.base)
    for argv in (("rollback",), ("rollback", "--preflight")):
        err = rig.cli(*argv).error_payload(2)
        assert "nothing to roll back to" in err["error"] and "blue" in err["error"], err
    assert snapshot(rig.base) == before


def test_missing_last_good_is_exit_2(rig: Rig) -> None:
    rig.install_by_hand()
    (rig.agent_dir / f"{rig.name}-last-good").unlink()
    before = snapshot(rig.base)
    err = rig.cli("rollback").error_payload(2)
    assert "last-good does not exist" in err["error"], err
    assert snapshot(rig.base) == before


def test_not_installed_and_a_bad_operation_id_are_exit_2(rig: Rig) -> None:
    rig.cli("rollback").error_payload(2)
    rig.install_by_hand()
    _last_good_on_green(rig)
    before = snapshot(rig.base)
    err = rig.cli("rollback", "--operation", "no spaces").error_payload(2)
    assert "--operation" in err["error"]
    assert snapshot(rig.base) == before

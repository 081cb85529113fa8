"""``upgrade --stage`` and ``activate`` through the whole CLI, without systemd (docs/cli.md).

The rig's systemctl is ``/bin/false``, so what is driven here ends before a restart: staging (nothing is
switched or restarted), what ``status`` says about it, and the refusals of ``activate`` (nothing staged:
exit 2; changed bytes: exit 1, aborted). An ``activate`` that switches, restarts and commits runs under the
private systemd (``tests/systemd/test_staging_real.py``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ._rig import Rig, snapshot, version_script
from .test_signed_releases import release


def _links(rig: Rig) -> tuple[str, str]:
    return (os.readlink(rig.agent_dir / f"{rig.name}-current"),
            os.readlink(rig.agent_dir / f"{rig.name}-last-good"))


def _stage(rig: Rig, archive: Path, op: str) -> dict[str, object]:
    run = rig.cli("upgrade", "--stage", "--archive", str(archive), "--operation", op)
    assert run.code == 0, run
    run.assert_clean_stderr()
    return run.payload()


def test_stage_installs_the_candidate_and_switches_nothing(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    archive = release(rig, tmp_path, "2.0.0")
    blue = rig.slot("blue").read_bytes()
    out = _stage(rig, archive, "st1")
    assert out == {"operation": "st1", "result": "staged", "from_version": None, "to_version": "2.0.0",
                   "slot": "blue", "reason": "candidate 2.0.0 staged in slot green; activate switches to it"}
    assert _links(rig) == (f"{rig.name}-blue", f"{rig.name}-blue")
    assert rig.slot("blue").read_bytes() == blue
    assert rig.slot("green").read_bytes() == version_script("2.0.0")
    assert rig.staging_leftovers() == []
    member = hashlib.sha256(version_script("2.0.0")).hexdigest()
    staged = rig.cli("status").payload()["staged"]
    assert staged == {"operation": "st1", "slot": "green", "sha256": member, "version": "2.0.0",
                      "archive_sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
                      "switch_in_window": False}
    human = rig.cli("status", json_out=False)
    assert f"staged: green 2.0.0 {member} (operation st1; activate switches)" in human.stdout.splitlines()


def test_a_second_stage_replaces_the_first(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    _stage(rig, release(rig, tmp_path, "2.0.0"), "st1")
    _stage(rig, release(rig, tmp_path, "2.1.0"), "st2")
    assert rig.slot("green").read_bytes() == version_script("2.1.0")
    staged = rig.cli("status").payload()["staged"]
    assert (staged["operation"], staged["version"]) == ("st2", "2.1.0")
    assert _links(rig) == (f"{rig.name}-blue", f"{rig.name}-blue")


def test_activate_with_nothing_staged_is_exit_2_one_line(installed_rig: Rig) -> None:
    rig = installed_rig
    before = snapshot(rig.base)
    err = rig.cli("activate", "--operation", "ac1").error_payload(2)
    assert err["error"] == "nothing staged: run upgrade --stage first", err
    human = rig.cli("activate", json_out=False)
    assert human.code == 2 and human.stdout == "", human
    assert human.stderr.splitlines() == ["upgrade-agent: nothing staged: run upgrade --stage first"], human
    assert snapshot(rig.base) == before  # no lock, no state_dir, no journal


def test_activate_refuses_a_staged_candidate_whose_bytes_changed(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    _stage(rig, release(rig, tmp_path, "2.0.0"), "st1")
    # the staged binary replaced behind the agent's back (a rename, as any writer of a slot must)
    swap = rig.agent_dir / "swap"
    swap.write_bytes(version_script("6.6.6"))
    swap.chmod(0o755)
    swap.rename(rig.slot("green"))
    before = rig.host_facts()
    run = rig.cli("activate", "--operation", "ac1")
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    assert (out["result"], out["slot"]) == ("aborted", "blue"), out
    now = hashlib.sha256(version_script("6.6.6")).hexdigest()[:12]
    staged = hashlib.sha256(version_script("2.0.0")).hexdigest()[:12]
    assert out["reason"] == (f"staged candidate in slot green ({rig.slot('green')}) changed: sha256 {now}, "
                             f"staged {staged}; stage it again"), out
    assert rig.host_facts() == before  # nothing switched, no slot touched
    assert rig.cli("status").payload()["staged"] is None
    assert rig.cli("activate", "--operation", "ac2").error_payload(2)["error"].startswith("nothing staged")


def test_activate_under_the_staging_operation_id_is_refused_not_replayed(
    installed_rig: Rig, tmp_path: Path
) -> None:
    # the id status prints beside the staged candidate is the staging episode's: replaying its recorded
    # result would print "staged" and exit 0 with nothing switched
    rig = installed_rig
    _stage(rig, release(rig, tmp_path, "2.0.0"), "st1")
    before = rig.host_facts()
    err = rig.cli("activate", "--operation", "st1").error_payload(2)
    assert err["error"] == ("activate: operation st1 is the episode that staged the candidate; an activation "
                            "is an episode of its own: leave --operation out, or give it a new id"), err
    assert rig.host_facts() == before
    assert rig.cli("status").payload()["staged"]["operation"] == "st1"

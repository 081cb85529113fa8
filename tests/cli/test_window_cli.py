"""``[schedule]`` maintenance windows through the whole CLI, without systemd (docs/configuration.md).

The window expression is judged by the real ``systemd-analyze calendar`` when the configuration loads;
outside the window ``upgrade`` and ``activate`` are refused before anything is locked or journaled unless
``--now``; ``upgrade --in-window`` stages and leaves the switch to the recovery timer, which reports a noop
naming the next opening while the window stays closed; ``upgrade --stage`` is allowed at any time; the
operator reports an operation waiting for its window as ``InProgress``, step ``Waiting``, once it has
staged its candidate. The timer's
switch inside an open window needs a restart: ``tests/systemd/test_timer.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ._rig import PYTHON, REPO, Rig, cli_env, snapshot, version_script
from .test_clean_input import IMPORT_TIME, imported
from .test_operator_cli import put
from .test_signed_releases import release


def closed_window(rig: Rig, extra: str = "") -> str:
    """Configure a daily one-minute window that opens three hours from now (UTC): closed now."""
    at = datetime.now(UTC) + timedelta(hours=3)
    window = f"*-*-* {at:%H:%M}:00 UTC"
    rig.write_config(f'[schedule]\nwindow = "{window}"\nwindow_s = 60\n\n{extra}')
    return window


def test_a_window_systemd_rejects_is_exit_2_one_line_naming_the_key(installed_rig: Rig) -> None:
    rig = installed_rig
    rig.write_config('[schedule]\nwindow = "Funday 25:00"\nwindow_s = 60\n')
    before = snapshot(rig.base)
    for argv in (("status",), ("upgrade", "--archive", "/nonexistent.tar.gz")):
        run = rig.cli(*argv, json_out=False)
        assert run.code == 2, run
        assert run.stderr.splitlines() == [
            f"upgrade-agent: {rig.config}: schedule.window: systemd-analyze calendar refused it: "
            "Failed to parse calendar specification 'Funday 25:00': Invalid argument"
        ], run
    assert snapshot(rig.base) == before


def test_jitter_must_leave_time_in_the_window(installed_rig: Rig) -> None:
    installed_rig.write_config('[schedule]\nwindow = "daily"\nwindow_s = 60\njitter_s = 60\n')
    err = installed_rig.cli("status").error_payload(2)
    assert err["error"].endswith("schedule.jitter_s: must be less than window_s (60)"), err


def test_outside_the_window_a_switch_is_refused_and_in_window_stages_for_the_timer(
    installed_rig: Rig, tmp_path: Path
) -> None:
    rig = installed_rig
    window = closed_window(rig)
    archive = release(rig, tmp_path, "2.0.0")
    before = rig.host_facts()
    unchanged = snapshot(rig.base)
    err = rig.cli("upgrade", "--archive", str(archive)).error_payload(2)
    assert err["error"].startswith(f"upgrade: outside the maintenance window (schedule.window = '{window}'): "
                                   "it opens for this host at "), err
    assert err["error"].endswith(
        "; --in-window stages it now for the recovery timer to switch in the window, --stage stages it for "
        "activate, --now switches anyway"), err
    assert snapshot(rig.base) == unchanged  # nothing locked, created or journaled
    both = rig.cli("upgrade", "--in-window", "--now", "--archive", str(archive), json_out=False)
    assert both.code == 2 and "not allowed with argument" in both.stderr, both

    run = rig.cli("upgrade", "--in-window", "--archive", str(archive), "--operation", "up1")
    assert run.code == 0, run
    out = run.payload()
    assert (out["result"], out["to_version"]) == ("staged", "2.0.0"), out
    assert out["reason"] == ("candidate 2.0.0 staged in slot green; the recovery timer switches to it inside "
                             "the maintenance window"), out
    said = [line for line in run.stderr.splitlines() if "outside the maintenance window" in line]
    assert len(said) == 1 and said[0].startswith(
        "upgrade-agent: upgrade: outside the maintenance window "
        f"(schedule.window = '{window}'): it opens for this host at "), run.stderr
    assert said[0].endswith(": staging now; the recovery timer switches to the candidate once the window is "
                            "open"), said
    after = rig.host_facts()
    assert (after["current"], after["last_good"]) == (before["current"], before["last_good"])
    assert rig.slot("green").read_bytes() == version_script("2.0.0")
    staged = rig.cli("status").payload()["staged"]
    assert (staged["operation"], staged["switch_in_window"]) == ("up1", True), staged
    human = rig.cli("status", json_out=False).stdout.splitlines()
    assert any(line.endswith("(operation up1; the recovery timer switches in the window)") for line in human)

    # the timer, window closed: a noop naming the wait; nothing switched, nothing journaled
    journal = snapshot(rig.journal_dir)
    tick = rig.cli("recover", "--trigger", "timer")
    assert tick.code == 0, tick
    result = tick.payload()
    assert (result["operation"], result["result"]) == (None, "noop"), result
    assert result["reason"].startswith(
        "candidate 2.0.0 staged by up1 waits: outside the maintenance window "
        f"(schedule.window = '{window}'): it opens for this host at "), result
    assert snapshot(rig.journal_dir) == journal
    assert rig.host_facts() == after
    said = rig.cli("recover", "--trigger", "timer", json_out=False)
    assert said.code == 0, said
    assert said.stdout.startswith(
        "nothing to recover: candidate 2.0.0 staged by up1 waits: outside the maintenance window"), said

    refused = rig.cli("activate", "--operation", "ac1").error_payload(2)
    assert refused["error"].startswith("activate: outside the maintenance window"), refused
    assert refused["error"].endswith("; --now switches anyway"), refused  # what is staged needs no --stage
    assert rig.cli("status").payload()["staged"]["operation"] == "up1"


def test_upgrade_stage_waits_for_activate_not_for_the_timer(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    rig.write_config('[schedule]\nwindow = "*-*-* *:*:00"\nwindow_s = 120\n')  # every minute, two long
    archive = release(rig, tmp_path, "2.0.0")
    staged = rig.cli("upgrade", "--stage", "--archive", str(archive), "--operation", "st1")
    assert staged.code == 0 and staged.payload()["result"] == "staged", staged
    assert rig.cli("status").payload()["staged"]["switch_in_window"] is False
    before = rig.host_facts()
    tick = rig.cli("recover", "--trigger", "timer")
    assert tick.code == 0 and tick.payload() == {
        "operation": None, "result": "noop", "from_version": None, "to_version": None, "slot": None,
        "reason": None}, tick
    assert rig.host_facts() == before


def test_now_overrides_the_window(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    closed_window(rig)
    # the binary current already runs: --now gets past the window and ends noop, before any restart
    same = tmp_path / "same.tar.gz"
    same.write_bytes(release(rig, tmp_path, "1.0.0").read_bytes())
    run = rig.cli("upgrade", "--now", "--archive", str(same), "--operation", "now1")
    assert run.code == 0 and run.payload()["result"] == "noop", run
    # activate --now gets past the window too: here to find the staged bytes changed (exit 1, no switch)
    assert rig.cli("upgrade", "--stage", "--archive", str(release(rig, tmp_path, "2.0.0"))).code == 0
    swap = rig.agent_dir / "swap"
    swap.write_bytes(version_script("6.6.6"))
    swap.chmod(0o755)
    swap.rename(rig.slot("green"))
    out = rig.cli("activate", "--now", "--operation", "ac1")
    assert out.code == 1 and out.payload()["result"] == "aborted", out
    assert os.readlink(rig.agent_dir / f"{rig.name}-current") == f"{rig.name}-blue"


def test_an_open_window_lets_the_switch_through(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    rig.write_config('[schedule]\nwindow = "*-*-* *:*:00"\nwindow_s = 120\n')  # every minute, two long
    same = tmp_path / "same.tar.gz"
    same.write_bytes(release(rig, tmp_path, "1.0.0").read_bytes())
    run = rig.cli("upgrade", "--archive", str(same), "--operation", "in1")
    assert run.code == 0 and run.payload()["result"] == "noop", run


def test_the_operator_reports_an_operation_waiting_for_its_window(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    spool = rig.base / "spool"
    spool.mkdir(mode=0o700)
    closed_window(rig, f'[operations]\nsource = "spool"\nspool_dir = "{spool}"\nnode_name = "n1"\n'
                       "poll_s = 0.1\nallow_local_sources = true\n")
    archive = release(rig, tmp_path, "2.0.0")
    put(spool, "op1", {"agent": rig.name, "archive": {
        "url": str(archive), "sha256": hashlib.sha256(archive.read_bytes()).hexdigest()}})
    before = rig.host_facts()
    proc = subprocess.Popen(
        [PYTHON, "-m", "agent.cli.main", "--config", str(rig.config), "--json", "operator"],
        cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        status_file = spool / "op1.status.json"
        deadline = time.monotonic() + 30
        # the first InProgress (step Waiting: accepted, not yet journaled) comes before the window's
        def message() -> str:
            return (json.loads(status_file.read_text()).get("message") or "") if status_file.exists() else ""

        while not message().endswith("activate switches to it"):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no status written"
            time.sleep(0.05)
        status = json.loads(status_file.read_text())
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert (status["phase"], status["step"], status["result"]) == ("InProgress", "Waiting", None), status
    assert status["message"].startswith("waiting for the maintenance window: the next opens at "), status
    staged = "; candidate 2.0.0 staged in slot green; activate switches to it"
    assert status["message"].endswith(staged), status
    # staged under the operation's own id while the window is closed: nothing switched
    after = rig.host_facts()
    assert (after["current"], after["last_good"]) == (before["current"], before["last_good"])
    assert rig.slot("green").read_bytes() == version_script("2.0.0")
    assert rig.cli("status").payload()["staged"]["operation"] == "op1"


def test_a_candidate_staged_for_the_window_still_switches_once_the_window_is_removed(
    installed_rig: Rig, tmp_path: Path
) -> None:
    # without a window the boot reader's quick path answers the timer: it must still see the candidate
    # upgrade --in-window left (its StagedForActivation record), or the switch would never come
    rig = installed_rig
    closed_window(rig)
    staged = rig.cli("upgrade", "--in-window", "--archive", str(release(rig, tmp_path, "2.0.0")),
                     "--operation", "up1")
    assert staged.code == 0 and staged.payload()["result"] == "staged", staged
    held = rig.cli("journal", "compact")  # sealing would hide the record from the boot reader
    assert held.code == 2 and "waits for the recovery timer to switch to it" in held.stderr, held
    rig.write_config("")  # the window removed: always open
    tick = rig.cli("recover", "--trigger", "timer", env=IMPORT_TIME)
    assert "agent.config.loader" in imported(tick), tick  # the full path ran
    # the rig's systemctl is /bin/false: the activation switches, then fails its restart and rolls back
    history = rig.cli("history").payload()["episodes"]
    assert history[0]["kind"] == "activate", history[0]
    boot = rig.cli("recover", "--trigger", "boot", env=IMPORT_TIME)
    assert boot.code == 0 and "agent.config.loader" not in imported(boot), boot  # boot keeps the quick path

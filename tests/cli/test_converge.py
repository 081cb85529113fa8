"""Convergence (docs/cli.md) without systemd: ``status`` / ``upgrade --preflight`` say how the host
converges, and ``recover --trigger timer`` acts only when the host lock is free.

Expected outcomes, written down:

- An open episode with the host lock held by a live process (this test process, through
  :class:`agent.host.lock.HostLock`): ``status`` shows ``episode.upgrader_pid`` = that pid, ``abandoned``
  false, ``next`` "wait: ...". Lock free: ``upgrader_pid`` null, ``abandoned`` true, ``next`` names
  ``recover-agent-upgrade``. ``upgrade --preflight`` reports the same ``episode``. Both write nothing.
- Unit files: the rig installs by hand only the agent unit, with other contents: ``missing_units`` lists
  the four others (the timer and its service among them), ``drifted_units`` the agent unit, and ``next``
  says "run upgrade-agent install to restore the units"; after writing the rendered files (``units
  --json``) both lists are empty and ``next`` is null.
- ``recover --trigger timer`` with the lock held and an episode open: exit 0 at once, stdout one line
  ``busy: a live upgrade holds the lock (pid N)`` (JSON: ``result`` noop, ``busy`` true), nothing written;
  ``--trigger manual`` in the same state still exits 75. Lock free: the timer's recovery aborts the
  abandoned pre-switch episode (``aborted``, exit 0) and leaves the links as they were.
"""

from __future__ import annotations

import os
import time

from agent.host.lock import HostLock

from ._journals import aborted_episode, committed_episode, write_journal
from ._rig import Rig, snapshot


def _open_episode(rig: Rig, op: str = "op-open") -> None:
    write_journal(rig.journal_dir, [("op-done", committed_episode("op-done", rig.name)),
                                      (op, aborted_episode(op)[:1])])


def _write_rendered_units(rig: Rig) -> None:
    for name, text in rig.cli("units").payload()["units"].items():
        (rig.unit_dir / name).write_text(text)


def test_status_names_the_live_upgrader_and_what_to_do(installed_rig: Rig) -> None:
    rig = installed_rig
    _open_episode(rig)
    _write_rendered_units(rig)
    with HostLock(str(rig.lock_path)):
        before = snapshot(rig.base)
        live = rig.cli("status")
        pre = rig.cli("upgrade", "--archive", str(rig.config), "--preflight")
        after = snapshot(rig.base)
    assert after == before
    out = live.payload()
    assert out["episode"] == {"operation": "op-open", "state": "opened", "upgrader_pid": os.getpid(),
                              "abandoned": False}, out
    assert out["next"] == f"wait: episode op-open is still running (pid {os.getpid()})"
    assert out["missing_units"] == [] and out["drifted_units"] == []
    assert pre.code == 75, pre
    assert pre.payload()["episode"] == out["episode"] and pre.payload()["lock"] == "busy"


def test_status_calls_an_episode_without_upgrader_abandoned(installed_rig: Rig) -> None:
    rig = installed_rig
    _open_episode(rig)
    _write_rendered_units(rig)
    before = snapshot(rig.base)
    out = rig.cli("status").payload()
    assert out["episode"] == {"operation": "op-open", "state": "opened", "upgrader_pid": None,
                              "abandoned": True}, out
    assert out["next"].startswith("run recover-agent-upgrade: episode op-open was abandoned"), out
    human = rig.cli("status", json_out=False)
    assert "episode: op-open (opened, abandoned (no upgrader holds the lock))" in human.stdout
    assert "next: run recover-agent-upgrade" in human.stdout
    assert "None" not in human.stdout and "True" not in human.stdout
    pre = rig.cli("upgrade", "--archive", str(rig.config), "--preflight").payload()
    assert pre["episode"] == out["episode"] and pre["next"] == out["next"]
    assert snapshot(rig.base) == before


def test_status_lists_missing_and_drifted_units(installed_rig: Rig) -> None:
    rig = installed_rig
    n = rig.name
    # A host installed by an older tool: only the agent unit, and not as this version renders it.
    for name in (f"{n}-recover.service", f"{n}-recover-boot.service", f"{n}-recover.timer",
                 f"{n}-recover-timer.service"):
        (rig.unit_dir / name).unlink()
    (rig.unit_dir / f"{n}.service").write_text("[Service]\nExecStart=/bin/true\n")
    out = rig.cli("status").payload()
    assert out["missing_units"] == [f"{n}-recover.service", f"{n}-recover-boot.service",
                                    f"{n}-recover.timer", f"{n}-recover-timer.service"], out
    assert out["drifted_units"] == [f"{n}.service"]
    assert out["next"].startswith("run upgrade-agent install to restore the units"), out
    assert f"{n}-recover.timer" in out["next"]
    pre = rig.cli("upgrade", "--archive", str(rig.config), "--preflight").payload()
    assert pre["missing_units"] == out["missing_units"] and pre["next"] == out["next"]
    _write_rendered_units(rig)
    out = rig.cli("status").payload()
    assert (out["missing_units"], out["drifted_units"], out["next"]) == ([], [], None)
    assert "next: nothing to do" in rig.cli("status", json_out=False).stdout


def test_status_on_a_bare_host_says_install(rig: Rig) -> None:
    out = rig.cli("status").payload()
    assert out["next"] == "run upgrade-agent install" and out["episode"] is None
    assert not rig.state_dir.exists() and not rig.lock_path.exists()


def test_timer_recovery_is_busy_at_once_while_the_lock_is_held(installed_rig: Rig) -> None:
    rig = installed_rig
    _open_episode(rig)
    with HostLock(str(rig.lock_path)):
        before = snapshot(rig.base)
        t0 = time.monotonic()
        human = rig.cli("recover", "--trigger", "timer", json_out=False)
        elapsed = time.monotonic() - t0
        js = rig.cli("recover", "--trigger", "timer")
        manual = rig.cli("recover", "--trigger", "manual")
        after = snapshot(rig.base)
    assert after == before
    assert human.code == 0, human
    assert human.stdout == f"busy: a live upgrade holds the lock (pid {os.getpid()})\n", human
    assert human.stderr == ""
    assert elapsed < 30  # generous bound for a loaded machine: it never waits on the lock
    out = js.payload()
    assert js.code == 0 and out["result"] == "noop" and out["busy"] is True and out["operation"] is None
    assert out["reason"] == f"busy: a live upgrade holds the lock (pid {os.getpid()})"
    manual.error_payload(75)


def test_timer_recovery_closes_an_abandoned_episode(installed_rig: Rig) -> None:
    rig = installed_rig
    _open_episode(rig)
    facts = rig.host_facts()
    run = rig.cli("recover", "--trigger", "timer")
    assert run.code == 0, run
    out = run.payload()
    assert out["operation"] == "op-open" and out["result"] == "aborted", out
    assert rig.host_facts() == facts
    dump = rig.cli("journal", "dump").payload()["records"]
    assert {"_type": "RecoveryStarted", "trigger": "timer"} in [r["event"] for r in dump]
    assert rig.cli("status").payload()["episode"] is None

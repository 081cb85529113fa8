"""SystemdServiceManager against the real private systemd, driven from the host (prefix + unit_dir)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import anyio
import pytest

from agent.host.clock import SystemClock
from agent.systemd.units import exec_line
from upgrade_core.errors import ServiceError

from .conftest import PYTHON, Rig, wait_for

pytestmark = [pytest.mark.systemd, pytest.mark.anyio]

WORKTREE = str(Path(__file__).resolve().parents[2])


async def install(rig: Rig, max_attempts: int = 3, exec_args: tuple[str, ...] = ()) -> None:
    """Render, write, daemon-reload and enable the units (what ``install`` does; the timer is not started
    here: these tests drive the units one by one)."""
    units = rig.units(max_attempts=max_attempts, exec_args=exec_args)
    written = await rig.manager.write_units(units)
    assert len(written) == len(units) == 5
    await rig.manager.daemon_reload()
    await rig.manager.enable(rig.unit, f"{rig.name}-recover-boot.service")


async def poll(rig: Rig, predicate, timeout_s: float = 8.0, what: str = "snapshot condition"):  # type: ignore[no-untyped-def]
    """Snapshot every 50 ms until ``predicate(snapshot)``; returns that snapshot."""
    with anyio.move_on_after(timeout_s):
        while True:
            snap = await rig.manager.snapshot()
            if predicate(snap):
                return snap
            await anyio.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}; last: {snap}")


async def test_script_agent_runs_and_restarts_through_a_transient_unit(rig: Rig) -> None:
    # The daemon's stop waits for a file the test creates, so the transient unit is held active while its
    # restart job runs: observing it does not depend on catching a timing window.
    release = rig.root / "release-stop"
    rig.blue.write_text(
        f"#!/bin/sh\ntrap 'while [ ! -e {release} ]; do sleep 0.05; done; exit 0' TERM\n"
        "while :; do sleep 0.1; done\n"
    )
    await install(rig)
    assert await rig.manager.is_enabled(rig.unit)
    assert (rig.sandbox.unit_dir / "multi-user.target.wants" / rig.unit).is_symlink()
    assert await rig.manager.start() == "active"

    first = await poll(rig, lambda s: s.cmdline != (), what="the process's argv")  # see render_agent_unit
    assert (first.active_state, first.sub_state, first.result) == ("active", "running", "success")
    assert first.main_pid > 0 and len(first.invocation_id) == 32
    assert first.exe == os.path.realpath("/bin/sh")  # an interpreted agent's exe is its interpreter
    assert first.cmdline == ("/bin/sh", str(rig.current))  # ... and its cmdline names the current link
    assert first.n_restarts == 0 and first.main_start_monotonic_s > 0

    transient = f"{rig.name}-restart-0123abcd-1-ab12"
    requested = SystemClock().monotonic()
    await rig.manager.restart(transient)
    wait_for(lambda: rig.show(f"{transient}.service", "ActiveState")["ActiveState"] == "active",
             what="the transient restart unit to be running")
    # The transient unit is active as soon as its systemctl runs; the agent unit enters "deactivating" when
    # the restart job reaches it, and stays there until the test lets the old process stop.
    wait_for(lambda: rig.show(rig.unit, "ActiveState")["ActiveState"] == "deactivating",
             what="the restart job to be stopping the old process")
    assert not await rig.manager.restart_done(transient)  # the job is between the old process and the new
    release.touch()  # let the old process stop; the restart job completes
    after = await poll(rig, lambda s: s.invocation_id not in ("", first.invocation_id)
                       and s.sub_state == "running", what="a new invocation")
    assert after.main_pid not in (0, first.main_pid)
    assert after.main_start_monotonic_s > first.main_start_monotonic_s
    # systemd's ...Monotonic and our Clock share CLOCK_MONOTONIC: "started after the restart request"
    assert requested < after.main_start_monotonic_s < SystemClock().monotonic()
    assert after.n_restarts == 0  # a requested restart is not an automatic one
    # --collect: the transient unit is gone once its systemctl returned, so the name can be reused
    wait_for(lambda: rig.show(f"{transient}.service", "LoadState")["LoadState"] == "not-found",
             what="the transient unit to be collected")
    assert await rig.manager.restart_done(transient)
    await rig.manager.restart(transient)
    await poll(rig, lambda s: s.invocation_id not in ("", after.invocation_id) and s.sub_state == "running",
               what="a second restart under the reused name")


async def test_elf_agent_exe_is_the_slot_file(rig: Rig) -> None:
    rig.blue.unlink()
    shutil.copy2("/bin/sleep", rig.blue)
    await install(rig, exec_args=("3600",))
    assert await rig.manager.start() == "active"
    snap = await poll(rig, lambda s: s.cmdline != (), what="the process's argv")
    assert snap.exe == str(rig.blue)  # the kernel resolved the current link to the slot
    assert snap.cmdline == (str(rig.current), "3600")


async def test_a_slot_that_cannot_be_executed_never_reads_as_active(rig: Rig) -> None:
    rig.blue.chmod(0o644)  # Type=exec: the start job itself fails (203/EXEC), nothing "started"
    await install(rig)
    assert await rig.manager.start() in ("failed", "activating")
    snap = await rig.manager.snapshot()
    assert snap.active_state != "active" and snap.main_pid == 0 and snap.result == "exit-code"
    assert rig.show(rig.unit, "ExecMainStatus")["ExecMainStatus"] == "203"


async def test_restart_on_failure_counts_n_restarts(rig: Rig) -> None:
    await install(rig)
    await rig.manager.start()
    first = await rig.manager.snapshot()
    rig.sandbox.run("systemctl", "kill", "--signal=KILL", rig.unit)
    snap = await poll(rig, lambda s: s.main_pid not in (0, first.main_pid) and s.sub_state == "running",
                      what="Restart=on-failure to start a new process")
    assert snap.n_restarts == 1
    assert snap.invocation_id != first.invocation_id
    # ExecMainCode/ExecMainStatus describe the current main process again once the new one runs
    assert (snap.exec_main_code, snap.exec_main_status) == (0, 0), snap


async def test_exit_1_after_300ms_reaches_auto_restart(rig: Rig) -> None:
    # case C16a: the candidate passes its version check, then exits 1 after 0.3 s
    rig.blue.write_text("#!/bin/sh\nsleep 0.3\nexit 1\n")
    await install(rig)
    # "systemctl start returning 0 proves nothing": the start job succeeds, the process dies 0.3 s later
    assert await rig.manager.start() in ("active", "activating")
    snap = await poll(rig, lambda s: s.sub_state == "auto-restart", what="auto-restart")
    assert snap.active_state == "activating" and snap.result == "exit-code" and snap.main_pid == 0
    assert snap.exe is None and snap.cmdline == ()
    # how it ended, from the unit's own properties: CLD_EXITED (1) with status 1; and what ExecStart runs
    assert (snap.exec_main_code, snap.exec_main_status) == (1, 1), snap
    assert snap.exec_start == str(rig.current), snap


async def test_crash_loop_hits_the_start_limit_and_on_failure_runs_recovery(rig: Rig) -> None:
    # case C16c. systemd 252 keeps Result=exit-code here ("Start request repeated too quickly" only sets
    # start-limit-hit when the previous result was success), so the limit shows as: failed, NRestarts equal
    # to the burst, and further starts refused until reset-failed.
    rig.blue.write_text("#!/bin/sh\nexit 1\n")
    await install(rig, max_attempts=1)
    assert rig.show(rig.unit, "StartLimitBurst")["StartLimitBurst"] == "3"  # max_attempts + 2
    # the start job ends once the first process died; start() does not wait out the crash loop
    assert await rig.manager.start() in ("active", "activating")
    snap = await poll(rig, lambda s: s.active_state == "failed", timeout_s=9.0, what="the start limit")
    assert (snap.sub_state, snap.result, snap.n_restarts) == ("failed", "exit-code", 3)
    wait_for(lambda: _line_written(rig.recover_log), what="OnFailure= to run the recovery unit")
    assert rig.recover_log.read_text() == f"--config {rig.config} --trigger on-failure\n"

    assert await rig.manager.start() == "failed"  # refused: the limit holds
    refused = await rig.manager.snapshot()
    # no new process ran (same invocation, same restart count); Result still says exit-code on 252
    assert (refused.invocation_id, refused.n_restarts, refused.main_pid) == (snap.invocation_id, 3, 0)
    await rig.manager.reset_failed()  # also resets the start-limit counter
    assert (await rig.manager.snapshot()).active_state == "inactive"
    rig.blue.write_text("#!/bin/sh\nexec sleep 30\n")
    assert await rig.manager.start() == "active"


async def test_runs_inside_unit_true_only_inside_the_unit(rig: Rig, tmp_path: Path) -> None:
    answer = tmp_path / "inside"
    code = (
        "import sys\n"
        "from agent.systemd.manager import SystemdServiceManager\n"
        f"m = SystemdServiceManager({rig.unit!r}, unit_dir='/etc/systemd/system', recover_exe='/bin/true',"
        " config_path='/etc/x.toml')\n"
        f"open({str(answer)!r} + '.tmp', 'w').write(str(m.runs_inside_unit()))\n"
        f"import os; os.rename({str(answer)!r} + '.tmp', {str(answer)!r})\n"
        "import time; time.sleep(3600)\n"
    )
    (rig.sandbox.unit_dir / rig.unit).write_text(
        f"[Service]\nEnvironment=PYTHONPATH={WORKTREE}\nExecStart={exec_line(PYTHON, ['-c', code])}\n"
    )
    await rig.manager.daemon_reload()
    await rig.manager.start()
    wait_for(answer.exists, what="the unit's answer")
    assert answer.read_text() == "True"
    assert rig.manager.runs_inside_unit() is False  # this test process is outside (on the host)


async def test_hand_off_recovery_runs_the_command_after_the_unit(rig: Rig) -> None:
    await install(rig)
    transient = f"{rig.name}-handoff-1"
    # the stub sleeps 1.5 s after writing, so the transient unit can be inspected while it runs
    rig.recover_exe.write_text(rig.recover_exe.read_text().replace("${STUB_SLEEP:-0}", "1.5"))
    await rig.manager.hand_off_recovery(transient, after_unit=True)
    wait_for(lambda: _line_written(rig.recover_log), what="the recovery command to run")
    assert rig.recover_log.read_text() == f"--config {rig.config} --trigger manual\n"
    props = rig.show(f"{transient}.service", "After", "ActiveState")
    assert props["ActiveState"] == "active"
    assert rig.unit in props["After"].split()
    wait_for(lambda: rig.show(f"{transient}.service", "LoadState")["LoadState"] == "not-found",
             what="the hand-off unit to be collected")


async def test_boot_recovery_unit_is_ordered_before_the_agent(rig: Rig) -> None:
    await install(rig)
    boot = f"{rig.name}-recover-boot.service"
    assert rig.unit in rig.show(boot, "Before")["Before"].split()
    assert await rig.manager.is_enabled(boot)
    assert not await rig.manager.is_enabled(f"{rig.name}-recover.service")  # started by OnFailure= only
    assert rig.show(rig.unit, "OnFailure")["OnFailure"] == f"{rig.name}-recover.service"


async def test_stop_disable_remove_leave_no_unit(rig: Rig) -> None:
    await install(rig)
    await rig.manager.start()
    assert await rig.manager.stop() == "inactive"
    units = list(rig.units())
    await rig.manager.disable(*units)
    assert not await rig.manager.is_enabled(rig.unit)
    removed = await rig.manager.remove_units(units)
    assert sorted(Path(p).name for p in removed) == sorted(units)
    assert not any(p.name in units for p in rig.sandbox.unit_dir.rglob("*"))
    await rig.manager.daemon_reload()
    assert rig.show(rig.unit, "LoadState")["LoadState"] == "not-found"
    # idempotent: a second reset of the same units has nothing to do
    assert await rig.manager.remove_units(units) == []
    await rig.manager.disable(*units)
    assert await rig.manager.stop() == "inactive"
    await rig.manager.reset_failed()


async def test_write_units_is_idempotent(rig: Rig) -> None:
    units = rig.units()
    assert len(await rig.manager.write_units(units)) == len(units) == 5
    assert await rig.manager.write_units(units) == []
    assert not [p for p in rig.sandbox.unit_dir.iterdir() if ".tmp-" in p.name]
    for name, text in units.items():
        assert (rig.sandbox.unit_dir / name).read_text() == text


async def test_start_of_a_missing_unit_names_the_command(rig: Rig) -> None:
    with pytest.raises(ServiceError, match=rf"systemctl start --no-block {rig.unit}` exited 5"):
        await rig.manager.start()


async def test_restart_with_a_transient_name_in_use_is_refused(rig: Rig, tmp_path: Path) -> None:
    await install(rig)
    await rig.manager.start()
    busy = f"{rig.name}-busy"
    rig.sandbox.run("systemd-run", f"--unit={busy}", "--collect", "--quiet", "sleep", "30")
    try:
        with pytest.raises(ServiceError, match="systemd-run"):
            await rig.manager.restart(busy)
    finally:
        rig.sandbox.run("systemctl", "stop", f"{busy}.service")


def _line_written(path: Path) -> bool:
    try:
        return path.read_text().endswith("\n")
    except FileNotFoundError:
        return False

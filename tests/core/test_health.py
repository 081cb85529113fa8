"""HealthJudge (design §4.3 step 7; C16 exits and crash loops, C19 wall-clock jumps)."""

from __future__ import annotations

import attrs
import pytest

from upgrade_core import Expectation, Failed, HealthJudge, Passed, Pending
from upgrade_core.ports import UnitSnapshot

SLOT = "/R/lib/agent/agent-green"
LINK = "/R/lib/agent/agent-current"
T0 = 500.0
EXPECT = Expectation(SLOT, LINK, T0, baseline_pid=10, baseline_invocation="a" * 32, stability_s=1.0,
                     timeout_s=5.0)
GOOD = UnitSnapshot("active", "running", "success", 20, "b" * 32, 0, T0 + 0.1, SLOT, (SLOT,))
OLD = attrs.evolve(GOOD, main_pid=10, invocation_id="a" * 32, exe="/R/lib/agent/agent-blue")


def run(samples: list[tuple[float, UnitSnapshot, str | None]], expect: Expectation = EXPECT) -> object:
    judge = HealthJudge(expect, T0)
    verdict: object = Pending()
    for now, snap, probe in samples:
        verdict = judge.observe(snap, probe, now)
    return verdict


def steady(snap: UnitSnapshot, start: float, end: float, probe: str | None = None) -> list[
    tuple[float, UnitSnapshot, str | None]
]:
    n = round((end - start) / 0.25)
    return [(start + 0.25 * i, snap, probe) for i in range(n + 1)]


def test_passes_after_the_stability_window() -> None:
    judge = HealthJudge(EXPECT, T0)
    assert isinstance(judge.observe(GOOD, None, T0 + 0.25), Pending)
    assert isinstance(judge.observe(GOOD, None, T0 + 1.0), Pending)
    assert judge.observe(GOOD, None, T0 + 1.25) == Passed()
    assert judge.observed == (20, "b" * 32)
    # The verdict sticks.
    assert judge.observe(attrs.evolve(GOOD, active_state="failed"), None, T0 + 2) == Passed()


def test_old_process_still_running_is_not_a_pass() -> None:
    verdict = run(steady(OLD, T0, T0 + 5.0))
    assert isinstance(verdict, Failed)
    assert "within 5 s" in verdict.reason and "restart not observed" in verdict.reason


@pytest.mark.parametrize(
    ("later", "reason"),
    [
        (attrs.evolve(GOOD, main_pid=21, invocation_id="c" * 32), "MainPID changed from 20 to 21"),
        (attrs.evolve(GOOD, invocation_id="c" * 32), "InvocationID changed"),
        (attrs.evolve(GOOD, n_restarts=1), "NRestarts rose from 0 to 1"),
        (attrs.evolve(GOOD, active_state="failed", sub_state="failed", result="exit-code"), "unit failed"),
        (attrs.evolve(GOOD, active_state="inactive", sub_state="dead"), "unit inactive"),
        (attrs.evolve(GOOD, result="start-limit-hit", active_state="failed"), "start-limit-hit"),
        (attrs.evolve(GOOD, main_pid=0, invocation_id="", active_state="activating",
                      sub_state="auto-restart"),
         "MainPID changed from 20 to 0"),
    ],
)
def test_fails_at_once(later: UnitSnapshot, reason: str) -> None:
    judge = HealthJudge(EXPECT, T0)
    assert isinstance(judge.observe(GOOD, None, T0 + 0.25), Pending)
    verdict = judge.observe(later, None, T0 + 0.5)
    assert isinstance(verdict, Failed) and reason in verdict.reason


def test_exe_mismatch_fails_at_once() -> None:
    snap = attrs.evolve(GOOD, exe="/R/lib/agent/agent-blue", cmdline=("/R/lib/agent/agent-blue",))
    verdict = HealthJudge(EXPECT, T0).observe(snap, None, T0 + 0.25)
    assert verdict == Failed(f"exe mismatch: main process runs /R/lib/agent/agent-blue, expected {SLOT}")


def test_interpreted_agent_passes_by_start_time_and_cmdline() -> None:
    snap = attrs.evolve(GOOD, exe="/usr/bin/python3.11", cmdline=("/usr/bin/python3.11", LINK, "serve"))
    assert run(steady(snap, T0 + 0.25, T0 + 1.5)) == Passed()


def test_interpreted_agent_started_before_the_restart_is_a_mismatch() -> None:
    snap = attrs.evolve(GOOD, exe="/usr/bin/python3.11", cmdline=("/usr/bin/python3.11", LINK),
                        main_start_monotonic_s=T0 - 1)
    verdict = run(steady(snap, T0 + 0.25, T0 + 1.5))
    assert isinstance(verdict, Failed) and "exe mismatch" in verdict.reason


def test_failing_probe_restarts_the_window() -> None:
    judge = HealthJudge(EXPECT, T0)
    for t in (0.25, 0.5, 0.75):
        assert isinstance(judge.observe(GOOD, None, T0 + t), Pending)
    assert judge.observe(GOOD, "HTTP 503", T0 + 1.0) == Pending("probe: HTTP 503")
    # Without the probe failure this sample would have passed (window from 0.25); now it restarts at 1.25.
    for t in (1.25, 1.5, 1.75, 2.0):
        assert isinstance(judge.observe(GOOD, None, T0 + t), Pending)
    assert judge.observe(GOOD, None, T0 + 2.25) == Passed()


def test_probe_failing_throughout_times_out() -> None:
    verdict = run(steady(GOOD, T0 + 0.25, T0 + 5.0, probe="connection refused"))
    assert verdict == Failed("not healthy for 1 s within 5 s: probe: connection refused")


def test_without_baseline_a_process_older_than_the_restart_is_not_new() -> None:
    expect = attrs.evolve(EXPECT, baseline_pid=None, baseline_invocation=None)
    old = attrs.evolve(GOOD, main_start_monotonic_s=T0 - 10)
    assert isinstance(run(steady(old, T0 + 0.25, T0 + 2.0), expect), Pending)
    assert run(steady(GOOD, T0 + 0.25, T0 + 2.0), expect) == Passed()


def test_only_the_monotonic_clock_counts() -> None:
    """C19: the judge never sees wall time; the samples' monotonic times alone make the window."""
    assert run([(T0 + 0.25, GOOD, None), (T0 + 1.2, GOOD, None)]) == Pending("")
    assert run([(T0 + 0.25, GOOD, None), (T0 + 1.25, GOOD, None)]) == Passed()


def test_inactive_before_the_restart_job_runs_is_not_a_failure() -> None:
    """An install: the unit never ran, the --no-block restart has not started yet; wait for it."""
    expect = attrs.evolve(EXPECT, baseline_pid=0, baseline_invocation="")
    never_ran = UnitSnapshot("inactive", "dead", "success", 0, "", 0, 0.0, None, ())
    judge = HealthJudge(expect, T0)
    assert judge.observe(never_ran, None, T0 + 0.25) == Pending("restart not begun yet")
    for t in (0.5, 0.75, 1.0, 1.25):
        assert isinstance(judge.observe(GOOD, None, T0 + t), Pending)
    assert judge.observe(GOOD, None, T0 + 1.5) == Passed()
    # A process that started after the request and is now dead fails at once, as before.
    dead = attrs.evolve(never_ran, main_start_monotonic_s=T0 + 0.1)
    verdict = HealthJudge(expect, T0).observe(dead, None, T0 + 0.25)
    assert isinstance(verdict, Failed) and "unit inactive" in verdict.reason
    # Never started at all: the attempt still ends, at its timeout.
    late = run(steady(never_ran, T0 + 0.25, T0 + 5.0), expect)
    assert late == Failed("not healthy for 1 s within 5 s: restart not begun yet")


def test_with_no_main_process_before_the_restart_an_older_process_is_not_ours() -> None:
    """MainPID 0 at baseline: a process started before our request (an earlier attempt's restart) waits."""
    expect = attrs.evolve(EXPECT, baseline_pid=0, baseline_invocation="")
    earlier = attrs.evolve(GOOD, main_start_monotonic_s=T0 - 0.5)
    assert run(steady(earlier, T0 + 0.25, T0 + 2.0), expect) == Pending("main process predates the restart")


def test_samples_come_sooner_while_waiting_and_when_the_window_ends() -> None:
    """Before the window the gaps grow by a quarter from 0.02 s up to the poll interval; inside it the
    next sample comes no later than the window's end (never sooner than 0.01 s); the window keeps its
    length."""
    judge = HealthJudge(EXPECT, T0)
    assert judge.next_sample_in(T0, 0.25) == pytest.approx(0.02)
    gaps = []
    for i in range(14):
        judge.observe(OLD, None, T0 + 0.01 * i)  # the old process: restart not observed yet
        gaps.append(judge.next_sample_in(T0, 0.25))
    assert gaps == pytest.approx([0.02 * 1.25**n for n in range(1, 12)] + [0.25, 0.25, 0.25])
    assert isinstance(judge.observe(GOOD, None, T0 + 0.3), Pending)  # the window starts at T0 + 0.3
    assert judge.next_sample_in(T0 + 0.3, 0.25) == 0.25
    assert judge.next_sample_in(T0 + 1.2, 0.25) == pytest.approx(0.1)
    assert judge.next_sample_in(T0 + 1.3, 0.25) == 0.01
    assert isinstance(judge.observe(GOOD, None, T0 + 1.29), Pending)  # 0.99 s held: not yet
    assert judge.observe(GOOD, None, T0 + 1.3) == Passed()


def test_a_window_broken_by_the_probe_waits_with_short_gaps_again() -> None:
    judge = HealthJudge(EXPECT, T0)
    judge.observe(GOOD, None, T0 + 0.2)
    judge.observe(GOOD, "HTTP 503", T0 + 0.4)
    assert judge.window_start is None and judge.next_sample_in(T0 + 0.4, 0.25) == pytest.approx(0.025)


@pytest.mark.parametrize(
    ("code", "status", "said"),
    [(1, 1, "the service exited with status 1"), (2, 9, "the service killed by SIGKILL"),
     (3, 11, "the service dumped core on SIGSEGV")],
)
def test_a_main_process_that_ended_is_named_by_how_systemd_saw_it_end(
    code: int, status: int, said: str
) -> None:
    """``ExecMainCode``/``ExecMainStatus`` (systemd.exec(5)) turn "MainPID changed from 20 to 0" into a
    reason that says what the process did."""
    judge = HealthJudge(EXPECT, T0)
    assert isinstance(judge.observe(GOOD, None, T0 + 0.25), Pending)
    gone = attrs.evolve(GOOD, main_pid=0, invocation_id="", active_state="activating",
                        sub_state="auto-restart", exec_main_code=code, exec_main_status=status)
    assert judge.observe(gone, None, T0 + 0.5) == Failed(f"MainPID changed from 20 to 0: {said}")


def test_a_unit_that_failed_says_its_exit_status() -> None:
    judge = HealthJudge(EXPECT, T0)
    assert isinstance(judge.observe(GOOD, None, T0 + 0.25), Pending)
    failed = attrs.evolve(GOOD, active_state="failed", sub_state="failed", result="exit-code",
                          exec_main_code=1, exec_main_status=3)
    assert judge.observe(failed, None, T0 + 0.5) == Failed(
        "unit failed (failed, result exit-code): the service exited with status 3")


def test_an_interpreter_whose_command_line_reads_empty_is_waited_for_not_called_a_mismatch() -> None:
    """The exe and the command line are two reads: a candidate that exits between them shows the interpreter
    and an empty command line (proc(5): a zombie's). Found by tests/systemd/test_human_output.py once samples
    came closer together: the rollback's reason read "exe mismatch" instead of the exit systemd saw."""
    judge = HealthJudge(EXPECT, T0)
    exiting = attrs.evolve(GOOD, exe="/usr/bin/python3.11", cmdline=())
    assert judge.observe(exiting, None, T0 + 0.3) == Pending("main process command line unreadable (exiting)")
    gone = attrs.evolve(GOOD, active_state="activating", sub_state="auto-restart", main_pid=0, exe=None,
                        exec_main_code=1, exec_main_status=1)
    verdict = judge.observe(gone, None, T0 + 0.35)
    assert verdict == Failed("MainPID changed from 20 to 0: the service exited with status 1")
    # and a process that keeps its command line empty never passes: the attempt ends at its timeout
    verdict = run(steady(exiting, T0 + 0.25, T0 + 5.0))
    assert isinstance(verdict, Failed)
    assert "within 5 s: main process command line unreadable" in verdict.reason


def test_exe_mismatch_names_what_execstart_runs_not_the_interpreter() -> None:
    """A drop-in that pins ``ExecStart`` elsewhere: the reason names the script the unit runs."""
    snap = attrs.evolve(GOOD, exe="/usr/bin/python3.11", cmdline=("/usr/bin/python3.11", "/opt/other/agent"),
                        exec_start="/opt/other/agent")
    verdict = HealthJudge(EXPECT, T0).observe(snap, None, T0 + 0.25)
    assert verdict == Failed("exe mismatch: main process runs /usr/bin/python3.11 (its ExecStart runs "
                             f"/opt/other/agent), expected {SLOT}")

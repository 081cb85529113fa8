"""HealthJudge at its edges (design §4.3 step 7): the exact verdicts and reasons, and the boundaries of time.

``tests/core/test_health.py`` covers each rule; these pin what a mutation run showed no test deciding: the
reason each wait reports (it ends up in ``HealthFailed`` at the timeout), a process that started at the very
instant of the restart request, a unit that never leaves ``activating``, the ``environment`` flag, and the
identity rules for a MainPID or an InvocationID seen alone.
"""

from __future__ import annotations

import math

import attrs
import pytest

from upgrade_core import Failed, HealthJudge, Passed, Pending
from upgrade_core._health import FIRST_GAP_S, GAP_GROWTH, backoff_gap
from upgrade_core.ports import ProbeUnreachable, UnitSnapshot

from .test_health import EXPECT, GOOD, LINK, OLD, SLOT, T0, run, steady

NO_BASELINE = attrs.evolve(EXPECT, baseline_pid=0, baseline_invocation="")
TIMEOUT = "not healthy for 1 s within 5 s"


def test_a_judge_that_saw_no_sample_has_no_verdict_yet() -> None:
    judge = HealthJudge(EXPECT, T0)
    assert judge.verdict == Pending("no sample yet")
    assert judge.observed is None and judge.window_start is None


def test_the_backoff_grows_by_a_quarter_sixteen_times_then_stays() -> None:
    gaps = [backoff_gap(n) for n in range(20)]
    assert gaps[:17] == pytest.approx([FIRST_GAP_S * GAP_GROWTH**n for n in range(17)])
    assert gaps[17:] == [gaps[16]] * 3
    assert gaps[16] > 0.25  # past the default poll interval, which caps it (design §4.3 step 7)
    assert math.isfinite(backoff_gap(100_000))  # a very long wait never overflows the float


def test_a_backoff_gap_is_at_most_about_a_quarter_of_the_time_already_waited() -> None:
    """What a wait looks for is seen at most ~25 % (plus the first gap) after it happened."""
    waited = 0.0
    for n in range(16):
        gap = backoff_gap(n)
        assert gap <= 0.25 * waited + FIRST_GAP_S + 1e-12
        waited += gap


@pytest.mark.parametrize("state", ["failed", "inactive"])
def test_start_limit_hit_fails_at_once_with_its_own_reason(state: str) -> None:
    """Even before any new process was seen (an install whose unit never started): no waiting for it."""
    snap = UnitSnapshot(state, "dead", "start-limit-hit", 0, "", 0, 0.0, None, ())
    assert HealthJudge(NO_BASELINE, T0).observe(snap, None, T0 + 0.25) == Failed("start-limit-hit")


def test_a_unit_still_activating_never_passes_and_says_so_at_the_timeout() -> None:
    """The new process runs the right binary, but ``activating`` is not ``active/running``: no window."""
    starting = attrs.evolve(GOOD, active_state="activating", sub_state="start-post")
    judge = HealthJudge(EXPECT, T0)
    for now, snap, probe in steady(starting, T0 + 0.25, T0 + 4.75):
        assert judge.observe(snap, probe, now) == Pending("unit activating/start-post")
        assert judge.window_start is None
    assert judge.observe(starting, None, T0 + 5.0) == Failed(f"{TIMEOUT}: unit activating/start-post")


def test_only_an_unreachable_probe_is_an_environment_failure() -> None:
    assert run(steady(OLD, T0, T0 + 5.0)) == Failed(f"{TIMEOUT}: restart not observed yet", False)
    refused = run(steady(GOOD, T0 + 0.25, T0 + 5.0, probe="HTTP 503"))
    assert refused == Failed(f"{TIMEOUT}: probe: HTTP 503", False)
    unreachable = ProbeUnreachable("connection refused")
    samples: list[tuple[float, UnitSnapshot, str | None]] = [
        (now, snap, unreachable) for now, snap, _ in steady(GOOD, T0 + 0.25, T0 + 5.0)]
    assert run(samples) == Failed(f"{TIMEOUT}: probe: connection refused", True)


def test_a_window_cut_by_the_timeout_fails_without_a_detail() -> None:
    """Healthy from 4.5 s on: the window (1 s) cannot complete within the 5 s timeout."""
    judge = HealthJudge(EXPECT, T0)
    assert judge.observe(OLD, None, T0 + 0.25) == Pending("restart not observed yet")
    assert judge.observe(GOOD, None, T0 + 4.5) == Pending("")
    assert judge.observe(GOOD, None, T0 + 5.0) == Failed(TIMEOUT)


@pytest.mark.parametrize(
    ("snap", "why"),
    [
        (attrs.evolve(GOOD, main_pid=0, invocation_id="", exe=None, cmdline=()), "no main process yet"),
        # the unit's invocation exists (ExecStartPre runs) but its main process does not yet
        (attrs.evolve(GOOD, main_pid=0, exe=None, cmdline=()), "no main process yet"),
        (attrs.evolve(GOOD, invocation_id=""), "no main process yet"),
        (attrs.evolve(GOOD, exe=None), "exe unreadable"),
        (OLD, "restart not observed yet"),
        # the same invocation with another MainPID: the process re-executed itself, the unit did not restart
        (attrs.evolve(GOOD, invocation_id=EXPECT.baseline_invocation), "restart not observed yet"),
    ],
)
def test_each_wait_names_what_is_missing_and_a_later_good_sample_still_passes(
    snap: UnitSnapshot, why: str
) -> None:
    judge = HealthJudge(EXPECT, T0)
    assert judge.observe(snap, None, T0 + 0.25) == Pending(why)
    for now, good, probe in steady(GOOD, T0 + 0.5, T0 + 1.5):
        verdict = judge.observe(good, probe, now)
    assert verdict == Passed() and judge.observed == (GOOD.main_pid, GOOD.invocation_id)


def test_a_new_invocation_id_changing_after_it_was_seen_fails_with_its_reason() -> None:
    judge = HealthJudge(EXPECT, T0)
    judge.observe(GOOD, None, T0 + 0.25)
    assert judge.observe(attrs.evolve(GOOD, invocation_id="c" * 32), None, T0 + 0.5) == Failed(
        "InvocationID changed")


def test_a_process_started_at_the_instant_of_the_restart_request_is_ours() -> None:
    """Started at exactly ``restart_requested_monotonic``: not older than the request, by every rule."""
    at_request = attrs.evolve(GOOD, main_start_monotonic_s=T0)
    # without a baseline, identity is decided by the start time
    assert run(steady(at_request, T0 + 0.25, T0 + 1.25), NO_BASELINE) == Passed()
    # an interpreted agent (exe is the interpreter) is judged by its start time and command line
    interpreted = attrs.evolve(at_request, exe="/usr/bin/python3.11", cmdline=("/usr/bin/python3.11", LINK))
    assert run(steady(interpreted, T0 + 0.25, T0 + 1.25)) == Passed()
    # inactive, and started at the request: the restart did run and the process is gone already
    gone = UnitSnapshot("inactive", "dead", "exit-code", 0, "", 0, T0, None, ())
    assert HealthJudge(NO_BASELINE, T0).observe(gone, None, T0 + 0.25) == Failed(
        "unit inactive (dead, result exit-code)")
    # a moment earlier it is still the state from before the request: wait for the restart job
    before = attrs.evolve(gone, main_start_monotonic_s=T0 - 0.001)
    assert HealthJudge(NO_BASELINE, T0).observe(before, None, T0 + 0.25) == Pending("restart not begun yet")


def test_the_slot_itself_as_exe_needs_no_command_line() -> None:
    assert GOOD.exe == SLOT
    assert run(steady(attrs.evolve(GOOD, cmdline=()), T0 + 0.25, T0 + 1.25)) == Passed()

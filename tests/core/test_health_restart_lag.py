"""HealthJudge and the lag of a ``--no-block`` restart (found by tests/systemd/test_cli_scenarios.py).

The restart is requested through a transient unit started with ``systemd-run --no-block``; the first
samples may still show the unit as it was before the restart job ran. On ``install`` that is
``inactive/dead`` (the unit never ran, no process started since the request): this must not fail the
attempt, or a good first install is aborted and the second attempt's restart races the first one's. The
wait is bounded by the attempt's own timeout.
"""

from __future__ import annotations

import attrs

from upgrade_core import Expectation, Failed, HealthJudge, Passed, Pending
from upgrade_core.ports import UnitSnapshot

SLOT = "/R/lib/agent/agent-blue"
LINK = "/R/lib/agent/agent-current"
T0 = 100.0
NEVER_RAN = UnitSnapshot("inactive", "dead", "success", 0, "", 0, 0.0, None, ())
EXPECT = Expectation(SLOT, LINK, T0, baseline_pid=0, baseline_invocation="", stability_s=1.0, timeout_s=5.0)
GOOD = UnitSnapshot("active", "running", "success", 20, "b" * 32, 0, T0 + 0.1, SLOT, (SLOT,))


def test_inactive_before_the_restart_took_effect_waits_then_passes() -> None:
    judge = HealthJudge(EXPECT, T0)
    verdict = judge.observe(NEVER_RAN, "connection refused", T0 + 0.01)
    assert isinstance(verdict, Pending) and "not begun" in verdict.why
    assert isinstance(judge.observe(GOOD, None, T0 + 0.25), Pending)
    assert judge.observe(GOOD, None, T0 + 1.25) == Passed()


def test_a_restart_that_never_begins_fails_at_the_attempt_timeout() -> None:
    judge = HealthJudge(EXPECT, T0)
    assert isinstance(judge.observe(NEVER_RAN, None, T0 + EXPECT.timeout_s - 0.01), Pending)
    verdict = judge.observe(NEVER_RAN, None, T0 + EXPECT.timeout_s)
    assert isinstance(verdict, Failed) and "restart not begun" in verdict.reason


def test_inactive_after_the_new_process_was_seen_fails_at_once() -> None:
    judge = HealthJudge(EXPECT, T0)
    assert isinstance(judge.observe(GOOD, None, T0 + 0.25), Pending)
    verdict = judge.observe(attrs.evolve(NEVER_RAN), None, T0 + 0.5)
    assert isinstance(verdict, Failed) and "unit inactive" in verdict.reason


def test_failed_before_the_new_process_was_seen_still_fails_at_once() -> None:
    failed = attrs.evolve(NEVER_RAN, active_state="failed", sub_state="failed", result="exit-code")
    verdict = HealthJudge(EXPECT, T0).observe(failed, None, T0 + 0.25)
    assert isinstance(verdict, Failed) and "unit failed" in verdict.reason

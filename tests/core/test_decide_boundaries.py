"""The recovery decision (design §4.5) at the boundaries the golden rows do not reach.

``test_decide.py`` has one row per case of the table, mostly with three attempts and at most one begun. What
recovery does with an active candidate depends on what already happened in the episode, not only on its state:
how many attempts the recorded policy allows, how many were begun, whether the last one was judged, and which
slot the switch recorded as ``last-good``. Hypothesis draws such histories (any policy from 1 to 5 attempts,
any number begun, each failed or cut inside) and checks the plan against the rule written out here.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from upgrade_core import (
    Abort,
    EpisodeState,
    FinishRollback,
    HostFacts,
    Plan,
    ResumeHealth,
    Rollback,
    decide,
    fold,
)
from upgrade_core import _events as ev
from upgrade_core._events import Event
from upgrade_core.ports import LinkState

from .journals import CAND_SHA, OPENED, PRE_SWITCH, attempt, records

ON_GREEN = HostFacts(LinkState("green", "blue"), CAND_SHA)
ON_BLUE = HostFacts(LinkState("blue", "blue"))

# Each begun attempt ends failed with a reason, or (only the latest one) was cut inside by a crash.
outcomes = st.lists(st.sampled_from(["MainPID changed", "unit failed", "probe: HTTP 503"]), max_size=5)


def upgrade(max_attempts: int, *, last_good: str | None = "blue") -> list[Event]:
    """An upgrade blue -> green with ``max_attempts`` recorded at opening, switched and landed."""
    opened = attrs.evolve(OPENED, max_health_attempts=max_attempts)
    switch = [ev.SwitchIntended("green", "blue", last_good), ev.SwitchCommitted("green")]
    return [opened, *PRE_SWITCH[1:], *switch]


def install(max_attempts: int, *, last_good: str | None = None) -> list[Event]:
    """An install onto a bare host (slot blue), switched and landed."""
    opened = ev.EpisodeOpened("op1", "install", "file:///a", None, None, None, None, max_attempts, 1.0, 3.0)
    return [opened, ev.ArchiveFetched(1, "a" * 64), ev.CandidateStaged("blue", CAND_SHA, 1, "/s"),
            ev.CandidateVerified("2.0.0"), ev.CandidateInstalled("blue", CAND_SHA),
            ev.SwitchIntended("blue", None, last_good), ev.SwitchCommitted("blue")]


def attempts(failures: list[str], cut: bool, target: ev.HealthTarget = "candidate") -> list[Event]:
    events = [e for n, reason in enumerate(failures, 1) for e in attempt(n, reason, target)]
    if cut:
        events += attempt(len(failures) + 1, None, target)
    return events


def out_of_attempts(max_attempts: int, failures: list[str]) -> str:
    detail = failures[-1] if failures else "out of health attempts"
    return f"candidate unhealthy after {max_attempts} attempt(s): {detail}"


def plan_of(events: list[Event], facts: HostFacts = ON_GREEN) -> Plan:
    return decide(fold(records(events)), facts)


@given(max_attempts=st.integers(1, 5), failures=outcomes, cut=st.booleans())
def test_an_active_candidate_spends_exactly_the_recorded_attempts(
    max_attempts: int, failures: list[str], cut: bool
) -> None:
    failures = failures[: max_attempts - cut]
    begun = len(failures) + cut
    plan = plan_of([*upgrade(max_attempts), *attempts(failures, cut)])
    if begun < max_attempts:
        assert plan == ResumeHealth(max_attempts - begun, close_open_attempt=cut)
    else:
        assert plan == Rollback(out_of_attempts(max_attempts, failures), "blue", close_open_attempt=cut)


@given(max_attempts=st.integers(1, 5), failures=outcomes, cut=st.booleans(), last_good=st.sampled_from(
    [None, "green"]))
def test_an_install_never_rolls_back_whatever_its_switch_recorded(
    max_attempts: int, failures: list[str], cut: bool, last_good: str | None
) -> None:
    """A bare host has nothing to return to: out of attempts, an install aborts (even if its switch named a
    last-good slot)."""
    failures = failures[: max_attempts - cut]
    begun = len(failures) + cut
    plan = plan_of([*install(max_attempts, last_good=last_good), *attempts(failures, cut)], ON_BLUE)
    if begun < max_attempts:
        assert plan == ResumeHealth(max_attempts - begun, close_open_attempt=cut)
    else:
        assert plan == Abort(out_of_attempts(max_attempts, failures))


def test_one_attempt_left_is_still_an_attempt() -> None:
    """The boundary no golden row had: two of three attempts failed -> the third one, not a rollback."""
    plan = plan_of([*upgrade(3), *attempts(["a", "b"], cut=False)])
    assert plan == ResumeHealth(1)
    assert plan_of([*upgrade(3), *attempts(["a", "b", "c"], cut=False)]) == Rollback(
        "candidate unhealthy after 3 attempt(s): c", "blue")


def test_a_crash_inside_the_only_attempt_rolls_back_without_a_failure_reason() -> None:
    plan = plan_of([*upgrade(1), *attempts([], cut=True)])
    assert plan == Rollback("candidate unhealthy after 1 attempt(s): out of health attempts", "blue",
                            close_open_attempt=True)


def test_an_upgrade_whose_switch_recorded_no_last_good_aborts_instead_of_rolling_back_to_nothing() -> None:
    events = [*upgrade(2, last_good=None), *attempts(["x", "y"], cut=False)]
    assert plan_of(events) == Abort("candidate unhealthy after 2 attempt(s): y")


def test_an_intended_switch_that_landed_resumes_with_every_recorded_attempt() -> None:
    for max_attempts in (1, 2, 4):
        events = upgrade(max_attempts)[:-1]  # SwitchCommitted missing
        assert plan_of(events) == ResumeHealth(max_attempts, confirm_switch=True)


@given(max_attempts=st.integers(1, 5), failures=outcomes, cut=st.booleans())
def test_a_rollback_in_progress_spends_the_last_goods_own_attempts(
    max_attempts: int, failures: list[str], cut: bool
) -> None:
    """The last-good's attempts count apart from the candidate's: a failed one is closed, a cut one is not."""
    failures = failures[: max_attempts - cut]
    reason = out_of_attempts(max_attempts, ["start-limit-hit"])
    candidate = [*upgrade(max_attempts), *attempts(["start-limit-hit"] * max_attempts, cut=False)]
    events = [*candidate, ev.RollbackStarted(reason, "blue"), *attempts(failures, cut, "last_good")]
    begun = len(failures) + cut
    assert plan_of(events, ON_BLUE) == FinishRollback("blue", max(0, max_attempts - begun), cut)


def test_an_open_episode_in_a_state_no_open_episode_has_is_a_bug_named_by_episode_and_state() -> None:
    view = fold(records([*upgrade(3)]))
    assert view.open_episode is not None
    for state in (EpisodeState.NEW, EpisodeState.CLOSED):
        broken = attrs.evolve(view, open_episode=attrs.evolve(view.open_episode, state=state))
        with pytest.raises(AssertionError, match=rf"^decide: open episode op1 in state {state.value}$"):
            decide(broken, ON_GREEN)

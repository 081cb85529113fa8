"""The maintenance-window rule (docs/configuration.md ``[schedule]``): pure arithmetic on window starts."""

from __future__ import annotations

from upgrade_core import WindowVerdict, host_delay_s, window_verdict

DAY = 86_400.0
START = 1_764_640_800.0  # 2025-12-02 02:00:00 UTC, a window start
STARTS = [START, START + DAY, START + 2 * DAY]


def test_inside_a_window_after_the_hosts_delay_it_is_open_until_the_window_ends() -> None:
    assert window_verdict(STARTS, START + 600, 3600, 300) == WindowVerdict(True, closes_at=START + 3600)
    assert window_verdict(STARTS, START + 300, 3600, 300).open  # the delay's own second is inside
    assert window_verdict(STARTS, START + 3599, 3600, 300).open


def test_before_the_hosts_delay_or_after_the_end_it_waits_for_the_next_opening() -> None:
    assert window_verdict(STARTS, START + 299, 3600, 300) == WindowVerdict(False, opens_at=START + 300)
    assert window_verdict(STARTS, START + 3600, 3600, 300) == WindowVerdict(False, opens_at=START + DAY + 300)
    assert window_verdict(STARTS, START - 1, 3600, 0) == WindowVerdict(False, opens_at=START)


def test_no_later_start_means_no_opening_known() -> None:
    assert window_verdict([START], START + 7200, 3600, 0) == WindowVerdict(False)
    assert window_verdict([], START, 3600, 0) == WindowVerdict(False)


def test_the_hosts_delay_is_stable_bounded_and_differs_between_hosts() -> None:
    delays = {host_delay_s(f"{n:032x}", "agent", 600) for n in range(200)}
    assert all(0 <= d <= 600 and d == int(d) for d in delays)
    assert len(delays) > 100  # spread over the window, not one instant for the fleet
    assert host_delay_s("a" * 32, "agent", 600) == host_delay_s("a" * 32, "agent", 600)
    assert host_delay_s("a" * 32, "agent", 0) == 0.0

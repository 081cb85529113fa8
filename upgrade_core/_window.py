"""Maintenance windows (docs/configuration.md ``[schedule]``): whether a switch may happen now. Pure.

A window opens at each start its calendar expression names (systemd.time(7); the agent computes the starts
with ``systemd-analyze calendar``) and lasts ``window_s`` seconds. Each host waits its own delay into the
window (``jitter_s`` at most, the same delay at every start: derived from the machine id), so that a fleet
sharing one expression does not restart all at once (kured, FLUO and system-upgrade-controller spread
reboots the same way). A switch (``upgrade``, ``activate``, a managed operation) happens only between a
start plus the host's delay and the start plus ``window_s``; fetching and staging may happen any time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import attrs

__all__ = ["WindowVerdict", "host_delay_s", "window_verdict"]


@attrs.frozen
class WindowVerdict:
    """Whether a switch may happen now.

    Attributes:
        open: now lies inside a window (after this host's delay into it).
        opens_at: when not ``open``, Unix seconds at which this host's part of the next window begins, or
            None when no start was given after now (the expression names none in the span computed).
        closes_at: when ``open``, Unix seconds at which the window ends.
    """

    open: bool
    opens_at: float | None = None
    closes_at: float | None = None


def host_delay_s(machine_id: str, agent: str, jitter_s: float) -> float:
    """This host's delay into every window, in whole seconds within ``[0, jitter_s]``.

    Deterministic: the sha256 of the machine id (``/etc/machine-id``, machine-id(5)) and the agent name
    picks it, so it stays the same across restarts and differs between hosts and between agents of a host.

    Args:
        machine_id: the host's machine id (any string; the host name when there is none).
        agent: ``agent.name``.
        jitter_s: the configured bound, seconds, >= 0.
    """
    span = int(jitter_s)
    if span <= 0:
        return 0.0
    digest = hashlib.sha256(f"{machine_id}\0{agent}".encode()).digest()
    return float(int.from_bytes(digest[:8], "big") % (span + 1))


def window_verdict(starts: Sequence[float], now: float, window_s: float, delay_s: float) -> WindowVerdict:
    """Whether ``now`` lies in a window, else when the next one opens for this host.

    Args:
        starts: window starts, Unix seconds, ascending: every start after ``now - window_s`` (a window
            that began earlier has ended), at least up to the first one after ``now``.
        now: Unix seconds.
        window_s: the window's length, seconds, > 0.
        delay_s: this host's delay into each window (:func:`host_delay_s`), seconds, ``< window_s``.

    Returns:
        ``open`` with ``closes_at`` inside ``[start + delay_s, start + window_s)``; otherwise the first
        ``start + delay_s`` after ``now`` as ``opens_at`` (None when there is none).
    """
    for start in starts:
        begins, ends = start + delay_s, start + window_s
        if begins <= now < ends:
            return WindowVerdict(True, closes_at=ends)
        if begins > now:
            return WindowVerdict(False, opens_at=begins)
    return WindowVerdict(False)

"""The maintenance window as this host sees it (docs/configuration.md ``[schedule]``).

:func:`window_now` combines the configured expression's starts (``systemd-analyze calendar``, through
:mod:`agent.systemd.calendar`), this host's delay into each window (from its machine id) and the wall clock
into the pure :func:`upgrade_core.window_verdict`. :func:`refuse_outside_window` is the rule the command line
applies to a switch a person asks for (``upgrade``, ``activate``) without ``--now``.
"""

from __future__ import annotations

import functools
import socket
import time
from datetime import UTC, datetime

from agent.config.loader import AgentConfig
from agent.errors import UsageError
from agent.fs.regular import read_regular_file
from agent.systemd.calendar import calendar_starts
from upgrade_core import WindowVerdict, host_delay_s, window_verdict

__all__ = [
    "MACHINE_ID_PATH", "OutsideWindowError", "closed_window_text", "refuse_outside_window", "window_now",
]

MACHINE_ID_PATH = "/etc/machine-id"
"""machine-id(5): the host's identity the per-host delay derives from (the host name when unreadable)."""

_ITERATIONS = 32  # starts computed per look: enough to cover a window that many starts overlap


class OutsideWindowError(UsageError):
    """A switch asked for outside the maintenance window without ``--now``: nothing was locked, fetched or
    journaled. Exit 2 (the message says when the next window opens for this host)."""


@functools.cache
def machine_id() -> str:
    """The host's machine id (machine-id(5)), or its host name when the file cannot be read; read once per
    process (it does not change while the system runs)."""
    try:
        text = read_regular_file(MACHINE_ID_PATH, limit=256).decode("ascii", "replace").strip()
    except (OSError, ValueError):
        text = ""
    return text or socket.gethostname()


def window_now(config: AgentConfig, now: float | None = None) -> WindowVerdict:
    """Whether a switch may happen now on this host (always, when ``schedule.window`` is "").

    Args:
        config: the configuration (``[schedule]``, ``agent.name``).
        now: Unix seconds (default the wall clock: a window is a time of day, not a duration).

    Raises:
        ConfigError: ``systemd-analyze calendar`` cannot be run (exit 2).
    """
    sched = config.schedule
    if not sched.window:
        return WindowVerdict(True)
    now = time.time() if now is None else now
    delay = host_delay_s(machine_id(), config.agent.name, sched.jitter_s)
    verdict = window_verdict(calendar_starts(sched.window, now - sched.window_s, _ITERATIONS), now,
                             sched.window_s, delay)
    if not verdict.open and verdict.opens_at is None:  # every start computed lay before now: look ahead
        verdict = window_verdict(calendar_starts(sched.window, now, 1), now, sched.window_s, delay)
    return verdict


def closed_window_text(config: AgentConfig, verdict: WindowVerdict) -> str:
    """``outside the maintenance window (schedule.window = '...'): it opens for this host at <UTC>`` for a
    closed ``verdict`` (the words every refusal, wait and status line use)."""
    when = "it names no later start" if verdict.opens_at is None else (
        "it opens for this host at "
        + datetime.fromtimestamp(int(verdict.opens_at), UTC).isoformat().replace("+00:00", "Z"))
    return f"outside the maintenance window (schedule.window = {config.schedule.window!r}): {when}"


def refuse_outside_window(config: AgentConfig, what: str) -> None:
    """Raise :class:`OutsideWindowError` when ``what`` (a switch a person asks for: ``upgrade``, ``activate``)
    falls outside the maintenance window (``upgrade --in-window`` stages instead and leaves the switch to the
    recovery timer: :meth:`agent.session.session.Session.recover`).

    Raises:
        OutsideWindowError: outside the window (exit 2), naming ``schedule.window`` and the next opening.
        ConfigError: as :func:`window_now`.
    """
    verdict = window_now(config)
    if not verdict.open:
        hint = "--now switches anyway" if what == "activate" else (
            "--in-window stages it now for the recovery timer to switch in the window, --stage stages it for "
            "activate, --now switches anyway")
        raise OutsideWindowError(f"{what}: {closed_window_text(config, verdict)}; {hint}")

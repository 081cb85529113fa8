"""systemd calendar expressions (systemd.time(7)) through the real ``systemd-analyze calendar``.

The ``[schedule] window`` expression is checked and its starts computed by systemd's own parser, so that
the agent accepts exactly what a timer unit would, and never a dialect of its own. ``systemd-analyze
calendar`` is a local computation (no manager is asked), so it runs on the host directly, never behind
``host.systemctl_prefix``. Times are read from the ``(in UTC)`` line systemd prints when the local zone is
not UTC, else from the elapse line itself (which then ends in ``UTC``).
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime

from agent.errors import ConfigError
from agent.sanitize import MAX_LOG_LINE_CHARS, clean_text

__all__ = ["CALENDAR_TIMEOUT_S", "calendar_starts", "check_calendar"]

CALENDAR_TIMEOUT_S = 10.0
"""Seconds one ``systemd-analyze calendar`` may take (it computes locally, in milliseconds)."""

_STAMP = "%a %Y-%m-%d %H:%M:%S UTC"


def _analyze(expression: str, *extra: str) -> str:
    """``systemd-analyze calendar [EXTRA] -- EXPRESSION``'s stdout.

    Raises:
        ConfigError: ``schedule.window: ...``: systemd refused the expression (its own message), or
            ``systemd-analyze`` cannot be run or did not finish in time (exit 2).
    """
    argv = ["systemd-analyze", "calendar", *extra, "--", expression]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CALENDAR_TIMEOUT_S, check=False,
                              stdin=subprocess.DEVNULL, errors="replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = "did not finish in time" if isinstance(exc, subprocess.TimeoutExpired) else (
            exc.strerror or str(exc))
        raise ConfigError(
            f"schedule.window: cannot run systemd-analyze calendar to check it: {why}"
        ) from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["refused"])[-1]
        raise ConfigError(
            f"schedule.window: systemd-analyze calendar refused it: {clean_text(said, MAX_LOG_LINE_CHARS)}"
        )
    return done.stdout


def check_calendar(expression: str) -> None:
    """Raise unless systemd accepts ``expression`` as a calendar event (what ``OnCalendar=`` takes).

    Raises:
        ConfigError: as :func:`_analyze` (exit 2; the loader prefixes the file name).
    """
    _analyze(expression)


def calendar_starts(expression: str, base: float, iterations: int) -> list[float]:
    """The first ``iterations`` times after ``base`` that ``expression`` names, Unix seconds, ascending
    (``systemd-analyze calendar --base-time=@BASE --iterations=N``; fewer when the expression names fewer,
    e.g. a date in the past).

    Raises:
        ConfigError: as :func:`_analyze`, or output this parser does not recognise (named in the line).
    """
    out = _analyze(expression, f"--base-time=@{int(base)}", f"--iterations={iterations}")
    starts: list[float] = []
    pending: str | None = None
    for raw in out.splitlines():
        key, _, value = raw.strip().partition(": ")
        if key == "Next elapse" or key.startswith("Iter. #"):
            pending = value
            if value.endswith(" UTC"):
                starts.append(_parse(value))
                pending = None
        elif key == "(in UTC)" and pending is not None:
            starts.append(_parse(value))
            pending = None
    return starts


def _parse(stamp: str) -> float:
    try:
        return datetime.strptime(stamp, _STAMP).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ConfigError(
            f"schedule.window: unexpected systemd-analyze calendar output {clean_text(stamp, 80)!r}"
        ) from None

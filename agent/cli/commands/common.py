"""Small helpers every command uses: the session named by ``--config``, a writing run under the signal
rules, stderr lines, times."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import anyio

from agent.session.session import Session
from upgrade_core import UpgradeResult

T = TypeVar("T")


def cli_session(args: argparse.Namespace, *, label: str = "download") -> Session:
    """The :class:`~agent.session.session.Session` of the configuration named by ``--config`` (or
    discovered), with the CLI's download display and phase lines on stderr at the level ``-q``/``-v`` ask
    for (:mod:`agent.cli.commands.progress`).

    Raises:
        ConfigError: the file is missing, unreadable or invalid (exit 2).
    """
    from agent.cli.commands.progress import HealthPolicy, PhaseLines, Progress, verbosity

    level = verbosity(args)
    lines = PhaseLines(level)
    session = Session.load(args.config, progress=Progress(label, level, lines), on_event=lines)
    lines.policy = HealthPolicy(session.config.health.max_attempts, session.config.health.timeout_s)
    return session


def run_writing(
    session: Session, args: argparse.Namespace, flow: Callable[[], Awaitable[T]]
) -> T | UpgradeResult:
    """Run one of ``session``'s writing methods to its end under the signal rules of design §4.3 step 10
    (:func:`agent.cli.commands.signals.run_with_signals`), with the progress display shown meanwhile."""
    from agent.cli.commands.progress import Progress
    from agent.cli.commands.signals import run_with_signals

    progress = session.progress
    with progress if isinstance(progress, Progress) else contextlib.nullcontext():
        return anyio.run(run_with_signals, session, flow, args.json)


def rfc3339(ts: float | None) -> str | None:
    """A wall-clock timestamp as RFC 3339 UTC to the second (``...Z``), None for None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

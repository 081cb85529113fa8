"""Small helpers every command uses: the configuration named by ``--config``, stderr lines, times."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime

from agent.config import AgentConfig, discover_config_path, load_config


def load_args(args: argparse.Namespace) -> tuple[AgentConfig, str]:
    """The configuration named by ``--config`` (or discovered) and its absolute path.

    Raises:
        ConfigError: the file is missing, unreadable or invalid (exit 2).
    """
    path = discover_config_path(args.config)
    return load_config(path), os.path.abspath(path)


def log(message: str) -> None:
    """One ``upgrade-agent: ...`` line on stderr."""
    sys.stderr.write(f"upgrade-agent: {message}\n")
    sys.stderr.flush()


def rfc3339(ts: float | None) -> str | None:
    """A wall-clock timestamp as RFC 3339 UTC to the second (``...Z``), None for None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

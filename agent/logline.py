"""One ``upgrade-agent: ...`` line on stderr: the only way the agent talks to a person outside ``--json``
(progress and logs go to stderr only, design §7)."""

from __future__ import annotations

import sys

__all__ = ["PROG", "log"]

PROG = "upgrade-agent"  # the program's name: the prefix of every line it writes for a person


def log(message: str) -> None:
    """Write ``upgrade-agent: <message>`` and a newline to stderr, flushed."""
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.stderr.flush()

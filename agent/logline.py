"""One ``upgrade-agent: ...`` line on stderr: the only way the agent talks to a person outside ``--json``
(progress and logs go to stderr only, SPEC 7)."""

from __future__ import annotations

import sys

__all__ = ["log"]


def log(message: str) -> None:
    """Write ``upgrade-agent: <message>`` and a newline to stderr, flushed."""
    sys.stderr.write(f"upgrade-agent: {message}\n")
    sys.stderr.flush()

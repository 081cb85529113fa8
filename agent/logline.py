"""One ``upgrade-agent: ...`` line on stderr: the only way the agent talks to a person outside ``--json``
(progress and logs go to stderr only, design §7)."""

from __future__ import annotations

import sys

from agent.sanitize import MAX_LOG_LINE_CHARS, clean_text

__all__ = ["PROG", "log"]

PROG = "upgrade-agent"  # the program's name: the prefix of every line it writes for a person


def log(message: str) -> None:
    """Write ``upgrade-agent: <message>`` and a newline to stderr, flushed.

    ``message`` passes :func:`agent.sanitize.clean_text` first: it is one line whatever it quotes (under
    systemd each stderr line is one journald entry, so an embedded newline would forge another entry), no
    control character or ANSI escape reaches the reader's terminal, and it is at most
    :data:`~agent.sanitize.MAX_LOG_LINE_CHARS` characters long.
    """
    sys.stderr.write(f"{PROG}: {clean_text(message, MAX_LOG_LINE_CHARS)}\n")
    sys.stderr.flush()

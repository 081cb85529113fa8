"""One ``upgrade-agent: ...`` line on stderr: the only way the agent talks to a person outside ``--json``
(progress and logs go to stderr only, design §7).

Under systemd (stderr connected to the journal, which systemd announces in ``JOURNAL_STREAM`` as the
``DEVICE:INODE`` of that stream, systemd.exec(5)) each line starts with its syslog priority in the
``<N>`` form sd-daemon(3) defines (journald reads it with ``SyslogLevelPrefix=yes``, the default), so
``journalctl -p err`` finds every failure and ``-p warning`` every health attempt that failed. On a
terminal or a pipe the lines carry no prefix.
"""

from __future__ import annotations

import os
import sys

from agent.sanitize import MAX_LOG_LINE_CHARS, clean_text

__all__ = ["ERR", "INFO", "PROG", "WARNING", "log"]

PROG = "upgrade-agent"  # the program's name: the prefix of every line it writes for a person

ERR, WARNING, INFO = 3, 4, 6
"""syslog(3) priorities: ``LOG_ERR``, ``LOG_WARNING``, ``LOG_INFO``."""


def _stderr_is_journal() -> bool:
    """True when fd 2 is the stream systemd named in ``JOURNAL_STREAM`` (systemd.exec(5): compare the
    device and inode numbers, since a child may have redirected stderr elsewhere)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = stream.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def log(message: str, priority: int = INFO) -> None:
    """Write ``upgrade-agent: <message>`` and a newline to stderr, flushed; ``priority`` (:data:`ERR`,
    :data:`WARNING` or :data:`INFO`) becomes a ``<N>`` prefix when stderr is the journal (see above).

    ``message`` passes :func:`agent.sanitize.clean_text` first: it is one line whatever it quotes (under
    systemd each stderr line is one journald entry, so an embedded newline would forge another entry), no
    control character or ANSI escape reaches the reader's terminal, and it is at most
    :data:`~agent.sanitize.MAX_LOG_LINE_CHARS` characters long.
    """
    prefix = f"<{priority}>" if _stderr_is_journal() else ""
    sys.stderr.write(f"{prefix}{PROG}: {clean_text(message, MAX_LOG_LINE_CHARS)}\n")
    sys.stderr.flush()

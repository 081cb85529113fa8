"""The documented test-only crash hook (design §8): SIGKILL this process at a named step.

When ``UPGRADE_AGENT_TEST_KILL_AFTER=TAG`` (or ``TAG#N``) is set, :func:`crash_point` called with ``TAG``
for the N-th time (default the first) SIGKILLs the process at once: no handler, no ``finally``, no flush,
as a power cut or the OOM killer would. It does nothing when the variable is unset, which is every real run.

The steps that call it and their tags:

- each journal append, once its record is durable: the event's stable tag (``agent/session/wiring.py``);
- the operator, after each status it published: ``operator-InProgress``, ``operator-terminal``;
- each unit file written durably by the systemd binding: ``unit-file`` (so ``unit-file#2`` is the moment
  between the second and the third write of one ``install``; ``agent/systemd/manager.py``);
- ``host move``, between its records: ``host-move-copied`` (the copy made and labelled, before the
  exchange) and ``host-move-exchanged`` (the exchange durable, the old link not removed yet;
  ``agent/host/hostmove.py``).

A foundation module (no import of the project) so that every layer can mark its steps.
"""

from __future__ import annotations

import os
import signal
from typing import Final

__all__ = ["KILL_HOOK_ENV", "crash_point"]

KILL_HOOK_ENV: Final = "UPGRADE_AGENT_TEST_KILL_AFTER"
"""The environment variable naming the step to be killed at: ``TAG`` or ``TAG#N``."""


def _parse(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    tag, _, nth = value.partition("#")
    return tag, int(nth) if nth else 1


_CRASH_AT: Final = _parse(os.environ.get(KILL_HOOK_ENV))
_CRASH_SEEN: dict[str, int] = {}


def crash_point(tag: str) -> None:
    """Count one passage of the step ``tag``; SIGKILL this process when it is the one
    ``UPGRADE_AGENT_TEST_KILL_AFTER`` names (see the module docstring). Does nothing when it is unset."""
    if _CRASH_AT is None:
        return
    _CRASH_SEEN[tag] = _CRASH_SEEN.get(tag, 0) + 1
    if (tag, _CRASH_SEEN[tag]) == _CRASH_AT:
        os.kill(os.getpid(), signal.SIGKILL)

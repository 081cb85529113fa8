"""The lean no-op path of ``recover`` (design §9 ``recover.noop``: within 1.8x ``python -c pass`` in the
installed venv).

At boot, ``recover-agent-upgrade`` almost always finds nothing to do. This module answers that case with a
few standard-library modules only (not json, re, typing or tomllib), before argparse and before any
session: it checks that the command line is a plain ``recover`` and asks
:func:`agent.session.noop.nothing_open`, which is True only when it is certain that no episode is open.
Anything else returns None and the full path (lock, repair, replay, fold, decide) takes over, which also
produces every error message. It never writes and never creates a file.
"""

from __future__ import annotations

import sys


def _option(argv: list[str], name: str) -> str | None:
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


NOOP_JSON = ('{"operation": null, "result": "noop", "from_version": null, "to_version": null, "slot": null, '
             '"reason": null}')
"""The ``--json`` result of a no-op recovery, as ``json.dumps`` writes it for the full path's result (written
out here: :mod:`json` loads :mod:`re`, a third of the no-op's budget; a test pins the two equal)."""

_TRIGGERS = frozenset({"boot", "on-failure", "manual", "timer"})


def _plain_recover(argv: list[str]) -> bool:
    """True when ``argv`` is exactly ``recover`` plus well-formed ``--config``, ``--json``, ``--trigger``.

    Anything else (an unknown option, a bad trigger, a second command word) goes to argparse on the full
    path, so that a usage error exits 2 there instead of being answered with a noop here (design §7).
    """
    i, commands = 0, 0
    while i < len(argv):
        word = argv[i]
        if word == "recover":
            commands += 1
        elif word == "--json":
            pass
        elif word in ("--config", "--trigger"):
            if i + 1 >= len(argv):
                return False
            if word == "--trigger" and argv[i + 1] not in _TRIGGERS:
                return False
            i += 1
        elif word.startswith("--config="):
            pass
        elif word.startswith("--trigger="):
            if word.split("=", 1)[1] not in _TRIGGERS:
                return False
        else:
            return False
        i += 1
    return commands == 1


def recover_noop(argv: list[str]) -> int | None:
    """Answer ``recover`` when nothing is open: print the noop result and return 0; else None.

    Args:
        argv: the whole command line after the program name (``recover`` somewhere in it).
    """
    if not _plain_recover(argv):
        return None
    from agent.session.noop import nothing_open

    timer = _option(argv, "--trigger") == "timer"  # its follow-up in a maintenance window: the full path's
    if not nothing_open(_option(argv, "--config"), timer=timer):  # any doubt: the full path decides
        return None
    if "--json" in argv:
        sys.stdout.write(NOOP_JSON + "\n")
    else:
        sys.stdout.write("nothing to recover: no open episode\n")
    sys.stdout.flush()
    return 0

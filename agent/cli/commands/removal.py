"""``reset`` (the agent's units) and ``uninstall`` (units, layout, ``state_dir`` files, lock; never the
legacy root or the configuration): only what the install record lists. The work is the session's
(:meth:`agent.session.session.Session.reset`, :meth:`~agent.session.session.Session.uninstall`)."""

from __future__ import annotations

import argparse

import anyio

from agent.cli.commands.outcome import Outcome
from agent.session.session import Cleanup, Session
from upgrade_core.errors import CleanupIncompleteError


def cmd_reset(args: argparse.Namespace) -> Outcome:
    """``reset``: stop, disable and remove the agent's units (those it wrote), daemon-reload."""
    return _cleanup_outcome(anyio.run(Session.load(args.config).reset))


def _cleanup_outcome(out: Cleanup) -> Outcome:
    """``{"removed": [...], "kept": [...], "notes": [...]}``; a removal the host refused is the command's
    error (the first one), the others go with it as ``cleanup_errors``.

    Raises:
        CleanupIncompleteError: a removal failed (exit 3: part was removed, an operator must look);
            ``cleanup_errors`` on it lists the rest.
    """
    if out.errors:
        error = CleanupIncompleteError(out.errors[0])
        error.cleanup_errors = out.errors[1:]  # type: ignore[attr-defined]
        raise error
    lines = [f"removed {p}" for p in out.removed] + out.kept + out.notes
    payload = {"removed": out.removed, "kept": out.kept, "notes": out.notes}
    return Outcome(payload, "\n".join(lines) or "nothing to remove")


def cmd_uninstall(args: argparse.Namespace) -> Outcome:
    """``uninstall``: reset, then what the install record lists, the files the agent wrote in ``state_dir``,
    and the lock (:meth:`agent.session.session.Session.uninstall`)."""
    return _cleanup_outcome(anyio.run(Session.load(args.config).uninstall))

"""The command implementations behind :mod:`agent.cli.main` (design §7), one module per command family.

Each ``cmd_*`` takes the parsed arguments and returns an :class:`Outcome`: the JSON payload (the shapes
design §7 pins), a human summary, and the exit code. The work itself is the embedding session's
(:class:`agent.session.session.Session`); a command parses, asks the session, and prints. Errors are raised,
and :func:`describe_error` maps them to one line and an exit code in one place.

- :mod:`~agent.cli.commands.upgrade`: ``upgrade`` (and ``--preflight``), ``rollback`` (and ``--preflight``),
  ``recover``;
- :mod:`~agent.cli.commands.install`: ``install`` (and adoption);
- :mod:`~agent.cli.commands.readers`: ``status``, ``history``, ``units``, ``host-root``;
- :mod:`~agent.cli.commands.journal`: ``journal verify|dump|compact``;
- :mod:`~agent.cli.commands.removal`: ``reset``, ``uninstall``;
- :mod:`~agent.cli.commands.demo`: ``demo``;
- :mod:`~agent.cli.commands.operator`: ``operator`` (managed operations, docs/managed.md);
- :mod:`~agent.cli.commands.ignition`: ``ignition`` (an Ignition config for a new host, docs/ignition.md);
- shared: :mod:`~agent.cli.commands.common` (the session of ``--config``, a writing run),
  :mod:`~agent.cli.commands.signals`, :mod:`~agent.cli.commands.progress`,
  :mod:`~agent.cli.commands.outcome` (result payloads).

Readers (``status``, ``history``, ``journal verify|dump``, ``units``, ``host-root``) never write and never
create ``state_dir`` or the lock. Writers take the host lock, non-blocking, and hold it until their
episode closes.
"""

from __future__ import annotations

import argparse
import errno
import importlib
from collections.abc import Callable

from agent.cli.commands.outcome import Outcome
from agent.groups import sole_error
from upgrade_core.errors import UpgradeError

__all__ = ["COMMANDS", "Outcome", "describe_error", "run_command"]


EXIT_HOST_REFUSED = 4
"""design §10: the host refused (permission, ownership, file type, read-only file system); nothing changed."""

# errno values that mean "the host refused" (exit 4), not "rolled back or aborted" (exit 1 keeps only that).
_REFUSED_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO}
)


def describe_error(exc: BaseException) -> tuple[int | None, str]:
    """Map an exception to ``(exit code, one line)``; ``(None, ...)`` for an unexpected bug (re-raised).

    Journal errors (corrupt, newer version, poisoned, undecodable) exit 3 naming file and offset; a journal
    path that is not ours exits 4, a journal directory held by another writer 75, a journal of another
    configuration 2. An ``OSError`` of permission, ownership, file type or a read-only file system
    (EACCES, EPERM, EROFS, ELOOP, ENOTDIR, EISDIR, ENXIO) exits 4 (design §10) rather than 1, which means
    only "rolled back or aborted: the previous good binary runs".
    """
    from journal import JournalBusyError, JournalError, JournalOwnerError, JournalRefusedError

    exc = sole_error(exc)
    if isinstance(exc, UpgradeError):
        return exc.exit_code, str(exc)
    if isinstance(exc, JournalRefusedError):
        return EXIT_HOST_REFUSED, f"{exc}; nothing was changed"
    if isinstance(exc, JournalBusyError):
        return 75, str(exc)
    if isinstance(exc, JournalOwnerError):
        return 2, str(exc)
    if isinstance(exc, JournalError):
        return 3, str(exc)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        if exc.errno in _REFUSED_ERRNOS:
            return EXIT_HOST_REFUSED, f"{where}{exc.strerror or exc}; the host refused, nothing was changed"
        return 1, f"{where}{exc.strerror or exc}"
    return None, repr(exc)


# command -> (module, function). A command imports its own module when it runs: `upgrade` does not load
# the operator's Kubernetes client, Ignition, the demo or the readers (the upgrade's fixed costs, design §9
# ``upgrade.end_to_end``).
_WHERE = {
    "install": ("agent.cli.commands.install", "cmd_install"),
    "upgrade": ("agent.cli.commands.upgrade", "cmd_upgrade"),
    "recover": ("agent.cli.commands.upgrade", "cmd_recover"),
    "rollback": ("agent.cli.commands.upgrade", "cmd_rollback"),
    "status": ("agent.cli.commands.readers", "cmd_status"),
    "history": ("agent.cli.commands.readers", "cmd_history"),
    "journal": ("agent.cli.commands.journal", "cmd_journal"),
    "units": ("agent.cli.commands.readers", "cmd_units"),
    "host-root": ("agent.cli.commands.readers", "cmd_host_root"),
    "reset": ("agent.cli.commands.removal", "cmd_reset"),
    "uninstall": ("agent.cli.commands.removal", "cmd_uninstall"),
    "demo": ("agent.cli.commands.demo", "cmd_demo"),
    "operator": ("agent.cli.commands.operator", "cmd_operator"),
    "ignition": ("agent.cli.commands.ignition", "cmd_ignition"),
}


def _on_demand(module: str, function: str) -> Callable[[argparse.Namespace], Outcome]:
    def command(args: argparse.Namespace) -> Outcome:
        run: Callable[[argparse.Namespace], Outcome] = getattr(importlib.import_module(module), function)
        return run(args)

    command.__name__ = command.__qualname__ = function
    return command


COMMANDS: dict[str, Callable[[argparse.Namespace], Outcome]] = {
    name: _on_demand(module, function) for name, (module, function) in _WHERE.items()
}
"""Every command's implementation, by name; each loads its module on its first call."""


def run_command(args: argparse.Namespace) -> Outcome:
    """Dispatch ``args.command`` to its implementation."""
    return COMMANDS[args.command](args)

"""The command implementations behind :mod:`agent.cli.main` (design §7), one module per command family.

Each ``cmd_*`` takes the parsed arguments and returns an :class:`Outcome`: the JSON payload (the shapes
design §7 pins), a human summary, and the exit code. The work itself is the embedding session's
(:class:`agent.session.session.Session`); a command parses, asks the session, and prints. Errors are raised,
and :func:`agent.errors.describe_error` maps them to one line and an exit code in one place.

- :mod:`~agent.cli.commands.upgrade`: ``upgrade`` (and ``--preflight``), ``rollback`` (and ``--preflight``),
  ``recover``;
- :mod:`~agent.cli.commands.install`: ``install`` (and adoption);
- :mod:`~agent.cli.commands.readers`: ``status``, ``history``, ``units``, ``host-root``;
- :mod:`~agent.cli.commands.journal`: ``journal verify|dump|compact|quarantine``;
- :mod:`~agent.cli.commands.trust`: ``trust reset``;
- :mod:`~agent.cli.commands.host`: ``host move`` (docs/host.md);
- :mod:`~agent.cli.commands.removal`: ``reset``, ``uninstall``;
- :mod:`~agent.cli.commands.demo`: ``demo``;
- :mod:`~agent.cli.commands.operator`: ``operator`` (managed operations, docs/managed.md);
- :mod:`~agent.cli.commands.ignition`: ``ignition`` (an Ignition config for a new host, docs/ignition.md);
- :mod:`~agent.cli.commands.delta`: ``delta make`` (a delta for ``upgrade --delta``, docs/delta.md);
- shared: :mod:`~agent.cli.commands.common` (the session of ``--config``, a writing run),
  :mod:`~agent.cli.commands.signals`, :mod:`~agent.cli.commands.progress`,
  :mod:`~agent.cli.commands.outcome` (result payloads).

Readers (``status``, ``history``, ``journal verify|dump``, ``units``, ``host-root``) never write and never
create ``state_dir`` or the lock. Writers take the host lock, non-blocking, and hold it until their
episode closes.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from agent.cli.commands.outcome import Outcome

__all__ = ["COMMANDS", "Outcome", "run_command"]


# command -> (module, function). A command imports its own module when it runs: `upgrade` does not load
# the operator's Kubernetes client, Ignition, the demo or the readers (the upgrade's fixed costs, design §9
# ``upgrade.end_to_end``).
_WHERE = {
    "install": ("agent.cli.commands.install", "cmd_install"),
    "upgrade": ("agent.cli.commands.upgrade", "cmd_upgrade"),
    "recover": ("agent.cli.commands.upgrade", "cmd_recover"),
    "rollback": ("agent.cli.commands.upgrade", "cmd_rollback"),
    "activate": ("agent.cli.commands.upgrade", "cmd_activate"),
    "status": ("agent.cli.commands.readers", "cmd_status"),
    "history": ("agent.cli.commands.readers", "cmd_history"),
    "journal": ("agent.cli.commands.journal", "cmd_journal"),
    "trust": ("agent.cli.commands.trust", "cmd_trust"),
    "host": ("agent.cli.commands.host", "cmd_host"),
    "units": ("agent.cli.commands.readers", "cmd_units"),
    "host-root": ("agent.cli.commands.readers", "cmd_host_root"),
    "reset": ("agent.cli.commands.removal", "cmd_reset"),
    "uninstall": ("agent.cli.commands.removal", "cmd_uninstall"),
    "demo": ("agent.cli.commands.demo", "cmd_demo"),
    "operator": ("agent.cli.commands.operator", "cmd_operator"),
    "ignition": ("agent.cli.commands.ignition", "cmd_ignition"),
    "delta": ("agent.cli.commands.delta", "cmd_delta"),
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

"""``demo``: the private-systemd walk-through of :mod:`agent.testing.demo`."""

from __future__ import annotations

import argparse

from agent.cli.commands.outcome import Outcome


def cmd_demo(args: argparse.Namespace) -> Outcome:
    """``demo``: see :mod:`agent.testing.demo`. Under ``--json`` the walk-through goes to stderr and stdout
    holds only ``{"demo": bool}``."""
    import sys

    from agent.testing import demo

    code = demo.run(sys.stderr if args.json else sys.stdout)
    return Outcome({"demo": code == 0}, None, code)

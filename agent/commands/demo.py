"""``demo``: the private-systemd walk-through of :mod:`agent.harness.demo`."""

from __future__ import annotations

import argparse

from agent.commands.outcome import Outcome


def cmd_demo(args: argparse.Namespace) -> Outcome:
    """``demo``: see :mod:`agent.harness.demo`."""
    from agent.harness import demo

    code = demo.run()
    return Outcome({"demo": code == 0}, None, code)

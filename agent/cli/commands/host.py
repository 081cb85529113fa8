"""``host move``: a host root linked to ``host.legacy_root`` becomes a real directory, as one journaled
episode (docs/host.md, "Moving a linked host into a real root"). The work is the session's
(:meth:`agent.session.session.Session.host_move`); it takes the host lock."""

from __future__ import annotations

import argparse

from agent.cli.commands.common import cli_session, run_writing
from agent.cli.commands.outcome import Outcome, result_outcome


def cmd_host(args: argparse.Namespace) -> Outcome:
    """``host move``: the episode's result (``committed``, ``aborted`` exit 1, or ``noop`` when the host root
    is a real directory already)."""
    session = cli_session(args)
    return result_outcome(run_writing(session, args, session.host_move))

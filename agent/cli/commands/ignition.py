"""``ignition``: print the Ignition config that provisions this configuration on a new read-only-``/usr``
host (design §10, docs/ignition.md; :mod:`agent.session.ignition`). Renders only: nothing is fetched,
locked or written."""

from __future__ import annotations

import argparse
import json

from agent.cli.commands.outcome import Outcome
from agent.session.ignition import render_ignition
from agent.session.session import Session


def cmd_ignition(args: argparse.Namespace) -> Outcome:
    """``ignition --archive URL --sha256 HEX --runtime URL --runtime-sha256 HEX``: the config as JSON on
    stdout (with or without ``--json``: it is one JSON object either way).

    Raises:
        UsageError, ConfigError: bad input or configuration (exit 2); see
            :func:`agent.session.ignition.render_ignition`.
    """
    config = render_ignition(
        Session.load(args.config), archive=args.archive, sha256=args.sha256, runtime=args.runtime,
        runtime_sha256=args.runtime_sha256,
    )
    return Outcome(config, json.dumps(config, indent=2))

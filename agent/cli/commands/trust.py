"""``trust reset``: clear the anti-rollback watermark and the known-bad memory, journaled (docs/trust.md).
The work is the session's (:meth:`agent.session.session.Session.trust_reset`); it takes the host lock."""

from __future__ import annotations

import argparse

import anyio

from agent.cli.commands.outcome import Outcome
from agent.session.session import Session


def cmd_trust(args: argparse.Namespace) -> Outcome:
    """``trust reset``: prints what it cleared, one line each (the watermark, every known-bad release)."""
    done = anyio.run(Session.load(args.config).trust_reset)
    watermark = "none" if done.watermark is None else str(done.watermark)
    lines = [f"trust reset: operation {done.result.operation}", f"cleared watermark: {watermark}"]
    lines += [f"cleared known-bad release: {b.sha256} (operation {b.operation})" for b in done.known_bad]
    if not done.known_bad:
        lines.append("cleared known-bad releases: none")
    return Outcome(done.to_json(), "\n".join(lines))

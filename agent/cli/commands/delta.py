"""``delta make --from OLD --to NEW -o OUT``: the publisher's side of delta upgrades (docs/delta.md)."""

from __future__ import annotations

import argparse

from agent.cli.commands.outcome import Outcome
from agent.session.publish import make_delta


def cmd_delta(args: argparse.Namespace) -> Outcome:
    """``delta make``: write a zstd patch-from delta of ``--to`` against ``--from`` at ``-o``; print the
    delta's sha256 and size and the target's (the values ``upgrade --delta-sha256`` and ``--member-sha256``
    take).

    Raises:
        UsageError: ``--from`` or ``--to`` cannot be read or is empty, or ``-o`` cannot be written (exit 2);
            nothing is left at ``-o`` then.
    """
    made = make_delta(args.old, args.new, args.out)
    payload = {
        "delta": args.out,
        "delta_sha256": made.delta_sha256,
        "delta_size": made.delta_size,
        "member_sha256": made.member_sha256,
        "member_size": made.member_size,
    }
    human = (
        f"delta: {args.out} ({made.delta_size} bytes) sha256 {made.delta_sha256}\n"
        f"target: {args.new} ({made.member_size} bytes) sha256 {made.member_sha256}\n"
        f"upgrade --delta URL --delta-sha256 {made.delta_sha256} --member-sha256 {made.member_sha256}"
    )
    return Outcome(payload, human)

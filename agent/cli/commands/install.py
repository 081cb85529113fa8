"""``install``: a bare host to blue, links, units, start, health; adoption of a plain binary or a legacy
layout (design §7). The work is :meth:`agent.session.session.Session.install`."""

from __future__ import annotations

import argparse

import attrs

from agent.cli.commands.common import cli_session, run_writing
from agent.cli.commands.outcome import Outcome, result_outcome
from agent.release.fetch import parse_sha256
from agent.systemd.stable_paths import check_stable_executables


def cmd_install(args: argparse.Namespace) -> Outcome:
    """``install`` (design §7): bare host -> blue, links, units, start, health; adoption without --archive.

    Raises:
        ConfigError, UsageError: bad configuration or arguments; nothing to adopt (exit 2).
        LayoutConflictError: a partial layout or a file where a link must be (exit 2), before the lock.
        AlreadyInstalledError: installed with a different binary (exit 2).
        UsageError: the units would run the tool from a temporary or per-user path and
            ``--allow-unstable-paths`` was not given (exit 2, :mod:`agent.systemd.stable_paths`), before the
            lock.
        LockBusyError: the host lock is held (exit 75).
    """
    session = cli_session(args)
    if args.archive is None:  # adopt what is there, checked against --sha256 / --expect-version
        request = None
        parse_sha256(args.sha256)  # a malformed digest is refused before the host is looked at
    else:
        request = session.request(
            args.archive, sha256=args.sha256, expect_version=args.expect_version, signature=args.signature,
            retry_known_bad=args.retry_known_bad,
        )
    # units that run the tool from /tmp, a home directory or a checkout break recovery later (docs/install.md)
    check_stable_executables(session.unit_executables(), allow=args.allow_unstable_paths)
    sha, version = args.sha256, args.expect_version
    result = run_writing(session, args, lambda: session.install(request, sha256=sha, expect_version=version))
    outcome = result_outcome(result)
    payload, human, lines = dict(outcome.payload), outcome.human or "", []
    if session.repaired is not None:  # an installed host: what was missing or drifted and is now repaired
        payload["repaired"] = list(session.repaired)
        human += "".join(f"\nrepaired {p}" for p in session.repaired)
    if session.cleanup_errors:  # the result stays the install's; the clean-up's problems go with it
        payload["cleanup_errors"] = list(session.cleanup_errors)
        lines = [f"upgrade-agent: clean-up: {e}" for e in session.cleanup_errors]
    stderr = "\n".join(([outcome.stderr] if outcome.stderr else []) + lines) or None
    return attrs.evolve(outcome, payload=payload, human=human, stderr=stderr)

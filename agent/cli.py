"""The command line of SPEC 7: ``upgrade-agent`` with subcommands, plus ``agent-upgrade`` and
``recover-agent-upgrade``.

Output contract: with ``--json`` every exit prints exactly one JSON object on stdout (errors add ``error``
and ``exit_code``); progress and logs go to stderr only. Without ``--json`` a short human summary goes to
stdout. Every expected failure is one line on stderr (``upgrade-agent: <message>``) and a documented exit
code, never a traceback. Exit codes: 0 committed/noop, 1 rolled_back/aborted, 2 usage/config/not
installed/already installed, 3 needs_attention/journal corrupt or poisoned, 4 the host refused (SPEC 10),
75 busy, 130 interrupted twice.

The no-op ``recover`` path stays lean (SPEC 9 ``recover.noop``): it imports only the standard library until
it knows there is work.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "main_recover", "main_upgrade"]

PROG = "upgrade-agent"
EXIT_CODES_HELP = """exit codes:
  0    committed or noop; recover left no open episode
  1    rolled_back or aborted: the host runs its previous good binary
  2    usage, configuration, not installed, already installed
  3    needs_attention; journal corrupt, newer or poisoned; a failure after the switch;
       a reset/uninstall that removed only part of what it made
  4    the host refused: permission, ownership, file type, read-only file system; nothing was changed
  75   busy: another process holds the host lock (or the journal)
  130  interrupted twice"""
EXIT_USAGE, EXIT_INTERRUPTED = 2, 130


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit 2 through our own error path."""

    def error(self, message: str) -> Any:
        raise _UsageExit(f"{self.prog}: {message}")


class _UsageExit(Exception):
    pass


def _add_common(p: argparse.ArgumentParser, *, top: bool) -> None:
    # Accepted before and after the subcommand: the subparser's copies default to SUPPRESS so that a value
    # given before the subcommand is not overwritten by the subparser's default.
    default: Any = None if top else argparse.SUPPRESS
    p.add_argument("--config", metavar="PATH", default=default, help="configuration file (TOML)")
    p.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print exactly one JSON object on stdout",
    )


def own_version() -> str:
    """The installed ``upgrade-core`` distribution's version (``0+unknown`` when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("upgrade-core")
    except PackageNotFoundError:
        return "0+unknown"


class _VersionAction(argparse.Action):
    """``--version``: ``upgrade-agent X.Y.Z``, or with ``--json`` anywhere on the line one JSON object
    ``{"version": "X.Y.Z"}`` (SPEC 7: with ``--json`` every exit prints exactly one JSON object)."""

    def __init__(self, option_strings: Sequence[str], dest: str, wants_json: bool = False, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)
        self.wants_json = wants_json

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None
    ) -> None:
        if self.wants_json:
            sys.stdout.write(json.dumps({"version": own_version()}) + "\n")
        else:
            sys.stdout.write(f"{PROG} {own_version()}\n")
        sys.stdout.flush()
        parser.exit(0)


_SIG_HELP = "the release's minisign signature (default: <archive>.minisig)"
_RETRY_HELP = "offer a release that failed its health check or verification before (see status known_bad)"


def build_parser(*, wants_json: bool = False) -> argparse.ArgumentParser:
    """The whole command-line grammar (SPEC 7); ``wants_json``: ``--json`` is on the command line (for
    ``--version``, which acts as soon as it is parsed)."""
    parser = _ArgumentParser(
        prog=PROG,
        description="Crash-safe blue/green upgrades of a host daemon.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action=_VersionAction, wants_json=wants_json, help="print the tool's own version"
    )
    _add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)

    def cmd(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        _add_common(p, top=False)
        return p

    p = cmd("install", "install the agent on a bare host (or adopt an existing binary)")
    p.add_argument("--archive", metavar="SRC")
    p.add_argument("--sha256", metavar="HEX")
    p.add_argument("--expect-version", metavar="V")
    p.add_argument("--signature", metavar="SRC", help=_SIG_HELP)
    p.add_argument("--retry-known-bad", action="store_true", help=_RETRY_HELP)
    p.add_argument(
        "--allow-unstable-paths", action="store_true",
        help="write units even when they would run this tool from /tmp, a home directory or a git checkout "
        "(also UPGRADE_AGENT_ALLOW_UNSTABLE_PATHS=1)",
    )
    p = cmd("upgrade", "upgrade the agent (the supervised flow)")
    p.add_argument("--archive", metavar="SRC", required=True)
    p.add_argument("--sha256", metavar="HEX")
    p.add_argument("--expect-version", metavar="V")
    p.add_argument("--signature", metavar="SRC", help=_SIG_HELP)
    p.add_argument("--retry-known-bad", action="store_true", help=_RETRY_HELP)
    p.add_argument("--operation", metavar="ID")
    p.add_argument("--preflight", action="store_true", help="print the plan; fetch nothing, change nothing")
    p = cmd("rollback", "switch current to last-good as its own episode, restart, health-check")
    p.add_argument("--operation", metavar="ID")
    p.add_argument("--preflight", action="store_true", help="print the plan; change nothing")
    p = cmd("recover", "replay the journal and finish or roll back an open episode")
    p.add_argument("--trigger", choices=["boot", "on-failure", "manual", "timer"], default="manual")
    cmd("status", "show slots, links, service and the open episode (never runs binaries)")
    cmd("history", "list episodes from the journal, newest first")
    p = cmd("journal", "journal maintenance (quarantine: move the journal aside, start anew from the host)")
    p.add_argument("action", choices=["verify", "dump", "compact", "quarantine"])
    cmd("units", "print the rendered unit files")
    cmd("host-root", "print the resolved host root; changes nothing")
    cmd("reset", "stop, disable and remove the agent's units")
    cmd("uninstall", "reset, then remove everything install created")
    p = cmd("operator", "take upgrade operations from [operations] source and report each one's status")
    p.add_argument("--once", action="store_true", help="stop when no operation is left to do")
    p = cmd("ignition", "print an Ignition config (spec 3.x JSON) that provisions this configuration")
    p.add_argument("--archive", metavar="URL", required=True, help="the release archive (http(s) URL)")
    p.add_argument("--sha256", metavar="HEX", required=True, help="the release archive's sha256")
    p.add_argument("--runtime", metavar="URL", help="the runtime tar.gz (http(s) URL); required")
    p.add_argument("--runtime-sha256", metavar="HEX", help="the runtime tar.gz's sha256")
    cmd("demo", "boot a private systemd and walk through install, upgrade, rollback and recovery")
    return parser


def _emit(args: argparse.Namespace, payload: dict[str, Any], human: str | None) -> None:
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(payload, sort_keys=False) + "\n")
    elif human:
        sys.stdout.write(human.rstrip("\n") + "\n")
    sys.stdout.flush()


def _fail(
    args: argparse.Namespace | None, message: str, code: int, cleanup_errors: Sequence[str] = ()
) -> int:
    message = "; ".join(part.strip() for part in message.splitlines() if part.strip())  # one line, always
    sys.stderr.write(f"{PROG}: {message}\n")
    for line in cleanup_errors:  # the first error is the result; what its clean-up could not do follows
        sys.stderr.write(f"{PROG}: clean-up: {line}\n")
    sys.stderr.flush()
    if args is not None and getattr(args, "json", False):
        payload: dict[str, Any] = {"error": message, "exit_code": code}
        if cleanup_errors:
            payload["cleanup_errors"] = list(cleanup_errors)
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``upgrade-agent`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_json = "--json" in argv
    # Lean path first: a `recover` with nothing open must not pay for the heavy imports.
    if argv and "recover" in argv:
        import agent.fastpath as fastpath

        quick = fastpath.recover_noop(argv)
        if quick is not None:
            return quick
    try:
        args = build_parser(wants_json=wants_json).parse_args(argv)
    except _UsageExit as exc:
        ns = argparse.Namespace(json=wants_json)
        return _fail(ns, str(exc).split(": ", 1)[-1], EXIT_USAGE)
    if args.command is None:
        build_parser().print_usage(sys.stderr)
        return _fail(args, "a command is required (see --help)", EXIT_USAGE)
    import agent.commands as commands

    try:
        outcome = commands.run_command(args)
    except KeyboardInterrupt:
        return _fail(args, "interrupted", EXIT_INTERRUPTED)
    except Exception as exc:  # the one place where errors become exit codes (SPEC 7)
        code, message = commands.describe_error(exc)
        if code is None:
            raise
        from agent._groups import sole_error

        return _fail(args, message, code, getattr(sole_error(exc), "cleanup_errors", None) or ())
    _emit(args, outcome.payload, outcome.human)
    if outcome.stderr:
        sys.stderr.write(outcome.stderr.rstrip("\n") + "\n")
    return outcome.exit_code


def main_upgrade() -> None:
    """``agent-upgrade``: the same as ``upgrade-agent upgrade``."""
    sys.exit(main(["upgrade", *sys.argv[1:]]))


def main_recover() -> None:
    """``recover-agent-upgrade``: the same as ``upgrade-agent recover``."""
    sys.exit(main(["recover", *sys.argv[1:]]))


def _entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    _entry()

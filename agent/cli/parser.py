"""The command-line grammar of design §7 (argparse), apart from :mod:`agent.cli.main` so that the no-op
``recover``
path, answered before any parsing, does not load argparse (design §9 ``recover.noop``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from agent.logline import PROG

__all__ = ["EXIT_CODES_HELP", "UsageExit", "build_parser", "own_version"]

EXIT_CODES_HELP = """exit codes:
  0    committed, noop, staged or switched_stopped; recover left no open episode
  1    rolled_back or aborted: the host runs its previous good binary
  2    usage, configuration, not installed, already installed; upgrade while current is a
       candidate activate left stopped and unchecked
  3    needs_attention; journal corrupt, newer or poisoned; a failure after the switch;
       a reset/uninstall that removed only part of what it made
  4    the host refused: permission, ownership, file type, read-only file system; nothing was changed
  75   busy: another process holds the host lock (or the journal)
  130  interrupted twice"""


_NOW_HELP = "switch even outside the [schedule] maintenance window (someone is at the console)"


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit 2 through our own error path."""

    def error(self, message: str) -> Any:
        raise UsageExit(f"{self.prog}: {message}")


class UsageExit(Exception):
    """A usage error, reported by :func:`agent.cli.main.main` as one line and exit 2."""


def _add_common(p: argparse.ArgumentParser, *, top: bool) -> None:
    # Accepted before and after the subcommand: the subparser's copies default to SUPPRESS so that a value
    # given before the subcommand is not overwritten by the subparser's default.
    default: Any = None if top else argparse.SUPPRESS
    p.add_argument("--config", metavar="PATH", default=default, help="configuration file (TOML)")
    p.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print exactly one JSON object on stdout (the lines on stderr are unchanged)",
    )
    quiet_or_verbose = p.add_mutually_exclusive_group()
    quiet_or_verbose.add_argument(
        "-q", "--quiet", action="store_true", default=False if top else argparse.SUPPRESS,
        help="print only the result: no phase lines or download progress on stderr",
    )
    quiet_or_verbose.add_argument(
        "-v", "--verbose", action="store_true", default=False if top else argparse.SUPPRESS,
        help="also print every journal record as it is written (the event trace) on stderr",
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
    ``{"version": "X.Y.Z"}`` (design §7: with ``--json`` every exit prints exactly one JSON object)."""

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


_VERSION_HELP = "print the tool's own version and exit 0 (with --json: {\"version\": ...})"
_SIG_HELP = "the release's minisign signature (default: <archive>.minisig)"
_ARCHIVE_HELP = "the release archive (tar; gzip, zstd, xz or bzip2): an http(s) URL or a local path"
_SHA_HELP = "the archive's expected sha256 (64 hex digits); a mismatch aborts before anything is staged"
_EXPECT_HELP = "the version the candidate's version command must report; anything else aborts"
_OPERATION_HELP = "the episode's operation id ([A-Za-z0-9._-]{1,64}); default: a fresh random id"
_RETRY_HELP = "offer a release that failed its health check or verification before (see status known_bad)"


def build_parser(*, wants_json: bool = False) -> argparse.ArgumentParser:
    """The whole command-line grammar (design §7); ``wants_json``: ``--json`` is on the command line (for
    ``--version``, which acts as soon as it is parsed)."""
    parser = _ArgumentParser(
        prog=PROG,
        description="Crash-safe blue/green upgrades of a host daemon.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action=_VersionAction, wants_json=wants_json, help=_VERSION_HELP
    )
    _add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)

    def cmd(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        _add_common(p, top=False)
        # --version after a command word too: agent-upgrade and recover-agent-upgrade put one first
        p.add_argument("--version", action=_VersionAction, wants_json=wants_json, help=_VERSION_HELP)
        return p

    p = cmd("install", "install the agent on a bare host (or adopt an existing binary)")
    p.add_argument("--archive", metavar="SRC", help=_ARCHIVE_HELP + "; without it, adopt the binary in place")
    p.add_argument("--sha256", metavar="HEX", help=_SHA_HELP)
    p.add_argument("--expect-version", metavar="V", help=_EXPECT_HELP)
    p.add_argument("--signature", metavar="SRC", help=_SIG_HELP)
    p.add_argument("--retry-known-bad", action="store_true", help=_RETRY_HELP)
    p.add_argument(
        "--allow-unstable-paths", action="store_true",
        help="write units even when they would run this tool from /tmp, a home directory or a git checkout "
        "(also UPGRADE_AGENT_ALLOW_UNSTABLE_PATHS=1)",
    )
    p = cmd("upgrade", "upgrade the agent (the supervised flow)")
    p.add_argument("--archive", metavar="SRC", help=_ARCHIVE_HELP + " (with --delta: the fall-back)")
    p.add_argument("--sha256", metavar="HEX", help=_SHA_HELP)
    p.add_argument("--delta", metavar="SRC", help="a zstd patch-from delta against the current binary")
    p.add_argument("--delta-sha256", metavar="HEX", help="the delta's sha256 (required with --delta)")
    p.add_argument(
        "--member-sha256", metavar="HEX",
        help="the rebuilt binary's sha256 (with --delta; without it the delta's frame checksum is required)",
    )
    p.add_argument("--expect-version", metavar="V", help=_EXPECT_HELP)
    p.add_argument("--signature", metavar="SRC", help=_SIG_HELP)
    p.add_argument("--retry-known-bad", action="store_true", help=_RETRY_HELP)
    p.add_argument("--operation", metavar="ID", help=_OPERATION_HELP)
    p.add_argument("--preflight", action="store_true", help="print the plan; fetch nothing, change nothing")
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--stage", action="store_true",
        help="fetch, verify and install into the inactive slot, switch nothing (result staged); see activate",
    )
    when.add_argument(
        "--in-window", action="store_true",
        help="outside the [schedule] maintenance window: stage now (result staged) and let the recovery "
        "timer switch once the window is open; inside it: upgrade at once",
    )
    when.add_argument("--now", action="store_true", help=_NOW_HELP)
    p = cmd("activate", "switch to the candidate upgrade --stage installed, restart, health-check")
    p.add_argument("--operation", metavar="ID", help=_OPERATION_HELP)
    p.add_argument("--now", action="store_true", help=_NOW_HELP)
    p = cmd("rollback", "switch current to last-good as its own episode, restart, health-check")
    p.add_argument(
        "--below-watermark", action="store_true",
        help="roll back even when last-good is below this host's anti-rollback watermark (journaled)",
    )
    p.add_argument("--operation", metavar="ID", help=_OPERATION_HELP)
    p.add_argument("--preflight", action="store_true", help="print the plan; change nothing")
    p = cmd("recover", "replay the journal and finish or roll back an open episode")
    p.add_argument(
        "--trigger", choices=["boot", "on-failure", "manual", "timer"], default="manual",
        help="who started the recovery (journaled); timer acts only when the host lock is free "
        "(default: manual)",
    )
    cmd("status", "show slots, links, service and the open episode (never runs binaries)")
    cmd("history", "list episodes from the journal, newest first")
    p = cmd("journal", "journal maintenance (quarantine: move the journal aside, start anew from the host)")
    p.add_argument(
        "action", choices=["verify", "dump", "compact", "quarantine"],
        help="verify: check every record; dump: print them; compact: seal and drop old episodes; "
        "quarantine: move the journal aside and start anew from what the host shows",
    )
    p = cmd("trust", "anti-rollback state (reset: clear the watermark and the known-bad releases, journaled)")
    p.add_argument("action", choices=["reset"], help="reset: clear the watermark and the known-bad releases")
    p = cmd("host", "the host root (move: a root linked to host.legacy_root becomes a real directory)")
    p.add_argument("action", choices=["move"],
                   help="move: copy the layout into a real host root that takes the link's place atomically")
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
    p = cmd("delta", "make a delta: a zstd frame of NEW against OLD as a raw-content dictionary")
    p.add_argument("action", choices=["make"], help="make: write a zstd patch-from delta of NEW against OLD")
    p.add_argument("--from", dest="old", metavar="OLD", required=True, help="the binary hosts run now")
    p.add_argument("--to", dest="new", metavar="NEW", required=True, help="the target binary")
    p.add_argument("-o", dest="out", metavar="OUT", required=True, help="the delta file to write")
    cmd("demo", "boot a private systemd and walk through install, upgrade, rollback and recovery")
    return parser

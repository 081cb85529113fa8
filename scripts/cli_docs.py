"""The manual page and the bash and zsh completions of ``upgrade-agent``, generated from its own argparse
grammar (:func:`agent.cli.parser.build_parser`) by argparse-manpage and shtab, so they never drift from
``--help``.

Usage: ``python scripts/cli_docs.py PREFIX`` (run by the project venv's Python, which has both tools from the
test extra; ``make cli-docs`` writes into ``build/cli-docs``). Writes, creating the directories:

    PREFIX/share/man/man1/upgrade-agent.1                     man upgrade-agent
    PREFIX/share/bash-completion/completions/upgrade-agent    bash
    PREFIX/share/zsh/site-functions/_upgrade-agent            zsh

Prints each written path on stdout, one a line. Exit 0 written, 2 bad usage. ``make install`` installs them
under its PREFIX, and ``make bundle`` ships them in the runtime archive under ``share/``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROG = "upgrade-agent"
DESCRIPTION = "crash-safe blue/green upgrades of a host daemon's binary"


def generate(prefix: Path) -> list[Path]:
    """Write the man page and the completions under ``prefix`` (see the module doc); returns their paths.

    Raises:
        subprocess.CalledProcessError: argparse-manpage failed (its message went to stderr).
        ImportError: shtab is not installed (the test extra has it).
    """
    sys.path.insert(0, str(ROOT))
    import shtab

    from agent.cli.parser import build_parser, own_version

    man = prefix / "share" / "man" / "man1" / f"{PROG}.1"
    bash = prefix / "share" / "bash-completion" / "completions" / PROG
    zsh = prefix / "share" / "zsh" / "site-functions" / f"_{PROG}"
    for path in (man, bash, zsh):
        path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-c", "import sys; from argparse_manpage.cli import main; sys.exit(main())",
         "--module", "agent.cli.parser", "--function", "build_parser", "--project-name", "upgrade-core",
         "--description", DESCRIPTION,
         "--version", own_version(), "--manual-title", "upgrade-core manual", "--output", str(man)],
        check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    parser = build_parser()
    bash.write_text(shtab.complete(parser, "bash").rstrip("\n") + "\n")
    zsh.write_text(shtab.complete(parser, "zsh").rstrip("\n") + "\n")
    return [man, bash, zsh]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: cli_docs.py PREFIX", file=sys.stderr)
        return 2
    for path in generate(Path(argv[0]).resolve()):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

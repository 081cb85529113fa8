"""The man page and the shell completions generated from the parser (``scripts/cli_docs.py``, ``make
cli-docs``, ``make install``, ``make bundle``): ``man`` renders the page with every command and option, and
bash completes command words and options from the file."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli.parser import build_parser

from ._rig import REPO, SUBPROCESS_TIMEOUT_S


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prefix = tmp_path_factory.mktemp("cli-docs")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "cli_docs.py"), str(prefix)], cwd=REPO,
                          capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        str(prefix / "share/man/man1/upgrade-agent.1"),
        str(prefix / "share/bash-completion/completions/upgrade-agent"),
        str(prefix / "share/zsh/site-functions/_upgrade-agent"),
    ]
    return prefix


def _grammar() -> tuple[list[str], set[str]]:
    """Every command word and every long option of every command."""
    top = build_parser()
    commands: dict[str, argparse.ArgumentParser] = {}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands = dict(action.choices)
    options = {o for p in (top, *commands.values()) for a in p._actions for o in a.option_strings
               if o.startswith("--")}
    return list(commands), options


@pytest.mark.skipif(shutil.which("man") is None, reason="needs man(1)")
def test_man_renders_every_command_and_option(generated: Path) -> None:
    page = generated / "share/man/man1/upgrade-agent.1"
    done = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True, check=False,
                          env={"MANWIDTH": "200", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout=60)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("UPGRADE-AGENT(1)"), text[:200]
    assert "crash-safe blue/green upgrades of a host daemon's binary" in text
    commands, options = _grammar()
    assert [c for c in commands if f"upgrade-agent {c}" not in text] == []
    assert sorted(o for o in options if o not in text) == ["--help"]  # argparse-manpage leaves -h out
    assert "75   busy: another process holds the host lock" in text  # the exit codes of --help


def _complete(generated: Path, *words: str) -> list[str]:
    script = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _shtab_upgrade_agent; '
              'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", script, "complete",
                           str(generated / "share/bash-completion/completions/upgrade-agent"), *words],
                          capture_output=True, text=True, check=True, timeout=60)
    return sorted(line for line in done.stdout.splitlines() if line)


def test_bash_completes_commands_and_their_options(generated: Path) -> None:
    assert _complete(generated, "upgrade-agent", "u") == ["uninstall", "units", "upgrade"]
    assert _complete(generated, "upgrade-agent", "upgrade", "--s") == ["--sha256", "--signature", "--stage"]
    assert _complete(generated, "upgrade-agent", "journal", "") == ["compact", "dump", "quarantine", "verify"]
    assert _complete(generated, "upgrade-agent", "recover", "--trigger", "o") == ["on-failure"]


def test_zsh_completion_defines_its_function(generated: Path) -> None:
    text = (generated / "share/zsh/site-functions/_upgrade-agent").read_text()
    assert text.startswith("#compdef upgrade-agent")
    # zsh itself parses it (the bootstrap installs zsh): a syntax error fails here, not on a user's shell
    subprocess.run(["zsh", "-n", str(generated / "share/zsh/site-functions/_upgrade-agent")], check=True,
                   timeout=30)

"""The command line's conventions: help text for every option of every command, ``--version`` (and
``--version --json``) on all three entry points exiting 0, ``-q`` and ``-v`` refused together."""

from __future__ import annotations

import argparse
import json
import subprocess

import pytest

from agent.cli.parser import build_parser, own_version

from ._rig import PYTHON, REPO, SUBPROCESS_TIMEOUT_S, Rig, cli_env

ENTRY_POINTS = {  # console script -> the function pyproject.toml's [project.scripts] names
    "upgrade-agent": "main",
    "agent-upgrade": "main_upgrade",
    "recover-agent-upgrade": "main_recover",
}


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    top = build_parser()
    found = [("upgrade-agent", top)]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.extend(action.choices.items())
    return found


@pytest.mark.parametrize(("name", "parser"), _parsers(), ids=[name for name, _ in _parsers()])
def test_every_option_has_help_text(name: str, parser: argparse.ArgumentParser) -> None:
    missing = [a.option_strings or [a.dest] for a in parser._actions
               if not isinstance(a, argparse._SubParsersAction) and not a.help]
    assert missing == [], f"{name}: no help for {missing}"


def _run_entry_point(function: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """The console script's own function, as the installed wrapper calls it (``sys.argv`` set)."""
    code = f"import sys; sys.argv = {['x', *argv]!r}; from agent.cli.main import {function}; {function}()"
    return subprocess.run([PYTHON, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, check=False)


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_version_on_every_entry_point_exits_0(script: str) -> None:
    done = _run_entry_point(ENTRY_POINTS[script], "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"upgrade-agent {own_version()}\n", "")
    done = _run_entry_point(ENTRY_POINTS[script], "--version", "--json")
    assert (done.returncode, json.loads(done.stdout), done.stderr) == (0, {"version": own_version()}, "")


def test_quiet_and_verbose_together_are_a_usage_error(rig: Rig) -> None:
    run = rig.cli("status", "-q", "-v", json_out=False)
    assert run.code == 2 and run.stdout == ""
    assert run.error_lines() == ["upgrade-agent: argument -v/--verbose: not allowed with argument -q/--quiet"]

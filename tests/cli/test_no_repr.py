"""No Python repr in any human output (design §7): every command's stdout and stderr, without ``--json``,
on a bare host, on an installed host with a journal of every kind of episode, and for bad configuration
values, is free of ``None``, ``True``, ``False``, ``{'``, ``[]``, ``()`` and tracebacks."""

from __future__ import annotations

import re

import pytest

from ._journals import aborted_episode, committed_episode, write_journal
from ._rig import Rig
from .test_release_memory_cli import rolled_back, signed_commit

_REPR = re.compile(r"\bNone\b|\bTrue\b|\bFalse\b|\{'|\[\]|\(\)|Traceback")

COMMANDS = (
    ["status"], ["history"], ["journal", "verify"], ["journal", "dump"], ["units"], ["host-root"],
    ["upgrade", "--preflight", "--archive", "http://127.0.0.1:9/a.tar.gz"], ["rollback", "--preflight"],
    ["recover"], ["-v", "recover"], ["journal", "compact"], ["--version"], ["recover", "--version"],
)


def _assert_plain(rig: Rig, argv: list[str]) -> None:
    run = rig.cli(*argv, json_out=False)
    for stream, text in (("stdout", run.stdout), ("stderr", run.stderr)):
        found = _REPR.search(text)
        assert found is None, f"{argv}: {stream} shows {found.group()!r}:\n{text}"


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_no_repr_on_a_bare_host(rig: Rig, argv: list[str]) -> None:
    _assert_plain(rig, argv)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_no_repr_on_an_installed_host_with_every_kind_of_episode(installed_rig: Rig, argv: list[str]) -> None:
    rig = installed_rig
    write_journal(rig.state_dir / "journal", [
        ("op-commit", committed_episode("op-commit", rig.name)), ("op-abort", aborted_episode("op-abort")),
        ("op-signed", signed_commit("op-signed", rig.name, 3)),
        ("op-bad", rolled_back("op-bad", rig.name, "4" * 64)),
    ])
    _assert_plain(rig, argv)


@pytest.mark.parametrize(
    "toml",
    ['[health]\nmax_attempts = true\n', '[download]\nallow_http = true\n', '[journal]\nkeep_episodes = []\n',
     '[verify]\ntimeout_s = {a = 1}\n', '[verify]\ntimeout_s = -1.5\n', '[download]\nallow_http = "often"\n'],
    ids=["bool-for-int", "bool-for-choice", "array-for-int", "table-for-number", "negative", "bad-choice"],
)
def test_no_repr_in_configuration_errors(rig: Rig, toml: str) -> None:
    rig.config.write_text(f'[agent]\nname = "{rig.name}"\n\n{toml}')
    run = rig.cli("status", json_out=False)
    assert run.code == 2, run
    [line] = run.stderr.splitlines()
    assert line.startswith(f"upgrade-agent: {rig.config}: ") and "agent.name" not in line, line
    assert _REPR.search(line) is None, line

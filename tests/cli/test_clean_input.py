"""Clean input (docs/cli.md, Output): a configuration that is not UTF-8 is one line and exit 2 on every path,
the boot-time fast path included; ``--version --json`` is one JSON object.

Expected outcomes, written down:

- UTF-16 (with its BOM), Latin-1 with a high byte, a UTF-8 BOM, UTF-16 without a BOM (NUL bytes): exit 2,
  exactly one stderr line ``upgrade-agent: <config path>: ...`` naming the file and what is wrong, no
  traceback, no Python repr; with ``--json`` one object ``{"error", "exit_code": 2}``; ``state_dir`` and
  the lock are not created. Same for ``recover --trigger boot`` (the lean path of agent/cli/fastpath.py),
  ``status`` and ``upgrade --preflight``.
- ``upgrade-agent --version --json`` (and ``--json --version``): exit 0, stdout is exactly
  ``{"version": "<the distribution's version>"}``.
"""

from __future__ import annotations

import base64
import json
from importlib.metadata import version
from pathlib import Path

import pytest

from ._rig import Rig, Run, run_cli

CONFIG = '[agent]\nname = "enc-agent"\n\n[host]\nstate_dir = "{state}"\nlock_path = "{lock}"\n'

ENCODINGS = {
    "utf-16-bom": (lambda t: t.encode("utf-16"), "UTF-16"),
    "utf-16le-no-bom": (lambda t: t.encode("utf-16-le"), "NUL byte"),
    "latin-1": (lambda t: (t + "# café\n").encode("latin-1"), "byte 0xe9"),
    "utf-8-bom": (lambda t: b"\xef\xbb\xbf" + t.encode(), "byte order mark"),
}

COMMANDS = {
    "recover-boot": ("recover", "--trigger", "boot"),
    "recover": ("recover",),
    "status": ("status",),
    "preflight": ("upgrade", "--archive", "/nonexistent.tar.gz", "--preflight"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_config_not_utf8_is_one_line_exit_2(tmp_path: Path, encoding: str, command: str) -> None:
    encode, words = ENCODINGS[encoding]
    state, lock = tmp_path / "state", tmp_path / "run" / "enc.lock"
    config = tmp_path / "enc.toml"
    config.write_bytes(encode(CONFIG.format(state=state, lock=lock)))
    for json_out in (False, True):
        argv = ["--config", str(config), *(["--json"] if json_out else []), *COMMANDS[command]]
        run = run_cli(argv)
        assert run.code == 2, run
        run.assert_clean_stderr()
        (line,) = run.stderr.splitlines()
        assert line.startswith(f"upgrade-agent: {config}: "), line
        assert words in line, line
        assert "b'" not in line and "\\x" not in line and "None" not in line, line
        if json_out:
            assert run.error_payload(2)["error"] == line.removeprefix("upgrade-agent: ")
        else:
            assert run.stdout == ""
    assert not state.exists() and not lock.exists()


IMPORT_TIME = {"PYTHONPROFILEIMPORTTIME": "1"}  # the interpreter lists every module it imports on stderr


def imported(run: Run) -> set[str]:
    """The modules a run imported (``PYTHONPROFILEIMPORTTIME`` lines, ``import time: self | cumulative |
    name``): the boot-time no-op's lean path never imports the full configuration loader,
    ``agent.config.loader``."""
    lines = [line for line in run.stderr.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[1].strip() for line in lines}


def test_plain_utf8_config_still_reaches_the_fast_path(rig: Rig) -> None:
    """The control: the same config in UTF-8 answers the boot-time no-op (exit 0, lock never created, the
    full configuration loader never imported)."""
    run = rig.cli("recover", "--trigger", "boot", env=IMPORT_TIME)
    assert run.code == 0 and run.payload()["result"] == "noop", run
    assert not rig.lock_path.exists()
    assert "agent.config.loader" not in imported(run) and "agent.config.boot" in imported(run)


@pytest.mark.parametrize("argv", [("--version", "--json"), ("--json", "--version")])
def test_version_json_is_one_object(argv: tuple[str, ...]) -> None:
    run = run_cli(list(argv))
    assert run.code == 0, run
    assert json.loads(run.stdout) == {"version": version("upgrade-core")}
    assert run.stdout.count("\n") == 1 and run.stderr == ""


def test_version_human() -> None:
    run = run_cli(["--version"])
    assert run.code == 0 and run.stdout == f"upgrade-agent {version('upgrade-core')}\n", run


def test_a_config_with_operations_still_reaches_the_fast_path(rig: Rig) -> None:
    """``[operations]`` (docs/managed.md) is in the quick reader's schema: a managed host's boot-time no-op
    recovery stays on the lean path (the lock is never created)."""
    spool = rig.base / "spool"
    rig.write_config(f'[operations]\nsource = "spool"\nspool_dir = "{spool}"\nnode_name = "n1"\n')
    run = rig.cli("recover", "--trigger", "boot", env=IMPORT_TIME)
    assert run.code == 0 and run.payload()["result"] == "noop", run
    assert not rig.lock_path.exists()
    assert "agent.config.loader" not in imported(run)


def test_a_bad_operations_section_is_refused_on_the_fast_path_too(rig: Rig) -> None:
    rig.write_config('[operations]\nsource = "spool"\n')
    run = rig.cli("recover", "--trigger", "boot")
    assert run.code == 2 and "operations.spool_dir: is required" in run.stderr, run


def test_a_signed_hosts_config_still_reaches_the_fast_path(rig: Rig) -> None:
    """``[trust]`` (docs/trust.md) is in the quick reader's schema: a host that requires signed releases
    answers its boot-time no-op on the lean path too (the lock is never created); the boot reads no
    signature."""
    key = base64.b64encode(b"Ed" + bytes(range(40))).decode()
    rig.write_config(f'[trust]\nroot_keys = ["{key}"]\nkeyring = "https://keys.example.com/ring"\n')
    run = rig.cli("recover", "--trigger", "boot", env=IMPORT_TIME)
    assert run.code == 0 and run.payload()["result"] == "noop", run
    assert not rig.lock_path.exists()
    assert not {"agent.config.loader", "agent.release.minisign"} & imported(run)


def test_a_bad_trust_section_is_refused_on_the_fast_path_too(rig: Rig) -> None:
    rig.write_config('[trust]\nkeyring = "https://keys.example.com/ring"\n')
    run = rig.cli("recover", "--trigger", "boot")
    assert run.code == 2 and "trust.keyring: needs root_keys" in run.stderr, run

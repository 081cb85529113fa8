"""A temp host root and the real ``upgrade-agent`` CLI run as a subprocess (design §7), without systemd.

Every path the configuration names (host root, ``state_dir``, lock, unit dir) lives under the test's
``tmp_path``; ``host.systemctl_prefix`` is ``/bin/false`` by default, so any systemd call fails loudly
instead of reaching this machine's real services. The scenarios here all end before a restart.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# Variables of the real environment that would change what the CLI does; never inherited by a test run.
_SCRUBBED = ("UPGRADE_AGENT_CONFIG", "UPGRADE_AGENT_TEST_KILL_AFTER")
SUBPROCESS_TIMEOUT_S = 120.0  # a safety net against a hung CLI, not an assertion about speed


@attrs.frozen
class Run:
    """One finished CLI process: exit code, stdout and stderr (text)."""

    argv: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    def payload(self) -> dict[str, Any]:
        """The ONE JSON object on stdout (design §7 ``--json``); fails the test on anything else."""
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, f"expected exactly one JSON line on stdout, got {self.stdout!r} ({self})"
        obj = json.loads(lines[0])
        assert isinstance(obj, dict), f"stdout is JSON but not an object: {lines[0]!r}"
        return obj

    def error_payload(self, code: int) -> dict[str, Any]:
        """The error object of a failed ``--json`` run, checked against design §7 (``error``,
        ``exit_code``)."""
        assert self.code == code, f"exit {self.code}, expected {code}: {self}"
        obj = self.payload()
        assert obj.get("exit_code") == code, obj
        assert isinstance(obj.get("error"), str) and obj["error"], obj
        self.assert_clean_stderr()
        return obj

    def assert_clean_stderr(self) -> None:
        """No traceback for an expected failure (design §7)."""
        assert "Traceback" not in self.stderr, self.stderr
        assert "Traceback" not in self.stdout, self.stdout

    def error_lines(self) -> list[str]:
        """The ``upgrade-agent: ...`` lines on stderr."""
        return [line for line in self.stderr.splitlines() if line.startswith("upgrade-agent: ")]


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI run: this one minus the scrubbed variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env.update(extra or {})
    return env


def run_cli(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Run:
    """``python -m agent.cli.main ARGV`` from the repository root (so the worktree's code is what runs)."""
    done = subprocess.run(
        [PYTHON, "-m", "agent.cli.main", *argv],
        cwd=REPO,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    return Run(tuple(argv), done.returncode, done.stdout, done.stderr)


def snapshot(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every path under ``root``: (kind, mode, sha256 of a file's bytes / a link's target / "")."""
    out: dict[str, tuple[str, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[os.path.relpath(p, root)] = ("link", 0, os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
                out[os.path.relpath(p, root)] = ("file", stat.S_IMODE(st.st_mode), digest)
            else:
                out[os.path.relpath(p, root)] = ("dir", stat.S_IMODE(st.st_mode), "")
    return out


def version_script(version: str) -> bytes:
    """A tiny slot binary: a shell script whose ``version`` command prints ``version``."""
    return f'#!/bin/sh\nif [ "$1" = version ]; then echo {version}; exit 0; fi\nexec sleep 3600\n'.encode()


class Rig:
    """One agent on a temp host: its config file, layout paths, and a CLI runner.

    Args:
        base: an empty temp directory (``tmp_path``).
        name: the agent name (unique per test).
    """

    def __init__(self, base: Path, name: str = "cli-agent") -> None:
        self.base = base
        self.name = name
        self.root = base / "root"
        self.state_dir = base / "state"
        self.journal_dir = self.state_dir / "journal"
        self.lock_path = base / "run" / f"{name}.lock"
        self.unit_dir = base / "units"
        self.config = base / "etc" / f"{name}.toml"
        self.agent_dir = self.root / "lib" / name
        self.write_config()

    # -- configuration ---------------------------------------------------------------------------------
    def config_text(
        self, extra: str = "", systemctl_prefix: Sequence[str] = ("/bin/false",), agent_extra: str = ""
    ) -> str:
        """A config with every path under ``base``; ``extra`` is TOML appended (whole sections),
        ``agent_extra`` lines added to ``[agent]``."""
        prefix = ", ".join(json.dumps(p) for p in systemctl_prefix)
        return (
            f'[agent]\nname = "{self.name}"\nexec_args = ["serve"]\n{agent_extra}\n'
            f'[host]\nroot = "{self.root}"\nstate_dir = "{self.state_dir}"\nlock_path = "{self.lock_path}"\n'
            f'unit_dir = "{self.unit_dir}"\nsystemctl_prefix = [{prefix}]\n\n'
            f"[health]\nstability_s = 0.5\ntimeout_s = 2.0\nmax_attempts = 2\n\n{extra}"
        )

    def write_config(
        self, extra: str = "", systemctl_prefix: Sequence[str] = ("/bin/false",), agent_extra: str = ""
    ) -> Path:
        """(Re)write the config file (see :meth:`config_text`); returns its path."""
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self.config_text(extra, systemctl_prefix, agent_extra))
        return self.config

    # -- running ---------------------------------------------------------------------------------------
    def cli(self, *argv: str, json_out: bool = True, env: Mapping[str, str] | None = None) -> Run:
        """``upgrade-agent --config CONFIG [--json] ARGV``."""
        head = ["--config", str(self.config)] + (["--json"] if json_out else [])
        return run_cli([*head, *argv], env)

    # -- the host ----------------------------------------------------------------------------------------
    def slot(self, slot: str) -> Path:
        """``R/lib/NAME/NAME-<slot>``."""
        return self.agent_dir / f"{self.name}-{slot}"

    def install_by_hand(self, blue: str = "1.0.0", green: str | None = "0.9.0") -> None:
        """The layout of design §3 as ``install`` leaves it, made by hand: blue (and an older green) slot,
        ``current`` and ``last-good`` naming blue by bare relative targets, ``R/bin/NAME``, and unit files.
        """
        self.agent_dir.mkdir(parents=True)
        for slot, version in (("blue", blue), ("green", green)):
            if version is not None:
                self.slot(slot).write_bytes(version_script(version))
                self.slot(slot).chmod(0o755)
        os.symlink(f"{self.name}-blue", self.agent_dir / f"{self.name}-current")
        os.symlink(f"{self.name}-blue", self.agent_dir / f"{self.name}-last-good")
        (self.root / "bin").mkdir()
        os.symlink(f"../lib/{self.name}/{self.name}-current", self.root / "bin" / self.name)
        self.unit_dir.mkdir()
        for name, text in self.rendered_units().items():  # as install writes them: no drift to repair
            (self.unit_dir / name).write_text(text)

    def rendered_units(self) -> dict[str, str]:
        """The unit files this configuration renders (what ``install`` writes), file name -> text."""
        from agent.session.session import Session

        return Session.load(str(self.config)).units()

    def host_facts(self) -> dict[str, Any]:
        """What must not change when an upgrade is refused: both links, both slots (sha256 and mode),
        every entry of the agent directory (no staging leftovers), ``R/bin`` and the unit dir."""
        return {
            "current": os.readlink(self.agent_dir / f"{self.name}-current"),
            "last_good": os.readlink(self.agent_dir / f"{self.name}-last-good"),
            "agent_dir": snapshot(self.agent_dir),
            "bin": snapshot(self.root / "bin"),
            "units": snapshot(self.unit_dir),
        }

    def staging_leftovers(self) -> list[str]:
        """Names of ``.NAME-<slot>.stage-<hex>`` files in the agent directory."""
        return sorted(n for n in os.listdir(self.agent_dir) if n.startswith(f".{self.name}-"))

    def state_bytes(self) -> bytes:
        """Every byte of every file under ``state_dir`` (journal segments, results), concatenated."""
        chunks = []
        for dirpath, _dirs, files in os.walk(self.state_dir):
            for n in sorted(files):
                chunks.append(Path(dirpath, n).read_bytes())
        return b"".join(chunks)

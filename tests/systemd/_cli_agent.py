"""Drive the real ``upgrade-agent`` CLI against the session's private systemd (shared by the crash tests).

An :class:`CliAgent` is one agent as an operator would run it: a config file (unique NAME, host root,
state_dir and lock under the test's directory, units in the sandbox), the CLI run as a subprocess from this
worktree, and read-only views of what the host shows afterwards: the journal (replayed with
:data:`upgrade_core.EVENT_CODEC`), the published result files, the slot links and the unit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from agent.testing.sandbox import PrivateSystemd, agent_config_toml, free_port
from journal import replay
from upgrade_core import EVENT_CODEC, Recorded

WORKTREE = Path(__file__).resolve().parents[2]
KILL_ENV = "UPGRADE_AGENT_TEST_KILL_AFTER"


def sha256_path(path: Path) -> str:
    """sha256 of a file's bytes, 64 lowercase hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@attrs.define
class CliAgent:
    """One agent installed and upgraded through the real CLI.

    Attributes:
        sandbox: the private systemd the units live in.
        name: ``agent.name`` (unique per agent).
        base: this agent's directory (host root ``base/root``, ``base/state``, ``base/run``).
        config: the TOML config path.
        port: the agent's loopback HTTP port (its ``/healthz`` is the health probe).
    """

    sandbox: PrivateSystemd
    name: str
    base: Path
    config: Path
    port: int

    @classmethod
    def create(
        cls,
        sandbox: PrivateSystemd,
        base: Path,
        *,
        prefix: str,
        member: str,
        exec_args: Sequence[str] | None = None,
        stability_s: float = 0.3,
        timeout_s: float = 6.0,
        max_attempts: int = 2,
    ) -> CliAgent:
        """Write a fresh config for a uniquely named agent under ``base`` (nothing installed yet).

        Args:
            prefix: the name's prefix; a random suffix makes it unique in the shared sandbox.
            member: the archive member path (fixed, so one set of release archives serves every agent).
            exec_args: ``agent.exec_args``; ``{config}`` and ``{port}`` are substituted. Default
                ``["serve", "--port", PORT]``.
            stability_s, timeout_s, max_attempts: the ``[health]`` keys (seconds, seconds, count).
        """
        name = f"{prefix}-{secrets.token_hex(3)}"
        base.mkdir(parents=True, exist_ok=True)
        enter = sandbox.write_prefix_script(base / "in-sandbox")
        # What runs inside units imports the project from the venv's editable install (/work/main); point
        # it at this worktree instead, so the recovery units and the self-upgrading daemon run the code
        # under test. Drop-ins, so the unit files stay exactly as the CLI renders them.
        for unit in (f"{name}.service", f"{name}-recover.service", f"{name}-recover-boot.service",
                     f"{name}-recover-timer.service"):
            dropin = sandbox.unit_dir / f"{unit}.d"
            dropin.mkdir(exist_ok=True)
            (dropin / "worktree.conf").write_text(f"[Service]\nEnvironment=PYTHONPATH={WORKTREE}\n")
        port = free_port()
        config = base / f"{name}.toml"
        args = [a.format(config=config, port=port) for a in (exec_args or ["serve", "--port", "{port}"])]
        config.write_text(
            agent_config_toml(
                name=name,
                root=base / "root",
                state_dir=base / "state",
                lock_path=base / "run" / f"{name}.lock",
                unit_dir=sandbox.unit_dir,
                systemctl_prefix=[str(enter)],
                port=port,
                exec_args=args,
                member=member,
                stability_s=stability_s,
                timeout_s=timeout_s,
                max_attempts=max_attempts,
            )
        )
        return cls(sandbox, name, base, config, port)

    # -- the CLI -------------------------------------------------------------------------------------
    def cli(
        self, *argv: str, env: dict[str, str] | None = None, timeout_s: float = 90.0
    ) -> subprocess.CompletedProcess[str]:
        """``python -m agent.cli.main --config CFG --json ARGV`` from this worktree; never raises on exit."""
        return subprocess.run(
            [sys.executable, "-m", "agent.cli.main", "--config", str(self.config), "--json", *argv],
            cwd=WORKTREE, env={**os.environ, **(env or {})}, capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )

    def recover(self, trigger: str = "manual", env: dict[str, str] | None = None,
                deadline_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``recover --trigger T``; while another process holds the lock (exit 75) retry every 0.1 s.

        An ``OnFailure=`` recovery started by systemd may own the episode; design §4.5 says the holder
        owns it, so waiting for it to let go and then recovering again is what an operator would do.
        """
        deadline = time.monotonic() + deadline_s
        while True:
            done = self.cli("recover", "--trigger", trigger, env=env)
            if done.returncode != 75 or time.monotonic() > deadline:
                return done
            time.sleep(0.1)

    # -- what the host shows -------------------------------------------------------------------------
    @property
    def lib(self) -> Path:
        """``R/lib/NAME``."""
        return self.base / "root" / "lib" / self.name

    @property
    def unit(self) -> str:
        """The agent's unit name."""
        return f"{self.name}.service"

    def link(self, which: str) -> str | None:
        """The bare target of ``NAME-current`` / ``NAME-last-good`` (``"NAME-blue"``), or None."""
        try:
            return os.readlink(self.lib / f"{self.name}-{which}")
        except FileNotFoundError:
            return None

    def slot_sha(self, which: str) -> str | None:
        """sha256 of the slot the link ``which`` resolves to (None when it dangles or is missing)."""
        path = self.lib / f"{self.name}-{which}"
        return sha256_path(path) if path.exists() else None

    def records(self) -> list[Recorded]:
        """Every durable record of the journal, in sequence order (a read-only replay).

        The test reads without the host lock, so a segment the running agent compacts away between the
        replay's listing and its open is missing (FileNotFoundError, seen in CI while a self-upgrade ran);
        the replay is then read again, at most 20 times."""
        for _ in range(19):
            with contextlib.suppress(FileNotFoundError):
                return list(replay(str(self.base / "state" / "journal"), EVENT_CODEC).records)
            time.sleep(0.05)
        return list(replay(str(self.base / "state" / "journal"), EVENT_CODEC).records)

    def episode(self, operation: str) -> list[Recorded]:
        """The records of one episode."""
        return [r for r in self.records() if r.episode_id == operation]

    def open_episodes(self) -> list[str]:
        """Episodes with an ``EpisodeOpened`` but no ``EpisodeClosed``."""
        opened: dict[str, None] = {}
        for r in self.records():
            tag = type(r.event).TAG
            if tag == "EpisodeOpened":
                opened[r.episode_id] = None
            elif tag == "EpisodeClosed":
                opened.pop(r.episode_id, None)
        return list(opened)

    def result_file(self, operation: str) -> dict[str, Any] | None:
        """``state_dir/results/<operation>.json`` parsed, or None when absent."""
        path = self.base / "state" / "results" / f"{operation}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def service(self) -> dict[str, str]:
        """``systemctl show`` of the agent unit (ActiveState, SubState, MainPID, NRestarts)."""
        out = self.sandbox.run(
            "systemctl", "show", self.unit, "-p", "ActiveState,SubState,MainPID,NRestarts"
        ).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def main_cmdline(self, pid: str) -> list[str]:
        """``/proc/PID/cmdline`` inside the sandbox's PID namespace, split on NUL."""
        done = self.sandbox.run("cat", f"/proc/{pid}/cmdline", check=False)
        return [a for a in done.stdout.split("\0") if a]

    def served_version(self) -> str | None:
        """The version the agent answers on ``/healthz`` (``"ok 1.0.0"`` -> ``"1.0.0"``), None if down."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode()
        except OSError:
            return None
        parts = text.split()
        return parts[1] if len(parts) >= 2 else None

    def teardown(self) -> None:
        """``uninstall`` by the CLI (units, links, state), then the drop-ins; units by hand if it fails."""
        done = self.cli("uninstall", timeout_s=60)
        if done.returncode != 0:
            mine = sorted(p.name for p in self.sandbox.unit_dir.iterdir() if p.name.startswith(self.name))
            for unit in mine:
                self.sandbox.run("systemctl", "stop", unit, check=False)
                (self.sandbox.unit_dir / unit).unlink(missing_ok=True)
            self.sandbox.run("systemctl", "daemon-reload", check=False)
        for dropin in self.sandbox.unit_dir.glob(f"{self.name}*.service.d"):
            (dropin / "worktree.conf").unlink(missing_ok=True)
            dropin.rmdir()
        self.sandbox.run("systemctl", "reset-failed", check=False)


def tags_with_occurrence(records: Sequence[Recorded]) -> Iterator[tuple[str, int]]:
    """``(TAG, N)`` per record: N counts that tag's occurrences so far (1-based), as the hook's ``TAG#N``."""
    seen: dict[str, int] = {}
    for r in records:
        tag = type(r.event).TAG
        seen[tag] = seen.get(tag, 0) + 1
        yield tag, seen[tag]

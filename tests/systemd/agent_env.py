"""One sample agent driven through the real CLI under the session's private systemd (design §7, design §8).

:class:`AgentEnv` builds a configuration for one uniquely named agent whose host root, ``state_dir`` and
lock live under the test's ``tmp_path``, builds its releases with
:func:`agent.testing.releases.build_release`,
serves them over loopback HTTP (:class:`ReleaseServer`, which also records every request path so a test can
prove that nothing was fetched), and runs ``python -m agent.cli.main --config CFG --json ...`` as a
subprocess, returning ``(exit code, the one JSON object, stderr)`` as a :class:`Cli`.

Two ways to place the CLI (both real, neither mocked):

- ``inside=False`` (the ``make demo`` set-up): the CLI runs on the host and reaches the sandbox through
  ``host.systemctl_prefix`` = the sandbox's ``nsenter`` prefix.
- ``inside=True``: the CLI runs inside the sandbox's namespaces (``nsenter`` in front of the interpreter,
  ``host.systemctl_prefix = []``), as on a real host. Units the sandbox starts by itself
  (``OnFailure=`` -> ``NAME-recover.service``, a handed-off ``recover --trigger manual``) read the same
  configuration, so only this placement lets them work: from inside, the host's PID in the ``nsenter``
  prefix names no process.

The worktree's code is imported (``PYTHONPATH``); units started by systemd run ``recover-agent-upgrade``
beside ``sys.executable``, i.e. the installed project.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from agent.config.boot import machine_arch
from agent.testing.releases import ReleaseServer, agent_script, build_release, sha256_file
from agent.testing.sandbox import PrivateSystemd, agent_config_toml, free_port

WORKTREE = str(Path(__file__).resolve().parents[2])
CLI_TIMEOUT_S = 120.0


@attrs.frozen
class Cli:
    """One CLI run.

    Attributes:
        code: the exit status (negative: killed by that signal).
        json: the single JSON object printed on stdout (None when stdout held none, e.g. SIGKILL).
        stderr: everything written to stderr.
        stdout: raw stdout.
    """

    code: int
    json: dict[str, Any] | None
    stderr: str
    stdout: str


@attrs.frozen
class Release:
    """A built release archive: its URL, its sha256, the member's bytes and their sha256."""

    version: str
    behaviour: str
    path: Path
    url: str
    sha256: str
    member_sha256: str


def poll(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 50 ms; fail the test after ``timeout_s`` seconds naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def tree(top: Path) -> dict[str, str]:
    """Every path under ``top`` (relative) -> its kind: ``dir``, ``file:<sha256>``, ``link:<target>``."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(top))
            if p.is_symlink():
                out[rel] = f"link:{os.readlink(p)}"
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = "file:" + hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@attrs.define
class AgentEnv:
    """One test's agent: its configuration, releases, CLI runner and observations of the real host.

    Attributes:
        sandbox: the session's private systemd.
        server: the session's release server.
        work: the test's directory (``tmp_path``); every path the agent may write is under it.
        name: ``agent.name`` (unique per test).
        port: the sample agent's ``/healthz`` port.
        inside: the CLI runs inside the sandbox (see module docstring).
        config: the configuration file.
        root: ``host.root`` (absent until install).
        state_dir: ``host.state_dir`` (absent until install; its parent exists).
        lock_path: ``host.lock_path`` (absent until install; its parent exists).
    """

    sandbox: PrivateSystemd
    server: ReleaseServer
    work: Path
    name: str
    port: int
    inside: bool
    config: Path
    root: Path
    state_dir: Path
    lock_path: Path
    program: tuple[str, ...] | None = None
    """The ``upgrade-agent`` to run instead of ``python -m agent.cli.main``: e.g. the runtime bundle's
    executable (``tests/bundle.py``); then no ``PYTHONPATH`` is passed and the units name the
    ``recover-agent-upgrade`` beside it."""

    @classmethod
    def create(
        cls,
        sandbox: PrivateSystemd,
        server: ReleaseServer,
        work: Path,
        *,
        inside: bool = False,
        stability_s: float = 0.5,
        timeout_s: float = 10.0,
        max_attempts: int = 2,
        name: str | None = None,
        extra_config: str = "",
        program: tuple[str, ...] | None = None,
        systemctl_prefix: list[str] | None = None,
        socket: bool = False,
    ) -> AgentEnv:
        """Write the configuration (nothing else is created: root, state_dir and the lock are absent).

        Args:
            name: ``agent.name``; default a fresh ``cli-<hex>``. Several hosts of one fleet (each its own
                sandbox and ``work``) share one name, as the hosts of a real fleet do.
            extra_config: TOML appended to the configuration (e.g. a ``[trust]`` section).
            program: see the attribute.
            systemctl_prefix: ``host.systemctl_prefix``; default the placement's (the sandbox's ``nsenter``
                prefix, or none inside). A test puts a wrapper in front of it to answer one command as a
                host would (e.g. a refused ``reset-failed``).
            socket: ``[agent] socket = "127.0.0.1:PORT"``: ``NAME.socket`` listens on the agent's port and
                hands it to the agent (design §11).
        """
        name = name or f"cli-{secrets.token_hex(4)}"
        port = free_port()
        (work / "var").mkdir(exist_ok=True)
        (work / "run").mkdir(exist_ok=True)
        root, state_dir, lock_path = work / "root", work / "var" / name, work / "run" / f"{name}.lock"
        prefix = systemctl_prefix if systemctl_prefix is not None else [] if inside else list(sandbox.prefix)
        config = work / f"{name}.toml"
        config.write_text(
            agent_config_toml(
                name=name,
                root=root,
                state_dir=state_dir,
                lock_path=lock_path,
                unit_dir=sandbox.unit_dir,
                systemctl_prefix=prefix,
                port=port,
                stability_s=stability_s,
                timeout_s=timeout_s,
                max_attempts=max_attempts,
                socket=f"127.0.0.1:{port}" if socket else "",
            )
            + (f"\n{extra_config}" if extra_config else "")
        )
        return cls(sandbox, server, work, name, port, inside, config, root, state_dir, lock_path, program)

    # -- releases and the CLI ----------------------------------------------------------------------------
    def release(self, version: str, behaviour: str = "good") -> Release:
        """Build ``version`` with the sample agent's ``behaviour`` into the served directory; describe it."""
        arch = machine_arch()
        assert arch is not None, f"unsupported machine {os.uname().machine}"
        tag = behaviour.replace(":", "-")
        out = self.server.directory / f"{self.name}-{tag}"
        path = build_release(out, version, behaviour, name=self.name, arch=arch)
        member = hashlib.sha256(agent_script(version, behaviour)).hexdigest()
        url = f"{self.server.base}/{out.name}/{path.name}"
        return Release(version, behaviour, path, url, sha256_file(path), member)

    def argv(self, *args: str) -> list[str]:
        """The full command line of ``upgrade-agent --config CFG --json ARGS``."""
        head = list(self.program) if self.program else [sys.executable, "-m", "agent.cli.main"]
        cmd = [*head, "--config", str(self.config), "--json", *args]
        return [*self.sandbox.prefix, *cmd] if self.inside else cmd

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The CLI's environment: this worktree's code first (a ``program`` gets no Python variables)."""
        if self.program:
            base = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
            return {**base, **(extra or {})}
        return {**os.environ, "PYTHONPATH": WORKTREE, **(extra or {})}

    def cli(self, *args: str, env: dict[str, str] | None = None) -> Cli:
        """Run the CLI to its end; parse its single JSON object from stdout."""
        done = subprocess.run(
            self.argv(*args), capture_output=True, text=True, env=self.env(env), cwd=WORKTREE,
            timeout=CLI_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
        )
        lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
        doc = json.loads(lines[-1]) if lines else None
        assert len(lines) <= 1, f"--json printed more than one line: {done.stdout!r}"
        return Cli(done.returncode, doc, done.stderr, done.stdout)

    def install(self, rel: Release) -> Cli:
        """``install --archive URL --sha256 HEX --expect-version V``; asserts it committed."""
        out = self.cli("install", "--archive", rel.url, "--sha256", rel.sha256,
                       "--expect-version", rel.version)
        assert out.code == 0, out.stderr
        assert out.json is not None and out.json["result"] == "committed", out
        return out

    def upgrade(self, rel: Release, operation: str, env: dict[str, str] | None = None) -> Cli:
        """``upgrade --archive URL --sha256 HEX --operation OP``."""
        return self.cli("upgrade", "--archive", rel.url, "--sha256", rel.sha256, "--operation", operation,
                        env=env)

    # -- observations --------------------------------------------------------------------------------------
    @property
    def lib(self) -> Path:
        """``R/lib/NAME``."""
        return self.root / "lib" / self.name

    @property
    def unit(self) -> str:
        """``NAME.service``."""
        return f"{self.name}.service"

    def link(self, which: str) -> str:
        """The bare target of ``NAME-current`` or ``NAME-last-good`` (``os.readlink``)."""
        return os.readlink(self.lib / f"{self.name}-{which}")

    def slot_sha256(self, slot: str) -> str:
        """sha256 of the slot file."""
        return hashlib.sha256((self.lib / f"{self.name}-{slot}").read_bytes()).hexdigest()

    def show(self, unit: str | None = None, *props: str) -> dict[str, str]:
        """``systemctl show`` of a unit inside the sandbox."""
        names = props or ("ActiveState", "SubState", "MainPID", "Result", "NRestarts", "LoadState")
        out = self.sandbox.run("systemctl", "show", unit or self.unit, "-p", ",".join(names)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def main_process(self) -> tuple[int, str, list[str]]:
        """The unit's MainPID, its ``/proc/PID/exe`` and argv (read in the sandbox's pid namespace)."""
        pid = int(self.show(None, "MainPID")["MainPID"])
        assert pid > 0, f"{self.unit} has no main process: {self.show()}"
        exe = self.sandbox.run("readlink", f"/proc/{pid}/exe").stdout.strip()
        raw = self.sandbox.run("cat", f"/proc/{pid}/cmdline").stdout
        return pid, exe, [part for part in raw.split("\0") if part]

    def assert_running(self, slot: str, rel: Release) -> int:
        """The unit is active/running; its MainPID runs the current link, which resolves to ``slot``,
        whose bytes are ``rel``'s member; ``/healthz`` answers with ``rel``'s version. Returns the MainPID."""
        state = self.show()
        assert (state["ActiveState"], state["SubState"]) == ("active", "running"), state
        pid, exe, argv = self.main_process()
        assert os.path.basename(exe).startswith("python"), exe  # an interpreted agent's exe: its interpreter
        assert argv[1] == str(self.lib / f"{self.name}-current"), argv
        assert self.link("current") == f"{self.name}-{slot}"
        assert self.slot_sha256(slot) == rel.member_sha256
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as resp:
            assert resp.read().decode().split() == ["ok", rel.version]
        return pid

    def result_file(self, operation: str) -> dict[str, Any] | None:
        """``state_dir/results/<operation>.json``, parsed; None when absent."""
        path = self.state_dir / "results" / f"{operation}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def journal(self) -> list[dict[str, Any]]:
        """Every journal record (``journal dump --json``): ``seq``, ``episode``, ``time``, ``event``."""
        out = self.cli("journal", "dump")
        assert out.code == 0 and out.json is not None, out
        records: list[dict[str, Any]] = out.json["records"]
        return records

    def events(self, operation: str) -> list[str]:
        """The event types journaled for ``operation``, in sequence order."""
        return [r["event"]["_type"] for r in self.journal() if r["episode"] == operation]

    def published_seq(self, operation: str) -> int:
        """The sequence number of ``operation``'s one ``ResultPublished`` record (asserts there is one)."""
        seqs = [r["seq"] for r in self.journal()
                if r["episode"] == operation and r["event"]["_type"] == "ResultPublished"]
        assert len(seqs) == 1, seqs
        return int(seqs[0])

    def kill_points(self, operation: str) -> list[str]:
        """``TAG#N`` for every record of ``operation``'s episode as the journal holds them (the crash hook's
        values, agent/session/wiring.py), preceded by the operator's point after its ``InProgress`` status and
        followed by the one after its terminal status."""
        seen: dict[str, int] = {}
        points = []
        for tag in self.events(operation):
            seen[tag] = seen.get(tag, 0) + 1
            points.append(f"{tag}#{seen[tag]}")
        return ["operator-InProgress", *points, "operator-terminal"]

    def units_present(self) -> list[str]:
        """Every file or link in the sandbox's unit directory (recursively) that names this agent."""
        return sorted(k for k in tree(self.sandbox.unit_dir) if self.name in k)

    def teardown(self) -> None:
        """Best effort: ``uninstall``, then stop and remove anything of this agent still in the sandbox."""
        subprocess.run(self.argv("uninstall"), capture_output=True, env=self.env(), cwd=WORKTREE,
                       timeout=CLI_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
        listed = self.sandbox.run("systemctl", "list-units", "--all", "--plain", "--no-legend",
                                  f"{self.name}*", check=False).stdout
        for line in listed.splitlines():
            unit = line.split()[0] if line.split() else ""
            if unit:
                self.sandbox.run("systemctl", "stop", unit, check=False)
        for path in sorted(self.sandbox.unit_dir.rglob(f"{self.name}*")):
            path.unlink(missing_ok=True)
        self.sandbox.run("systemctl", "daemon-reload", check=False)
        self.sandbox.run("systemctl", "reset-failed", check=False)


@pytest.fixture(scope="session")
def release_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReleaseServer]:
    """The session's loopback release server."""
    server = ReleaseServer(tmp_path_factory.mktemp("releases"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def make_env(
    sandbox: PrivateSystemd, release_server: ReleaseServer, tmp_path: Path
) -> Iterator[Callable[..., AgentEnv]]:
    """``make_env(inside=False, stability_s=0.5, timeout_s=10.0, max_attempts=2) -> AgentEnv``; torn down
    afterwards."""
    made: list[AgentEnv] = []

    def make(**kwargs: Any) -> AgentEnv:
        env = AgentEnv.create(sandbox, release_server, tmp_path, **kwargs)
        made.append(env)
        return env

    try:
        yield make
    finally:
        for env in made:
            env.teardown()

"""A fleet of real hosts on this machine for the ``upgrade_core.fleet`` Ansible collection (docs/managed.md).

Each host is its own private systemd (:class:`~agent.testing.sandbox.PrivateSystemd`) with its own host
root, ``state_dir``, lock and agent port, driven like a real host: the agent's CLI runs *inside* the
sandbox's namespaces (:class:`~tests.systemd.agent_env.AgentEnv` with ``inside=True``), and Ansible
reaches it through the collection's ``upgrade_core.fleet.nsenter`` connection (``nsenter -t PID -m -p -u
-i``), so every module runs in the host's own mount table, ``/run`` and process tree. All hosts share the
agent name (one release, one signature, as in a real fleet).

The collection is built with the real ``ansible-galaxy collection build`` and installed offline into a
private collections path; ``ansible-playbook`` runs as a subprocess with a bounded timeout, with its
configuration, home and temporary files under the test's directory (never ``~/.ansible``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from .agent_env import WORKTREE, AgentEnv

COLLECTION_SRC = Path(WORKTREE) / "ansible" / "ansible_collections" / "upgrade_core" / "fleet"
BIN = Path(sys.executable).parent
# upgrade-agent of the environment running the tests (the project's .venv: this checkout, editable)
AGENT_EXE = BIN / "upgrade-agent"
GALAXY_TIMEOUT_S = 120.0
PLAYBOOK_TIMEOUT_S = 300.0
_RECAP = re.compile(r"^(\S+)\s*:\s*((?:\w+=\d+\s*)+)$")


@attrs.frozen
class Play:
    """One finished ``ansible-playbook`` run.

    Attributes:
        code: its exit status (0 ok, 2 a host failed, 4 unreachable, ...).
        stdout, stderr: its output.
        recap: the PLAY RECAP counters per host (``ok``, ``changed``, ``failed``, ...), as printed.
        summary: the rollout summary JSON file, parsed (None when the play wrote none).
    """

    code: int
    stdout: str
    stderr: str
    recap: dict[str, dict[str, int]]
    summary: dict[str, Any] | None

    def summary_by_host(self) -> dict[str, dict[str, Any]]:
        """The summary's host entries keyed by inventory name."""
        assert self.summary is not None, f"no summary written:\n{self.stdout[-3000:]}\n{self.stderr[-2000:]}"
        return {entry["host"]: entry for entry in self.summary["hosts"]}


def parse_recap(stdout: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP lines of ``ansible-playbook``'s default output: host -> counter -> value."""
    recap: dict[str, dict[str, int]] = {}
    lines = stdout.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("PLAY RECAP")), len(lines))
    for line in lines[start + 1:]:
        m = _RECAP.match(line.strip())
        if m:
            recap[m.group(1)] = {k: int(v) for k, v in (kv.split("=") for kv in m.group(2).split())}
    return recap


def ansible_env(home: Path) -> dict[str, str]:
    """Environment for the Ansible programs: this environment's bin first, config and state under ``home``."""
    return {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_CONFIG": str(home / "ansible.cfg"),
        "ANSIBLE_HOME": str(home),
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PYTHONPATH": WORKTREE,
    }


def build_collection(home: Path) -> Path:
    """``ansible-galaxy collection build`` the repository's collection, then install the tarball offline into
    ``home/collections`` with ``ansible.cfg`` naming it. Returns the tarball's path."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "tmp").mkdir(exist_ok=True)
    (home / "ansible.cfg").write_text(
        "[defaults]\n"
        f"collections_path = {home / 'collections'}\n"
        "forks = 8\n"
        "retry_files_enabled = false\n"
        "host_key_checking = false\n"
        "interpreter_python = auto_silent\n"
        f"remote_tmp = {home / 'remote-tmp'}\n"
        "[connection]\n"
        "pipelining = true\n"
    )
    env = ansible_env(home)
    out = home / "dist"
    run([str(BIN / "ansible-galaxy"), "collection", "build", str(COLLECTION_SRC), "--output-path", str(out)],
        env, GALAXY_TIMEOUT_S)
    tarballs = sorted(out.glob("upgrade_core-fleet-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", str(tarballs[0]),
         "-p", str(home / "collections")], env, GALAXY_TIMEOUT_S)
    return tarballs[0]


def run_bounded(argv: list[str], env: dict[str, str], timeout_s: float, cwd: str | Path = WORKTREE
                ) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a session of its own; after ``timeout_s`` seconds kill that whole process group
    (Ansible's workers with it) and fail the test naming the command. Returns the finished process."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(argv[:3])} ... did not finish within {timeout_s} s:\n"
                    f"{out[-3000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run(argv: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """:func:`run_bounded`, failing the test naming the output when ``argv`` exits non-zero."""
    done = run_bounded(argv, env, timeout_s)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def host_vars(env: AgentEnv) -> dict[str, Any]:
    """One host's inventory variables: ``upgrade_core.fleet.nsenter`` into its sandbox's PID 1 (and only
    while that PID is still in the sandbox's pid namespace), this environment's Python for the modules, and
    the agent's configuration as ``rollout_config``."""
    return {
        "ansible_connection": "upgrade_core.fleet.nsenter",
        "ansible_nsenter_pid": env.sandbox.pid,
        "ansible_nsenter_namespace": env.sandbox.pidns,
        "ansible_python_interpreter": sys.executable,
        "rollout_config": str(env.config),
    }


@attrs.define
class Fleet:
    """Hosts ``host0`` .. ``hostN-1`` in inventory order, each an :class:`AgentEnv` in its own sandbox.

    Attributes:
        hosts: inventory name -> the host's agent (its ``sandbox`` is that host's private systemd).
        home: the Ansible configuration, home and collections directory (see :func:`build_collection`).
        inventory: the YAML inventory file.
    """

    hosts: dict[str, AgentEnv]
    home: Path
    inventory: Path

    @classmethod
    def create(cls, hosts: dict[str, AgentEnv], home: Path) -> Fleet:
        """Write the inventory (see :func:`host_vars`)."""
        inventory = home / "inventory.json"
        inventory.write_text(json.dumps({"all": {"hosts": {
            name: host_vars(env) for name, env in hosts.items()}}}, indent=1))
        return cls(hosts, home, inventory)

    def playbook(self, extra_vars: dict[str, Any], *args: str, summary: Path | None = None,
                 inventory: Path | None = None) -> Play:
        """``ansible-playbook -i INVENTORY upgrade_core.fleet.rollout -e JSON ARGS`` (bounded), with the
        summary written to ``summary`` (default ``home/summary-<n>.json``, a fresh name per run).

        Args:
            inventory: another inventory file (default the fleet's).
        """
        inventory = inventory or self.inventory
        if summary is None:
            summary = self.home / f"summary-{len(list(self.home.glob('summary-*.json')))}.json"
        summary.unlink(missing_ok=True)
        variables = {"rollout_executable": str(AGENT_EXE), "rollout_summary_path": str(summary), **extra_vars}
        argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), "upgrade_core.fleet.rollout",
                "-e", json.dumps(variables), *args]
        done = run_bounded(argv, ansible_env(self.home), PLAYBOOK_TIMEOUT_S, cwd=inventory.parent)
        doc = json.loads(summary.read_text()) if summary.exists() else None
        return Play(done.returncode, done.stdout, done.stderr, parse_recap(done.stdout), doc)

    def adhoc(self, host: str, module: str, args: dict[str, str]) -> tuple[int, str, dict[str, Any]]:
        """``ansible HOST -m MODULE -a 'k=v ...' -o`` (bounded): its exit status, the host's state word
        (``SUCCESS``, ``CHANGED``, ``FAILED!``) and its result object, parsed from the one-line output."""
        kv = " ".join(f"{k}={v}" for k, v in args.items())
        argv = [str(BIN / "ansible"), host, "-i", str(self.inventory), "-m", module, "-a", kv, "-o"]
        done = run_bounded(argv, ansible_env(self.home), PLAYBOOK_TIMEOUT_S, cwd=self.home)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith(f"{host} | ")), None)
        assert line is not None and "=> " in line, f"no result line for {host}:\n{done.stdout}\n{done.stderr}"
        head, body = line.split(" => ", 1)
        return done.returncode, head.split(" | ", 1)[1].strip(), json.loads(body)


def start_ticks(env: AgentEnv, pid: int) -> int:
    """When process ``pid`` of ``env``'s host started, in clock ticks since boot (``/proc/PID/stat`` field
    22; one clock for every pid namespace of this machine, so hosts can be ordered by it)."""
    stat = env.sandbox.run("cat", f"/proc/{pid}/stat").stdout
    return int(stat.rsplit(")", 1)[1].split()[19])

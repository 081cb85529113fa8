"""``[[mirrors]] active_from`` under the private systemd, through the CLI (docs/configuration.md
``[[mirrors]]``): two machine roots (``kube1``, ``kube2``, as the seeds' nspawn machines), a state file the
host switches between upgrades, and a rollback that re-syncs the machine active at the rollback. What is
asserted is read from the machine trees and the running unit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.fs import durable

from . import agent_env
from .agent_env import AgentEnv

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server


def _activate(state: Path, machine: Path) -> None:
    doc = {"machines": {"active": {"root": str(machine)}}}
    durable.atomic_write_bytes(str(state), json.dumps(doc).encode())


def _sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def test_the_mirror_follows_the_active_machine_and_the_rollback(
    make_env: Callable[..., AgentEnv], tmp_path: Path
) -> None:
    kube1, kube2 = tmp_path / "machines" / "kube1", tmp_path / "machines" / "kube2"
    for machine in (kube1, kube2):
        (machine / "usr" / "local" / "bin").mkdir(parents=True)
    state = tmp_path / "hoststate" / "daemon.json"
    state.parent.mkdir()
    _activate(state, kube1)
    env = make_env(extra_config=(
        f'[[mirrors]]\npath = "usr/local/bin/{{name}}"\nactive_from = "{state}"\n'
        'active_key = "/machines/active/root"\n'))
    in1, in2 = kube1 / "usr" / "local" / "bin" / env.name, kube2 / "usr" / "local" / "bin" / env.name
    v1, v2, bad = env.release("1.0.0"), env.release("1.1.0"), env.release("2.0.0", "exit-after:0.3")

    env.install(v1)
    assert _sha(in1) == v1.member_sha256 and _sha(in2) is None

    _activate(state, kube2)  # the host moved to its other machine between two upgrades
    out = env.upgrade(v2, "up2")
    assert out.code == 0 and out.json is not None and out.json["result"] == "committed", out
    env.assert_running("green", v2)
    assert _sha(in2) == v2.member_sha256
    assert _sha(in1) == v1.member_sha256  # the machine no longer active keeps what it had

    _activate(state, kube1)
    out = env.upgrade(bad, "up3")
    assert out.code == 1 and out.json is not None and out.json["result"] == "rolled_back", out
    env.assert_running("green", v2)
    assert _sha(in1) == v2.member_sha256  # the rollback re-synced the machine active then
    assert _sha(in2) == v2.member_sha256
    synced = [r["event"] for r in env.journal()
              if r["episode"] == "up3" and r["event"]["_type"] == "MirrorsSynced"]
    assert synced and synced[0]["paths"] == [str(in1)]


def test_a_bad_active_file_refuses_the_upgrade_before_anything(
    make_env: Callable[..., AgentEnv], tmp_path: Path
) -> None:
    state = tmp_path / "hoststate" / "daemon.json"
    state.parent.mkdir()
    state.write_text('{"machines": {}}')
    env = make_env(extra_config=(
        f'[[mirrors]]\npath = "usr/local/bin/{{name}}"\nactive_from = "{state}"\n'
        'active_key = "/machines/active/root"\n'))
    v1 = env.release("1.0.0")
    out = env.cli("install", "--archive", v1.url, "--sha256", v1.sha256)
    assert out.code == 2, out
    assert out.json is not None and str(state) in out.json["error"], out
    assert "/machines/active/root" in out.json["error"], out
    assert "Traceback" not in out.stderr
    assert not env.root.exists() and not env.state_dir.exists()

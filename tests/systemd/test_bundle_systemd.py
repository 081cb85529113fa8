"""The self-contained runtime drives a real agent under the private systemd (docs/install.md): ``install`` and
``upgrade`` run the bundle's ``upgrade-agent`` (no ``python -m agent.cli.main``, no ``PYTHONPATH``), the
units it writes name the bundle's ``recover-agent-upgrade``, and systemd runs that recovery unit successfully.

The bundle is unpacked in the session's temporary directory, so ``install`` is told to accept an unstable
path (the suite's ``UPGRADE_AGENT_ALLOW_UNSTABLE_PATHS=1``, tests/conftest.py); on a host it lives under the
host root (docs/install.md).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from . import agent_env
from .agent_env import AgentEnv

pytestmark = pytest.mark.systemd

# the shared fixtures, visible to this module's tests
make_env = agent_env.make_env
release_server = agent_env.release_server

MakeEnv = Callable[..., AgentEnv]


def test_install_upgrade_and_rollback_through_the_bundle(make_env: MakeEnv, runtime_bundle: Path) -> None:
    env = make_env(inside=True, program=(str(runtime_bundle / "upgrade-agent"),))
    v1, v2, bad = env.release("1.0.0"), env.release("1.1.0"), env.release("2.0.0", "exit-after:0")
    env.install(v1)
    env.assert_running("blue", v1)
    recover = runtime_bundle / "recover-agent-upgrade"
    for unit in (f"{env.name}-recover.service", f"{env.name}-recover-boot.service"):
        text = (env.sandbox.unit_dir / unit).read_text()
        assert f"ExecStart={recover} --config {env.config} --trigger " in text, text

    up = env.upgrade(v2, "to-1.1.0")
    assert up.code == 0, up.stderr
    assert up.json is not None and up.json["result"] == "committed"
    env.assert_running("green", v2)

    down = env.upgrade(bad, "to-bad")
    assert down.code == 1, down.stderr
    assert down.json is not None and down.json["result"] == "rolled_back"
    env.assert_running("green", v2)

    # systemd itself runs the bundle's recovery program (what a reboot does): nothing open, success
    boot = f"{env.name}-recover-boot.service"
    env.sandbox.run("systemctl", "start", boot)
    shown = env.show(boot, "Result", "ExecMainStatus", "ExecStart")
    assert (shown["Result"], shown["ExecMainStatus"]) == ("success", "0"), shown
    assert f"path={recover} " in shown["ExecStart"], shown

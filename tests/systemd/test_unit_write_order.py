"""The order ``install`` writes the unit files in (agent/systemd/manager.py ``write_order``): a unit that
another one names in ``OnFailure=``, ``Requires=`` or ``Sockets=`` (or a timer's ``Unit=``) is on disk before
the unit that names it: with ``[agent] socket``, ``NAME.socket`` before the agent unit.

A real bare ``install`` is SIGKILLed by the documented crash hook (``UPGRADE_AGENT_TEST_KILL_AFTER=
unit-file#N``, agent/crashhook.py) right after its N-th unit file reached the disk, for every N; then the
unit directory is read: every reference from a unit file on disk names a unit file that is on disk too, and
the private systemd, reloaded, loads the agent unit with its ``OnFailure=`` unit found (``LoadState``).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable

import pytest

from agent.crashhook import KILL_HOOK_ENV
from agent.systemd.manager import write_order

from . import agent_env
from .agent_env import AgentEnv

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server

REFERENCE = re.compile(r"^(?:OnFailure|Unit|Requires|Sockets)=(.*)$", re.MULTILINE)


def dangling(env: AgentEnv) -> dict[str, list[str]]:
    """Unit file of this agent on disk -> the units it names (``OnFailure=``, ``Unit=``, ``Requires=``,
    ``Sockets=``) that are not."""
    on_disk = {p.name: p.read_text() for p in env.sandbox.unit_dir.iterdir()
               if p.is_file() and p.name.startswith(env.name)}
    missing = {}
    for name, text in on_disk.items():
        refs = [r for line in REFERENCE.findall(text) for r in line.split()]
        gone = [r for r in refs if r not in on_disk]
        if gone:
            missing[name] = gone
    return missing


def test_the_write_order_puts_each_failure_handler_first() -> None:
    units = {"a.service": "[Unit]\nOnFailure=b.service\n", "b.service": "[Unit]\n",
             "t.timer": "[Timer]\nUnit=s.service\n", "s.service": "[Service]\n", "x.service": ""}
    assert write_order(units) == ["b.service", "a.service", "s.service", "t.timer", "x.service"]


def test_the_write_order_puts_a_required_socket_first() -> None:
    """A service naming its socket (``Requires=``, ``Sockets=``) comes after it; the socket's own
    ``Service=`` names the service back and is not a reference (it would make a cycle)."""
    units = {"a.service": "[Unit]\nRequires=a.socket\n[Service]\nSockets=a.socket\n",
             "a.socket": "[Socket]\nService=a.service\n", "c.service": "[Unit]\nRequires=d.service\n",
             "d.service": ""}
    assert write_order(units) == ["a.socket", "a.service", "d.service", "c.service"]


@pytest.mark.parametrize("socket", [False, True], ids=["plain", "socket"])
def test_a_kill_between_two_unit_writes_leaves_no_unit_naming_a_missing_one(
    make_env: Callable[..., AgentEnv], socket: bool
) -> None:
    written = 0
    for nth in range(1, 10):
        env = make_env(socket=socket)
        rel = env.release("1.0.0")
        out = env.cli("install", "--archive", rel.url, "--sha256", rel.sha256,
                      env={KILL_HOOK_ENV: f"unit-file#{nth}"})
        if out.code == 0:  # fewer unit files than nth: every write was passed
            assert nth > 1
            break
        assert out.code == -signal.SIGKILL, out
        written = nth
        on_disk = sorted(p.name for p in env.sandbox.unit_dir.iterdir() if p.name.startswith(env.name))
        assert len(on_disk) == nth, on_disk
        assert dangling(env) == {}, on_disk
        if env.unit in on_disk:
            env.sandbox.run("systemctl", "daemon-reload")
            failure = env.show(None, "OnFailure")["OnFailure"]
            assert failure == f"{env.name}-recover.service"
            assert env.show(failure, "LoadState")["LoadState"] == "loaded"
            if socket:
                assert f"{env.name}.socket" in env.show(None, "Requires")["Requires"].split()
                assert env.show(f"{env.name}.socket", "LoadState")["LoadState"] == "loaded"
    # the agent unit and its recovery unit (and the socket), at least, were each a kill point
    assert written >= (3 if socket else 2)

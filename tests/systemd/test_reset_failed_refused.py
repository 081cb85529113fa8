"""Recovery on a host that refuses ``systemctl reset-failed`` (an SELinux policy on some images).

The refusal is answered at the service-manager port, in front of the real ``systemctl``: a wrapper given as
``host.systemctl_prefix`` answers ``systemctl reset-failed UNIT`` as ``systemctl`` itself does when the
manager denies the call (``Failed to reset failed state of unit UNIT: Access denied`` on stderr, exit 1:
systemctl's reset-failed verb prints that line and main() exits 1 for a failed verb; the message is sd-bus's
for a method refused with EACCES) and runs every other command unchanged. It also records the unit's real
``ActiveState/Result`` at each refusal. The unit really is ``failed`` in the private systemd (a candidate
crash-loops into its start limit, shortened for the test by a drop-in: ``StartLimitIntervalSec=``,
``RestartSec=``), and it is really restarted: ``MainPID``'s executable and argv, the links and ``/healthz``
are read afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.crashhook import KILL_HOOK_ENV
from agent.systemd.manager import SystemdServiceManager
from agent.testing.sandbox import PrivateSystemd
from upgrade_core.errors import ServiceError

from . import agent_env
from .agent_env import AgentEnv, Release, poll
from .conftest import Rig, wait_for

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server

REFUSE = r"""#!/bin/bash
# host.systemctl_prefix of the test: answer `systemctl reset-failed UNIT` as a host whose policy denies it.
args=("$@")
for i in "${!args[@]}"; do
    if [[ ${args[i]} == systemctl && ${args[i+1]:-} == reset-failed ]]; then
        unit=${args[i+2]}
        state=$("${args[@]:0:i}" systemctl show "$unit" -p ActiveState,Result | sort | paste -sd' ')
        printf '%s %s\n' "$unit" "$state" >> "$(dirname "$0")/refused.log"
        printf 'Failed to reset failed state of unit %s: Access denied\n' "$unit" >&2
        exit 1
    fi
done
exec "$@"
"""


def refusing_prefix(work: Path, inner: list[str]) -> list[str]:
    """``host.systemctl_prefix``: the refusing wrapper, then ``inner`` (the sandbox's prefix, or none)."""
    wrapper = work / "refuse-reset-failed"
    wrapper.write_text(REFUSE)
    wrapper.chmod(0o755)
    return [str(wrapper), *inner]


def refusals(work: Path) -> list[str]:
    """``UNIT ActiveState=... Result=...`` for every refused ``reset-failed``, in order."""
    log = work / "refused.log"
    return log.read_text().splitlines() if log.exists() else []


@contextlib.contextmanager
def drop_in(env: AgentEnv, text: str) -> Iterator[None]:
    """``NAME.service.d/test.conf`` in the sandbox's unit directory (removed afterwards), daemon-reloaded."""
    d = env.sandbox.unit_dir / f"{env.unit}.d"
    d.mkdir(exist_ok=True)
    (d / "test.conf").write_text(text)
    env.sandbox.run("systemctl", "daemon-reload")
    try:
        yield
    finally:
        shutil.rmtree(d, ignore_errors=True)
        env.sandbox.run("systemctl", "daemon-reload", check=False)


# The candidate dies 0.1 s after it serves; systemd restarts it 0.1 s later; StartLimitBurst is
# max_attempts + 2 = 4 within the interval, so the unit reaches start-limit-hit within about 2 s.
FAST_LOOP = "[Unit]\nStartLimitIntervalSec={interval}\n[Service]\nRestartSec=100ms\n"


@contextlib.contextmanager
def crash_loop_into_the_limit(env: AgentEnv, v1: Release, op: str, interval: str) -> Iterator[dict[str, Any]]:
    """Install ``v1``; with the :data:`FAST_LOOP` drop-in (start-limit ``interval``), upgrade to a candidate
    that dies 0.1 s after serving, the upgrader SIGKILLed once it saw it running (the documented hook), so
    that systemd's ``OnFailure=`` recovery finishes the episode; yields its published result."""
    bad = env.release("2.0.0", "exit-after:0.1")
    env.install(v1)
    with drop_in(env, FAST_LOOP.format(interval=interval)):
        killed = env.upgrade(bad, op, env={KILL_HOOK_ENV: "RestartObserved"})
        assert killed.code in (-9, 137), killed.stderr  # nsenter reports its child's SIGKILL as 128+9
        poll(lambda: env.result_file(op) is not None, 90.0, "the OnFailure= recovery to publish a result")
        result = env.result_file(op)
        assert result is not None
        yield result


def test_a_refused_reset_failed_is_waited_out_and_the_last_good_runs_again(
    make_env: Callable[..., AgentEnv], tmp_path: Path
) -> None:
    """The upgrader is killed once it saw the candidate running; the candidate crash-loops into the start
    limit; ``OnFailure=`` recovery spends the remaining attempt and rolls back. Each restart of the failed
    unit finds ``reset-failed`` refused, waits out the 4 s start-limit interval (plus the margin), starts
    the unit once more, and the last-good binary ends up running: the episode is ``rolled_back``."""
    env = make_env(inside=True, systemctl_prefix=refusing_prefix(tmp_path, []))
    v1 = env.release("1.0.0")
    op = "refused"
    with crash_loop_into_the_limit(env, v1, op, "4s") as result:
        assert result["result"] == "rolled_back", result
        poll(lambda: env.events(op)[-1:] == ["EpisodeClosed"], 10.0, "the episode to close")
        failed = [line for line in refusals(tmp_path) if "ActiveState=failed" in line.split()]
        assert failed and all(line.split()[0] == env.unit for line in failed), refusals(tmp_path)
        assert env.link("current") == env.link("last-good") == f"{env.name}-blue"
        env.assert_running("blue", v1)  # MainPID runs the current link -> blue, /healthz says 1.0.0
        console = env.sandbox.console_log.read_text(errors="replace")
        assert "waiting out the start limit of" in console or "waiting out the start limit of" in (
            env.sandbox.run("journalctl", "-q", "-u", f"{env.name}-recover.service", "--no-pager",
                            check=False).stdout), "the wait was not logged"


def test_a_start_limit_over_five_minutes_is_not_waited_for(
    make_env: Callable[..., AgentEnv], tmp_path: Path
) -> None:
    """With ``StartLimitIntervalSec=10min`` the refused ``reset-failed`` is not waited out: the restart is
    refused with one line naming the interval, and the unit is left ``failed``, as it was."""
    env = make_env(inside=True, systemctl_prefix=refusing_prefix(tmp_path, []))
    op = "too-long"
    with crash_loop_into_the_limit(env, env.release("1.0.0"), op, "10min") as result:
        assert result["result"] != "committed", result
        reasons = " ".join(str(r["event"]) for r in env.journal() if r["episode"] == op)
        assert "StartLimitIntervalUSec=10min is zero, infinite or over 300 s" in reasons, reasons
        assert env.show()["ActiveState"] == "failed"
        assert env.link("current") == env.link("last-good") == f"{env.name}-blue"


def test_a_binary_switched_during_the_wait_is_not_started(rig: Rig, sandbox: PrivateSystemd) -> None:
    """The manager reads what selects the binary (here the ``current`` link's target) before and after the
    wait; a change meanwhile is refused, and the unit is not started."""
    units = rig.units()
    units[rig.unit] = (units[rig.unit].replace("StartLimitIntervalSec=60", "StartLimitIntervalSec=2")
                       .replace("RestartSec=1\n", "RestartSec=100ms\n"))
    rig.blue.write_text("#!/bin/sh\nexit 3\n")
    green = rig.blue.with_name(f"{rig.name}-green")
    green.write_text("#!/bin/sh\nexec sleep 60\n")
    green.chmod(0o755)
    refused = refusing_prefix(rig.root, list(sandbox.prefix))

    first_read = anyio.Event()  # the manager has read the selection once, before its start-limit wait

    async def selection() -> str:
        target = os.readlink(rig.current)
        first_read.set()
        return target

    manager = SystemdServiceManager(
        rig.unit, unit_dir=sandbox.unit_dir, recover_exe=str(rig.recover_exe), config_path=str(rig.config),
        prefix=refused, command_timeout_s=10.0, poll_interval_s=0.05, selection=selection,
        start_limit_margin_s=0.5,
    )

    async def scenario() -> str:
        await manager.write_units({rig.unit: units[rig.unit]})
        await manager.daemon_reload()
        await manager.start()
        wait_for(lambda: rig.show(rig.unit, "ActiveState")["ActiveState"] == "failed", 20.0,
                 "the unit to crash-loop into its start limit")
        async with anyio.create_task_group() as tg:
            async def switch() -> None:
                with anyio.fail_after(30):
                    await first_read.wait()  # flip only after the first read: then the wait must see it
                tmp = rig.current.with_name("tmp-link")
                tmp.symlink_to(green.name)
                tmp.replace(rig.current)

            tg.start_soon(switch)
            with pytest.raises(ServiceError) as caught:
                await manager.restart(f"{rig.name}-restart-1")
        return str(caught.value)

    message = anyio.run(scenario)
    assert message.startswith(f"systemctl reset-failed {rig.unit} exited 1: Failed to reset failed state of "
                              f"unit {rig.unit}: Access denied; the binary {rig.unit} runs changed"), message
    assert f"({rig.name}-blue -> {rig.name}-green)" in message
    assert refusals(rig.root) and refusals(rig.root)[0].startswith(f"{rig.unit} ActiveState=failed ")
    assert rig.show(rig.unit, "ActiveState")["ActiveState"] == "failed"  # not started

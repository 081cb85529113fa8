"""ServiceManager contract (``upgrade_core.ports.ServiceManager``): the simulator and
``agent.systemd.manager.SystemdServiceManager`` inside the project's private systemd run the same tests.

The real agent is a copy of ``/bin/sleep`` in the blue slot, started through the ``current`` link, so its
``/proc/<MainPID>/exe`` is the slot file as for a native agent binary.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.systemd.manager import SystemdServiceManager
from tests.sim.host import SIM_POLICY, Behavior, SimService, World, make_candidate
from upgrade_core.errors import ServiceError
from upgrade_core.ports import ServiceManager, UnitSnapshot

pytestmark = pytest.mark.anyio

SETTLE_S = 10.0  # bound on any wait for the unit to reach a state


class ServiceRig:
    """Creates the port over a running agent unit (current -> blue) and a manager of a unit never loaded."""

    manager: ServiceManager
    absent: ServiceManager
    unit: str

    def exe(self) -> str:
        """What ``/proc/<MainPID>/exe`` resolves to for the running agent: the blue slot file."""
        raise NotImplementedError

    def monotonic(self) -> float:
        """CLOCK_MONOTONIC as the unit's ``...Monotonic`` properties see it."""
        raise NotImplementedError

    def transient_name(self) -> str:
        raise NotImplementedError

    async def poll(self, predicate: Callable[[UnitSnapshot], bool], what: str) -> UnitSnapshot:
        last: UnitSnapshot | None = None
        with anyio.move_on_after(SETTLE_S):
            while True:
                last = await self.manager.snapshot()
                if predicate(last):
                    return last
                await anyio.sleep(0.05)
        pytest.fail(f"timed out after {SETTLE_S} s waiting for {what}; last snapshot: {last}")


class SimServiceRig(ServiceRig):
    def __init__(self) -> None:
        self.world = World(SIM_POLICY)
        self.world.install_bare(make_candidate("base", Behavior()))
        self.unit = SIM_POLICY.unit
        self.manager = SimService(self.world, self.unit)
        self.absent = SimService(World(SIM_POLICY), self.unit)
        self.n = 0

    def exe(self) -> str:
        return self.world.slot_path("blue")

    def monotonic(self) -> float:
        return self.world.now

    def transient_name(self) -> str:
        self.n += 1
        return f"{SIM_POLICY.agent}-restart-0123abcd-{self.n}-{secrets.token_hex(2)}"


class RealServiceRig(ServiceRig):
    def __init__(self, sandbox: Any, tmp: Path) -> None:
        self.sandbox = sandbox
        self.name = f"ct-{secrets.token_hex(4)}"
        self.unit = f"{self.name}.service"
        lib = tmp / "root" / "lib" / self.name
        lib.mkdir(parents=True)
        self.blue = lib / f"{self.name}-blue"
        shutil.copy2("/bin/sleep", self.blue)
        os.chmod(self.blue, 0o755)
        current = lib / f"{self.name}-current"
        current.symlink_to(self.blue.name)
        (sandbox.unit_dir / self.unit).write_text(
            f"[Unit]\nDescription=contract test agent\n\n[Service]\nExecStart={current} 1000\n"
        )
        recover = tmp / "recover-agent-upgrade"
        recover.write_text("#!/bin/sh\nexit 0\n")
        recover.chmod(0o755)

        def manager(unit: str) -> SystemdServiceManager:
            return SystemdServiceManager(unit, unit_dir=sandbox.unit_dir, recover_exe=str(recover),
                                         config_path=str(tmp / "agent.toml"), prefix=sandbox.prefix,
                                         command_timeout_s=SETTLE_S, poll_interval_s=0.05)

        self.manager = manager(self.unit)
        self.absent = manager(f"{self.name}-absent.service")
        self.n = 0
        sandbox.run("systemctl", "daemon-reload")
        sandbox.run("systemctl", "start", self.unit, timeout_s=SETTLE_S)

    def exe(self) -> str:
        return os.path.realpath(self.blue)

    def monotonic(self) -> float:
        return time.monotonic()

    def transient_name(self) -> str:
        self.n += 1
        return f"{self.name}-restart-0123abcd-{self.n}-{secrets.token_hex(2)}"

    def close(self) -> None:
        self.sandbox.run("systemctl", "stop", self.unit, check=False, timeout_s=SETTLE_S)
        (self.sandbox.unit_dir / self.unit).unlink(missing_ok=True)
        self.sandbox.run("systemctl", "daemon-reload")
        self.sandbox.run("systemctl", "reset-failed", check=False)


def running(s: UnitSnapshot) -> bool:
    return (s.active_state, s.sub_state) == ("active", "running") and s.main_pid > 0 and s.exe is not None


class ServiceContract:
    """What every ServiceManager must do, from the port's docstrings (design §4.3 steps 6-7, design §6)."""

    @pytest.fixture
    def rig(self) -> Iterator[ServiceRig]:
        raise NotImplementedError

    def test_unit_is_the_agent_unit(self, rig: ServiceRig) -> None:
        assert rig.manager.unit == rig.unit

    def test_the_test_process_is_not_inside_the_unit(self, rig: ServiceRig) -> None:
        assert rig.manager.runs_inside_unit() is False

    async def test_snapshot_of_a_running_unit(self, rig: ServiceRig) -> None:
        snap = await rig.poll(running, "the agent to run")
        assert snap.result == "success"
        assert len(snap.invocation_id) == 32 and int(snap.invocation_id, 16) >= 0
        assert snap.n_restarts == 0
        assert 0.0 < snap.main_start_monotonic_s <= rig.monotonic()
        assert snap.exe == rig.exe()
        assert snap.cmdline[:1] and snap.cmdline[0].endswith("-current")  # ExecStart runs the current link

    async def test_snapshot_of_a_unit_never_loaded(self, rig: ServiceRig) -> None:
        snap = await rig.absent.snapshot()
        assert (snap.active_state, snap.sub_state) == ("inactive", "dead")
        assert (snap.main_pid, snap.invocation_id) == (0, "")
        assert (snap.exe, snap.cmdline, snap.main_start_monotonic_s) == (None, (), 0.0)

    async def test_restart_through_a_transient_unit_starts_a_new_invocation(self, rig: ServiceRig) -> None:
        first = await rig.poll(running, "the agent to run")
        requested = rig.monotonic()
        await rig.manager.restart(rig.transient_name())  # returns once accepted, never waits for the agent
        after = await rig.poll(lambda s: running(s) and s.invocation_id not in ("", first.invocation_id),
                               "a new invocation")
        assert after.main_pid != first.main_pid
        assert after.main_start_monotonic_s >= requested
        assert after.n_restarts == 0  # a requested restart is not an automatic one
        assert after.exe == rig.exe()

    async def test_restart_with_a_malformed_transient_name_is_a_service_error(self, rig: ServiceRig) -> None:
        first = await rig.poll(running, "the agent to run")
        with pytest.raises(ServiceError):
            await rig.manager.restart("not a unit/name")
        assert (await rig.manager.snapshot()).invocation_id == first.invocation_id


class TestSimService(ServiceContract):
    @pytest.fixture
    def rig(self) -> Iterator[ServiceRig]:
        yield SimServiceRig()


@pytest.mark.systemd
class TestRealService(ServiceContract):
    @pytest.fixture
    def rig(self, sandbox: Any, tmp_path: Path) -> Iterator[ServiceRig]:
        rig = RealServiceRig(sandbox, tmp_path)
        try:
            yield rig
        finally:
            rig.close()

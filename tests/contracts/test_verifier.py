"""Verifier contract (``upgrade_core.ports.Verifier``): the simulator and
``agent.release.verify.VerifierImpl``
running real small shell-script candidates run the same tests."""

from __future__ import annotations

import hashlib
from contextlib import suppress
from pathlib import Path
from typing import ClassVar, Literal

import anyio
import pytest

from agent.release.verify import VerifierImpl
from tests._proc import wait_dead
from tests.sim.host import SIM_POLICY, Behavior, Candidate, SimVerifier, World
from upgrade_core.errors import VerifyError, VerifyTimeoutError, VersionMismatchError
from upgrade_core.ports import Verifier

pytestmark = pytest.mark.anyio

Kind = Literal["prints", "exit1", "silent", "hang"]
TIMEOUT_S = 0.5  # the verifier's timeout; a hang must be reported within it plus HANG_GUARD_S
HANG_GUARD_S = 10.0


class VerifierRig:
    """Creates the port (version args ``("version",)``, timeout ``TIMEOUT_S``) and plants candidates."""

    verifier: Verifier

    def candidate(self, kind: Kind, version: str = "v1.2.3") -> str:
        """A candidate's path. ``prints``: prints ``agent version VERSION (abc)``, exits 0; ``exit1``:
        prints a version, exits 1; ``silent``: exits 0 printing nothing; ``hang``: never finishes."""
        raise NotImplementedError

    def missing(self) -> str:
        raise NotImplementedError

    def leftover_processes(self, path: str) -> list[int]:
        """Processes the candidate at ``path`` started that are still alive."""
        raise NotImplementedError


class SimVerifierRig(VerifierRig):
    BEHAVIOR: ClassVar[dict[Kind, Behavior]] = {"prints": Behavior(), "exit1": Behavior("verify_fail"),
                                      "silent": Behavior("verify_fail"), "hang": Behavior("verify_hang")}

    def __init__(self) -> None:
        self.world = World(SIM_POLICY)
        self.verifier = SimVerifier(self.world)
        self.n = 0

    def candidate(self, kind: Kind, version: str = "v1.2.3") -> str:
        self.n += 1
        cand = Candidate(hashlib.sha256(f"{kind}{self.n}".encode()).hexdigest(), version, self.BEHAVIOR[kind])
        path = f"{World.ROOT}/.agent-green.stage-{self.n:08x}"
        self.world.by_sha[cand.sha256] = cand
        self.world.files[path] = cand.sha256
        return path

    def missing(self) -> str:
        return f"{World.ROOT}/.agent-green.stage-ffffffff"

    def leftover_processes(self, path: str) -> list[int]:
        return []


class RealVerifierRig(VerifierRig):
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.verifier = VerifierImpl(version_args=("version",), timeout_s=TIMEOUT_S)
        self.n = 0

    def candidate(self, kind: Kind, version: str = "v1.2.3") -> str:
        self.n += 1
        path = self.tmp / f"cand{self.n}"
        pids = self.tmp / f"cand{self.n}.pids"
        text = {
            "prints": f'test "$1" = version || exit 9\necho "agent version {version} (abc)"\n',
            "exit1": f'echo "agent version {version}"\nexit 1\n',
            "silent": "exit 0\n",
            "hang": f'echo $$ >> {pids}\nsleep 30 &\necho $! >> {pids}\nwait\n',
        }[kind]
        path.write_text("#!/bin/sh\n" + text)
        path.chmod(0o755)
        return str(path)

    def missing(self) -> str:
        return str(self.tmp / "no-such-candidate")

    def leftover_processes(self, path: str) -> list[int]:
        pids = Path(path + ".pids")
        if not pids.exists():
            return []
        return [int(p) for p in pids.read_text().split() if not wait_dead(int(p), timeout_s=5.0)]


class VerifierContract:
    """What every Verifier must do, from the port's docstring (design §4.3 step 4, case C10)."""

    @pytest.fixture
    def rig(self) -> VerifierRig:
        raise NotImplementedError

    @pytest.mark.parametrize("expected", [None, "1.2.3", "v1.2.3"])
    async def test_returns_the_reported_version(self, rig: VerifierRig, expected: str | None) -> None:
        # the normalised version (no leading v) is what both record (C29)
        assert await rig.verifier.verify(rig.candidate("prints", "v1.2.3"), expected) == "1.2.3"

    async def test_another_version_than_expected_is_a_mismatch(self, rig: VerifierRig) -> None:
        with pytest.raises(VersionMismatchError) as info:
            await rig.verifier.verify(rig.candidate("prints", "v1.2.3"), "1.2.4")
        assert isinstance(info.value, VerifyError)

    @pytest.mark.parametrize("kind", ["exit1", "silent"])
    async def test_a_failing_version_command_is_a_verify_error(self, rig: VerifierRig, kind: Kind) -> None:
        with pytest.raises(VerifyError) as info:
            await rig.verifier.verify(rig.candidate(kind), None)
        assert type(info.value) is VerifyError  # neither a timeout nor a mismatch

    async def test_a_missing_candidate_is_a_verify_error(self, rig: VerifierRig) -> None:
        with pytest.raises(VerifyError):
            await rig.verifier.verify(rig.missing(), None)

    async def test_a_hanging_version_command_times_out_and_leaves_no_process(self, rig: VerifierRig) -> None:
        path = rig.candidate("hang")
        with anyio.fail_after(TIMEOUT_S + HANG_GUARD_S), pytest.raises(VerifyTimeoutError):
            await rig.verifier.verify(path, None)
        assert rig.leftover_processes(path) == []

    async def test_a_cancelled_verify_leaves_no_process(self, rig: VerifierRig) -> None:
        path = rig.candidate("hang")
        # The simulator reports the timeout at once (it does not model the wait): either outcome is legal.
        with anyio.fail_after(HANG_GUARD_S), anyio.move_on_after(TIMEOUT_S / 5), suppress(VerifyTimeoutError):
            await rig.verifier.verify(path, None)
        assert rig.leftover_processes(path) == []


class TestSimVerifier(VerifierContract):
    @pytest.fixture
    def rig(self) -> VerifierRig:
        return SimVerifierRig()


class TestRealVerifier(VerifierContract):
    @pytest.fixture
    def rig(self, tmp_path: Path) -> VerifierRig:
        return RealVerifierRig(tmp_path)

"""Host contract (``upgrade_core.ports.Host``): the simulator and ``agent.host.adapter.AgentHost`` over a
temporary
host root run the same tests."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Literal

import pytest

from agent.host.adapter import AgentHost
from tests.sim.host import EMPTY_SHA256, SIM_POLICY, SimHost, World
from upgrade_core import Slot
from upgrade_core.errors import HostError, LayoutConflictError
from upgrade_core.ports import Host, LinkState, StagedCandidate

pytestmark = pytest.mark.anyio

Link = Literal["current", "last-good"]
BLUE = b"#!/bin/sh\necho blue 1.0.0\n"
GREEN = b"#!/bin/sh\necho green 2.0.0\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class HostRig:
    """Creates the port over a bare host (layout directory, no slot, no link) and plants situations."""

    host: Host
    mirror: str

    def write(self, path: str, data: bytes) -> None:
        """A regular file (0755) holding ``data`` at ``path``: a slot, a staging file, an unrelated file."""
        raise NotImplementedError

    def digest(self, path: str) -> str | None:
        """sha256 of the file at ``path``; None when absent."""
        raise NotImplementedError

    def plant_link(self, link: Link, slot: Slot) -> None:
        raise NotImplementedError

    def plant_file_at_link(self, link: Link) -> None:
        """A real file where the ``link`` symlink must be."""
        raise NotImplementedError

    def mirror_digest(self) -> str | None:
        raise NotImplementedError

    async def staged(self, slot: Slot, data: bytes) -> StagedCandidate:
        """What an archive source leaves: ``data`` in a fresh staging file for ``slot``."""
        path = await self.host.prepare_staging(slot)
        self.write(path, data)
        return StagedCandidate(slot, path, sha(data), len(data), "a" * 64, 10)


class SimHostRig(HostRig):
    def __init__(self) -> None:
        self.world = World(SIM_POLICY)
        self.host = SimHost(self.world)
        self.mirror = "/sim/mirror/agent"
        self.world.mirror_paths = (self.mirror,)

    def write(self, path: str, data: bytes) -> None:
        self.world.files[path] = sha(data)

    def digest(self, path: str) -> str | None:
        return self.world.files.get(path)

    def plant_link(self, link: Link, slot: Slot) -> None:
        if link == "current":
            self.world.current = slot
        else:
            self.world.last_good = slot

    def plant_file_at_link(self, link: Link) -> None:
        self.world.link_conflicts.add(link)

    def mirror_digest(self) -> str | None:
        return self.world.mirror_files.get(self.mirror)


class RealHostRig(HostRig):
    NAME = "agent"

    def __init__(self, tmp: Path) -> None:
        self.root = tmp / "root"
        self.agent_dir = self.root / "lib" / self.NAME
        self.agent_dir.mkdir(parents=True)
        (tmp / "mirror").mkdir()
        self.mirror = str(tmp / "mirror" / self.NAME)
        self.host = AgentHost(str(self.root), self.NAME, max_member_bytes=1 << 20, mirrors=[self.mirror])

    def write(self, path: str, data: bytes) -> None:
        Path(path).write_bytes(data)
        os.chmod(path, 0o755)

    def digest(self, path: str) -> str | None:
        try:
            return sha(Path(path).read_bytes())
        except FileNotFoundError:
            return None

    def plant_link(self, link: Link, slot: Slot) -> None:
        (self.agent_dir / f"{self.NAME}-{link}").symlink_to(f"{self.NAME}-{slot}")

    def plant_file_at_link(self, link: Link) -> None:
        self.write(str(self.agent_dir / f"{self.NAME}-{link}"), b"not a link\n")

    def mirror_digest(self) -> str | None:
        return self.digest(self.mirror)


class HostContract:
    """What every Host must do, from the port's docstrings (design §3, 4.3 steps 3 and 5)."""

    @pytest.fixture
    def rig(self) -> HostRig:
        raise NotImplementedError

    def installed(self, rig: HostRig) -> None:
        """blue holds BLUE; current and last-good name blue."""
        rig.write(rig.host.slot_path("blue"), BLUE)
        rig.plant_link("current", "blue")
        rig.plant_link("last-good", "blue")

    async def test_a_bare_host_has_no_links_and_no_slots(self, rig: HostRig) -> None:
        assert rig.host.links() == LinkState(None, None)
        assert await rig.host.slot_sha256("blue") is None
        assert await rig.host.slot_sha256("green") is None

    def test_paths_follow_the_layout(self, rig: HostRig) -> None:
        blue, green = rig.host.slot_path("blue"), rig.host.slot_path("green")
        current = rig.host.current_link_path()
        assert all(os.path.isabs(p) for p in (blue, green, current))
        assert len({os.path.dirname(p) for p in (blue, green, current)}) == 1
        assert (blue.endswith("-blue"), green.endswith("-green"), current.endswith("-current")) == (True,) * 3

    async def test_slot_sha256_is_the_digest_of_the_slot_file(self, rig: HostRig) -> None:
        rig.write(rig.host.slot_path("blue"), BLUE)
        assert await rig.host.slot_sha256("blue") == sha(BLUE)
        assert await rig.host.slot_sha256("green") is None

    async def test_an_empty_slot_reads_as_missing(self, rig: HostRig) -> None:
        rig.write(rig.host.slot_path("green"), b"")
        assert rig.digest(rig.host.slot_path("green")) == EMPTY_SHA256  # the file is there, zero-length
        assert await rig.host.slot_sha256("green") is None

    async def test_point_current_then_links(self, rig: HostRig) -> None:
        rig.write(rig.host.slot_path("blue"), BLUE)
        rig.write(rig.host.slot_path("green"), GREEN)
        await rig.host.point_current("blue")
        assert rig.host.links() == LinkState("blue", None)
        await rig.host.point_last_good("blue")
        await rig.host.point_current("green")
        assert rig.host.links() == LinkState("green", "blue")
        await rig.host.point_current("green")  # idempotent
        assert rig.host.links() == LinkState("green", "blue")

    @pytest.mark.parametrize("empty", [False, True], ids=["missing", "empty"])
    async def test_a_link_is_never_pointed_at_a_missing_or_empty_slot(self, rig: HostRig,
                                                                     empty: bool) -> None:
        self.installed(rig)
        if empty:
            rig.write(rig.host.slot_path("green"), b"")
        with pytest.raises(HostError):
            await rig.host.point_current("green")
        with pytest.raises(HostError):
            await rig.host.point_last_good("green")
        assert rig.host.links() == LinkState("blue", "blue")

    @pytest.mark.parametrize("link", ["current", "last-good"])
    async def test_a_real_file_where_a_link_must_be_is_a_layout_conflict(self, rig: HostRig,
                                                                         link: Link) -> None:
        rig.write(rig.host.slot_path("blue"), BLUE)
        rig.plant_file_at_link(link)
        with pytest.raises(LayoutConflictError):
            rig.host.links()
        with pytest.raises(LayoutConflictError):
            await (rig.host.point_current if link == "current" else rig.host.point_last_good)("blue")

    async def test_prepare_staging_names_a_fresh_uncreated_path_beside_the_slots(self, rig: HostRig) -> None:
        a = await rig.host.prepare_staging("green")
        b = await rig.host.prepare_staging("green")
        assert a != b
        for path in (a, b):
            assert os.path.dirname(path) == os.path.dirname(rig.host.slot_path("green"))
            assert os.path.basename(path).startswith(".") and ".stage-" in path and "-green." in path
            assert rig.digest(path) is None

    async def test_install_staged_renames_the_staging_file_onto_the_slot(self, rig: HostRig) -> None:
        self.installed(rig)
        staged = await rig.staged("green", GREEN)
        await rig.host.install_staged(staged)
        assert await rig.host.slot_sha256("green") == staged.sha256 == sha(GREEN)
        assert rig.digest(staged.staging_path) is None
        assert rig.host.links() == LinkState("blue", "blue")

    @pytest.mark.parametrize("link", ["current", "last-good"])
    async def test_install_staged_never_replaces_a_slot_a_link_names(self, rig: HostRig, link: Link) -> None:
        rig.write(rig.host.slot_path("blue"), BLUE)
        rig.write(rig.host.slot_path("green"), GREEN)
        rig.plant_link("current", "blue" if link == "current" else "green")
        rig.plant_link("last-good", "blue")
        staged = await rig.staged("blue", b"#!/bin/sh\necho 3.0.0\n")
        with pytest.raises(HostError):
            await rig.host.install_staged(staged)
        assert await rig.host.slot_sha256("blue") == sha(BLUE)
        assert rig.digest(staged.staging_path) == staged.sha256  # nothing changed

    async def test_install_staged_without_its_staging_file_fails(self, rig: HostRig) -> None:
        self.installed(rig)
        path = await rig.host.prepare_staging("green")
        with pytest.raises(HostError):
            await rig.host.install_staged(StagedCandidate("green", path, sha(GREEN), len(GREEN), "a" * 64, 1))
        assert await rig.host.slot_sha256("green") is None

    async def test_sweep_staging_removes_only_staging_leftovers(self, rig: HostRig) -> None:
        self.installed(rig)
        rig.write(rig.host.slot_path("green"), GREEN)
        leftovers = [await rig.host.prepare_staging(slot) for slot in ("green", "blue", "green")]
        for path in leftovers:
            rig.write(path, b"partial")
        other = os.path.join(os.path.dirname(rig.host.slot_path("blue")), "notes.txt")
        rig.write(other, b"operator's file")
        removed = await rig.host.sweep_staging()
        assert sorted(removed) == sorted(leftovers)
        assert all(rig.digest(p) is None for p in leftovers)
        assert await rig.host.slot_sha256("blue") == sha(BLUE)
        assert await rig.host.slot_sha256("green") == sha(GREEN)
        assert rig.digest(other) == sha(b"operator's file")
        assert rig.host.links() == LinkState("blue", "blue")
        assert await rig.host.sweep_staging() == []

    async def test_discard_staging_removes_the_file_and_tolerates_its_absence(self, rig: HostRig) -> None:
        self.installed(rig)
        staged = await rig.staged("green", GREEN)
        await rig.host.discard_staging(staged.staging_path)
        assert rig.digest(staged.staging_path) is None
        await rig.host.discard_staging(staged.staging_path)
        assert await rig.host.slot_sha256("blue") == sha(BLUE)

    async def test_sync_mirrors_copies_the_slot_checked_by_digest(self, rig: HostRig) -> None:
        self.installed(rig)
        assert await rig.host.sync_mirrors("blue", sha(BLUE)) == (rig.mirror,)
        assert rig.mirror_digest() == sha(BLUE)

    async def test_sync_mirrors_refuses_a_slot_that_does_not_hold_the_digest(self, rig: HostRig) -> None:
        self.installed(rig)
        with pytest.raises(HostError):
            await rig.host.sync_mirrors("blue", sha(GREEN))
        assert rig.mirror_digest() is None


class TestSimHost(HostContract):
    @pytest.fixture
    def rig(self) -> HostRig:
        return SimHostRig()


class TestRealHost(HostContract):
    @pytest.fixture
    def rig(self, tmp_path: Path) -> HostRig:
        return RealHostRig(tmp_path)

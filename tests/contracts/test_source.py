"""ArchiveSource contract (``upgrade_core.ports.ArchiveSource``): the simulator and
``agent.release.source.ArchiveSourceImpl`` fed real tar archives from ``file://`` paths and a loopback HTTP
server run the same tests."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import anyio
import attrs
import pytest

from agent.release.fetch import FetchPolicy
from agent.release.source import ArchiveSourceImpl
from tests.agent_fetch._archives import Entry, compress, tar_bytes
from tests.agent_fetch._servers import LoopbackServer, body, serve
from tests.sim.host import SIM_POLICY, Behavior, Candidate, SimSource, World, archive_sha256
from upgrade_core.errors import (
    ArchiveRejectedError,
    ArchiveTruncatedError,
    CandidateError,
    DigestMismatchError,
    FetchError,
)
from upgrade_core.ports import ArchiveSource

pytestmark = pytest.mark.anyio

Transport = Literal["file", "http"]
MEMBER = "agent-linux-amd64"
BINARY = b"\x7fELF" + os.urandom(70_000)
STALL_GUARD_S = 10.0  # the stalling server never holds a connection longer than this


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@attrs.frozen
class Planted:
    """An archive the rig serves and what staging it must report."""

    source: str
    member_sha256: str
    member_size: int
    archive_sha256: str
    archive_size: int


class SourceRig:
    """Creates the port and plants archives; staging paths are fresh names in an existing directory."""

    source: ArchiveSource

    def plant_archive(self, member: bytes, transport: Transport) -> Planted:
        raise NotImplementedError

    def plant_truncated(self, member: bytes, transport: Transport) -> str:
        """An archive cut short (its compressed stream ends early)."""
        raise NotImplementedError

    def plant_rejected(self, member: bytes, transport: Transport) -> str:
        """An archive holding the member and a second entry (policy ``exact``)."""
        raise NotImplementedError

    def missing(self, transport: Transport) -> str:
        """A source naming nothing (no such file; HTTP 404)."""
        raise NotImplementedError

    def plant_stalling(self) -> str:
        """A source that delivers part of an archive, then stalls (bounded by ``STALL_GUARD_S``)."""
        raise NotImplementedError

    async def wait_stalled(self) -> None:
        """Return once a ``stage`` of the stalling source is under way."""
        raise NotImplementedError

    def staging_path(self) -> str:
        raise NotImplementedError

    def digest(self, path: str) -> str | None:
        raise NotImplementedError


class SimSourceRig(SourceRig):
    def __init__(self) -> None:
        self.world = World(SIM_POLICY)
        self.source = SimSource(self.world)
        self.n = 0

    def _name(self, transport: Transport) -> str:
        self.n += 1
        return f"{transport}://sim/a{self.n}.tar.gz"

    def _candidate(self, member: bytes) -> Candidate:
        return Candidate(sha(member), "1.0.0", Behavior(), size=len(member))

    def plant_archive(self, member: bytes, transport: Transport) -> Planted:
        src, cand = self._name(transport), self._candidate(member)
        self.world.add_archive(src, cand)
        return Planted(src, cand.sha256, len(member), archive_sha256(cand), 500)

    def _fault(self, member: bytes, transport: Transport, error: CandidateError) -> str:
        src = self.plant_archive(member, transport).source
        self.world.archive_faults[src] = error
        return src

    def plant_truncated(self, member: bytes, transport: Transport) -> str:
        return self._fault(member, transport, ArchiveTruncatedError("sim: archive truncated"))

    def plant_rejected(self, member: bytes, transport: Transport) -> str:
        return self._fault(member, transport, ArchiveRejectedError("sim: a second entry"))

    def missing(self, transport: Transport) -> str:
        return self._name(transport)

    def plant_stalling(self) -> str:
        self.world.stall_stage = True
        return self.plant_archive(BINARY, "http").source

    async def wait_stalled(self) -> None:
        for _ in range(5):
            await anyio.lowlevel.checkpoint()

    def staging_path(self) -> str:
        self.n += 1
        return f"{World.ROOT}/.agent-green.stage-{self.n:08x}"

    def digest(self, path: str) -> str | None:
        return self.world.files.get(path)


class RealSourceRig(SourceRig):
    def __init__(self, tmp: Path, server: LoopbackServer) -> None:
        self.tmp = tmp
        self.server = server
        self.slots = tmp / "lib" / "agent"
        self.slots.mkdir(parents=True)
        self.source = ArchiveSourceImpl(download=FetchPolicy(allow_http="loopback", timeout_s=20.0),
                                        member=MEMBER)
        self.n = 0
        self.stalled = threading.Event()
        self.release = threading.Event()

    def _serve(self, data: bytes, transport: Transport) -> str:
        self.n += 1
        name = f"a{self.n}.tar.gz"
        if transport == "file":
            path = self.tmp / name
            path.write_bytes(data)
            return f"file://{path}"
        self.server.routes[f"/{name}"] = body(data)
        return self.server.url(f"/{name}")

    def plant_archive(self, member: bytes, transport: Transport) -> Planted:
        data = compress(tar_bytes([Entry(MEMBER, data=member)]), "gzip")
        return Planted(self._serve(data, transport), sha(member), len(member), sha(data), len(data))

    def plant_truncated(self, member: bytes, transport: Transport) -> str:
        data = compress(tar_bytes([Entry(MEMBER, data=member)]), "gzip")
        return self._serve(data[: len(data) // 2], transport)

    def plant_rejected(self, member: bytes, transport: Transport) -> str:
        data = compress(tar_bytes([Entry(MEMBER, data=member), Entry("README", data=b"hi\n")]), "gzip")
        return self._serve(data, transport)

    def missing(self, transport: Transport) -> str:
        return f"file://{self.tmp}/no-such.tar.gz" if transport == "file" else self.server.url("/no-such")

    def plant_stalling(self) -> str:
        data = compress(tar_bytes([Entry(MEMBER, data=BINARY)]), "tar")
        stalled, release = self.stalled, self.release

        def handle(h: http.server.BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            stalled.set()
            release.wait(STALL_GUARD_S)
            h.close_connection = True

        self.server.routes["/stall"] = handle
        return self.server.url("/stall")

    async def wait_stalled(self) -> None:
        with anyio.fail_after(STALL_GUARD_S):
            while not self.stalled.is_set():
                await anyio.sleep(0.01)
        await anyio.sleep(0.05)  # not needed for the contract; lets the staging file take some bytes

    def staging_path(self) -> str:
        self.n += 1
        return str(self.slots / f".agent-green.stage-{self.n:08x}")

    def digest(self, path: str) -> str | None:
        try:
            return sha(Path(path).read_bytes())
        except FileNotFoundError:
            return None


TRANSPORTS = pytest.mark.parametrize("transport", ["file", "http"])


class SourceContract:
    """What every ArchiveSource must do, from the port's docstring (design §4.3 step 3, design §6)."""

    @pytest.fixture
    def rig(self) -> Iterator[SourceRig]:
        raise NotImplementedError

    @TRANSPORTS
    @pytest.mark.parametrize("with_digest", [False, True], ids=["no-digest", "digest"])
    async def test_a_good_archive_stages_exactly_its_member(self, rig: SourceRig, transport: Transport,
                                                            with_digest: bool) -> None:
        planted = rig.plant_archive(BINARY, transport)
        staging = rig.staging_path()
        staged = await rig.source.stage(planted.source, planted.archive_sha256 if with_digest else None,
                                        staging, "green")
        assert (staged.slot, staged.staging_path) == ("green", staging)
        assert (staged.sha256, staged.size) == (sha(BINARY), len(BINARY))
        assert (staged.archive_sha256, staged.archive_size) == (planted.archive_sha256, planted.archive_size)
        assert rig.digest(staging) == sha(BINARY)

    @TRANSPORTS
    async def test_a_digest_mismatch_is_refused_and_leaves_no_staging_file(self, rig: SourceRig,
                                                                          transport: Transport) -> None:
        planted = rig.plant_archive(BINARY, transport)
        staging = rig.staging_path()
        with pytest.raises(DigestMismatchError):
            await rig.source.stage(planted.source, "0" * 64, staging, "green")
        assert rig.digest(staging) is None

    @TRANSPORTS
    async def test_a_truncated_archive_is_one_typed_error(self, rig: SourceRig, transport: Transport) -> None:
        staging = rig.staging_path()
        with pytest.raises(ArchiveTruncatedError):
            await rig.source.stage(rig.plant_truncated(BINARY, transport), None, staging, "green")
        assert rig.digest(staging) is None

    @TRANSPORTS
    async def test_an_archive_breaking_the_member_rule_is_rejected(self, rig: SourceRig,
                                                                  transport: Transport) -> None:
        staging = rig.staging_path()
        with pytest.raises(ArchiveRejectedError):
            await rig.source.stage(rig.plant_rejected(BINARY, transport), None, staging, "green")
        assert rig.digest(staging) is None

    @TRANSPORTS
    async def test_a_missing_source_is_a_fetch_error_not_a_bad_candidate(self, rig: SourceRig,
                                                                         transport: Transport) -> None:
        staging = rig.staging_path()
        with pytest.raises(FetchError):
            await rig.source.stage(rig.missing(transport), None, staging, "green")
        assert rig.digest(staging) is None

    async def test_a_cancelled_stage_removes_the_staging_file(self, rig: SourceRig) -> None:
        src = rig.plant_stalling()
        staging = rig.staging_path()
        with anyio.fail_after(STALL_GUARD_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(rig.source.stage, src, None, staging, "green")
                await rig.wait_stalled()
                tg.cancel_scope.cancel()
        assert rig.digest(staging) is None


class TestSimSource(SourceContract):
    @pytest.fixture
    def rig(self) -> Iterator[SourceRig]:
        yield SimSourceRig()


class TestRealSource(SourceContract):
    @pytest.fixture
    def rig(self, tmp_path: Path) -> Iterator[SourceRig]:
        with serve() as server:
            rig = RealSourceRig(tmp_path, server)
            try:
                yield rig
            finally:
                rig.release.set()



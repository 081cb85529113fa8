"""C05 (staging filesystem fills half way, on a real small tmpfs) and cancellation of ``stage``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest

from agent.release.source import ArchiveSourceImpl

from ._archives import Entry, compress, tar_bytes
from ._servers import LoopbackServer
from .conftest import MEMBER

ROOT = Path(__file__).parents[2]

_CHILD = r"""
import json, os, sys, anyio
from agent.release.source import ArchiveSourceImpl
from upgrade_core.errors import UpgradeError
archive, staging, member = sys.argv[1:4]
try:
    anyio.run(ArchiveSourceImpl(member=member).stage, archive, None, staging, "green")
    out = {"error": None}
except UpgradeError as exc:
    out = {"error": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}
out["left"] = sorted(os.listdir(os.path.dirname(staging)))
print(json.dumps(out))
"""


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m for a private tmpfs mount")
def test_c05_staging_filesystem_full_half_way(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    member = os.urandom(3 << 20)  # 3 MiB into a 1 MiB tmpfs: ENOSPC half way through the write
    archive.write_bytes(compress(tar_bytes([Entry(MEMBER, data=member)]), "gzip"))
    mnt = tmp_path / "slots"
    mnt.mkdir()
    staging = mnt / f".{MEMBER}-green.stage-00ff"
    script = (
        f"mount -t tmpfs -o size=1m,mode=0755 tmpfs {mnt} && "  # tmpfs is 1777 by default: never an agent dir
        f"{sys.executable} -c '{_CHILD}' {archive} {staging} {MEMBER}"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["error"] == "NoSpaceError"
    assert str(staging) in out["message"] and "no space" in out["message"]
    assert out["exit_code"] == 1
    assert out["left"] == []  # the partial staging file was removed
    assert list(mnt.iterdir()) == []  # and the outer view never saw the private mount


@pytest.mark.anyio
async def test_cancelled_stage_removes_the_staging_file(server: LoopbackServer, tmp_path: Path) -> None:
    release = threading.Event()
    data = compress(tar_bytes([Entry(MEMBER, data=os.urandom(1 << 20))]), "tar")

    def half_then_stall(h):  # type: ignore[no-untyped-def]
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[: len(data) // 2])
        h.wfile.flush()
        release.wait(30)

    server.routes["/a.tar"] = half_then_stall
    staging = tmp_path / "s"
    try:
        async with anyio.create_task_group() as tg:
            stage = ArchiveSourceImpl(member=MEMBER).stage
            tg.start_soon(stage, server.url("/a.tar"), None, str(staging), "blue")
            with anyio.fail_after(20):
                while not staging.exists() or not server.requests:  # created, and the body is flowing
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    finally:
        release.set()
    assert not staging.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.anyio
async def test_cancelling_extract_always_surfaces_as_the_cancellation(tmp_path: Path) -> None:
    """However the cancel and the worker's end of stream interleave, the caller sees its own cancellation
    (never the worker's internal stream abort as an error) and no staging file is left. 40 rounds with the
    cancel at varied points (found as a rare race in the full suite)."""
    from agent.release.extract import ExtractLimits, extract

    data = compress(tar_bytes([Entry(MEMBER, data=os.urandom(256 * 1024))]), "tar")
    for round_ in range(40):
        staging = tmp_path / f"s{round_}"

        async def feed(send, _coding) -> None:  # type: ignore[no-untyped-def]
            await send(data[: len(data) // 2])
            await anyio.sleep_forever()

        with anyio.move_on_after(0.001 * (round_ % 8)) as scope:
            await extract(feed, str(staging), member=MEMBER, policy="exact", limits=ExtractLimits(),
                          source_name="test")
        assert scope.cancelled_caught, f"round {round_}: extract returned instead of being cancelled"
        assert not staging.exists()
    assert list(tmp_path.iterdir()) == []

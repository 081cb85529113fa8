"""The overlapped single pass (design §9 ``fetch.extract``): tarfile over the forward-only feed, the member
writer thread.

The member's bytes no longer go through tarfile's stream buffer but straight from the decoder to a writer
thread (sha256 + write). These tests pin what that must not change: exact bytes for every member size
(with and without padding after the data, and across decoded pieces), entries skipped around the member,
truncation and corruption in the middle of a large member still refused, and the writer thread joined and
no file descriptor left open after an error or a cancellation.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import anyio
import pytest

from agent.release.extract import ExtractLimits, _TarFeed, _Writer, extract
from upgrade_core.errors import ArchiveTruncatedError, NoSpaceError

from ._archives import Entry, compress, tar_bytes
from .conftest import MEMBER, run_extract

pytestmark = pytest.mark.anyio


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _writers_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "extract-writer"]


@pytest.mark.parametrize("size", [1, 511, 512, 513, 1 << 20, (1 << 20) + 512, (3 << 20) - 1])
@pytest.mark.parametrize("how", ["tar", "gzip", "zstd"])
async def test_every_member_size_is_staged_exactly(tmp_path: Path, size: int, how: str) -> None:
    member = os.urandom(size)
    staging = tmp_path / "s"
    result = await run_extract(compress(tar_bytes([Entry(MEMBER, data=member)]), how), staging)
    assert staging.read_bytes() == member
    assert result.member_sha256 == hashlib.sha256(member).hexdigest()
    assert result.member_size == size


async def test_entries_around_the_member_are_skipped_in_select(tmp_path: Path) -> None:
    member = os.urandom((2 << 20) + 100)
    entries = [
        Entry("README", data=os.urandom(70_000)),
        Entry("bin", kind="dir"),
        Entry(MEMBER, data=member),
        Entry("LICENSE", data=b"x" * 1024),
        Entry("big", data=os.urandom(3 << 20)),
    ]
    staging = tmp_path / "s"
    result = await run_extract(compress(tar_bytes(entries), "gzip"), staging, policy="select")
    assert staging.read_bytes() == member
    assert result.entries == 5


@pytest.mark.parametrize("how", ["gzip", "zstd", "tar"])
async def test_cut_inside_a_large_member_is_truncation(tmp_path: Path, how: str) -> None:
    data = compress(tar_bytes([Entry(MEMBER, data=os.urandom(4 << 20))]), how)
    fds = _open_fds()
    staging = tmp_path / "s"
    with pytest.raises(ArchiveTruncatedError):
        await run_extract(data[: len(data) // 2], staging)
    assert not staging.exists()
    assert _writers_alive() == []
    assert _open_fds() == fds


async def test_corrupt_gzip_inside_a_large_member_is_refused(tmp_path: Path) -> None:
    data = bytearray(compress(tar_bytes([Entry(MEMBER, data=os.urandom(4 << 20))]), "gzip"))
    data[len(data) // 2] ^= 0xFF  # a stored block's byte: only the trailer's CRC32 can tell
    fds = _open_fds()
    staging = tmp_path / "s"
    with pytest.raises(ArchiveTruncatedError, match="corrupt gzip"):
        await run_extract(bytes(data), staging)
    assert not staging.exists()
    assert _writers_alive() == []
    assert _open_fds() == fds


async def test_cancel_during_the_member_joins_the_writer(tmp_path: Path) -> None:
    data = compress(tar_bytes([Entry(MEMBER, data=os.urandom(8 << 20))]), "gzip")
    fds = _open_fds()
    for round_ in range(6):
        staging = tmp_path / f"s{round_}"

        async def feed(send, _coding) -> None:  # type: ignore[no-untyped-def]
            for i in range(0, len(data) // 2, 65536):
                await send(data[i : i + 65536])
            await anyio.sleep_forever()

        with anyio.move_on_after(0.05 + 0.02 * round_) as scope:
            await extract(feed, str(staging), member=MEMBER, policy="exact", limits=ExtractLimits(),
                          source_name="test")
        assert scope.cancelled_caught
        assert not staging.exists()
        assert _writers_alive() == []
    assert _open_fds() == fds


def test_writer_error_is_raised_by_the_next_submit_and_returned_by_close() -> None:
    seen: list[bytes] = []

    def consume(piece: bytes) -> None:
        if piece == b"bad":
            raise NoSpaceError("full")
        seen.append(piece)

    writer = _Writer(consume, 2)
    writer.submit(b"a")
    writer.submit(b"bad")
    with pytest.raises(NoSpaceError):
        for _ in range(100):  # the error shows at the latest once the queue is drained
            writer.submit(b"later")
    assert isinstance(writer.close(), NoSpaceError)
    assert seen == [b"a"]
    assert _writers_alive() == []

    writer = _Writer(consume, 2)
    writer.submit(b"bad")
    assert isinstance(writer.close(), NoSpaceError)
    assert writer.close() is None  # idempotent


class _Pieces:
    """A decoder stand-in: returns the given pieces, then b""."""

    name = "test"

    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces

    def read(self, n: int) -> bytes:
        return self._pieces.pop(0) if self._pieces else b""


def test_feed_seeks_forward_and_back_only_within_the_last_piece() -> None:
    feed = _TarFeed(_Pieces([b"abc", b"defgh", b"\0\0"]), 1 << 20, "test")
    assert feed.read(4) == b"abcd"
    assert feed.tell() == 4
    feed.seek(3)  # back one byte, inside the piece decoded last
    assert feed.read(1) == b"d"
    with pytest.raises(RuntimeError):
        feed.seek(0)  # "abc" is gone: a stream cannot rewind
    assert feed.seek(7) == 7
    assert feed.read(10) == b"h\0\0"
    assert feed.total == 10 and feed.nonzero_end == 8 and feed.ended

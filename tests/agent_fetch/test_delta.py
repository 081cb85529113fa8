"""Deltas (docs/delta.md) through the real fetch and decode pass: deltas made by the real ``zstd
--patch-from`` (and by ``delta make``), served from a loopback HTTP server, rebuilt against a base into a
staging file. Each hostile delta is refused with its one line, within the limits, and leaves no staging file;
a refused delta with an archive beside it falls back to the archive."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import zstandard

from agent.release.delta import DeltaSource, make_delta
from agent.release.extract import DeltaBase, ExtractLimits, delta_window_limit
from agent.release.source import ArchiveSourceImpl
from upgrade_core.errors import (
    ArchiveLimitError,
    ArchiveRejectedError,
    ArchiveTruncatedError,
    DeltaBaseError,
    DigestMismatchError,
    FetchHTTPError,
)

from ._archives import zstd_patch
from ._servers import LoopbackServer, body

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("zstd") is None, reason="the real zstd tool makes the deltas"),
]

MIB = 1 << 20


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _binary(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _patched(old: bytes, seed: int) -> bytes:
    """``old`` with a few hundred bytes changed and some appended: a patch release's binary."""
    rng = random.Random(seed)
    new = bytearray(old)
    for _ in range(300):
        new[rng.randrange(len(new))] = rng.randrange(256)
    return bytes(new) + rng.randbytes(4096)


def _base(content: bytes, member_sha256: str | None) -> DeltaBase:
    return DeltaBase(content, "slot blue (test)", member_sha256)


def _source(limits: ExtractLimits | None = None) -> ArchiveSourceImpl:
    return ArchiveSourceImpl(limits=limits or ExtractLimits(), member_policy="none")


async def _stage(
    server: LoopbackServer, tmp: Path, delta: bytes, base: DeltaBase, *, sha: str | None = None,
    limits: ExtractLimits | None = None,
) -> tuple[Path, object]:
    server.routes["/d.zst"] = body(delta)
    staging = tmp / "stage"
    staged = await _source(limits).stage_from(
        server.url("/d.zst"), sha or _sha(delta), str(staging), "green", base
    )
    return staging, staged


@pytest.fixture
def pair(tmp_path: Path) -> tuple[bytes, bytes, bytes]:
    """(old, new, delta): 1 MiB binaries a patch apart and the real ``zstd --patch-from`` delta."""
    old = _binary(1, MIB)
    new = _patched(old, 2)
    return old, new, zstd_patch(old, new, tmp_path / "d").read_bytes()


async def test_a_zstd_patch_from_delta_rebuilds_the_exact_target(
    server: LoopbackServer, tmp_path: Path, pair: tuple[bytes, bytes, bytes]
) -> None:
    old, new, delta = pair
    assert len(delta) < len(new) // 20  # a delta, not the whole file again
    staging, staged = await _stage(server, tmp_path, delta, _base(old, _sha(new)))
    assert staging.read_bytes() == new
    assert os.stat(staging).st_mode & 0o777 == 0o755
    assert (staged.sha256, staged.size) == (_sha(new), len(new))  # type: ignore[attr-defined]
    assert (staged.archive_sha256, staged.archive_size) == (_sha(delta), len(delta))  # type: ignore[attr-defined]


async def test_delta_make_writes_what_zstd_decodes_and_the_agent_rebuilds(
    server: LoopbackServer, tmp_path: Path
) -> None:
    old, new = _binary(3, MIB), _patched(_binary(3, MIB), 4)
    (tmp_path / "old").write_bytes(old)
    (tmp_path / "new").write_bytes(new)
    made = make_delta(str(tmp_path / "old"), str(tmp_path / "new"), str(tmp_path / "made.zst"))
    delta = (tmp_path / "made.zst").read_bytes()
    assert (made.delta_sha256, made.delta_size, made.member_sha256) == (_sha(delta), len(delta), _sha(new))
    subprocess.run(
        ["zstd", "-q", "-d", "-f", "--patch-from", str(tmp_path / "old"), str(tmp_path / "made.zst"),
         "-o", str(tmp_path / "out")], check=True, timeout=60,
    )
    assert (tmp_path / "out").read_bytes() == new
    staging, _ = await _stage(server, tmp_path, delta, _base(old, _sha(new)))
    assert staging.read_bytes() == new


async def test_a_delta_made_against_another_base_is_refused_naming_the_base(
    server: LoopbackServer, tmp_path: Path, pair: tuple[bytes, bytes, bytes]
) -> None:
    _old, new, delta = pair
    other = _binary(9, MIB)
    with pytest.raises((DeltaBaseError, DigestMismatchError)) as err:
        await _stage(server, tmp_path, delta, _base(other, _sha(new)))
    assert f"sha256 {_sha(other)}" in str(err.value) and "another base" in str(err.value)
    assert not (tmp_path / "stage").exists()


async def test_without_a_member_digest_the_frames_checksum_tells_the_right_base_from_another(
    server: LoopbackServer, tmp_path: Path, pair: tuple[bytes, bytes, bytes]
) -> None:
    # the spool/Kubernetes spec's delta {url, sha256} names no member digest: the real zstd's frame checksum
    # (written by default) is what the decoder checks against the rebuilt bytes
    old, new, delta = pair
    assert zstandard.get_frame_parameters(delta).has_checksum
    staging, staged = await _stage(server, tmp_path, delta, _base(old, None))
    assert staging.read_bytes() == new
    assert staged.sha256 == _sha(new)  # type: ignore[attr-defined]
    staging.unlink()
    other = _binary(9, MIB)
    with pytest.raises(DeltaBaseError) as err:
        await _stage(server, tmp_path, delta, _base(other, None))
    assert f"sha256 {_sha(other)}" in str(err.value) and "another base" in str(err.value)
    assert not (tmp_path / "stage").exists()


async def test_without_a_member_digest_a_frame_without_a_checksum_is_refused_before_decoding(
    server: LoopbackServer, tmp_path: Path, pair: tuple[bytes, bytes, bytes]
) -> None:
    old, new, _delta = pair
    bare = zstd_patch(old, new, tmp_path / "bare", "--no-check").read_bytes()
    assert not zstandard.get_frame_parameters(bare).has_checksum
    refusal = ("the delta's zstd frame carries no content checksum and no member sha256 was given: the "
               "rebuilt binary could not be told from one rebuilt against another base")
    with pytest.raises(ArchiveRejectedError, match=refusal):
        await _stage(server, tmp_path, bare, _base(old, None))
    assert not (tmp_path / "stage").exists()
    staging, _ = await _stage(server, tmp_path, bare, _base(old, _sha(new)))  # a member digest suffices
    assert staging.read_bytes() == new


async def test_a_corrupt_delta_is_refused_by_its_digest(
    server: LoopbackServer, tmp_path: Path, pair: tuple[bytes, bytes, bytes]
) -> None:
    old, new, delta = pair
    bad = bytearray(delta)
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(DigestMismatchError, match=f"the delta's sha256 is not the expected {_sha(delta)}"):
        await _stage(server, tmp_path, bytes(bad), _base(old, _sha(new)), sha=_sha(delta))
    assert not (tmp_path / "stage").exists()


@pytest.mark.parametrize("keep", [3, 10, 100])
async def test_a_truncated_delta_is_refused(
    server: LoopbackServer, tmp_path: Path, pair: tuple[bytes, bytes, bytes], keep: int
) -> None:
    old, new, delta = pair
    cut = delta[: min(keep, len(delta) - 1)]
    with pytest.raises(ArchiveTruncatedError, match="truncated/corrupt"):
        await _stage(server, tmp_path, cut, _base(old, _sha(new)), sha=_sha(cut))
    assert not (tmp_path / "stage").exists()


async def test_a_frame_asking_for_a_window_above_the_limit_is_refused_before_decoding(
    server: LoopbackServer, tmp_path: Path
) -> None:
    limits = ExtractLimits(max_member_bytes=MIB)
    old, new = _binary(5, 4096), _binary(6, 4096)
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=22, write_content_size=0)
    dictionary = zstandard.ZstdCompressionDict(old, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    stream = zstandard.ZstdCompressor(dict_data=dictionary, compression_params=params).compressobj()
    delta = stream.compress(new) + stream.flush()  # size unknown to the compressor: the window stays 4 MiB
    assert zstandard.get_frame_parameters(delta).window_size > delta_window_limit(limits)
    refusal = r"4194304-byte window, above 2 \* limits.max_member_bytes = 2097152"
    with pytest.raises(ArchiveLimitError, match=refusal):
        await _stage(server, tmp_path, delta, _base(old, _sha(new)), limits=limits)
    assert not (tmp_path / "stage").exists()


@pytest.mark.parametrize("content_size", [True, False])
async def test_a_decompression_bomb_stops_at_max_member_bytes(
    server: LoopbackServer, tmp_path: Path, content_size: bool
) -> None:
    """64 MiB of zeros in a few KiB: refused by the frame's content size, or, when the frame does not say,
    as soon as the output passes ``max_member_bytes`` (the staging file never holds more)."""
    limits = ExtractLimits(max_member_bytes=MIB)
    old = _binary(7, 4096)
    params = zstandard.ZstdCompressionParameters.from_level(
        3, window_log=20, write_content_size=int(content_size), write_checksum=1
    )
    dictionary = zstandard.ZstdCompressionDict(old, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    compressor = zstandard.ZstdCompressor(dict_data=dictionary, compression_params=params)
    delta = compressor.compress(bytes(64 * MIB))
    assert len(delta) < 64 * 1024
    with pytest.raises(ArchiveLimitError, match=f"limits.max_member_bytes = {MIB}"):
        await _stage(server, tmp_path, delta, _base(old, "0" * 64), limits=limits)
    assert not (tmp_path / "stage").exists()


async def test_something_that_is_no_zstd_frame_is_refused(server: LoopbackServer, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="not a delta: no zstd frame at offset 0"):
        await _stage(server, tmp_path, b"<html>not found</html>", _base(b"x" * 100, "0" * 64))
    assert not (tmp_path / "stage").exists()


async def test_a_refused_delta_falls_back_to_the_archive_with_the_reason(
    server: LoopbackServer, tmp_path: Path, pair: tuple[bytes, bytes, bytes]
) -> None:
    _old, new, delta = pair
    other = _binary(9, MIB)
    server.routes["/d.zst"] = body(delta)
    server.routes["/full"] = body(new)
    seen: list[str] = []

    async def read_base(slot: str) -> DeltaBase:
        assert slot == "green"
        return _base(other, _sha(new))

    source = DeltaSource(
        deltas=_source(), read_base=read_base, fallback=_source(), fallback_source=server.url("/full"),
        fallback_sha256=_sha(new), on_fallback=seen.append,
    )
    staged = await source.stage(server.url("/d.zst"), _sha(delta), str(tmp_path / "stage"), "green")
    assert (tmp_path / "stage").read_bytes() == new
    assert staged.delta_refused is not None and "another base" in staged.delta_refused
    assert seen == [staged.delta_refused]
    assert [p for p, _ in server.requests] == ["/d.zst", "/full"]


async def test_without_an_archive_a_missing_delta_is_the_error(
    server: LoopbackServer, tmp_path: Path
) -> None:
    async def read_base(slot: str) -> DeltaBase:
        return _base(b"x" * 100, "0" * 64)

    source = DeltaSource(deltas=_source(), read_base=read_base)
    with pytest.raises(FetchHTTPError):
        await source.stage(server.url("/gone.zst"), "0" * 64, str(tmp_path / "stage"), "green")
    assert not (tmp_path / "stage").exists()

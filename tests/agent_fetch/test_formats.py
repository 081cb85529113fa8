"""Releases as publishers ship them (K10, C27/C28): every valid encoding, made by the real tools, accepted;
each one cut at ten offsets is the one "archive truncated/corrupt" error; a bare executable is the file.

The archives are made by the real command-line tools a publisher uses (``tar``, ``pigz``, ``zstd``,
``xz``, ``bzip2``), never by the code under test. The expected outcome of every case is written down
next to it: the staged bytes equal the member, the archive digest is the sha256 of the file as written,
and a refusal leaves nothing behind (the staging file gone, nothing else written).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import zstandard

from agent.release.extract import ExtractLimits
from upgrade_core.errors import ArchiveLimitError, ArchiveRejectedError, ArchiveTruncatedError

from ._archives import tree
from .conftest import MEMBER, run_extract

pytestmark = pytest.mark.anyio

TOOLS = ("tar", "pigz", "zstd", "xz", "bzip2")
_missing = [t for t in TOOLS if shutil.which(t) is None]
if _missing:  # scripts/bootstrap.sh installs them; a machine without them must not pass silently
    raise RuntimeError(
        f"tests/agent_fetch/test_formats.py needs {', '.join(_missing)} (run scripts/bootstrap.sh)"
    )

PAYLOAD = b"\x7fELF" + os.urandom(300_000) + bytes(100_000)  # incompressible then compressible


def _sh(cmd: str, cwd: Path) -> bytes:
    return subprocess.run(["sh", "-c", cmd], cwd=cwd, check=True, capture_output=True).stdout


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding ``MEMBER`` and ``release.tar`` (GNU tar's own archive of it, blocking 20)."""
    d = tmp_path_factory.mktemp("release")
    (d / MEMBER).write_bytes(PAYLOAD)
    (d / MEMBER).chmod(0o755)
    _sh(f"tar --format=gnu --owner=0 --group=0 -cf release.tar {MEMBER}", d)
    return d


def _skippable(payload: bytes, nibble: int = 0) -> bytes:
    return (0x184D2A50 + nibble).to_bytes(4, "little") + len(payload).to_bytes(4, "little") + payload


def _encodings(d: Path) -> dict[str, tuple[str, bytes]]:
    """name -> (compression the agent must report, archive bytes), each made by the real tool."""
    tar = (d / "release.tar").read_bytes()
    half = len(tar) // 2
    (d / "a.part").write_bytes(tar[:half])
    (d / "b.part").write_bytes(tar[half:])
    return {
        "tar": ("tar", tar),
        "gzip (gzip -9)": ("gzip", _sh("gzip -9 -n -c release.tar", d)),
        "pigz (-p 2, 32 KiB blocks)": ("gzip", _sh("pigz -p 2 -b 32 -c release.tar", d)),
        "pigz multi-member (two pigz outputs concatenated)": (
            "gzip",
            _sh("pigz -c a.part", d) + _sh("pigz -c b.part", d),
        ),
        "zstd two frames (zstd CLI, concatenated)": (
            "zstd",
            _sh("zstd -q -c a.part", d) + _sh("zstd -q -c b.part", d),
        ),
        "zstd without content size, without checksum (stdin)": (
            "zstd",
            _sh("cat release.tar | zstd -q --no-check -c", d),
        ),
        "zstd with content size and checksum, single segment": (
            "zstd",
            _sh("zstd -q -19 --check -c release.tar", d),
        ),
        "zstd skippable frames first, between and last": (
            "zstd",
            _skippable(b"meta")
            + _sh("zstd -q -c a.part", d)
            + _skippable(b"", 15)
            + _sh("zstd -q -c b.part", d)
            + _skippable(os.urandom(70_000), 7),
        ),
        "zstd one frame per 64 KiB block (zstandard, RLE and raw blocks)": (
            "zstd",
            b"".join(
                zstandard.ZstdCompressor(level=1, write_content_size=False).compress(tar[i : i + 65536])
                for i in range(0, len(tar), 65536)
            ),
        ),
        "xz (xz -6)": ("xz", _sh("xz -c release.tar", d)),
        "xz -9e with sha256 check": ("xz", _sh("xz -9e --check=sha256 -c release.tar", d)),
        "xz two streams with stream padding between and after": (
            "xz",
            _sh("xz --check=none -c a.part", d) + bytes(8) + _sh("xz -c b.part", d) + bytes(4),
        ),
        "bzip2 (bzip2 -9)": ("bzip2", _sh("bzip2 -9 -c release.tar", d)),
        "bzip2 two streams (pbzip2 style, concatenated)": (
            "bzip2",
            _sh("bzip2 -c a.part", d) + _sh("bzip2 -c b.part", d),
        ),
    }


ENCODING_NAMES = [
    "tar",
    "gzip (gzip -9)",
    "pigz (-p 2, 32 KiB blocks)",
    "pigz multi-member (two pigz outputs concatenated)",
    "zstd two frames (zstd CLI, concatenated)",
    "zstd without content size, without checksum (stdin)",
    "zstd with content size and checksum, single segment",
    "zstd skippable frames first, between and last",
    "zstd one frame per 64 KiB block (zstandard, RLE and raw blocks)",
    "xz (xz -6)",
    "xz -9e with sha256 check",
    "xz two streams with stream padding between and after",
    "bzip2 (bzip2 -9)",
    "bzip2 two streams (pbzip2 style, concatenated)",
]


@pytest.fixture(scope="module")
def encodings(release: Path) -> dict[str, tuple[str, bytes]]:
    made = _encodings(release)
    assert list(made) == ENCODING_NAMES
    return made


async def _refused(data: bytes, staging: Path, exc: type[Exception], **kw: object) -> Exception:
    before = tree(str(staging.parent.parent))
    with pytest.raises(exc) as info:
        await run_extract(data, staging, **kw)  # type: ignore[arg-type]
    assert not staging.exists()
    assert tree(str(staging.parent.parent)) == before
    assert "\n" not in str(info.value) and "test.tar" in str(info.value)
    return info.value


@pytest.mark.parametrize("name", ENCODING_NAMES)
async def test_c28_every_encoding_is_staged_exactly(
    staging: Path, encodings: dict[str, tuple[str, bytes]], name: str
) -> None:
    compression, data = encodings[name]
    result = await run_extract(data, staging, expected_sha256=hashlib.sha256(data).hexdigest())
    assert staging.read_bytes() == PAYLOAD
    assert result.member_sha256 == hashlib.sha256(PAYLOAD).hexdigest()
    assert (result.archive_sha256, result.archive_size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert result.compression == compression
    assert sorted(os.listdir(staging.parent)) == [staging.name]


def _cuts(name: str, data: bytes, tar_end: int) -> list[int]:
    """Ten cut offsets spread over the archive, from inside the magic number to one byte short.

    A plain tar is recognised by its ``ustar`` magic at offset 257 and is complete once its two zero end
    blocks are in, so its ten cuts lie between 300 and the end blocks (docs/candidate.md)."""
    if name == "tar":
        return [300 + (tar_end - 300) * k // 9 for k in range(10)]
    n = len(data)
    return sorted({1, 3, *(n * k // 8 for k in range(1, 8)), n - 1})


@pytest.mark.parametrize("name", ENCODING_NAMES)
async def test_c28_each_encoding_cut_at_ten_offsets_is_the_one_truncation_error(
    staging: Path, encodings: dict[str, tuple[str, bytes]], release: Path, name: str
) -> None:
    _compression, data = encodings[name]
    tar_end = 512 + len(PAYLOAD) + (-len(PAYLOAD) % 512) + 1024 - 1  # the last byte of the end blocks
    cuts = _cuts(name, data, tar_end)
    assert len(cuts) == 10
    for cut in cuts:
        err = await _refused(data[:cut], staging, ArchiveTruncatedError)
        assert "archive truncated/corrupt" in str(err), (cut, err)


# Streams whose every byte is covered by a check of the format itself (CRC32, xxhash64, CRC32/sha256,
# stream CRC). Without a check (zstd --no-check, xz --check=none, stored blocks of incompressible data) a
# flipped byte is not the format's to find: the --sha256 pin over the file is (test_expected_digest).
CHECKED = [
    n
    for n in ENCODING_NAMES
    if n != "tar"
    and "without checksum" not in n
    and "skippable" not in n
    and "64 KiB" not in n
    and "two streams with stream padding" not in n
]


@pytest.mark.parametrize("name", CHECKED)
async def test_c28_a_flipped_byte_inside_the_compressed_data_is_the_same_error(
    staging: Path, encodings: dict[str, tuple[str, bytes]], name: str
) -> None:
    _compression, data = encodings[name]
    at = len(data) // 3
    broken = data[:at] + bytes([data[at] ^ 0x55]) + data[at + 1 :]
    err = await _refused(broken, staging, ArchiveTruncatedError)
    assert "archive truncated/corrupt" in str(err)


@pytest.mark.parametrize("name", [n for n in ENCODING_NAMES if n != "tar"])
async def test_c28_trailing_garbage_after_the_proper_end_is_refused(
    staging: Path, encodings: dict[str, tuple[str, bytes]], name: str
) -> None:
    _compression, data = encodings[name]
    err = await _refused(data + b"GARBAGE!", staging, ArchiveRejectedError)
    assert "trailing data" in str(err)


async def test_xz_padding_not_a_multiple_of_four_is_corrupt(staging: Path, release: Path) -> None:
    data = _sh("xz -c release.tar", release) + bytes(3)
    await _refused(data, staging, ArchiveTruncatedError)


async def test_detection_is_by_content_never_by_name(
    staging: Path, encodings: dict[str, tuple[str, bytes]]
) -> None:
    """The source name says .tar.gz; the bytes are xz: they are read as xz."""
    from agent.release.extract import extract

    from .conftest import feed_bytes

    data = encodings["xz (xz -6)"][1]
    result = await extract(
        feed_bytes(data),
        str(staging),
        member=MEMBER,
        policy="exact",
        limits=ExtractLimits(),
        source_name="https://example.com/release.tar.gz",
    )
    assert result.compression == "xz" and staging.read_bytes() == PAYLOAD


# -- a bare executable (agent.member_policy = "none") --------------------------------------------------
async def test_bare_executable_is_the_candidate(staging: Path) -> None:
    binary = Path(shutil.which("true") or "/bin/true").read_bytes()
    result = await run_extract(binary, staging, policy="none")
    assert staging.read_bytes() == binary
    assert oct(staging.stat().st_mode & 0o777) == "0o755"
    digest = hashlib.sha256(binary).hexdigest()
    assert (result.member_sha256, result.archive_sha256, result.compression) == (digest, digest, "none")


async def test_bare_policy_never_sniffs_for_archive_magic(
    staging: Path, encodings: dict[str, tuple[str, bytes]]
) -> None:
    """With "none" a gzip file is not unpacked: it is the file (the version check would then refuse it)."""
    data = encodings["gzip (gzip -9)"][1]
    await run_extract(data, staging, policy="none")
    assert staging.read_bytes() == data


async def test_bare_empty_file_refused(staging: Path) -> None:
    err = await _refused(b"", staging, ArchiveRejectedError, policy="none")
    assert "empty" in str(err)


async def test_bare_file_bounded_by_member_and_archive_limits(staging: Path) -> None:
    err = await _refused(
        os.urandom(5000),
        staging,
        ArchiveLimitError,
        policy="none",
        limits=ExtractLimits(max_member_bytes=4096),
    )
    assert "max_member_bytes" in str(err)
    err = await _refused(
        os.urandom(5000),
        staging,
        ArchiveLimitError,
        policy="none",
        limits=ExtractLimits(max_archive_bytes=4096),
    )
    assert "max_archive_bytes" in str(err)


async def test_bare_file_never_written_through_an_existing_path(staging: Path, tmp_path: Path) -> None:
    target = tmp_path / "running-binary"
    target.write_bytes(b"original")
    staging.symlink_to(target)
    from upgrade_core.errors import HostError

    with pytest.raises(HostError):
        await run_extract(b"\x7fELF new", staging, policy="none")
    assert target.read_bytes() == b"original" and staging.is_symlink()


async def test_xz_decoder_memory_is_bounded(staging: Path, release: Path) -> None:
    """An xz stream whose dictionary needs more than the decoder memory bound is refused, not decoded."""
    data = _sh("xz --lzma2=dict=192MiB -c release.tar", release)
    err = await _refused(data, staging, ArchiveLimitError)
    assert "decoder memory" in str(err)


GZIP_NAMES = [n for n in ENCODING_NAMES if n.startswith(("gzip", "pigz"))]


@pytest.mark.parametrize("inflater", ["isal", "zlib"])
@pytest.mark.parametrize("name", GZIP_NAMES)
async def test_gzip_reads_the_same_through_isal_and_the_zlib_fallback(
    staging: Path, encodings: dict[str, tuple[str, bytes]], monkeypatch: pytest.MonkeyPatch, name: str,
    inflater: str,
) -> None:
    """gzip is inflated by ISA-L (python-isal) where it is installed, else by zlib: both stage the same
    bytes and refuse a cut, a flipped byte and trailing data with the same errors."""
    import zlib

    from agent.release import extract

    assert extract._inflate.__name__ == "isal.isal_zlib"  # a dependency: the default here
    if inflater == "zlib":
        monkeypatch.setattr(extract, "_inflate", zlib)
        monkeypatch.setattr(extract, "_INFLATE_ERRORS", (zlib.error,))
    _compression, data = encodings[name]
    await run_extract(data, staging)
    assert staging.read_bytes() == PAYLOAD
    staging.unlink()
    err = await _refused(data[: len(data) // 2], staging, ArchiveTruncatedError)
    assert "archive truncated/corrupt" in str(err)
    at = len(data) // 3
    flipped = data[:at] + bytes([data[at] ^ 0x55]) + data[at + 1:]
    assert "archive truncated/corrupt" in str(await _refused(flipped, staging, ArchiveTruncatedError))
    assert "trailing data" in str(await _refused(data + b"GARBAGE!", staging, ArchiveRejectedError))
    second = await _refused(data + b"\x1f\x8b\x00garbage", staging, ArchiveRejectedError)  # a bad 2nd header
    assert "trailing data" in str(second)

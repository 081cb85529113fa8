"""Field cases K1-K3 (C01-C04, C07) and C09 against the real extraction pipeline, on asyncio and trio.

Every case writes its expected outcome down: the error class, that the staging file is gone, and that
nothing else appeared under tmp_path.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from agent.release.extract import ExtractLimits
from upgrade_core.errors import (
    ArchiveLimitError,
    ArchiveRejectedError,
    ArchiveTruncatedError,
    DigestMismatchError,
    HostError,
)

from ._archives import Entry, compress, tar_bytes, tar_header, tree, zstd_zero_bomb
from .conftest import MEMBER, run_extract

pytestmark = pytest.mark.anyio

BINARY = b"\x7fELF" + bytes(range(256)) * 300  # 76,804 bytes, not all zeros


async def _refused(data: bytes, staging: Path, exc: type[Exception], **kw: object) -> Exception:
    before = tree(str(staging.parent.parent))
    with pytest.raises(exc) as info:
        await run_extract(data, staging, **kw)  # type: ignore[arg-type]
    assert not staging.exists()
    assert tree(str(staging.parent.parent)) == before
    assert "test.tar" in str(info.value)
    return info.value


@pytest.mark.parametrize("how", ["tar", "gzip", "zstd"])
async def test_good_archive_is_staged_exactly(staging: Path, how: str) -> None:
    data = compress(tar_bytes([Entry(MEMBER, data=BINARY)]), how)
    result = await run_extract(data, staging)
    assert staging.read_bytes() == BINARY
    assert stat.S_IMODE(staging.stat().st_mode) == 0o755
    assert result.member_sha256 == hashlib.sha256(BINARY).hexdigest()
    assert result.archive_sha256 == hashlib.sha256(data).hexdigest()
    assert (result.member_size, result.archive_size, result.compression) == (len(BINARY), len(data), how)
    assert sorted(os.listdir(staging.parent)) == [staging.name]


async def test_multi_member_gzip_and_dot_slash_name(staging: Path) -> None:
    raw = tar_bytes([Entry("./" + MEMBER, data=BINARY)])
    data = gzip.compress(raw[:700]) + gzip.compress(raw[700:])
    await run_extract(data, staging)
    assert staging.read_bytes() == BINARY


async def test_expected_digest(staging: Path) -> None:
    data = compress(tar_bytes([Entry(MEMBER, data=BINARY)]), "gzip")
    await run_extract(data, staging, expected_sha256=hashlib.sha256(data).hexdigest())
    staging.unlink()
    err = await _refused(data, staging, DigestMismatchError, expected_sha256="0" * 64)
    # the digest the bytes have is never told: the source may be a file the asker cannot read
    assert str(err).endswith(f"the archive's sha256 is not the expected {'0' * 64}")
    assert hashlib.sha256(data).hexdigest() not in str(err)


# -- K1 C01: escaping names --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../etc/cron.d/x", "/etc/cron.d/x", f"x/../{MEMBER}", f"/{MEMBER}"])
@pytest.mark.parametrize("policy", ["exact", "select"])
async def test_c01_escaping_names_refused(staging: Path, name: str, policy: str) -> None:
    data = compress(tar_bytes([Entry(name, data=b"* * * * * root sh -c evil\n")]), "gzip")
    await _refused(data, staging, ArchiveRejectedError, policy=policy)


async def test_c01_escaping_name_next_to_the_member_refused_in_select(staging: Path) -> None:
    data = tar_bytes([Entry(MEMBER, data=BINARY), Entry("../../etc/cron.d/x", data=b"evil")])
    await _refused(data, staging, ArchiveRejectedError, policy="select")


# -- K1 C02: links, devices, FIFOs -------------------------------------------------------------------
@pytest.mark.parametrize(
    "entry",
    [
        Entry(MEMBER, kind="lnk", linkname="../../../usr/bin/sudo"),
        Entry(MEMBER, kind="sym", linkname="/usr/bin/sudo"),
        Entry(MEMBER, kind="chr"),
        Entry(MEMBER, kind="blk"),
        Entry(MEMBER, kind="fifo"),
        Entry(MEMBER, kind="dir"),
        Entry(MEMBER, data=b""),
    ],
    ids=["hardlink", "symlink", "chardev", "blockdev", "fifo", "dir", "empty"],
)
@pytest.mark.parametrize("policy", ["exact", "select"])
async def test_c02_member_must_be_a_nonempty_regular_file(staging: Path, entry: Entry, policy: str) -> None:
    await _refused(compress(tar_bytes([entry]), "gzip"), staging, ArchiveRejectedError, policy=policy)


async def test_c02_hardlink_after_the_member_is_a_duplicate(staging: Path) -> None:
    sudo = Entry(MEMBER, kind="lnk", linkname="../../../usr/bin/sudo")
    data = tar_bytes([Entry(MEMBER, data=BINARY), sudo])
    await _refused(data, staging, ArchiveRejectedError, policy="select")


async def test_exact_refuses_any_second_entry(staging: Path) -> None:
    data = tar_bytes([Entry(MEMBER, data=BINARY), Entry("README", data=b"hi")])
    await _refused(data, staging, ArchiveRejectedError, policy="exact")


async def test_select_ignores_other_entries_of_any_type(staging: Path) -> None:
    data = compress(
        tar_bytes([
            Entry("bin", kind="dir"),
            Entry("LICENSE", data=b"text"),
            Entry("latest", kind="sym", linkname="/etc/shadow"),
            Entry("sudo", kind="lnk", linkname="../../../usr/bin/sudo"),
            Entry("null", kind="chr"),
            Entry("pipe", kind="fifo"),
            Entry(f"bin/{MEMBER}", data=BINARY),
        ]),
        "zstd",
    )
    await run_extract(data, staging, member=f"bin/{MEMBER}", policy="select")
    assert staging.read_bytes() == BINARY
    assert sorted(os.listdir(staging.parent)) == [staging.name]


async def test_select_needs_the_member(staging: Path) -> None:
    await _refused(tar_bytes([Entry("other", data=BINARY)]), staging, ArchiveRejectedError, policy="select")


# -- K1 C03: no dependence on tarfile's extraction filters ------------------------------------------
async def test_c03_link_accepted_by_data_filter_is_still_refused(staging: Path) -> None:
    # A relative symlink inside the destination passes filter="data" (tarfile.data_filter) ...
    link = Entry(MEMBER, kind="sym", linkname="real-binary")
    if hasattr(tarfile, "data_filter"):
        info = tarfile.TarInfo(MEMBER)
        info.type, info.linkname = tarfile.SYMTYPE, "real-binary"
        assert tarfile.data_filter(info, str(staging.parent)) is not None
    # ... but the member must be a regular file whatever the Python patch level.
    data = tar_bytes([Entry("real-binary", data=BINARY), link])
    await _refused(data, staging, ArchiveRejectedError, policy="select")


def test_c03_extraction_never_calls_tarfile_extract() -> None:
    source = Path(__file__).parents[2].joinpath("agent", "release", "extract.py").read_text()
    code = "\n".join(line.split("#", 1)[0] for line in source.splitlines())
    for forbidden in (".extractall(", ".extract(", "filter=", "extraction_filter", "data_filter"):
        assert forbidden not in code


# -- K2 C04: resource exhaustion ---------------------------------------------------------------------
async def test_c04_gzip_bomb_limited(staging: Path) -> None:
    # gzip tops out near 1032:1, so a ~40 KiB archive expands to ~40 MiB; the bound is scaled to match.
    data = compress(tar_bytes([Entry("filler", data=bytes(40 << 20)), Entry(MEMBER, data=BINARY)]), "gzip")
    assert len(data) < 64 * 1024
    limits = ExtractLimits(max_total_bytes=8 << 20)
    err = await _refused(data, staging, ArchiveLimitError, policy="select", limits=limits)
    assert "max_total_bytes" in str(err)


async def test_c04_zstd_eight_gib_of_zeros_limited_by_default_limits(staging: Path) -> None:
    bomb = zstd_zero_bomb(tar_header("zeros", 8 << 30), 8 << 30)
    assert len(bomb) < 300 * 1024
    err = await _refused(bomb, staging, ArchiveLimitError, policy="select")
    assert "max_total_bytes" in str(err)


async def test_c04_member_larger_than_member_limit(staging: Path) -> None:
    data = compress(tar_bytes([Entry(MEMBER, data=bytes(4 << 20))]), "gzip")
    await _refused(data, staging, ArchiveLimitError, limits=ExtractLimits(max_member_bytes=1 << 20))


async def test_c04_archive_larger_than_archive_limit(staging: Path) -> None:
    data = tar_bytes([Entry(MEMBER, data=BINARY)])
    await _refused(data, staging, ArchiveLimitError, limits=ExtractLimits(max_archive_bytes=64 * 1024))


async def test_c04_header_understating_its_data(staging: Path) -> None:
    real = tar_header(MEMBER, 1000) + BINARY[:5000]  # the header says 1000 bytes; 5000 follow
    real += bytes(-len(real) % 512) + bytes(1024)
    await _refused(compress(real, "gzip"), staging, ArchiveRejectedError)


async def test_c04_hundred_thousand_empty_entries(staging: Path) -> None:
    empties = b"".join(tar_header(f"e{i}", 0) for i in range(100_000))
    data = compress(empties + tar_bytes([Entry(MEMBER, data=BINARY)]), "gzip")
    err = await _refused(data, staging, ArchiveLimitError, policy="select")
    assert "max_entries" in str(err)


async def test_c04_zstd_window_limit(staging: Path) -> None:
    import zstandard

    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=24)
    raw = tar_bytes([Entry(MEMBER, data=os.urandom(1 << 20) * 20)])
    data = zstandard.ZstdCompressor(compression_params=params).compress(raw)
    limits = ExtractLimits(max_zstd_window_bytes=1 << 20)
    err = await _refused(data, staging, ArchiveLimitError, limits=limits)
    assert "max_zstd_window_bytes" in str(err)


# -- K3 C07: truncation ------------------------------------------------------------------------------
def _cut_cases() -> list[tuple[str, bytes]]:
    raw = tar_bytes([Entry(MEMBER, data=os.urandom(200_000))])
    gz = compress(raw, "gzip")
    zs = compress(raw, "zstd")
    return [
        ("tar.gz cut inside the member data", gz[: len(gz) // 2]),
        ("tar.gz cut after the member, before the gzip trailer", gz[:-8]),
        ("tar.gz cut one byte short", gz[:-1]),
        ("tar.zst cut mid-frame", zs[: len(zs) // 2]),
        ("tar.zst cut inside the checksum", zs[:-2]),
        ("tar cut inside the member data", raw[:100_000]),
        ("tar cut right after the member data", raw[: 512 + 200_000 + (-200_000 % 512)]),
    ]


@pytest.mark.parametrize(("label", "data"), _cut_cases(), ids=lambda v: v if isinstance(v, str) else "")
async def test_c07_truncation_is_one_typed_error(staging: Path, label: str, data: bytes) -> None:
    err = await _refused(data, staging, ArchiveTruncatedError)
    assert "truncated" in str(err)


@pytest.mark.parametrize("how", ["gzip", "zstd"])
async def test_trailing_garbage_after_the_stream_refused(staging: Path, how: str) -> None:
    data = compress(tar_bytes([Entry(MEMBER, data=BINARY)]), how) + b"GARBAGE!"
    err = await _refused(data, staging, ArchiveRejectedError)
    assert "trailing data" in str(err)


async def test_nonzero_bytes_after_the_tar_end_refused(staging: Path) -> None:
    raw = tar_bytes([Entry(MEMBER, data=BINARY)])
    await _refused(compress(raw + b"\x01" + bytes(511), "gzip"), staging, ArchiveRejectedError)


# -- K5 C09: the staging file is always a new inode ---------------------------------------------------
async def test_c09_existing_file_at_staging_path_is_never_written(staging: Path) -> None:
    """Run a copy of ``sleep`` from the staging path: staging refuses (O_EXCL) and leaves it intact."""
    sleep_bin = shutil.which("sleep")
    assert sleep_bin is not None
    staging.write_bytes(Path(sleep_bin).read_bytes())
    staging.chmod(0o755)
    digest = hashlib.sha256(staging.read_bytes()).hexdigest()
    proc = subprocess.Popen([str(staging), "30"])
    try:
        with pytest.raises(HostError, match="cannot create"):
            await run_extract(tar_bytes([Entry(MEMBER, data=BINARY)]), staging)
        assert proc.poll() is None
        assert hashlib.sha256(staging.read_bytes()).hexdigest() == digest
    finally:
        proc.kill()
        proc.wait()


async def test_c09_symlink_at_staging_path_is_not_followed(staging: Path, tmp_path: Path) -> None:
    target = tmp_path / "running-binary"
    target.write_bytes(b"original")
    staging.symlink_to(target)
    with pytest.raises(HostError):
        await run_extract(tar_bytes([Entry(MEMBER, data=BINARY)]), staging)
    assert target.read_bytes() == b"original"
    assert staging.is_symlink()



async def test_not_an_archive(staging: Path) -> None:
    err = await _refused(b"<html>502 Bad Gateway</html>\n" * 40, staging, ArchiveRejectedError)
    assert "not an archive" in str(err) and "member_policy" in str(err)


@pytest.mark.parametrize(
    "data",
    [b"\xfd7zXZ\x00" + bytes(600), b"BZh91AY&SY" + bytes(600), b"", b"\x1f", b"\x28\xb5\x2f", b"\xfd7zX"],
    ids=["xz-zeros", "bzip2-zeros", "empty", "gzip-magic-cut", "zstd-magic-cut", "xz-magic-cut"],
)
async def test_corrupt_or_empty_is_the_truncation_error(staging: Path, data: bytes) -> None:
    """A compression magic followed by garbage, an empty body, a body cut inside a magic number: all are
    "archive truncated/corrupt" (C28), never a second kind of error."""
    err = await _refused(data, staging, ArchiveTruncatedError)
    assert "archive truncated/corrupt" in str(err)

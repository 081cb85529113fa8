"""Archive builders for the fetch/extract tests: real tar headers, real gzip and zstd streams."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
import zstandard

KINDS = ("reg", "dir", "sym", "lnk", "chr", "blk", "fifo")
_TYPES = {
    "reg": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "sym": tarfile.SYMTYPE,
    "lnk": tarfile.LNKTYPE,
    "chr": tarfile.CHRTYPE,
    "blk": tarfile.BLKTYPE,
    "fifo": tarfile.FIFOTYPE,
}


@attrs.frozen
class Entry:
    """One tar entry to write: name, kind (see KINDS), data (regular files only), link target."""

    name: str
    kind: str = "reg"
    data: bytes = b""
    linkname: str = ""


def tar_bytes(entries: Iterable[Entry], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A real tar stream (tarfile writer, 10240-byte records) holding ``entries`` in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type = _TYPES[e.kind]
            info.mode = 0o755
            if e.kind == "reg":
                info.size = len(e.data)
                tf.addfile(info, io.BytesIO(e.data))
            else:
                info.linkname = e.linkname
                tf.addfile(info)
    return buf.getvalue()


def tar_end_offset(entries: Sequence[Entry]) -> int:
    """Offset of the end-of-archive blocks for short (< 100 char) names: headers plus padded data."""
    return sum(512 + (-(-len(e.data) // 512) * 512 if e.kind == "reg" else 0) for e in entries)


HOWS = ("tar", "gzip", "gzip-2", "zstd", "zstd-2", "xz", "xz-2", "bzip2", "bzip2-2")


def compress(data: bytes, how: str) -> bytes:
    """``how`` is one of :data:`HOWS`: "tar" (none), "gzip", "zstd" (with a content checksum), "xz",
    "bzip2"; a "-2" suffix splits the data in two members / frames / streams (a zstd one adds skippable
    frames around them, an xz one stream padding). Encoded by the standard library and zstandard."""
    if how.endswith("-2"):
        base, half = how[:-2], len(data) // 2
        first, second = compress(data[:half], base), compress(data[half:], base)
        if base == "zstd":
            skip = (0x184D2A5A).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
            return skip + first + skip + second
        return first + (bytes(4) if base == "xz" else b"") + second
    if how == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    if how == "zstd":
        return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(data)
    if how == "xz":
        return lzma.compress(data, format=lzma.FORMAT_XZ)
    if how == "bzip2":
        return bz2.compress(data)
    return data


def zstd_zero_bomb(header: bytes, zero_bytes: int) -> bytes:
    """One zstd frame: a raw block holding ``header`` then RLE blocks of zeros, built by hand.

    Each RLE block is 4 bytes (3-byte header + the byte) and expands to 128 KiB (RFC 8878), so 8 GiB of
    zeros take 256 KiB. No content size and a 128 KiB window (Window_Descriptor exponent 7 -> 2**17).
    """
    block = 128 * 1024
    assert zero_bytes % block == 0
    out = bytearray(b"\x28\xb5\x2f\xfd")
    out.append(0x00)  # FHD: no FCS, not single-segment, no checksum, no dictionary
    out.append((17 - 10) << 3)  # Window_Descriptor: exponent 7, mantissa 0 -> 128 KiB
    out += ((len(header) << 3) | (0 << 1) | 0).to_bytes(3, "little") + header  # raw block
    n = zero_bytes // block
    rle = ((block << 3) | (1 << 1)).to_bytes(3, "little") + b"\0"
    last = ((block << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"\0"
    out += rle * (n - 1) + last
    return bytes(out)


def tar_header(name: str, size: int) -> bytes:
    """A single 512-byte ustar header for a regular file of ``size`` bytes (data not included)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o755
    return info.tobuf(format=tarfile.GNU_FORMAT)


def tree(root: str) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` (files, dirs, links) with (mode, size): to prove nothing else was written."""
    import os

    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size)
    return out


def zstd_patch(base: bytes, target: bytes, out: Path, *extra: str) -> Path:
    """``zstd --patch-from`` (the publishers' own tool, docs/delta.md): a delta of ``target`` against
    ``base`` written to ``out`` (beside it ``OUT.base`` and ``OUT.target``); ``extra`` goes to zstd first."""
    base_file, target_file = out.with_name(f"{out.name}.base"), out.with_name(f"{out.name}.target")
    base_file.write_bytes(base)
    target_file.write_bytes(target)
    subprocess.run(["zstd", "-q", "-f", *extra, "--patch-from", str(base_file), str(target_file),
                    "-o", str(out)], check=True, timeout=60)
    return out

"""Fetch benchmarks: loopback HTTP fetch + sha256 + decompress + untar + fsync of one member.

Ours: ``ArchiveSourceImpl.stage`` (agent.release.fetch + agent.release.extract) in a child ``python -c``
process of the installed venv (:func:`benchmarks._harness.installed_prefix`, as hosts run it), with
``--sha256`` checked, member written and fsynced. Baseline, same server, same archive, same
disk, with GNU tar's matching decompressor (``-z``: gzip, ``--zstd``: zstd, ``-J``: xz):

    curl -s URL | tee >(sha256sum >/dev/null) | tar -x FLAG -C DIR && sync DIR/MEMBER

Each side runs in a fresh wrapper process that reports ``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``
(the peak RSS of the measured process tree) and the wall time; the rows give medians of 3 interleaved runs.
Inputs are built once under :func:`benchmarks._harness.cache_dir` and reused:

- ``fetch.extract`` (incompressible input): ``gzip -1`` of 256 MiB of random bytes. Stored blocks: the
  decoder hardly runs, so this row measures hashing, copying and writing.
- ``fetch.extract.gzip`` / ``.zstd`` / ``.xz`` (real input): 64 MiB of this machine's own shared libraries
  (the regular ``*.so*`` files of ``/usr/lib/<machine>-linux-gnu``, by name, concatenated and cut; the row
  reports the sha256) packed with ``gzip -6``, ``zstd -19`` and ``xz -6``, as releases are. Here the decoder
  is the cost. Targets 0.45, 0.9 and 1.0; peak RSS <= 48 MiB.
- ``fetch.extract.decoder_limit``: ours against the fastest decoder alone (no hash, no write), per format;
  the row is the format with the highest ratio. Target 1.3.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import statistics
import subprocess
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from . import _harness

NAME = "fetch.extract"
MEMBER = "bench-agent-linux-amd64"
MEMBER_BYTES = 256 << 20
TARGET_RATIO = 0.7  # design §9 (the first target, 1.3, was tightened once met)
RSS_LIMIT_MIB = 48.0  # design §9 (the first limit, 80, was tightened once met)
RUNS = 3

_OURS = r"""
import anyio, hashlib, os, sys
from agent.release.extract import ExtractLimits
from agent.release.source import ArchiveSourceImpl
url, digest, staging, member, member_sha = sys.argv[1:6]
limits = ExtractLimits(max_archive_bytes=1 << 30, max_member_bytes=1 << 30, max_total_bytes=1 << 31)
src = ArchiveSourceImpl(member=member, limits=limits)
staged = anyio.run(src.stage, url, digest, staging, "blue")
sys.exit(0 if staged.sha256 == member_sha else 3)
"""


def _build(cache: Path) -> tuple[Path, str, str]:
    """Build (once) the archive; returns (archive path, archive sha256, member sha256)."""
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / "fetch-extract.tar.gz"
    meta = cache / "fetch-extract.json"
    if archive.exists() and meta.exists():
        info = json.loads(meta.read_text())
        return archive, info["archive_sha256"], info["member_sha256"]
    src = cache / "src"
    src.mkdir(exist_ok=True)
    member_path = src / MEMBER
    digest = hashlib.sha256()
    with open(member_path, "wb") as f:
        for _ in range(MEMBER_BYTES // (1 << 20)):
            block = os.urandom(1 << 20)
            digest.update(block)
            f.write(block)
    tmp = cache / "fetch-extract.tar.gz.tmp"
    subprocess.run(
        ["bash", "-c", f"set -o pipefail; tar -C {src} -cf - {MEMBER} | gzip -1 > {tmp}"], check=True
    )
    archive_sha = hashlib.sha256(tmp.read_bytes()).hexdigest()
    os.replace(tmp, archive)
    meta.write_text(json.dumps({"archive_sha256": archive_sha, "member_sha256": digest.hexdigest()}))
    shutil.rmtree(src)
    return archive, archive_sha, digest.hexdigest()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _side_by_side(archive: Path, archive_sha: str, member_sha: str, tar_flag: str,
                  runs: int = RUNS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``runs`` interleaved runs of ours and the shell baseline on ``archive`` served over loopback HTTP;
    (ours, baseline) wrapper reports. ``tar_flag`` names the baseline's decompressor (``z``, ``J``,
    ``--zstd``)."""
    python = _harness.installed("python")
    work = archive.parent / "work"
    handler = partial(_QuietHandler, directory=str(archive.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{archive.name}"
    env = _harness.clean_env()
    ours: list[dict[str, Any]] = []
    base: list[dict[str, Any]] = []
    try:
        for _ in range(runs):
            for side in ("ours", "baseline"):
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
                if side == "ours":
                    staging = work / f".{MEMBER}-blue.stage-bench"
                    argv = [python, "-P", "-c", _OURS, url, archive_sha, str(staging), MEMBER, member_sha]
                    ours.append(_harness.measure(argv, env))
                else:
                    script = (
                        f"set -o pipefail; curl -sf {url} | tee >(sha256sum >/dev/null) | tar -x {tar_flag} "
                        f"-C {work} && sync {work / MEMBER}"
                    )
                    base.append(_harness.measure(["bash", "-c", script]))
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(work, ignore_errors=True)
    return ours, base


def run() -> dict[str, Any]:
    """Run both sides ``RUNS`` times, interleaved; return the row (medians of wall seconds)."""
    archive, archive_sha, member_sha = _build(_harness.cache_dir())
    ours, base = _side_by_side(archive, archive_sha, member_sha, "-z")
    value = statistics.median(r["seconds"] for r in ours)
    baseline_value = statistics.median(r["seconds"] for r in base)
    peak = max(r["peak_rss_mib"] for r in ours)
    ratio = value / baseline_value
    return {
        "name": NAME,
        "value": round(value, 3),
        "unit": "s",
        "baseline": "curl -s URL | tee >(sha256sum >/dev/null) | tar xz -C dir && sync file",
        "baseline_value": round(baseline_value, 3),
        "ratio": round(ratio, 3),
        "target": TARGET_RATIO,
        "met": ratio <= TARGET_RATIO and peak <= RSS_LIMIT_MIB,
        "peak_rss_mib": round(peak, 1),
        "baseline_peak_rss_mib": round(max(r["peak_rss_mib"] for r in base), 1),
        "input": "incompressible (random bytes, gzip -1)",
        "member_bytes": MEMBER_BYTES,
        "archive_bytes": archive.stat().st_size,
        "throughput_mib_s": round(MEMBER_BYTES / (1 << 20) / value, 1),
        "runs": RUNS,
        "ours_seconds": [round(r["seconds"], 3) for r in ours],
        "baseline_seconds": [round(r["seconds"], 3) for r in base],
    }


# -- real, compressible input ---------------------------------------------------------------------------
def _library_dir() -> Path:
    """The machine's multiarch library directory (``/usr/lib/x86_64-linux-gnu`` on Debian), else /usr/lib."""
    multiarch = Path(f"/usr/lib/{os.uname().machine}-linux-gnu")
    return multiarch if multiarch.is_dir() else Path("/usr/lib")


def _corpus(cache: Path, size: int) -> tuple[Path, str, list[str]]:
    """``cache/corpus/MEMBER``: the machine's own shared libraries (regular ``*.so*`` files of
    :func:`_library_dir`, by name), concatenated, the list repeated if short, cut at ``size`` bytes; built
    once. Returns (file, sha256, the first library names) -- deterministic on one machine."""
    where = cache / "corpus"
    member, meta = where / MEMBER, where / "corpus.json"
    if member.exists() and meta.exists():
        info = json.loads(meta.read_text())
        if info["bytes"] == size:
            return member, info["sha256"], info["libraries"]
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    names = sorted(p.name for p in _library_dir().iterdir()
                   if ".so" in p.name and p.is_file() and not p.is_symlink())
    digest, left, used = hashlib.sha256(), size, []
    with open(member, "wb") as out:
        while left > 0 and names:
            for name in names:
                try:
                    data = (_library_dir() / name).read_bytes()[:left]
                except OSError:
                    continue
                out.write(data)
                digest.update(data)
                used.append(name)
                left -= len(data)
                if left == 0:
                    break
    meta.write_text(json.dumps({"bytes": size, "sha256": digest.hexdigest(), "libraries": used[:5]}))
    return member, digest.hexdigest(), used[:5]


FORMATS = {  # name -> (packer command, archive suffix, GNU tar's flag for the baseline, target ratio)
    "gzip": ("gzip -6", "tar.gz", "-z", 0.45),
    "zstd": ("zstd -19 -T0 -q", "tar.zst", "--zstd", 0.9),
    "xz": ("xz -6 -T1", "tar.xz", "-J", 1.0),
}
CORPUS_BYTES = 64 << 20
DECODER_LIMIT_TARGET = 1.3


def _packed(fmt: str) -> tuple[Path, str, str]:
    """The corpus as a one-member tar packed by ``FORMATS[fmt]``'s tool (built once, cached):
    (archive, archive sha256, member sha256)."""
    cache = _harness.cache_dir()
    member, member_sha, _ = _corpus(cache, CORPUS_BYTES)
    packer, suffix, _flag, _target = FORMATS[fmt]
    archive = cache / "corpus" / f"corpus.{suffix}"
    meta = archive.with_name(archive.name + ".json")
    if archive.exists() and meta.exists():
        info = json.loads(meta.read_text())
        if info["member_sha256"] == member_sha:
            return archive, info["archive_sha256"], member_sha
    tmp = archive.with_name(archive.name + ".tmp")
    tar = f"tar -C {member.parent} --owner=0 --group=0 --mtime=@0 -cf - {MEMBER}"
    subprocess.run(["bash", "-c", f"set -o pipefail; {tar} | {packer} > {tmp}"], check=True)
    digest = hashlib.sha256()
    with open(tmp, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    os.replace(tmp, archive)
    meta.write_text(json.dumps({"archive_sha256": digest.hexdigest(), "member_sha256": member_sha}))
    return archive, digest.hexdigest(), member_sha


def extract_row(fmt: str, runs: int = RUNS) -> dict[str, Any]:
    """``fetch.extract.<fmt>``: ours vs ``curl | tee >(sha256sum) | tar -x`` with the matching decompressor,
    on the shared-library corpus (medians of ``runs`` interleaved runs)."""
    archive, archive_sha, member_sha = _packed(fmt)
    packer, _suffix, flag, target = FORMATS[fmt]
    ours, base = _side_by_side(archive, archive_sha, member_sha, flag, runs)
    value = statistics.median(r["seconds"] for r in ours)
    baseline_value = statistics.median(r["seconds"] for r in base)
    peak = max(r["peak_rss_mib"] for r in ours)
    ratio = value / baseline_value
    return {
        "name": f"fetch.extract.{fmt}", "value": round(value, 3), "unit": "s",
        "baseline": f"curl -s URL | tee >(sha256sum >/dev/null) | tar -x {flag} -C dir && sync file",
        "baseline_value": round(baseline_value, 3), "ratio": round(ratio, 3), "target": target,
        "met": ratio <= target and peak <= RSS_LIMIT_MIB, "peak_rss_mib": round(peak, 1),
        "rss_limit_mib": RSS_LIMIT_MIB,
        "baseline_peak_rss_mib": round(max(r["peak_rss_mib"] for r in base), 1),
        "input": f"{CORPUS_BYTES >> 20} MiB of this machine's shared libraries ({_library_dir()}), {packer}",
        "member_bytes": CORPUS_BYTES, "archive_bytes": archive.stat().st_size, "member_sha256": member_sha,
        "throughput_mib_s": round(CORPUS_BYTES / (1 << 20) / value, 1), "runs": runs,
        "ours_seconds": [round(r["seconds"], 3) for r in ours],
        "baseline_seconds": [round(r["seconds"], 3) for r in base],
        # CPU seconds (user + system, every process of each side): less moved by a loaded machine than wall
        # time, which is what the ratio compares
        "ours_cpu_s": round(min(r["cpu_s"] for r in ours), 3),
        "baseline_cpu_s": round(min(r["cpu_s"] for r in base), 3),
    }


_DECODE_ONLY = r"""
import lzma, sys
fmt, path = sys.argv[1:3]
if fmt == "gzip":
    try:
        from isal import isal_zlib as inflate
    except ImportError:
        import zlib as inflate
    d = inflate.decompressobj(wbits=31)
elif fmt == "zstd":
    import zstandard
    d = zstandard.ZstdDecompressor().decompressobj()
else:
    d = lzma.LZMADecompressor()
with open(path, "rb") as f:
    while block := f.read(1 << 20):
        d.decompress(block)
"""


def decoder_limit(runs: int = RUNS) -> dict[str, Any]:
    """``fetch.extract.decoder_limit``: for each format, ours (the whole fetch, digest, extract and fsync)
    against the fastest decoder this project has for it alone (``isal``, ``zstandard``, ``lzma``) in a
    fresh Python process of the same installed venv reading the archive from the page cache, no hashing, no
    writing. The row is the format with the highest ratio; every format's figures are beside it."""
    per: dict[str, dict[str, float]] = {}
    for fmt in FORMATS:
        archive, archive_sha, member_sha = _packed(fmt)
        ours, _base = _side_by_side(archive, archive_sha, member_sha, FORMATS[fmt][2], runs)
        decode = [_harness.installed("python"), "-P", "-c", _DECODE_ONLY, fmt, str(archive)]
        alone = [_harness.measure(decode, _harness.clean_env())["seconds"] for _ in range(runs)]
        value, limit = statistics.median(r["seconds"] for r in ours), min(alone)
        per[fmt] = {"ours_s": round(value, 3), "decoder_s": round(limit, 3), "ratio": round(value / limit, 3),
                    "peak_rss_mib": round(max(r["peak_rss_mib"] for r in ours), 1)}
    worst = max(per, key=lambda f: per[f]["ratio"])
    return _harness.row(
        "fetch.extract.decoder_limit", per[worst]["ours_s"], "s",
        f"the fastest decoder alone ({worst}: isal / zstandard / lzma in a fresh process, no hash, no write)",
        per[worst]["decoder_s"], DECODER_LIMIT_TARGET, worst_format=worst, formats=per,
        peak_rss_mib=max(p["peak_rss_mib"] for p in per.values()),
    )


BENCHMARKS: dict[str, Callable[[], dict[str, Any]]] = {
    NAME: run,
    **{f"fetch.extract.{fmt}": partial(extract_row, fmt) for fmt in FORMATS},
    "fetch.extract.decoder_limit": decoder_limit,
}

if __name__ == "__main__":
    print(json.dumps(run(), indent=2))

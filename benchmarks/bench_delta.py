"""``fetch.delta``: a delta upgrade's stage against the full archive's, on two consecutive real releases.

Input: esbuild 0.28.1 and 0.28.2 (``@esbuild/linux-x64``, or ``-arm64``, from the npm registry), the
publisher's own gzip tarballs, fetched once and cached by :mod:`agent.testing.published` (under
``$UPGRADE_CORE_REAL_INPUT_CACHE``, each checked against the registry's ``dist.integrity`` before it is
cached and against its recorded sha256 on every later run). Why this pair: it is the newest patch
release the registry listed on 2026-12-01 and, of the five pairs of consecutive patch releases tried
(0.21.4->0.21.5, 0.24.0->0.24.1, 0.25.11->0.25.12, 0.27.6->0.27.7, 0.28.1->0.28.2), the one with the
largest delta, so the row does not flatter deltas. Delta / full archive bytes of those pairs with
``zstd -19 --patch-from``: 0.084, 0.122, 0.074, 0.0002 (0.27.7's binary differs from 0.27.6's in a few bytes
only: not a fair sample) and 0.194.

The delta is made as a publisher makes it, with ``upgrade-agent delta make --from OLD --to NEW -o OUT``
(the repository's maker: zstd level 19, the old binary as a raw-content dictionary, long-distance matching,
a window covering the larger file; ``zstd -d --patch-from`` decodes it). Its frame's window is the
target's size (about 11 MiB), far under the agent's decoder cap (``2 * limits.max_member_bytes`` = 512
MiB by default, ``agent.release.extract.delta_window_limit``); nothing was loosened for this row. What the
zstd command line gave on the same pair (zstd 1.5.4): ``--patch-from`` at its default level 3 0.464,
``-19`` 0.194 (919,814 bytes), ``--ultra -22`` 0.191, ``-19 --long=27`` 0.194 (the window already covers
the file), ``-19`` with ``targetLength=4096,chainLog=30`` 0.191: only the level matters. ``delta make``
wrote 917,403 bytes (0.1935).

Ours: ``DeltaSource.stage`` (agent.release.delta) in a child process of the installed venv
(:func:`benchmarks._harness.installed_prefix`, as hosts run it; the baseline's child too): the base is the old
binary in a slot file, read whole as the session reads it (one read in a worker thread), the delta fetched
from a loopback HTTP server, decoded against the base into the staging file, its sha256 and the rebuilt
member's checked, fsynced. Baseline: ``ArchiveSourceImpl.stage`` of the full ``.tgz`` from the same server
(member ``package/bin/esbuild``, ``member_policy = "select"``), sha256 checked, fsynced. Both in fresh
processes, interleaved, ``RUNS`` each; the ratio compares the medians of the stage alone (timed inside the
child around ``stage``: the modules the stage imports lazily, the HTTP client's among them, count on both
sides; the interpreter's start and the agent's modules do not). Beside it: the median of the per-run ratios
(each delta stage against the full stage run right after it: steadier than the ratio of medians when the
machine's load moves during the row), the best of each side and the whole-process seconds.

Figures: ``delta_bytes``, ``full_bytes``, ``bytes_ratio`` (target <= 0.30, goal 0.15), ``ratio`` (target
<= 1.0), ``peak_rss_mib`` (the delta side's process tree). ``met`` needs both targets. An unreachable
registry with nothing cached makes the row :func:`benchmarks._harness.skipped`, with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent.testing.published import (
    ESBUILD_MEMBER,
    NPM_REGISTRY,
    RegistryUnreachable,
    esbuild_package,
    npm_tarball,
    tar_member,
)
from agent.testing.releases import ReleaseServer

from . import _harness

NAME = "fetch.delta"
OLD_VERSION = "0.28.1"
NEW_VERSION = "0.28.2"
TARGET_RATIO = 1.0
BYTES_TARGET = 0.30
BYTES_GOAL = 0.15
RUNS = 11
ROOT = Path(__file__).resolve().parents[1]

_FULL = r"""
import anyio, json, sys, time
from agent.release.source import ArchiveSourceImpl
url, digest, staging, member, member_sha = sys.argv[1:6]
src = ArchiveSourceImpl(member=member, member_policy="select")
t0 = time.perf_counter()
staged = anyio.run(src.stage, url, digest, staging, "green")
print(json.dumps({"stage_s": time.perf_counter() - t0}))
sys.exit(0 if staged.sha256 == member_sha else 3)
"""

_DELTA = r"""
import anyio, json, os, sys, time
from agent.fs.regular import read_regular_file
from agent.release.delta import DeltaSource
from agent.release.extract import DeltaBase
from agent.release.source import ArchiveSourceImpl
url, digest, staging, slot_file, member_sha = sys.argv[1:6]
async def read_base(slot):
    limit = os.stat(slot_file).st_size + 1  # one read of the slot's size, as the session asks for
    content = await anyio.to_thread.run_sync(lambda: read_regular_file(slot_file, limit=limit))
    return DeltaBase(content, f"slot blue ({slot_file})", member_sha)
src = DeltaSource(deltas=ArchiveSourceImpl(member_policy="none"), read_base=read_base)
t0 = time.perf_counter()
staged = anyio.run(src.stage, url, digest, staging, "green")
print(json.dumps({"stage_s": time.perf_counter() - t0}))
sys.exit(0 if staged.sha256 == member_sha and staged.delta_refused is None else 3)
"""


def _make_delta(old: Path, new: Path, out: Path, env: dict[str, str]) -> tuple[dict[str, Any], float]:
    """``upgrade-agent --json delta make --from old --to new -o out``: (its JSON, wall seconds)."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "--json", "delta", "make", "--from", str(old), "--to",
         str(new), "-o", str(out)],
        capture_output=True, text=True, env=env, cwd=ROOT, check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"delta make exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    made: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return made, seconds


def _stages(
    work: Path, published: dict[str, tuple[Path, str]], runs: int
) -> tuple[dict[str, Any], float, dict[str, list[dict[str, Any]]]]:
    """In ``work``: the old binary as the current slot's file, the delta made from it to the new one, both
    served over loopback HTTP with the new release's ``.tgz``; ``runs`` interleaved stages of each side.
    Returns (``delta make``'s JSON, its wall seconds, side -> the :func:`benchmarks._harness.measure`
    reports with ``stage_s``)."""
    served = work / "served"
    served.mkdir()
    slot_file = work / "esbuild-blue"  # the old binary, as the current slot holds it
    slot_file.write_bytes(tar_member(published[OLD_VERSION][0], ESBUILD_MEMBER))
    new_binary = work / "esbuild-new"
    new_binary.write_bytes(tar_member(published[NEW_VERSION][0], ESBUILD_MEMBER))
    full_archive, full_sha = published[NEW_VERSION]
    shutil.copyfile(full_archive, served / full_archive.name)
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # delta make: the publisher's side, not measured
    delta = served / f"esbuild-{OLD_VERSION}-to-{NEW_VERSION}.zst"
    made, make_s = _make_delta(slot_file, new_binary, delta, env)
    server = ReleaseServer(served)
    python = _harness.installed("python")
    staging = work / ".esbuild-green.stage-bench"
    sides: dict[str, list[dict[str, Any]]] = {"delta": [], "full": []}
    try:
        for _ in range(runs):
            for side in ("delta", "full"):
                staging.unlink(missing_ok=True)
                if side == "delta":
                    argv = [python, "-P", "-c", _DELTA, f"{server.base}/{delta.name}", made["delta_sha256"],
                            str(staging), str(slot_file), made["member_sha256"]]
                else:
                    argv = [python, "-P", "-c", _FULL, f"{server.base}/{full_archive.name}", full_sha,
                            str(staging), ESBUILD_MEMBER, made["member_sha256"]]
                report = _harness.measure(argv, _harness.clean_env())
                report["stage_s"] = json.loads(report["output"][-1])["stage_s"]
                sides[side].append(report)
    finally:
        server.close()
    return made, make_s, sides


def delta_row(cache: Path | None = None, registry: str = NPM_REGISTRY, runs: int = RUNS) -> dict[str, Any]:
    """The ``fetch.delta`` row (see the module docstring); :func:`benchmarks._harness.skipped` when the
    registry cannot be reached and the releases are not cached, or esbuild has no package for this machine.

    Args:
        cache: where the published tarballs are cached (default ``$UPGRADE_CORE_REAL_INPUT_CACHE``).
        registry: the npm registry's base URL.
        runs: stages of each side, interleaved.

    Raises:
        PublishedMismatch: a cached tarball or a download does not match its digest (never skipped).
        RuntimeError: ``delta make`` or a stage failed; its stderr is in the message.
    """
    package = esbuild_package()
    if package is None:
        return _harness.skipped(NAME, f"esbuild publishes no npm package for machine {os.uname().machine}")
    try:
        published = {v: npm_tarball(package, v, cache, registry=registry) for v in (OLD_VERSION, NEW_VERSION)}
    except RegistryUnreachable as exc:
        return _harness.skipped(NAME, f"package registry unreachable and nothing cached: {exc}")
    work = _harness.disk_dir("fetch-delta")
    try:
        made, make_s, sides = _stages(work, published, runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    full_archive = published[NEW_VERSION][0]
    value = statistics.median(r["stage_s"] for r in sides["delta"])
    baseline_value = statistics.median(r["stage_s"] for r in sides["full"])
    full_bytes = full_archive.stat().st_size
    bytes_ratio = made["delta_size"] / full_bytes
    result = _harness.row(
        NAME, round(value, 4), "s (stage)",
        f"ArchiveSourceImpl.stage of the publisher's full .tgz ({package} {NEW_VERSION}), same server",
        round(baseline_value, 4), TARGET_RATIO,
        pair=f"{package} {OLD_VERSION} -> {NEW_VERSION}",
        maker="upgrade-agent delta make (zstd -19, patch-from)",
        delta_bytes=made["delta_size"], full_bytes=full_bytes, bytes_ratio=round(bytes_ratio, 4),
        bytes_target=BYTES_TARGET, bytes_goal=BYTES_GOAL, member_bytes=made["member_size"],
        delta_make_s=round(make_s, 2), runs=runs,
        delta_stage_s=[round(r["stage_s"], 4) for r in sides["delta"]],
        full_stage_s=[round(r["stage_s"], 4) for r in sides["full"]],
        paired_ratio_median=round(statistics.median(
            d["stage_s"] / f["stage_s"] for d, f in zip(sides["delta"], sides["full"], strict=True)), 3),
        best_delta_stage_s=round(min(r["stage_s"] for r in sides["delta"]), 4),
        best_full_stage_s=round(min(r["stage_s"] for r in sides["full"]), 4),
        delta_process_s=round(statistics.median(r["seconds"] for r in sides["delta"]), 3),
        full_process_s=round(statistics.median(r["seconds"] for r in sides["full"]), 3),
        peak_rss_mib=round(max(r["peak_rss_mib"] for r in sides["delta"]), 1),
        full_peak_rss_mib=round(max(r["peak_rss_mib"] for r in sides["full"]), 1),
    )
    result["met"] = result["met"] and bytes_ratio <= BYTES_TARGET
    return result


BENCHMARKS = {NAME: delta_row}

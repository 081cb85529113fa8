"""Helpers shared by the benchmarks (design §9): timing, result rows, child-process peak RSS, file-system
type.

Every benchmark measures our figure and its baseline in the same run on the same data and reports
``ratio = our cost / baseline cost`` (lower is better).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
_MEMORY_FS = frozenset({"tmpfs", "ramfs", "devtmpfs"})


def best_of(fn: Callable[[], object], repeat: int = 5) -> float:
    """Seconds taken by the fastest of ``repeat`` calls of ``fn`` (``time.perf_counter``).

    The minimum is the least noisy estimate of what the code costs; slower runs measure the machine.
    """
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def compile_project() -> None:
    """Write the bytecode of the project's packages (``agent``, ``upgrade_core``, ``journal``) into their
    ``__pycache__``, as pip does when it installs the wheel on a host.

    Why: the measured processes import the project from this checkout. Under ``PYTHONDONTWRITEBYTECODE``
    (set in some shells and CI images) they would compile every project module from source at each start,
    30-50 ms of CPU a host never spends, while the third-party packages of ``.venv`` were compiled at
    install. Compiling here once makes both sides of a row start as they would on a host.
    """
    import compileall

    for package in ("agent", "upgrade_core", "journal"):
        compileall.compile_dir(str(REPO_ROOT / package), quiet=1)


def fs_type(path: str | os.PathLike[str]) -> str:
    """The file-system type of the mount holding ``path`` (:func:`agent.fs.watch.fs_type`)."""
    from agent.fs.watch import fs_type as mount_fs_type

    return mount_fs_type(os.fspath(path))


def disk_dir(name: str) -> Path:
    """A fresh directory on a real disk for a benchmark: ``.cache/bench/<name>`` under the repository,
    else ``/var/tmp/upgrade-core-bench/<name>``; never a memory file system (fsync there proves nothing).

    Raises:
        RuntimeError: both candidates are on tmpfs/ramfs.
    """
    import shutil

    for base in (REPO_ROOT / ".cache" / "bench", Path("/var/tmp/upgrade-core-bench")):
        base.mkdir(parents=True, exist_ok=True)
        if fs_type(base) not in _MEMORY_FS:
            path = base / name
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            return path
    raise RuntimeError(
        "no disk-backed directory for journal benchmarks (.cache/bench and /var/tmp are tmpfs)"
    )


_MEASURE = r"""
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
done = subprocess.run(sys.argv[1:])
elapsed = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": done.returncode, "seconds": elapsed, "peak_rss_mib": usage.ru_maxrss / 1024,
                  "cpu_s": usage.ru_utime + usage.ru_stime}))
"""


def measure(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv`` under a small fresh wrapper process; its report: ``seconds`` (wall), ``peak_rss_mib``
    (``RUSAGE_CHILDREN``: the measured process tree's peak resident set), ``cpu_s`` (user + system of that
    tree), ``rc``, and ``output``: the lines ``argv`` printed on stdout.

    Raises:
        RuntimeError: ``argv`` exited non-zero; the end of its stderr is in the message.
    """
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, env=env, check=True
    )
    *printed, last = out.stdout.strip().splitlines()
    result: dict[str, Any] = json.loads(last)
    if result["rc"] != 0:
        raise RuntimeError(f"{argv[:3]} exited {result['rc']}: {out.stderr[-2000:]}")
    result["output"] = printed
    return result


def row(
    name: str,
    value: float,
    unit: str,
    baseline: str,
    baseline_value: float,
    target: float,
    **extras: Any,
) -> dict[str, Any]:
    """One result row: ``ratio = value / baseline_value``; ``met`` when ``ratio <= target``."""
    ratio = value / baseline_value if baseline_value > 0 else float("inf")
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_value": baseline_value,
        "ratio": round(ratio, 3),
        "target": target,
        "met": ratio <= target,
        **extras,
    }


def skipped(name: str, reason: str) -> dict[str, Any]:
    """The row of a benchmark that could not run here: ``{"name", "skipped": true, "reason", "met": null}``,
    no figure at all (never a made-up one). ``reason`` is one line, e.g. an unreachable registry."""
    return {"name": name, "skipped": True, "reason": reason, "met": None}


def run_in_child(name: str) -> dict[str, Any]:
    """Run benchmark ``name`` in a child ``python -m benchmarks --child NAME`` and return its row.

    ``peak_rss_mib`` is the child's peak resident set (``ru_maxrss`` from ``os.wait4``, KiB on Linux), set
    unless the benchmark reported its own or was :func:`skipped`.

    Raises:
        RuntimeError: the child failed; its stderr is in the message.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "--child", name],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark {name} failed (exit {proc.returncode}): {err.strip()}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if result.get("skipped"):
        return result
    result.setdefault("peak_rss_mib", round(usage.ru_maxrss / 1024, 1))
    return result

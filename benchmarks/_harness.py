"""Helpers shared by the benchmarks (design §9): timing, result rows, child-process peak RSS, file-system
type, and the installed venv every row that starts our code runs it from.

Every benchmark measures our figure and its baseline in the same run on the same data and reports
``ratio = our cost / baseline cost`` (lower is better).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
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


SYSTEM_PYTHON = "/usr/bin/python3"  # what scripts/install_prefix.sh makes the venv with (docs/install.md)
INSTALL_EXTRAS = "kubernetes"  # operator.idle.kubernetes needs the optional extra; nothing else imports it
INSTALL_TIMEOUT_S = 900.0
PACKAGES = ("agent", "upgrade_core", "journal")


def cache_dir() -> Path:
    """``$UPGRADE_CORE_BENCH_CACHE``, default ``~/.cache/upgrade-core/bench`` (a disk, not tmpfs): inputs and
    builds the rows reuse between runs."""
    default = Path.home() / ".cache" / "upgrade-core" / "bench"
    return Path(os.environ.get("UPGRADE_CORE_BENCH_CACHE", str(default)))


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ``PYTHON*`` variable (what a unit gives the agent), plus
    ``extra``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}, **extra}


def _install_digest() -> str:
    """sha256 (hex) of what goes into the installed venv: sources, pyproject.toml, the install script, the
    extras and the interpreter's version."""
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True).stdout
    h = hashlib.sha256(f"{version}\0{INSTALL_EXTRAS}\0".encode())
    files = [REPO_ROOT / "pyproject.toml", REPO_ROOT / "scripts" / "install_prefix.sh"]
    for package in PACKAGES:
        files += [p for p in (REPO_ROOT / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for path in sorted(files):
        h.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def installed_prefix() -> Path:
    """A venv built from this checkout the way ``make install PREFIX=... EXTRAS=kubernetes`` builds it
    (``scripts/install_prefix.sh``: a wheel, not editable, bytecode compiled by pip, dependencies from the
    package index, ``/usr/bin/python3``); cached in ``cache_dir()/installed/<digest>`` and rebuilt when the
    sources change. Its directory; looked up once per process (the lookup hashes every source file).

    Why every row that starts our code runs from it (design §9): that is how hosts run the program. The
    development venv imports an editable-install hook in every process and holds the test dependencies,
    some of which our dependencies load when present (httpcore imports ``trio``: about 40 ms at each start).

    Raises:
        RuntimeError: the install script failed (its stderr, tail, in the message).
    """
    base = cache_dir() / "installed"
    prefix = base / _install_digest()[:16]
    complete = prefix / ".bench-complete"
    if complete.exists():
        return prefix
    shutil.rmtree(prefix, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    env = clean_env(PYTHON=SYSTEM_PYTHON, BUILD_PYTHON=sys.executable, EXTRAS=INSTALL_EXTRAS)
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "install_prefix.sh"), str(prefix)],
                          capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S, check=False)
    if done.returncode != 0:
        tail = done.stderr.strip()[-2000:]
        raise RuntimeError(f"install_prefix.sh failed (exit {done.returncode}): {tail}")
    complete.write_text("")
    for other in base.iterdir():  # keep only the current build
        if other != prefix and other.is_dir():
            shutil.rmtree(other, ignore_errors=True)
    return prefix


def installed(name: str) -> str:
    """The path of ``name`` (``python``, ``upgrade-agent``, ``recover-agent-upgrade``) in
    :func:`installed_prefix`'s ``bin``. Run its ``python -c`` with ``-P``: without it ``sys.path`` starts
    with the working directory, the checkout when the runner runs there, and the child would import the
    checkout's packages instead of the installed ones."""
    return str(installed_prefix() / "bin" / name)


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

"""``recover.noop.installed`` (design §9): the boot-time no-op recovery in the layout ``make install`` builds.

The development venv (``.venv``, an editable install) is not what a host runs: its editable-install hook
imports ``pathlib`` and ``re`` in every Python process, so the baseline ``python -c pass`` there pays about
as much as our fast path would, and the ratio flatters us. This row builds, once, a plain venv the way
``make install PREFIX=...`` does (``scripts/install_prefix.sh``: a wheel of this checkout, not editable,
its dependencies from the package index, the distribution's ``/usr/bin/python3``) and measures both sides
in it: ``PREFIX/bin/recover-agent-upgrade --config CONFIG --trigger boot`` on the journal of 50 closed,
compacted episodes that ``recover.noop`` uses, against ``PREFIX/bin/python -c pass``. Whole processes,
best of 25 interleaved runs each, with an environment that names no ``PYTHON*`` variable.

The venv is cached under ``$UPGRADE_CORE_BENCH_CACHE`` (default ``~/.cache/upgrade-core/bench``) in
``installed/<digest>``, the digest covering the package sources, ``pyproject.toml``, the install script
and the interpreter; an unchanged tree costs one hash of the sources. Building it needs the package index
(the same as ``make install``).

Target: <= 1.8 (goal 1.5). ``BENCHMARKS = {"recover.noop.installed": ...}``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import _harness
from .bench_e2e import EPISODES, NOOP_RUNS, _peak_rss_mib, _timed, _top_imports, noop_config, noop_journal

TARGET = 1.8  # design §9 (goal 1.5)
SYSTEM_PYTHON = "/usr/bin/python3"  # what scripts/install_prefix.sh makes the venv with (docs/install.md)
BUILD_TIMEOUT_S = 900.0
PACKAGES = ("agent", "upgrade_core", "journal")


def cache_dir() -> Path:
    """``$UPGRADE_CORE_BENCH_CACHE``, default ``~/.cache/upgrade-core/bench`` (a disk, not tmpfs)."""
    default = Path.home() / ".cache" / "upgrade-core" / "bench"
    return Path(os.environ.get("UPGRADE_CORE_BENCH_CACHE", str(default)))


def clean_env() -> dict[str, str]:
    """This process's environment without any ``PYTHON*`` variable: what a boot unit gives the agent."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _digest() -> str:
    """sha256 (hex) of what goes into the installed venv: sources, pyproject.toml, the script, the
    interpreter's version."""
    root = _harness.REPO_ROOT
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True).stdout
    h = hashlib.sha256(version.encode())
    files = [root / "pyproject.toml", root / "scripts" / "install_prefix.sh"]
    for package in PACKAGES:
        files += [p for p in (root / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    for path in sorted(files):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def installed_prefix() -> Path:
    """A venv built by ``scripts/install_prefix.sh`` from this checkout (cached); its directory.

    Raises:
        RuntimeError: the install script failed (its stderr, tail, in the message).
    """
    base = cache_dir() / "installed"
    prefix = base / _digest()[:16]
    complete = prefix / ".bench-complete"
    if complete.exists():
        return prefix
    shutil.rmtree(prefix, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    env = {**clean_env(), "PYTHON": SYSTEM_PYTHON, "BUILD_PYTHON": sys.executable}
    done = subprocess.run(["bash", str(_harness.REPO_ROOT / "scripts" / "install_prefix.sh"), str(prefix)],
                          capture_output=True, text=True, env=env, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        tail = done.stderr.strip()[-2000:]
        raise RuntimeError(f"install_prefix.sh failed (exit {done.returncode}): {tail}")
    complete.write_text("")
    for other in base.iterdir():  # keep only the current build
        if other != prefix and other.is_dir():
            shutil.rmtree(other, ignore_errors=True)
    return prefix


def recover_noop_installed() -> dict[str, Any]:
    """``recover-agent-upgrade --trigger boot`` with nothing to do vs ``python -c pass``, both in the
    installed venv (target <= 1.8, design §9)."""
    prefix = installed_prefix()
    work = _harness.disk_dir("recover-noop-installed")
    records = noop_journal(work)
    config, lock = noop_config(work)
    env = clean_env()
    python = str(prefix / "bin" / "python")
    ours_argv = [str(prefix / "bin" / "recover-agent-upgrade"), "--config", str(config), "--trigger", "boot"]
    base_argv = [python, "-c", "pass"]
    first = subprocess.run(ours_argv, capture_output=True, text=True, env=env, cwd=work, check=False)
    if first.returncode != 0:
        raise RuntimeError(f"recover-agent-upgrade exited {first.returncode}: {first.stderr.strip()}")
    ours = base = float("inf")
    for _ in range(NOOP_RUNS):  # interleaved, so that machine noise hits both sides alike
        ours = min(ours, _timed(ours_argv, env=env, cwd=work)[0])
        base = min(base, _timed(base_argv, env=env, cwd=work)[0])
    result = _harness.row(
        "recover.noop.installed", ours * 1e3, "ms", "python -c pass in the same installed venv", base * 1e3,
        TARGET, episodes=EPISODES, journal_records=records, fast_path=not lock.exists(),
        command="PREFIX/bin/recover-agent-upgrade --config CONFIG --trigger boot",
        prefix=str(prefix), peak_rss_mib=_peak_rss_mib(ours_argv, env=env),
        top_imports=_top_imports(ours_argv, env, python=python),
    )
    shutil.rmtree(work, ignore_errors=True)
    return result


BENCHMARKS = {"recover.noop.installed": recover_noop_installed}

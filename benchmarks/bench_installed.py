"""``recover.noop.installed`` (design §9): the boot-time no-op recovery in the layout ``make install`` builds.

The development venv (``.venv``, an editable install) is not what a host runs: its editable-install hook
imports ``pathlib`` and ``re`` in every Python process, so the baseline ``python -c pass`` there pays about
as much as our fast path would, and the ratio flatters us. This row builds, once, a plain venv the way
``make install PREFIX=...`` does (``scripts/install_prefix.sh``: a wheel of this checkout, not editable,
its dependencies from the package index, the distribution's ``/usr/bin/python3``) and measures both sides
in it: ``PREFIX/bin/recover-agent-upgrade --config CONFIG --trigger boot`` on the journal of 50 closed,
compacted episodes that ``recover.noop`` uses, against ``PREFIX/bin/python -c pass``. Whole processes,
best of 25 interleaved runs each, with an environment that names no ``PYTHON*`` variable.

The venv is :func:`benchmarks._harness.installed_prefix` (built once per tree, cached), which the other
rows that start our code (fetch, delta, end to end, operators) use too. Building it needs the package index
(the same as ``make install``).

Target: <= 1.8 (goal 1.5). ``BENCHMARKS = {"recover.noop.installed": ...}``.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from . import _harness
from .bench_e2e import EPISODES, NOOP_RUNS, _peak_rss_mib, _timed, _top_imports, noop_config, noop_journal

TARGET = 1.8  # design §9 (goal 1.5)


def recover_noop_installed() -> dict[str, Any]:
    """``recover-agent-upgrade --trigger boot`` with nothing to do vs ``python -c pass``, both in the
    installed venv (target <= 1.8, design §9)."""
    prefix = _harness.installed_prefix()
    work = _harness.disk_dir("recover-noop-installed")
    records = noop_journal(work)
    config, lock = noop_config(work)
    env = _harness.clean_env()
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

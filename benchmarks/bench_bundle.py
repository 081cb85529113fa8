"""Start-up cost of the self-contained runtime (docs/install.md): ``recover.noop.bundle``.

Ours: the runtime bundle's ``recover-agent-upgrade`` (``make bundle``, built or taken from
``.cache/bundle`` by ``scripts/build_bundle.py``, unpacked with ``tar`` into a disk directory) with
``--config CONFIG --trigger boot`` and nothing to do: the same 50 closed, compacted episodes as
``recover.noop`` (:mod:`benchmarks.bench_e2e`). Baseline: ``sys.executable -c pass``. The row also reports
the installed package's entry script on the same journal (``installed_ms``, the ``recover.noop`` figure
measured in the same run) and ``bundle_vs_installed``. Whole processes, best of 25 interleaved runs of
each of the three. The bundle runs with an empty environment (no ``PYTHONHOME``, ``PYTHONPATH``, ``PATH``),
as it would on a host without Python.

Target: <= 4x ``python -c pass``. A frozen program pays what the interpreter pays plus its bootloader
(which maps the bundled ``libpython`` and sets up the archive importer) and, unlike a venv, it reads its
modules from one compressed archive: measured 3.1x to 3.4x on a loaded two-core machine
(docs/benchmarks-history.md); 4x leaves room for machine noise and is still far below what a boot unit
notices.

``BENCHMARKS = {"recover.noop.bundle": ...}``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import _harness
from .bench_e2e import EPISODES, NOOP_RUNS, _entry, _entry_env, _peak_rss_mib, _timed, _write_journal

BUILD_TIMEOUT_S = 900.0


def _runtime(work: Path) -> Path:
    """The runtime archive for this checkout (built or cached), unpacked under ``work``; its directory."""
    built = subprocess.run(
        [sys.executable, str(_harness.REPO_ROOT / "scripts" / "build_bundle.py")], cwd=_harness.REPO_ROOT,
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )
    if built.returncode != 0:
        raise RuntimeError(f"build_bundle.py failed: {built.stderr.strip()[-2000:]}")
    subprocess.run(["tar", "-xzf", built.stdout.strip(), "-C", str(work)], check=True, timeout=120)
    return work / "upgrade-core-runtime"


def recover_noop_bundle() -> dict[str, Any]:
    """``recover-agent-upgrade --trigger boot`` from the bundle, nothing to do, vs ``python -c pass``."""
    import anyio

    work = _harness.disk_dir("recover-noop-bundle")
    runtime = _runtime(work)
    state = work / "state"
    records = anyio.run(_write_journal, state / "journal", EPISODES)
    lock = work / "run" / "bench-agent.lock"
    config = work / "bench-agent.toml"
    config.write_text(
        f'[agent]\nname = "bench-agent"\n\n[host]\nroot = "{work}/root"\nstate_dir = "{state}"\n'
        f'lock_path = "{lock}"\nunit_dir = "{work}/units"\n'
    )
    tail = ["--config", str(config), "--trigger", "boot"]
    ours_argv = [str(runtime / "recover-agent-upgrade"), *tail]
    installed_argv = [*_entry("recover-agent-upgrade"), *tail]
    base_argv = [sys.executable, "-c", "pass"]
    empty: dict[str, str] = {}
    installed_env = _entry_env()
    for argv, env in ((ours_argv, empty), (installed_argv, installed_env)):
        first = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if first.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {first.returncode}: {first.stderr.strip()}")
    ours = installed = base = float("inf")
    for _ in range(NOOP_RUNS):  # interleaved, so that machine noise hits all three alike
        ours = min(ours, _timed(ours_argv, env=empty)[0])
        installed = min(installed, _timed(installed_argv, env=installed_env)[0])
        base = min(base, _timed(base_argv)[0])
    result = _harness.row(
        "recover.noop.bundle", ours * 1e3, "ms", "python -c pass (whole process)", base * 1e3, 4.0,
        episodes=EPISODES, journal_records=records, fast_path=not lock.exists(),
        installed_ms=round(installed * 1e3, 2), bundle_vs_installed=round(ours / installed, 3),
        command="upgrade-core-runtime/recover-agent-upgrade --config CONFIG --trigger boot (env -i)",
        peak_rss_mib=_peak_rss_mib(ours_argv, env=empty),
    )
    shutil.rmtree(work, ignore_errors=True)
    return result


BENCHMARKS = {"recover.noop.bundle": recover_noop_bundle}

"""Start-up cost of the self-contained runtime (docs/install.md): ``recover.noop.bundle``.

Ours: the runtime bundle's ``recover-agent-upgrade`` (``make bundle``, built or taken from
``.cache/bundle`` by ``scripts/build_bundle.py``, unpacked with ``tar`` into a disk directory) with
``--config CONFIG --trigger boot`` and nothing to do: the same 50 closed, compacted episodes as
``recover.noop`` (:mod:`benchmarks.bench_e2e`). Baseline: an empty program (``pass``) frozen the same way,
a PyInstaller one-folder bundle built by the same PyInstaller and interpreter, so that both sides pay the
bootloader, the bundled ``libpython`` and the archive importer, and the ratio is what our code adds. It is
built once (about a minute) and cached under ``$UPGRADE_CORE_BENCH_CACHE`` (default
``~/.cache/upgrade-core/bench``) in ``empty-bundle/<digest>``. The row also reports the installed
package's entry script on the same journal (``installed_ms``, the ``recover.noop`` figure measured in the
same run), ``bundle_vs_installed`` and ``python -c pass`` (``python_ms``, the previous baseline). Whole
processes, best of 25 interleaved runs of each. The bundles run with an empty environment (no
``PYTHONHOME``, ``PYTHONPATH``, ``PATH``), as they would on a host without Python.

Target: <= 1.3 of the empty frozen program (against ``python -c pass`` the row read 3.0 to 3.3: most of
that was the bootloader, which an empty program pays too).

``BENCHMARKS = {"recover.noop.bundle": ...}``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import _harness
from ._harness import cache_dir
from .bench_e2e import (
    EPISODES,
    NOOP_RUNS,
    _entry,
    _entry_env,
    _peak_rss_mib,
    _timed,
    noop_config,
    noop_journal,
)

TARGET = 1.3  # design §9: what a frozen no-op may add to a frozen empty program
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


def empty_bundle() -> Path:
    """An empty program (``pass``) frozen as a PyInstaller one-folder bundle (cached); its executable.

    Raises:
        subprocess.CalledProcessError: PyInstaller failed (its output went to stderr).
    """
    import PyInstaller

    key = hashlib.sha256(f"{sys.version}\0{PyInstaller.__version__}\0onedir pass".encode()).hexdigest()
    base = cache_dir() / "empty-bundle"
    slot = base / key[:16]
    program = slot / "dist" / "empty" / "empty"
    if program.is_file():
        return program
    shutil.rmtree(slot, ignore_errors=True)
    slot.mkdir(parents=True)
    (slot / "empty.py").write_text("pass\n")
    subprocess.run(
        [sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--onedir", "--log-level", "WARN",
         "--name", "empty", "--distpath", str(slot / "dist"), "--workpath", str(slot / "build"),
         "--specpath", str(slot), str(slot / "empty.py")],
        check=True, cwd=slot, stdout=sys.stderr, timeout=BUILD_TIMEOUT_S,
    )
    return program


def recover_noop_bundle() -> dict[str, Any]:
    """``recover-agent-upgrade --trigger boot`` from the bundle, nothing to do, vs an empty frozen program
    (target <= 1.3)."""
    empty = str(empty_bundle())
    work = _harness.disk_dir("recover-noop-bundle")
    runtime = _runtime(work)
    records = noop_journal(work)
    config, lock = noop_config(work)
    tail = ["--config", str(config), "--trigger", "boot"]
    ours_argv = [str(runtime / "recover-agent-upgrade"), *tail]
    installed_argv = [*_entry("recover-agent-upgrade"), *tail]
    base_argv = [sys.executable, "-c", "pass"]
    no_env: dict[str, str] = {}
    installed_env = _entry_env()
    empty_argv = [empty]
    for argv, env in ((ours_argv, no_env), (installed_argv, installed_env), (empty_argv, no_env)):
        first = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if first.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {first.returncode}: {first.stderr.strip()}")
    ours = installed = base = python = float("inf")
    for _ in range(NOOP_RUNS):  # interleaved, so that machine noise hits all four alike
        ours = min(ours, _timed(ours_argv, env=no_env)[0])
        base = min(base, _timed(empty_argv, env=no_env)[0])
        installed = min(installed, _timed(installed_argv, env=installed_env)[0])
        python = min(python, _timed(base_argv)[0])
    result = _harness.row(
        "recover.noop.bundle", ours * 1e3, "ms", "an empty program frozen the same way (PyInstaller "
        "one-folder, env -i)", base * 1e3, TARGET,
        episodes=EPISODES, journal_records=records, fast_path=not lock.exists(),
        installed_ms=round(installed * 1e3, 2), bundle_vs_installed=round(ours / installed, 3),
        python_ms=round(python * 1e3, 2),
        command="upgrade-core-runtime/recover-agent-upgrade --config CONFIG --trigger boot (env -i)",
        peak_rss_mib=_peak_rss_mib(ours_argv, env=no_env),
    )
    shutil.rmtree(work, ignore_errors=True)
    return result


BENCHMARKS = {"recover.noop.bundle": recover_noop_bundle}

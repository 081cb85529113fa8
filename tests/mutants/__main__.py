"""``python -m tests.mutants`` (``make mutants``): deliberately broken variants must fail the suite.

For each ``*.patch`` here (a unified diff against this repository, ``-p1``): copy the repository's
sources to a scratch directory, apply the patch with ``patch``, run the tests named in :data:`TESTS`, and
expect a failure. Prints, per mutant, the first test that failed (the one that kills it). Exits 1 if any
mutant survives or a patch no longer applies.

Mutants:
- ``a``: recovery rolls back whenever an episode is open (the Go anchor's unconditional recovery flag).
- ``b``: the episode is closed before its result reaches the sink (the Go anchor's lost result).
- ``c``: ``last-good`` is pointed at the candidate when the switch happens, before the commit.
- ``d``: the simulated journal skips the fsync of ``SwitchIntended`` (a dropped durability barrier).
- ``e``: the real journal (``journal/_writer.py``) drops the fdatasync of every appended batch.
- ``f``: the orchestrator's checked append (``CheckedJournal.append``) appends without the pre-check, so
  an event breaking a lifecycle rule is made durable first (docs/adr/0002); killed by
  ``tests/core/test_rule_pairs.py``.
- ``g``: an operator rollback (kind ``rollback``) that runs out of attempts "returns" to what ``last-good``
  names, i.e. stays on the unhealthy slot it just switched to, instead of the previous ``current``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
COPY = ("upgrade_core", "journal", "agent", "tests", "pyproject.toml")
TESTS: dict[str, list[str]] = {
    "a_recovery_rolls_back_any_open_episode": [
        "tests/core/test_decide.py", "tests/core/test_prefix_recovery.py",
    ],
    "b_close_before_publish": ["tests/core/test_prefix_recovery.py", "tests/core/test_orchestrator.py"],
    "c_last_good_moved_at_switch": ["tests/core/test_orchestrator.py", "tests/core/test_prefix_recovery.py"],
    "d_journal_fsync_dropped": ["tests/core/test_prefix_recovery.py", "tests/core/test_crash_stateful.py"],
    "e_real_journal_fdatasync_dropped": ["tests/journal"],
    "f_append_without_precheck": ["tests/core/test_rule_pairs.py"],
    "g_rollback_returns_to_last_good": ["tests/core/test_decide.py", "tests/core/test_rollback.py"],
}
FAILED = re.compile(r"^FAILED (.+?)(?: - .*)?$", re.MULTILINE)


def run_one(patch: Path) -> tuple[bool, str]:
    """Apply ``patch`` to a scratch copy and run its tests; returns (killed, detail)."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as scratch:
        work = Path(scratch)
        for name in COPY:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
            elif src.exists():
                shutil.copy2(src, work / name)
        applied = subprocess.run(["patch", "-p1", "--batch", "--forward", "-i", str(patch)], cwd=work,
                                 capture_output=True, text=True, timeout=60)
        if applied.returncode != 0:
            return False, f"patch does not apply: {applied.stdout.strip()} {applied.stderr.strip()}"
        tests = TESTS.get(patch.stem, ["tests/core"])
        env = dict(os.environ, UPGRADE_CORE_STATEFUL_SCALE="0.1", PYTHONDONTWRITEBYTECODE="1")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
             "-k", "not every_crash_point", *tests],
            cwd=work, capture_output=True, text=True, env=env, timeout=900,
        )
        if proc.returncode == 0:
            return False, "SURVIVED: every test passed"
        match = FAILED.search(proc.stdout)
        return True, match.group(1) if match else f"pytest exit {proc.returncode}"


def main() -> int:
    patches = sorted(HERE.glob("*.patch"))
    survivors = 0
    for patch in patches:
        killed, detail = run_one(patch)
        survivors += not killed
        print(f"{'killed  ' if killed else 'ALIVE   '} {patch.stem}: {detail}", flush=True)
    print(f"{len(patches) - survivors}/{len(patches)} mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())

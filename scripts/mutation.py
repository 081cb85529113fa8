"""``make mutation``: mutmut over the pure core, then per-module figures (docs/mutation.md).

mutmut 3 writes its work tree (``mutants/``) into the directory it runs in. So that nothing lands in the
source tree, this script copies what the run needs (pyproject.toml, whose ``[tool.mutmut]`` section is the
configuration, the packages and the tests) into ``.mutation/`` (git-ignored), runs ``mutmut run`` there on a
fresh copy every time (no cached verdict from an older checkout), and reads mutmut's per-file results back.

Prints, per module: mutants made, killed (timeouts count as killed), survived, equivalent (a survivor listed
in :data:`EQUIVALENT` with its reason) and skipped (no test reaches the mutated function). Exits 1 when a
survivor is not listed as equivalent, or a listed one no longer survives (the list is stale).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
COPY = ("pyproject.toml", "README.md", "docs", "upgrade_core", "journal", "agent", "tests")
MODULES = (
    "upgrade_core/_decide.py",
    "upgrade_core/_state.py",
    "upgrade_core/_health.py",
    "upgrade_core/_fold.py",
    "journal/_framing.py",
)

# mutmut's exit-code classes (mutmut/stats.py): what a worker's pytest exit code means
_KILLED = {1, 3}
_TIMEOUT = {36, 24, -24, 152, 255}
_SURVIVED = {0}
_NO_TESTS = {5, 33}
_SKIPPED = {34}

_DEFAULT_UNUSED = (
    "get()'s default is never used: each episode's fields start as a copy of _VIEW_FIELDS, which has the key"
)
EQUIVALENT: dict[str, str] = {
    # mutant name (mutmut's) -> why it cannot change behaviour; docs/mutation.md lists the same, by line
    "journal._framing.x_decode_envelope__mutmut_43":
        '"utf-8" -> "UTF-8": codec names are looked up case-insensitively',
    "journal._framing.x_encode_segment_header__mutmut_16":
        "the packed crc field 0 -> 1: the [:28] slice drops those four bytes before the CRC is computed",
    "journal._framing.x_decode_segment_header__mutmut_11":
        "unpack_from(buf, 0) -> unpack_from(buf): the offset's default is 0",
    "journal._framing.x_decode_frames__mutmut_51":
        "nxt - end == 4 -> nxt + end == 4: that test is a shortcut; without it the padding slice is empty "
        "and _ZERO_PAD[0] is b'', so the comparison after it holds for the same frames",
    "journal._framing.x_valid_frame_after__mutmut_8":
        "pos + 16 <= n -> < n: a header that ends exactly at the buffer's end leaves no room for the frame's "
        "CRC trailer, so the scan could never return it anyway",
    "journal._framing.x_valid_frame_after__mutmut_9":
        "the all-zero-header skip compares an empty slice (so never skips): an all-zero header fails its "
        "CRC anyway (crc32 of 12 zero bytes is 0x7bd5c66f, not 0), the skip only saves the CRC",
    "upgrade_core._fold.xǁFolderǁ_raise_watermark__mutmut_3":
        "> -> >=: on equality the watermark is set to the value it already has",
    "upgrade_core._fold.xǁFolderǁ_h_installed__mutmut_16":
        "the else branch is unreachable: CandidateInstalled is legal only in verified, which only "
        "CandidateVerified reaches, so candidate_version is never None there",
    "upgrade_core._fold.xǁFolderǁ_h_installed__mutmut_17": "as _h_installed__mutmut_16 (unreachable branch)",
    "upgrade_core._fold.xǁFolderǁ_h_installed__mutmut_18": "as _h_installed__mutmut_16 (unreachable branch)",
    "upgrade_core._fold.xǁFolderǁ_h_failed__mutmut_14": _DEFAULT_UNUSED,
    "upgrade_core._fold.xǁFolderǁ_h_failed__mutmut_16": _DEFAULT_UNUSED,
    "upgrade_core._fold.xǁFolderǁ_h_failed__mutmut_17": _DEFAULT_UNUSED,
    "upgrade_core._fold.xǁFolderǁ_h_recovery__mutmut_6": _DEFAULT_UNUSED,
    "upgrade_core._fold.xǁFolderǁ_h_recovery__mutmut_8": _DEFAULT_UNUSED,
    "upgrade_core._fold.xǁFolderǁ_h_recovery__mutmut_11": _DEFAULT_UNUSED,
    "upgrade_core._health.xǁHealthJudgeǁ__init____mutmut_4":
        'first_invocation starts as "" instead of None: read only once first_pid is set, which sets it too',
    "upgrade_core._health.xǁHealthJudgeǁ__init____mutmut_5":
        'first_n_restarts starts as "" instead of None: read only once first_pid is set, which sets it too',
    "upgrade_core._health.xǁHealthJudgeǁ_identity__mutmut_15":
        "main_pid <= 0 -> <= 1: MainPID 1 is systemd itself, never a unit's main process",
    "upgrade_core._state.x__build_machine__mutmut_12":
        "send_event=False dropped: False is transitions' default",
    "upgrade_core._state.x_next_state__mutmut_7":
        "type(event) -> type(None) in the unknown-episode check: (new, EpisodeOpened) is in the table, so a "
        "refusal in state new is never for an EpisodeOpened and the second condition always holds",
    "upgrade_core._state.x_diagram_mermaid__mutmut_6":
        "continue -> break at the first RecoveryStarted entry: those entries are added to the table after "
        "all others, so nothing follows them",
}
"""Survivors that no test can kill, each with its reason (docs/mutation.md)."""


def _copy_sources() -> None:
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, WORK / name, ignore=ignore)
        else:
            shutil.copy2(src, WORK / name)


def _mutmut(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "mutmut"
    # UPGRADE_CORE_MUTATION: tests/conftest.py runs the slowest test files last (see there)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", UPGRADE_CORE_MUTATION="1")
    return subprocess.run([str(exe), *args], cwd=WORK, env=env, text=True, check=False)


_SHOW = """
import sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
for name in sys.argv[1:]:
    print(f"\\nsurvived, not listed as equivalent: {name}")
    print(get_diff_for_mutant(name).rstrip())
"""


def _show(names: list[str]) -> None:
    """Each mutant's diff (what ``mutmut show`` prints), in one process."""
    subprocess.run([sys.executable, "-c", _SHOW, *names], cwd=WORK, check=False)


def _results() -> dict[str, dict[str, int | None]]:
    out: dict[str, dict[str, int | None]] = {}
    for module in MODULES:
        meta = WORK / "mutants" / (module + ".meta")
        data = json.loads(meta.read_text()) if meta.exists() else {}
        out[module] = dict(data.get("exit_code_by_key", {}))
    return out


def main(argv: list[str]) -> int:
    jobs = argv[0] if argv else os.environ.get("MUTATION_JOBS", "2")
    started = time.monotonic()
    _copy_sources()
    run = _mutmut("run", "--max-children", jobs)
    if run.returncode != 0:
        print(f"make mutation: mutmut run exited {run.returncode}", flush=True)
        return 1
    results = _results()
    listed = set(EQUIVALENT)
    unlisted: list[str] = []
    rows = []
    totals = [0] * 6
    for module, codes in results.items():
        made = len(codes)
        killed = sum(1 for c in codes.values() if c in _KILLED or c in _TIMEOUT)
        survivors = [k for k, c in codes.items() if c in _SURVIVED]
        equivalent = [k for k in survivors if k in listed]
        unlisted += [k for k in survivors if k not in listed]
        skipped = sum(1 for c in codes.values() if c in _NO_TESTS or c in _SKIPPED)
        other = made - killed - len(survivors) - skipped
        row = [made, killed, len(survivors) - len(equivalent), len(equivalent), skipped, other]
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        rows.append((module, row))
    stale = sorted(listed - {k for codes in results.values() for k, c in codes.items() if c in _SURVIVED})
    print()
    head = ("module", "made", "killed", "survived", "equivalent", "skipped", "other")
    print(f"{head[0]:<26}" + "".join(f"{h:>11}" for h in head[1:]))
    for module, row in [*rows, ("total", totals)]:
        print(f"{module:<26}" + "".join(f"{v:>11}" for v in row))
    print(f"\nwall time {time.monotonic() - started:.0f} s; work files in {WORK.relative_to(ROOT)}/")
    if totals[5]:
        print("some mutants ended neither killed nor survived (interrupted, suspicious, segfault): see "
              "`cd .mutation && ../.venv/bin/mutmut results --all true`")
        return 1
    _show(unlisted)
    for name in stale:
        print(f"listed as equivalent but did not survive (stale entry): {name}")
    return 1 if unlisted or stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

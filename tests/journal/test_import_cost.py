"""Replay stays import-light (design §9 ``recover.noop``): ``import journal`` loads none of typing, re,
contextlib, attrs, anyio, zstandard; ``journal.scan`` of a journal without sealed segments adds none of
them; ``replay`` adds attrs (for Record) but neither anyio nor zstandard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ._support import Closed, build_journal

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
HEAVY = {"typing", "re", "contextlib", "attrs", "anyio", "zstandard", "trio"}
preloaded = HEAVY & set(sys.modules)
import journal
before = sorted(HEAVY & set(sys.modules) - preloaded)
journal.scan(sys.argv[1])
scanned = sorted(HEAVY & set(sys.modules) - preloaded)
class Raw:
    def encode(self, event): return event
    def decode(self, data): return data
result = journal.replay(sys.argv[1], Raw())
after = sorted({"anyio", "zstandard", "trio"} & set(sys.modules))
import json
print(json.dumps({"before": before, "scanned": scanned, "after": after, "records": len(result.records)}))
"""


def test_replay_imports_neither_anyio_nor_zstandard(tmp_path: Path) -> None:
    build_journal(str(tmp_path), [("op", Closed())])
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, check=True
    )
    data = json.loads(out.stdout)
    assert data["before"] == []
    assert data["scanned"] == []
    assert data["after"] == []
    assert data["records"] == 1

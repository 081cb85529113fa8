"""ENOSPC on a real, full filesystem (case C05): a 64 KiB tmpfs mounted in a private mount namespace
(``unshare -m``), so nothing leaks onto the host. The append gets a typed error, the journal stays readable
and holds exactly the acknowledged records (nothing half-written), and later appends are refused the same
way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
def test_enospc_on_a_real_full_tmpfs(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = 'mount -t tmpfs -o size=64k tmpfs "$1" && exec "$2" -m tests.journal._enospc_script "$1"'
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(mnt), sys.executable],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["acked"] > 10  # the tmpfs took some records before it filled up
    assert len(out["errors"]) == 2 and all("no space left" in e for e in out["errors"])
    assert out["replay_equals_acked"] is True
    assert out["torn"] is None
    assert out["files"] == ["00000000000000000001.jnl"]
    assert list(mnt.iterdir()) == []  # the tmpfs lived only in the private namespace

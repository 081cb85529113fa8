"""Real read-only and full filesystems (cases C05, C14), each check in a private mount namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ._helpers import BLUE_BYTES, GREEN_BYTES, NAME, installed_host, snapshot

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1) for mounts"
)


def in_private_mount_ns(check: str, d: Path) -> dict[str, Any]:
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-m", "tests.agent_host._ns_checks",
         check, str(d)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_c14_read_only_rescue_view(tmp_path: Path) -> None:
    installed_host(tmp_path / "R")
    before = snapshot(tmp_path / "R")
    r = in_private_mount_ns("ro_rescue_view", tmp_path)
    view = tmp_path / "rescue" / "opt" / "ua"
    assert r["raw_unlink_of_missing"] == {"oserror": "EROFS"}  # the trap the EROFS-safe removal avoids
    assert r["links"] == {"ok": "LinkState(current='blue', last_good='blue')"}
    assert r["current_resolves_to"] == str(view / "lib" / NAME / f"{NAME}-blue")  # relative links
    assert r["bin_resolves_to"] == str(view / "lib" / NAME / f"{NAME}-blue")
    assert r["remove_missing"] == {"ok": False}
    assert r["remove_existing"] == {"oserror": "EROFS"}
    assert r["discard_missing_staging"] == {"ok": None}
    assert r["sweep"] == {"ok": []}
    assert r["sha"]["ok"] and len(r["sha"]["ok"]) == 64
    assert r["prepare_staging"]["error"] == "HostError" and "read-only" in r["prepare_staging"]["message"]
    assert snapshot(tmp_path / "R") == before
    assert not os.path.ismount(view)  # the mount died with the namespace


def test_c14_read_only_usr_is_never_written(tmp_path: Path) -> None:
    legacy = tmp_path / "usr" / "local"
    d = legacy / "lib" / NAME
    d.mkdir(parents=True)
    (d / f"{NAME}-blue").write_bytes(BLUE_BYTES)
    (d / f"{NAME}-green").write_bytes(GREEN_BYTES)
    for name in (f"{NAME}-blue", f"{NAME}-green"):
        (d / name).chmod(0o755)
    (d / f"{NAME}-current").symlink_to(f"{NAME}-green")
    (d / f"{NAME}-last-good").symlink_to(f"{NAME}-blue")
    (tmp_path / "usr2" / "local" / "bin").mkdir(parents=True)
    (tmp_path / "usr2" / "local" / "bin" / NAME).write_bytes(BLUE_BYTES)
    (tmp_path / "usr2" / "local" / "bin" / NAME).chmod(0o755)
    usr_before = snapshot(tmp_path / "usr")
    r = in_private_mount_ns("ro_usr", tmp_path)
    assert r["adopt"]["ok"].startswith("Adoption(kind='legacy_layout'")
    assert r["r_link"] == "../usr/local"
    assert r["links"] == {"ok": "LinkState(current='green', last_good='blue')"}
    assert r["prepare_staging"]["error"] == "HostError" and "read-only" in r["prepare_staging"]["message"]
    assert r["point_current"]["error"] == "HostError" and "read-only" in r["point_current"]["message"]
    assert r["remove_layout"] == {"ok": [str(tmp_path / "opt" / "ua")]}
    assert r["r_exists_after"] is False
    assert r["binary_adopt"]["ok"].startswith("Adoption(kind='binary'")
    assert (tmp_path / "opt2" / "ua" / "lib" / NAME / f"{NAME}-blue").read_bytes() == BLUE_BYTES
    assert snapshot(tmp_path / "usr") == usr_before


def test_c05_small_tmpfs_refuses_before_any_write_and_sweeps(tmp_path: Path) -> None:
    r = in_private_mount_ns("small_tmpfs", tmp_path)
    assert r["refused"]["error"] == "NoSpaceError"
    assert "limits.max_member_bytes (2097152)" in r["refused"]["message"]
    assert r["unchanged_by_refusal"] is True
    agent_dir = tmp_path / "R" / "lib" / NAME
    assert r["swept"] == {"ok": [str(agent_dir / f".{NAME}-green.stage-1f")]}
    assert r["after_sweep"] == sorted([f"{NAME}-blue", f"{NAME}-current", f"{NAME}-last-good"])
    assert os.path.basename(r["fits"]["ok"]).startswith(f".{NAME}-green.stage-")
    assert r["fits_created"] is False


def test_noexec_host_root_is_refused(tmp_path: Path) -> None:
    r = in_private_mount_ns("noexec", tmp_path)
    assert r["prepare_staging"]["error"] == "NoExecError"
    assert "noexec" in r["prepare_staging"]["message"]

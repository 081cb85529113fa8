"""The one mount-table reader (agent.fs.mounts) against util-linux's own parser and real mounts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.fs.mounts import fs_type_of, parse_mountinfo, read_mounts

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("findmnt") is None, reason="needs findmnt(8)")
def test_agrees_with_findmnt_on_this_namespace() -> None:
    listed = json.loads(subprocess.run(["findmnt", "-J", "-l", "-o", "TARGET,FSTYPE"], capture_output=True,
                                       text=True, timeout=30, check=True).stdout)["filesystems"]
    theirs = sorted((m["target"], m["fstype"]) for m in listed)
    ours = sorted(tuple(m) for m in read_mounts())
    assert ours == theirs


def test_optional_fields_escapes_and_a_cut_line() -> None:
    table = (
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
        "30 22 0:40 / /srv/a\\040b\\011c rw master:2 propagate_from:1 - tmpfs tmpfs rw\n"
        "31 22 0:41 / /srv/cut rw"
    )
    assert parse_mountinfo(table) == [("/", "ext4"), ("/srv/a b\tc", "tmpfs")]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_real_mounts_with_a_space_and_one_stacked_over_another(tmp_path: Path) -> None:
    point = tmp_path / "a b"
    point.mkdir()
    check = (
        "import json, subprocess, sys\n"
        "from agent.fs.mounts import fs_type_of, read_mounts\n"
        "p = sys.argv[1]\n"
        "subprocess.run(['mount', '-t', 'tmpfs', 'none', p], check=True)\n"
        "first = fs_type_of(p + '/x', read_mounts())\n"
        "subprocess.run(['mount', '-t', 'ramfs', 'none', p], check=True)\n"
        "table = read_mounts()\n"
        "print(json.dumps([first, fs_type_of(p + '/x', table), fs_type_of(p + 'x', table)]))\n"
    )
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", check, str(point)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    inner, stacked, beside = json.loads(proc.stdout)
    assert (inner, stacked) == ("tmpfs", "ramfs")
    assert beside == fs_type_of(str(tmp_path), read_mounts()) != "ramfs"

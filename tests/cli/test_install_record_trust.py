"""The install record is a state file, and only what it may name is ever removed (docs/host.md, case C24/C30).

An install record another user planted, or one whose entries reach outside the host root, the unit directory
and ``state_dir``, would let ``uninstall`` or ``reset`` delete a file the agent never made. Each case plants
such a record beside a root-only canary file outside those directories and runs the real CLI. Expected
outcome, every case: exit 4 with one line naming the record, the canary keeps its bytes and inode, and
nothing under the test's directory changes. ``host.systemctl_prefix`` is ``/bin/false``: no case reaches
a service manager.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._rig import Rig, snapshot

NOBODY = 65534


def _record(rig: Rig, entries: list[dict[str, str]]) -> bytes:
    return (json.dumps({"format": 1, "agent": rig.name, "unit": f"{rig.name}.service",
                        "config": str(rig.config), "entries": entries}) + "\n").encode()


def _canary(tmp_path: Path) -> Path:
    outside = tmp_path / "elsewhere"
    outside.mkdir(mode=0o700)
    canary = outside / "root-only.conf"
    canary.write_bytes(b"root's own bytes\n")
    canary.chmod(0o600)
    return canary


def _expect_refused(rig: Rig, tmp_path: Path, canary: Path, command: str) -> None:
    before, ino, data = snapshot(tmp_path), canary.stat().st_ino, canary.read_bytes()
    err = rig.cli(command).error_payload(4)
    assert str(rig.state_dir / "install.json") in err["error"], err
    assert canary.read_bytes() == data and canary.stat().st_ino == ino
    assert snapshot(tmp_path) == before


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="ownership attacks need root and another uid")


@pytest.mark.parametrize("command", ["uninstall", "reset"])
@pytest.mark.parametrize("entry", ["outside", "dotdot", "unit elsewhere"])
def test_a_record_naming_a_path_outside_the_agents_directories_is_refused(
    tmp_path: Path, command: str, entry: str
) -> None:
    rig = Rig(tmp_path / "agent", f"rec-{entry.split()[0]}")
    canary = _canary(tmp_path)
    path = {"outside": str(canary), "dotdot": f"{rig.root}/../../elsewhere/{canary.name}",
            "unit elsewhere": str(canary)}[entry]
    kind = "unit" if entry == "unit elsewhere" else "file"
    rig.state_dir.mkdir(mode=0o700)
    (rig.state_dir / "install.json").write_bytes(_record(rig, [{"kind": kind, "path": path}]))
    (rig.state_dir / "install.json").chmod(0o600)
    _expect_refused(rig, tmp_path, canary, command)


@needs_root
@pytest.mark.parametrize("attack", ["foreign owner", "group-writable", "hard link", "symlink", "fifo"])
def test_a_record_that_is_not_a_state_file_of_roots_is_refused(tmp_path: Path, attack: str) -> None:
    rig = Rig(tmp_path / "agent", "rec-owner")
    canary = _canary(tmp_path)
    rig.state_dir.mkdir(mode=0o700)
    record = rig.state_dir / "install.json"
    planted = _record(rig, [{"kind": "file", "path": str(rig.root / "lib" / rig.name / "x")}])
    if attack == "foreign owner":  # written by the other user itself, in a child that dropped to its uid
        os.chmod(rig.state_dir, 0o733)  # (the child reaches it through an inherited directory descriptor)
        dfd = os.open(rig.state_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            flags = "os.O_WRONLY | os.O_CREAT | os.O_EXCL"
            code = (f"import os; os.setgid({NOBODY}); os.setuid({NOBODY}); "
                    f"fd = os.open('install.json', {flags}, 0o644, dir_fd={dfd}); os.write(fd, {planted!r})")
            subprocess.run([sys.executable, "-c", code], check=True, timeout=30, pass_fds=(dfd,))
        finally:
            os.close(dfd)
        os.chmod(rig.state_dir, 0o700)
        assert record.stat().st_uid == NOBODY
    elif attack == "group-writable":
        record.write_bytes(planted)
        record.chmod(0o660)
    elif attack == "hard link":
        record.write_bytes(planted)
        record.chmod(0o600)
        os.link(record, tmp_path / "second-name")
    elif attack == "symlink":
        record.symlink_to(canary)
    else:
        os.mkfifo(record, 0o600)
    _expect_refused(rig, tmp_path, canary, "uninstall")

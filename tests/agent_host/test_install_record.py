"""The install record and the removal rules (:mod:`agent.host.install_record`), on a temp directory.

Expected outcomes are in each test's name and asserts: what is listed and ours goes; everything else stays
byte-identical and is reported with its reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from agent.host.install_record import Entry, InstallRecord, RecordError, Remover, missing_dirs
from agent.host.layout import Layout
from agent.systemd.units import owner_header, unit_owner
from upgrade_core.errors import HostRefusedError

NAME = "rec-agent"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_record_is_written_0600_before_and_forgotten_after(tmp_path: Path) -> None:
    rec = InstallRecord.load(str(tmp_path), NAME, f"{NAME}.service", "/etc/x.toml", allowed=[str(tmp_path)])
    assert not rec.exists and rec.entries == []
    rec.intend("dir", [str(tmp_path / "a"), str(tmp_path / "a"), str(tmp_path / "b")])
    path = tmp_path / "install.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["format"] == 1 and doc["agent"] == NAME
    assert doc["entries"] == [{"kind": "dir", "path": str(tmp_path / "a")},
                              {"kind": "dir", "path": str(tmp_path / "b")}]
    again = InstallRecord.load(str(tmp_path), NAME, f"{NAME}.service", "/etc/x.toml", allowed=[str(tmp_path)])
    assert again.entries == [Entry("dir", str(tmp_path / "a")), Entry("dir", str(tmp_path / "b"))]
    again.forget([str(tmp_path / "a"), str(tmp_path / "b")])
    assert not path.exists()


def test_a_symlink_or_another_agents_record_is_refused(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.write_text("{}")
    (tmp_path / "install.json").symlink_to(canary)
    with pytest.raises(HostRefusedError, match="symlink"):
        InstallRecord.load(str(tmp_path), NAME, "u.service", "/c", allowed=[str(tmp_path)])
    (tmp_path / "install.json").unlink()
    other = InstallRecord(str(tmp_path), "other", "u.service", "/c")
    other.intend("dir", ["/nowhere"])
    with pytest.raises(RecordError, match="belongs to agent other"):
        InstallRecord.load(str(tmp_path), NAME, "u.service", "/c", allowed=[str(tmp_path)])
    assert canary.read_text() == "{}"


def test_missing_dirs_lists_only_what_does_not_exist(tmp_path: Path) -> None:
    assert missing_dirs(str(tmp_path / "x" / "y")) == [str(tmp_path / "x"), str(tmp_path / "x" / "y")]
    assert missing_dirs(str(tmp_path)) == []


def test_removal_rules_keep_what_is_not_ours(tmp_path: Path) -> None:
    root = tmp_path / "R"
    lay = Layout(str(root), NAME)
    agent_dir = Path(lay.agent_dir)
    agent_dir.mkdir(parents=True)
    (root / "bin").mkdir()
    blue = Path(lay.slot_path("blue"))
    blue.write_bytes(b"bin")
    os.symlink(f"{NAME}-blue", lay.current_link)
    notes = agent_dir / "operator-notes.txt"  # not ours: the directory stays, the note survives
    notes.write_text("keep\n")
    canary = tmp_path / "canary"
    canary.write_text("target\n")
    os.symlink(str(canary), lay.bin_link)  # listed as a link: the link goes, never its target
    listed_dir_now_symlink = tmp_path / "was-dir"
    listed_dir_now_symlink.symlink_to(tmp_path)
    file_where_link = tmp_path / "plain"
    file_where_link.write_text("plain\n")
    entries = [
        Entry("dir", str(root / "lib")), Entry("dir", str(agent_dir)), Entry("dir", str(root / "bin")),
        Entry("dir", str(listed_dir_now_symlink)), Entry("file", str(blue)),
        Entry("link", lay.current_link), Entry("link", lay.bin_link), Entry("link", str(file_where_link)),
    ]
    before = {p: _sha(p) for p in (notes, canary, file_where_link)}
    out = Remover(lay, str(tmp_path / "units")).remove(entries)
    assert sorted(out.removed) == sorted([str(blue), lay.current_link, lay.bin_link, str(root / "bin")])
    assert {p: _sha(p) for p in (notes, canary, file_where_link)} == before
    assert listed_dir_now_symlink.is_symlink()
    kept = "\n".join(out.kept)
    assert f"{agent_dir}: kept: not empty (operator-notes.txt)" in kept
    assert f"{root / 'lib'}: kept: not empty ({NAME})" in kept
    assert f"{listed_dir_now_symlink}: kept: a symlink" in kept
    assert f"{file_where_link}: kept: a regular file, not the link install made" in kept
    assert out.errors == []


def test_units_are_ours_only_with_this_agents_header(tmp_path: Path) -> None:
    lay = Layout(str(tmp_path / "R"), NAME)
    remover = Remover(lay, str(tmp_path))
    ours, theirs, plain = tmp_path / "a.service", tmp_path / "b.service", tmp_path / "c.service"
    ours.write_text(owner_header(NAME) + "[Unit]\n")
    theirs.write_text(owner_header("other") + "[Unit]\n")
    plain.write_text("[Unit]\n")
    legacy = tmp_path / "d.service"
    legacy.write_text(
        "# Written by upgrade-agent (upgrade-core). Rewritten on install; local edits are lost.\n"
        f"[Unit]\nDescription={NAME} (blue/green binary managed by upgrade-agent)\n"
    )
    fifo = tmp_path / "e.service"
    os.mkfifo(fifo)
    assert remover.unit_is_ours(str(ours)) == (True, "")
    assert remover.unit_is_ours(str(theirs)) == (False, f"written by upgrade-agent for other, not {NAME}")
    assert remover.unit_is_ours(str(plain))[0] is False
    assert remover.unit_is_ours(str(legacy)) == (True, "")
    assert remover.unit_is_ours(str(fifo)) == (False, "not a regular file")  # never waited on
    assert unit_owner("[Unit]\n") is None

"""The journal opens only what is its own (design §10, case C23), at the package level: every segment and the
owner record are reached relative to the checked directory descriptor, no-follow, non-blocking, and must be
regular files of the effective user with one link; the writer holds the directory's own lock and checks
the recorded owner. (The CLI-level cases, exit codes included, are in ``tests/cli/test_ownership.py``.)"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from journal import (
    JournalBusyError,
    JournalOwnerError,
    JournalRefusedError,
    JournalWriter,
    live_tail,
    read_owner,
    replay,
    scan,
)
from journal._reader import UNSURE, segment_name

from ._support import CODEC, Closed, Opened

pytestmark = pytest.mark.anyio

OWNER = {"agent": "a", "unit": "a.service"}


async def _journal(d: Path) -> Path:
    async with await JournalWriter.open(d, CODEC, owner=OWNER) as w:
        await w.append("op", Opened("op"))
    return d / segment_name(1, False)


def _canary(tmp_path: Path, content: bytes) -> tuple[Path, str]:
    canary = tmp_path / "canary"
    canary.write_bytes(content)
    return canary, hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "directory", "mode_0666"])
async def test_a_segment_that_is_not_ours_is_refused_by_writer_and_readers(tmp_path: Path, kind: str) -> None:
    """A live segment replaced by a symlink or hard link to a canary (holding the segment's bytes and a
    torn tail a writer would truncate), a FIFO, a directory or a group/world-writable file: the writer,
    ``replay`` and ``scan`` raise JournalRefusedError naming the segment; ``live_tail`` says UNSURE; the
    canary keeps every byte; nothing waits on the FIFO."""
    d = tmp_path / "journal"
    segment = await _journal(d)
    canary, digest = _canary(tmp_path, segment.read_bytes() + b"\0" * 24)
    segment.unlink()
    if kind == "symlink":
        segment.symlink_to(canary)
    elif kind == "hardlink":
        os.link(canary, segment)
    elif kind == "fifo":
        os.mkfifo(segment, 0o600)
    elif kind == "directory":
        segment.mkdir()
    else:
        segment.write_bytes(canary.read_bytes())
        segment.chmod(0o666)
    with pytest.raises(JournalRefusedError, match=str(segment)):
        await JournalWriter.open(d, CODEC, owner=OWNER)
    with pytest.raises(JournalRefusedError, match=str(segment)):
        replay(d, CODEC)
    with pytest.raises(JournalRefusedError):
        scan(d)
    assert live_tail(d) == UNSURE
    assert hashlib.sha256(canary.read_bytes()).hexdigest() == digest


async def test_a_symlinked_or_open_journal_directory_is_refused(tmp_path: Path) -> None:
    """The journal directory itself: a symlink (to a real journal) or a 0777 directory is refused by the
    writer and the readers; the target is untouched."""
    real = tmp_path / "real"
    await _journal(real)
    link = tmp_path / "journal"
    link.symlink_to(real, target_is_directory=True)
    before = sorted(os.listdir(real))
    with pytest.raises(JournalRefusedError, match="is a symlink"):
        await JournalWriter.open(link, CODEC, owner=OWNER)
    with pytest.raises(JournalRefusedError, match="is a symlink"):
        replay(link, CODEC)
    assert sorted(os.listdir(real)) == before
    real.chmod(0o777)
    with pytest.raises(JournalRefusedError, match="writable by group or others"):
        await JournalWriter.open(real, CODEC, owner=OWNER)
    assert live_tail(real) == UNSURE


async def test_owner_is_recorded_checked_and_adopted(tmp_path: Path) -> None:
    """A new journal records its owner (0600); another owner is refused before anything is read or
    repaired; a journal without a record is adopted by its first writer that names one, and readers never
    write it."""
    d = tmp_path / "journal"
    await _journal(d)
    assert read_owner(d) == OWNER
    assert (os.stat(d / "owner.json").st_mode & 0o777) == 0o600
    with pytest.raises(JournalOwnerError, match=r"agent a \(unit a.service\).*agent b \(unit b.service\)"):
        await JournalWriter.open(d, CODEC, owner={"agent": "b", "unit": "b.service"})
    (d / "owner.json").unlink()
    assert read_owner(d) is None
    replay(d, CODEC)
    assert not (d / "owner.json").exists()
    async with await JournalWriter.open(d, CODEC, owner={"agent": "b", "unit": "b.service"}) as w:
        await w.append("op", Closed())
    assert read_owner(d) == {"agent": "b", "unit": "b.service"}


async def test_one_writer_per_journal_directory(tmp_path: Path) -> None:
    """While a writer is open, a second open raises JournalBusyError; readers still read."""
    d = tmp_path / "journal"
    first = await JournalWriter.open(d, CODEC, owner=OWNER)
    try:
        with pytest.raises(JournalBusyError, match=str(d)):
            await JournalWriter.open(d, CODEC, owner=OWNER)
        replay(d, CODEC)
    finally:
        await first.aclose()
    async with await JournalWriter.open(d, CODEC, owner=OWNER):
        pass

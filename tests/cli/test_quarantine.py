"""``upgrade-agent journal quarantine`` (design §10, docs/cli.md) and the corrupt-journal paths naming it.

Expected outcomes, written down:

- A journal with a flipped byte in the middle (a valid frame follows: corruption, not a torn tail):
  ``status``, ``recover``, ``upgrade`` and ``journal verify`` exit 3 with one ``upgrade-agent:`` line naming
  the segment and ``upgrade-agent journal quarantine``.
- ``journal quarantine`` on it (current -> green 2.0.0, last-good -> blue 1.0.0): exit 0; the old
  directory is byte-for-byte at ``state_dir/quarantine/<UTC>/journal`` (0700 parents); the new journal's
  only episode ``quarantine-<UTC>`` is closed ``noop`` with a ``JournalQuarantined`` event carrying that
  path, both slots, their sha256 (read from the files) and versions (from their version commands);
  ``status`` then shows both versions and no episode, ``history`` the one quarantine episode, the result
  file exists; links and slots are untouched.
- It works on a healthy journal too (an operator's choice).
- It refuses (exit 3, one line naming the link and the slot file, "before `upgrade-agent journal
  quarantine`"), changing nothing, when ``last-good`` is missing, when ``current`` names an empty slot, or
  when a slot's version command fails; a bare host is exit 2; a held host lock is exit 75.
- Boot fast path (design §9) agrees with the full reader: with a closed live tail and an older sealed segment
  cut short, ``recover --trigger boot`` does not answer noop from the fast path: it exits 3 naming the
  sealed segment and the quarantine command, like ``status``. With the sealed segment intact it stays on
  the fast path (lock file never created).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from agent.host.lock import HostLock

from ._journals import aborted_episode, committed_episode, write_journal
from ._rig import Rig, snapshot

QUARANTINE = "upgrade-agent journal quarantine"


def _green_current(rig: Rig) -> None:
    rig.install_by_hand(blue="1.0.0", green="2.0.0")
    os.unlink(rig.agent_dir / f"{rig.name}-current")
    os.symlink(f"{rig.name}-green", rig.agent_dir / f"{rig.name}-current")


def _corrupt_journal(rig: Rig) -> Path:
    written = write_journal(rig.journal_dir, [("op-c", committed_episode("op-c", rig.name))])
    start, end = written.record_span(5)
    data = bytearray(written.segment.read_bytes())
    data[(start + end) // 2] ^= 0x40
    written.segment.write_bytes(bytes(data))
    return written.segment


def _tree_bytes(top: Path) -> dict[str, str]:
    return {str(p.relative_to(top)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(top.rglob("*")) if p.is_file()}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_corrupt_journal_errors_name_the_quarantine_command(installed_rig: Rig) -> None:
    rig = installed_rig
    segment = _corrupt_journal(rig)
    archive = rig.base / "never-read.tar.gz"
    archive.write_bytes(b"")
    for argv in (["status"], ["recover"], ["recover", "--trigger", "boot"], ["recover", "--trigger", "timer"],
                 ["upgrade", "--archive", str(archive)], ["journal", "verify"],
                 ["upgrade", "--archive", str(archive), "--preflight"]):
        run = rig.cli(*argv, json_out=False)
        assert run.code == 3, (argv, run)
        run.assert_clean_stderr()
        lines = [ln for ln in run.error_lines() if str(segment) in ln]
        assert len(lines) == 1, (argv, run.stderr)
        assert str(segment) in lines[0] and QUARANTINE in lines[0], (argv, lines[0])


def test_quarantine_moves_the_journal_aside_and_records_the_host(rig: Rig) -> None:
    _green_current(rig)
    _corrupt_journal(rig)
    old = _tree_bytes(rig.journal_dir)
    facts = rig.host_facts()
    run = rig.cli("journal", "quarantine")
    assert run.code == 0, run
    out = run.payload()
    moved = Path(out["quarantined"])
    assert moved.name == "journal" and moved.parent.parent == rig.state_dir / "quarantine", out
    assert _tree_bytes(moved) == old
    for d in (moved.parent, moved.parent.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    green, blue = rig.slot("green"), rig.slot("blue")
    assert out["current"] == {"slot": "green", "path": str(green), "sha256": _sha(green), "version": "2.0.0"}
    assert out["last_good"] == {"slot": "blue", "path": str(blue), "sha256": _sha(blue), "version": "1.0.0"}
    op = out["operation"]
    assert op == f"quarantine-{moved.parent.name}"
    assert rig.host_facts() == facts  # links and slots untouched

    carried = out["carried_over"]  # records 1-5 read; record 6 is the corrupt one; op-c never closed
    assert (carried["security_watermark"], carried["known_bad"], carried["read_through_seq"]) == (None, [], 5)
    assert str(rig.journal_dir / "00000000000000000001.jnl") in carried["problem"], carried

    seeded, *records = rig.cli("journal", "dump").payload()["records"]
    assert (seeded["seq"], seeded["episode"], seeded["event"]) == (1, "-", {
        "_type": "HistorySnapshot", "episodes": [],
        "facts": {"through_seq": 0, "reset_seq": None, "raises": [], "known_bad": [], "slot_versions": []},
    })
    assert [r["event"]["_type"] for r in records] == [
        "EpisodeOpened", "JournalQuarantined", "ResultPublished", "EpisodeClosed"]
    assert {r["episode"] for r in records} == {op}
    assert records[0]["event"]["kind"] == "quarantine"
    assert records[1]["event"] == {
        "_type": "JournalQuarantined", "quarantine_path": str(moved),
        "current_slot": "green", "current_sha256": _sha(green), "current_version": "2.0.0",
        "last_good_slot": "blue", "last_good_sha256": _sha(blue), "last_good_version": "1.0.0",
    }
    status = rig.cli("status").payload()
    assert status["episode"] is None
    assert (status["current"]["version"], status["last_good"]["version"]) == ("2.0.0", "1.0.0")
    history = rig.cli("history").payload()["episodes"]
    assert [(e["operation"], e["result"]) for e in history] == [(op, "noop")]
    assert (rig.state_dir / "results" / f"{op}.json").exists()
    assert rig.cli("journal", "verify").payload()["ok"] is True
    human = rig.cli("journal", "quarantine", json_out=False)  # again: a second quarantine directory
    assert human.code == 0, human
    assert human.stdout.splitlines()[1:] == [f"current: green 2.0.0 {_sha(green)}",
                                             f"last-good: blue 1.0.0 {_sha(blue)}",
                                             "carried over: watermark none; known-bad releases: none"]
    assert len(list((rig.state_dir / "quarantine").iterdir())) == 2


def test_quarantine_of_a_healthy_journal_is_allowed(installed_rig: Rig) -> None:
    rig = installed_rig
    write_journal(rig.journal_dir, [("op-a", aborted_episode("op-a"))])
    run = rig.cli("journal", "quarantine")
    assert run.code == 0, run
    assert rig.cli("status").payload()["current"]["version"] == "1.0.0"


def _refused(rig: Rig, *words: str) -> None:
    """Refused with one line naming ``words``; nothing changed but the host lock file (a writer's own)."""
    before = snapshot(rig.base)
    run = rig.cli("journal", "quarantine", json_out=False)
    assert run.code == 3, run
    run.assert_clean_stderr()
    (line,) = run.error_lines()
    for word in (*words, f"before `{QUARANTINE}`"):
        assert word in line, (word, line)
    lock = str(rig.lock_path.relative_to(rig.base))
    assert {k: v for k, v in snapshot(rig.base).items() if k not in (lock, "run")} == before


def test_quarantine_refuses_a_missing_last_good(installed_rig: Rig) -> None:
    rig = installed_rig
    _corrupt_journal(rig)
    link = rig.agent_dir / f"{rig.name}-last-good"
    link.unlink()
    _refused(rig, str(link), "missing", "last-good")


def test_quarantine_refuses_a_link_to_an_empty_slot(installed_rig: Rig) -> None:
    rig = installed_rig
    _corrupt_journal(rig)
    rig.slot("blue").write_bytes(b"")
    _refused(rig, f"{rig.name}-current", str(rig.slot("blue")), "missing or empty")


def test_quarantine_refuses_a_slot_that_does_not_verify(installed_rig: Rig) -> None:
    rig = installed_rig
    _corrupt_journal(rig)
    rig.slot("blue").write_bytes(b"#!/bin/sh\nexit 7\n")
    _refused(rig, str(rig.slot("blue")), "does not verify")


def test_quarantine_on_a_bare_host_is_exit_2(rig: Rig) -> None:
    run = rig.cli("journal", "quarantine")
    run.error_payload(2)
    assert not rig.state_dir.exists()


def test_quarantine_while_the_lock_is_held_is_75(installed_rig: Rig) -> None:
    rig = installed_rig
    _corrupt_journal(rig)
    with HostLock(str(rig.lock_path)):
        before = snapshot(rig.base)
        run = rig.cli("journal", "quarantine")
        assert snapshot(rig.base) == before
    run.error_payload(75)


def _sealed_history(rig: Rig) -> Path:
    """One sealed segment (op-c) and a live segment holding a closed episode (op-a)."""
    write_journal(rig.journal_dir, [("op-c", committed_episode("op-c", rig.name))])
    assert rig.cli("journal", "compact").code == 0
    write_journal(rig.journal_dir, [("op-a", aborted_episode("op-a"))])
    os.unlink(rig.lock_path)
    (sealed,) = sorted(rig.journal_dir.glob("*.jnl.zst"))
    return sealed


def test_boot_fast_path_stays_lean_over_intact_sealed_history(installed_rig: Rig) -> None:
    rig = installed_rig
    _sealed_history(rig)
    run = rig.cli("recover", "--trigger", "boot")
    assert run.code == 0 and run.payload()["result"] == "noop", run
    assert not rig.lock_path.exists()  # answered by agent/cli/fastpath.py: no lock taken


def test_boot_fast_path_agrees_with_the_full_reader_on_a_damaged_sealed_segment(installed_rig: Rig) -> None:
    rig = installed_rig
    sealed = _sealed_history(rig)
    sealed.write_bytes(sealed.read_bytes()[:-3])  # cut short: the full reader cannot decompress it
    status = rig.cli("status")
    status.error_payload(3)
    boot = rig.cli("recover", "--trigger", "boot", json_out=False)
    assert boot.code == 3, boot
    (line,) = boot.error_lines()
    assert str(sealed) in line and QUARANTINE in line, line

"""What the journal must never forget, through the whole CLI: across ``journal quarantine``, across a short
retention (``[journal] keep_episodes = 1``), and until ``trust reset`` (docs/trust.md, docs/recovery.md).

The rig's systemctl is ``/bin/false``: the history that sets the watermark or condemns a release is written
into the journal directly (``tests/cli/_journals.py``), as the orchestrator writes it; the releases offered
afterwards are signed with the real ``minisign`` and refused before any switch. Expected, written down:

- ``journal quarantine`` of a journal holding a signed commit at security version 5 and a rolled-back
  release (and, in one case, a corrupt record after them): exit 0, ``carried_over`` names watermark 5 and
  the release; a release signed at security version 3 is refused ``security version 3 is below this
  host's watermark 5`` and the rolled-back one ``was rolled back by operation op-bad`` (exit 1, host
  unchanged); with ``keep_episodes = 1``, once compaction has dropped the new journal's first record too,
  ``status`` still shows both.
- ``keep_episodes = 1``, after an upgrade, an operator rollback, an upgrade and an aborted upgrade, each
  followed by ``journal compact``: ``status`` shows green 2.0.0 and blue 1.0.0, ``history`` lists op-4,
  op-3, op-2 (the rollback), op-1 (the upgrade before it), and the next upgrade reports from-version 2.0.0.
- a quarantine interrupted after its move (an empty journal left) loses nothing: quarantining again carries
  over what the journal the first run moved aside tells; a journal unreadable from its first record carries
  nothing, and the output says why.
- ``trust reset`` prints what it cleared (watermark 5, the release and who condemned it), journals a
  ``trust-reset`` episode whose ``TrustReset`` record names them, and ``status`` then shows neither, also
  after compaction; with the host lock held it is exit 75 and nothing is written.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from agent.host.lock import HostLock
from journal import replay
from upgrade_core import EVENT_CODEC, Event, UpgradeResult
from upgrade_core import _events as ev

from ._journals import aborted_episode, committed_episode, write_journal
from ._rig import Rig, snapshot, version_script
from .test_release_memory_cli import refused_before_switch, rolled_back, signed_commit
from .test_signed_releases import keypair, release, sign, trust_root

BAD_SHA = hashlib.sha256(version_script("2.0.0")).hexdigest()  # the member release(rig, d, "2.0.0") packs


def _trust_history(rig: Rig) -> int:
    """op-high (signed, security version 5, committed) and op-bad (BAD_SHA rolled back); returns how many
    records that is."""
    high, bad = signed_commit("op-high", rig.name, 5), rolled_back("op-bad", rig.name, BAD_SHA)
    write_journal(rig.journal_dir, [("op-high", high), ("op-bad", bad)])
    return len(high) + len(bad)


def _old_releases_refused(rig: Rig, tmp_path: Path, sec: Path) -> None:
    low = release(rig, tmp_path, "3.0.0")
    sign(sec, low, f"name={rig.name} version=3.0.0 security_version=3")
    refused_before_switch(rig, "op-low", low, "security version 3 is below this host's watermark 5")
    again = release(rig, tmp_path, "2.0.0")
    sign(sec, again, f"name={rig.name} version=2.0.0 security_version=5")
    refusal = f"release {BAD_SHA[:12]} was rolled back by operation op-bad"
    refused_before_switch(rig, "op-again", again, refusal)


def _quarantine_keeps_trust(rig: Rig, tmp_path: Path, corrupt: bool) -> None:
    sec, pub = keypair(tmp_path, "publisher")
    # keep_episodes = 1: the refusals below are compacted away, and with them the new journal's seed
    rig.write_config(extra=f'[trust]\nroot_keys = ["{pub}"]\n[journal]\nkeep_episodes = 1\n')
    kept = _trust_history(rig)
    if corrupt:  # a third episode whose second record is damaged: the first two episodes still read
        written = write_journal(rig.journal_dir, [("op-c", committed_episode("op-c", rig.name))])
        start, end = written.record_span(1)  # offsets of this write's records
        data = bytearray(written.segment.read_bytes())
        data[(start + end) // 2] ^= 0x40
        written.segment.write_bytes(bytes(data))
        assert rig.cli("status").code == 3  # untrusted until quarantined
    run = rig.cli("journal", "quarantine")
    assert run.code == 0, run
    _old_releases_refused(rig, tmp_path, sec)
    assert rig.cli("journal", "compact").code == 0
    assert rig.cli("journal", "dump").payload()["records"][0]["seq"] > 1  # the seed itself is gone
    status = rig.cli("status").payload()
    assert status["security_watermark"] == 5, status
    assert status["known_bad"] == [{"sha256": BAD_SHA, "operation": "op-bad"}], status
    carried = run.payload()["carried_over"]
    assert (carried["security_watermark"], carried["known_bad"]) == (5, [BAD_SHA]), carried
    assert carried["read_through_seq"] == kept + (1 if corrupt else 0), carried
    assert (carried["problem"] is not None) == corrupt, carried


def test_quarantine_keeps_the_watermark_and_the_known_bad_releases(
    installed_rig: Rig, tmp_path: Path
) -> None:
    _quarantine_keeps_trust(installed_rig, tmp_path, corrupt=False)


def test_quarantine_of_a_corrupt_journal_keeps_what_precedes_the_damage(
    installed_rig: Rig, tmp_path: Path
) -> None:
    _quarantine_keeps_trust(installed_rig, tmp_path, corrupt=True)


def test_quarantine_says_what_it_carried_over(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    _trust_history(rig)
    run = rig.cli("journal", "quarantine", json_out=False)
    assert run.code == 0, run
    assert run.stdout.splitlines()[-1] == f"carried over: watermark 5; known-bad releases: {BAD_SHA[:12]}"


def test_a_quarantine_interrupted_after_its_move_loses_nothing(installed_rig: Rig, tmp_path: Path) -> None:
    """A crash between the move and the new journal's first record leaves an empty journal; quarantining that
    one carries over what the journal the first run moved aside tells."""
    rig = installed_rig
    sec, pub = keypair(tmp_path, "publisher")
    trust_root(rig, pub)
    _trust_history(rig)
    first = rig.cli("journal", "quarantine").payload()["quarantined"]
    for path in rig.journal_dir.iterdir():  # as if the first run had stopped right after its move
        path.unlink()
    write_journal(rig.journal_dir, [])
    run = rig.cli("journal", "quarantine", json_out=False)
    assert run.code == 0, run
    assert run.stdout.splitlines()[-2:] == [
        f"carried over: watermark 5; known-bad releases: {BAD_SHA[:12]}",
        f"nothing of the old journal could be used (it is empty); carried over from the earlier quarantined "
        f"journal {first} (through record {_records_in(first)})",
    ]
    _old_releases_refused(rig, tmp_path, sec)


def _records_in(journal_dir: str) -> int:
    return replay(journal_dir, EVENT_CODEC).records[-1].seq


def test_a_journal_unreadable_from_its_start_carries_nothing_and_says_why(installed_rig: Rig) -> None:
    rig = installed_rig
    written = write_journal(rig.journal_dir, [("op-high", signed_commit("op-high", rig.name, 5))])
    data = bytearray(written.segment.read_bytes())
    data[3] ^= 0xFF  # the segment header: nothing after it can be trusted
    written.segment.write_bytes(bytes(data))
    run = rig.cli("journal", "quarantine", json_out=False)
    assert run.code == 0, run
    carried, why = run.stdout.splitlines()[-2:]
    assert carried == "carried over: watermark none; known-bad releases: none"
    assert why.startswith("the old journal was read through record 0 only (") and str(written.segment) in why
    assert rig.cli("status").payload()["security_watermark"] is None


# -- a short retention ------------------------------------------------------------------------------------
def operator_rollback(op: str, agent: str) -> list[Event]:
    """``rollback`` from green 2.0.0 to last-good blue 1.0.0, healthy: committed, both links on blue."""
    result = UpgradeResult(op, "committed", "2.0.0", "1.0.0", "blue", None)
    return [
        ev.EpisodeOpened(op, "rollback", "last-good blue", "b" * 64, None, "green", "2.0.0", 2, 0.5, 2.0),
        ev.CandidateVerified("1.0.0"), ev.SwitchIntended("blue", "green", "blue"), ev.SwitchCommitted("blue"),
        ev.MirrorsSynced(()), ev.HealthAttemptStarted(1, "candidate"),
        ev.RestartRequested(f"{agent}-restart-{op[:8]}-1-00bb", 10.0), ev.RestartObserved(4343, "e" * 32),
        ev.HealthPassed(1, "candidate"), ev.UpgradeCommitted("blue", "1.0.0"), ev.ResultPublished(result),
        ev.EpisodeClosed("committed"),
    ]


def test_a_short_retention_keeps_versions_and_history_order(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    rig.slot("green").write_bytes(version_script("2.0.0"))
    os.unlink(rig.agent_dir / f"{rig.name}-current")
    os.symlink(f"{rig.name}-green", rig.agent_dir / f"{rig.name}-current")  # where op-3 left it
    rig.write_config(extra="[journal]\nkeep_episodes = 1\n")
    episodes = (("op-1", committed_episode("op-1", rig.name)), ("op-2", operator_rollback("op-2", rig.name)),
                ("op-3", committed_episode("op-3", rig.name)), ("op-4", aborted_episode("op-4")))
    for op, events in episodes:
        write_journal(rig.journal_dir, [(op, events)])
        assert rig.cli("journal", "compact").code == 0
    dumped = rig.cli("journal", "dump").payload()["records"]
    assert {r["episode"] for r in dumped} == {"-", "op-4"}  # op-1 to op-3 live on in snapshots only
    status = rig.cli("status").payload()
    assert (status["current"]["slot"], status["current"]["version"]) == ("green", "2.0.0"), status
    assert (status["last_good"]["slot"], status["last_good"]["version"]) == ("blue", "1.0.0"), status
    history = rig.cli("history").payload()["episodes"]
    assert [(e["operation"], e["from_version"], e["to_version"]) for e in history] == [
        ("op-4", "2.0.0", None), ("op-3", "1.0.0", "2.0.0"), ("op-2", "2.0.0", "1.0.0"),
        ("op-1", "1.0.0", "2.0.0"),
    ]
    archive = release(rig, tmp_path, "3.0.0")
    run = rig.cli("upgrade", "--archive", str(archive), "--expect-version", "9.9.9")
    assert run.code == 1, run
    assert (run.payload()["result"], run.payload()["from_version"]) == ("aborted", "2.0.0"), run.payload()


# -- trust reset --------------------------------------------------------------------------------------------
def test_trust_reset_clears_both_and_is_journaled(installed_rig: Rig) -> None:
    rig = installed_rig
    rig.write_config(extra="[journal]\nkeep_episodes = 1\n")
    _trust_history(rig)
    run = rig.cli("trust", "reset", json_out=False)
    assert run.code == 0, run
    run.assert_clean_stderr()
    lines = run.stdout.splitlines()
    op = lines[0].removeprefix("trust reset: operation ")
    assert op.startswith("trust-reset-"), lines
    assert lines[1:] == ["cleared watermark: 5", f"cleared known-bad release: {BAD_SHA} (operation op-bad)"]
    records = [r for r in rig.cli("journal", "dump").payload()["records"] if r["episode"] == op]
    assert [r["event"]["_type"] for r in records] == [
        "EpisodeOpened", "TrustReset", "ResultPublished", "EpisodeClosed"]
    assert records[0]["event"]["kind"] == "trust-reset"
    assert records[1]["event"] == {"_type": "TrustReset", "security_watermark": 5, "known_bad": [BAD_SHA]}
    for _ in range(2):  # and after compaction has summarised every episode but the newest
        status = rig.cli("status").payload()
        assert (status["security_watermark"], status["known_bad"]) == (None, []), status
        assert rig.cli("journal", "compact").code == 0
    again = rig.cli("trust", "reset")  # nothing left to clear: still its own journaled episode
    assert again.code == 0, again
    assert again.payload()["cleared"] == {"security_watermark": None, "known_bad": []}
    assert again.payload()["operation"] != op


def test_trust_reset_while_the_lock_is_held_is_75_and_writes_nothing(installed_rig: Rig) -> None:
    rig = installed_rig
    _trust_history(rig)
    with HostLock(str(rig.lock_path)):
        before = snapshot(rig.base)
        run = rig.cli("trust", "reset")
        assert snapshot(rig.base) == before
    run.error_payload(75)
    assert rig.cli("status").payload()["security_watermark"] == 5

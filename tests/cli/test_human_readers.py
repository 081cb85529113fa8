"""``status`` and ``history`` for a person: the watermark and the known-bad releases in ``status``, each
episode's kind and reason in ``history`` (human and JSON), and the kind kept through compaction."""

from __future__ import annotations

from ._journals import T0, aborted_episode, committed_episode, write_journal
from ._rig import Rig
from .test_release_memory_cli import rolled_back, signed_commit

BAD_SHA = "3" * 64


def test_human_status_shows_the_watermark_and_each_known_bad_release(installed_rig: Rig) -> None:
    rig = installed_rig
    write_journal(rig.journal_dir, [("op-high", signed_commit("op-high", rig.name, 5)),
                                      ("op-bad", rolled_back("op-bad", rig.name, BAD_SHA))])
    run = rig.cli("status", json_out=False)
    assert run.code == 0, run
    lines = run.stdout.splitlines()
    at = lines.index("security watermark: 5")
    assert lines[at + 1:at + 3] == [
        "known bad (1, refused unless --retry-known-bad):",
        f"  {BAD_SHA} (condemned by op-bad)",
    ], run.stdout


def test_human_status_says_when_there_is_no_watermark_and_nothing_known_bad(installed_rig: Rig) -> None:
    lines = installed_rig.cli("status", json_out=False).stdout.splitlines()
    assert "security watermark: none (no signed release committed)" in lines
    assert "known bad: none" in lines


def test_history_shows_each_episode_kind_and_reason(installed_rig: Rig) -> None:
    rig = installed_rig
    write_journal(rig.journal_dir, [("op-commit", committed_episode("op-commit", rig.name)),
                                      ("op-abort", aborted_episode("op-abort"))])
    rows = rig.cli("history").payload()["episodes"]
    assert [(r["operation"], r["kind"], r["result"], r["reason"]) for r in rows] == [
        ("op-abort", "upgrade", "aborted", "candidate reported version 9.9.9, expected 3.0.0"),
        ("op-commit", "upgrade", "committed", None),
    ]
    human = rig.cli("history", json_out=False)
    assert human.stdout.splitlines() == [
        f"2026-01-01T00:16:00Z  {'op-abort':<32}  upgrade      aborted         2.0.0 -> ?: "
        "candidate reported version 9.9.9, expected 3.0.0",
        f"2026-01-01T00:00:00Z  {'op-commit':<32}  upgrade      committed       1.0.0 -> 2.0.0",
    ], human.stdout


def test_the_episode_kind_survives_compaction(installed_rig: Rig) -> None:
    rig = installed_rig
    rig.write_config("[journal]\nkeep_episodes = 1\n")
    write_journal(rig.journal_dir, [("op-commit", committed_episode("op-commit", rig.name))])
    assert rig.cli("journal", "compact").code == 0  # seals the segment holding op-commit
    write_journal(rig.journal_dir, [("op-abort", aborted_episode("op-abort"))], start=T0 + 3600)
    assert rig.cli("journal", "compact").code == 0  # op-commit's segment goes, a summary stays
    dumped = rig.cli("journal", "dump").payload()["records"]
    assert any(r["event"]["_type"] == "HistorySnapshot" for r in dumped), dumped
    rows = rig.cli("history").payload()["episodes"]
    assert [(r["operation"], r["kind"]) for r in rows] == [("op-abort", "upgrade"), ("op-commit", "upgrade")]

"""upgrade_core.operation_status: a managed operation's status derived from the journal alone
(docs/managed.md)."""

from __future__ import annotations

from typing import get_args

import attrs

from upgrade_core import (
    EVENT_CODEC,
    PHASE_OF_RESULT,
    TERMINAL_PHASES,
    fold,
    operation_status,
    refused_status,
)
from upgrade_core import _events as ev
from upgrade_core._events import ResultValue
from upgrade_core._history import summarize_history

from .journals import (
    COMMITTED_RESULT,
    FULL_COMMIT,
    FULL_ROLLBACK,
    OP,
    OPENED,
    PRE_SWITCH,
    SWITCHED,
    records,
)

BOOT = "0f3c6a52-1d3e-4c56-9a4b-8b1f2d9e7c10"


def with_boot(events: list[ev.Event]) -> list[ev.Event]:
    return [attrs.evolve(e, boot_id=BOOT) if isinstance(e, ev.EpisodeOpened) else e for e in events]


def test_a_committed_episode_is_succeeded_with_its_result_record() -> None:
    recs = records(with_boot(FULL_COMMIT))
    st = operation_status(fold(recs), OP)
    assert st is not None and st.terminal
    published = next(r for r in recs if isinstance(r.event, ev.ResultPublished))
    closed = recs[-1]
    assert (st.phase, st.result, st.from_version, st.to_version) == (
        "Succeeded", "committed", "1.0.0", "2.0.0")
    assert st.journal_seq == published.seq
    assert (st.boot_id, st.started_at, st.finished_at) == (BOOT, recs[0].wall_time, closed.wall_time)


def test_a_rolled_back_episode_is_rolled_back_with_its_reason() -> None:
    st = operation_status(fold(records(FULL_ROLLBACK)), OP)
    assert st is not None and (st.phase, st.result) == ("RolledBack", "rolled_back")
    assert st.message and "start-limit-hit" in st.message
    assert st.boot_id is None  # a journal written before boot ids were recorded


def test_an_open_episode_is_in_progress_and_an_unknown_one_is_none() -> None:
    st = operation_status(fold(records(with_boot(SWITCHED))), OP)
    assert st is not None and not st.terminal
    assert (st.phase, st.result, st.from_version, st.to_version, st.journal_seq) == (
        "InProgress", None, "1.0.0", "2.0.0", None)
    assert operation_status(fold(records(PRE_SWITCH)), "another-op") is None


def test_published_but_not_yet_closed_is_already_terminal() -> None:
    events = FULL_COMMIT[:-1]  # a crash between ResultPublished and EpisodeClosed
    st = operation_status(fold(records(events)), OP)
    assert st is not None and st.phase == "Succeeded" and st.journal_seq == len(events)


def test_the_same_journal_always_derives_the_same_status() -> None:
    recs = records(with_boot(FULL_COMMIT))
    assert operation_status(fold(recs), OP) == operation_status(fold(list(recs)), OP)


def test_a_summarised_episode_keeps_its_result_times_seq_and_boot_id() -> None:
    """A status republished after compaction is the one published before it (docs/managed.md)."""
    recs = records(with_boot(FULL_COMMIT))
    before = operation_status(fold(recs), OP)
    snapshot = summarize_history(recs)
    st = operation_status(fold(records([snapshot], episode=ev.SNAPSHOT_EPISODE)), OP)
    assert st == before
    assert st is not None and st.journal_seq == len(recs) - 1 and st.phase == "Succeeded"
    assert st.started_at == recs[0].wall_time and st.boot_id is not None


def test_a_summary_written_before_seqs_were_kept_has_no_seq() -> None:
    recs = records(FULL_COMMIT)
    (summary,) = summarize_history(recs).episodes
    old = ev.HistorySnapshot((attrs.evolve(summary, opened_seq=None, published_seq=None),))
    st = operation_status(fold(records([old], episode=ev.SNAPSHOT_EPISODE)), OP)
    assert st is not None and (st.phase, st.result, st.journal_seq) == ("Succeeded", "committed", None)


def test_every_result_value_maps_to_a_terminal_phase() -> None:
    assert set(PHASE_OF_RESULT) == set(get_args(ResultValue))
    assert set(PHASE_OF_RESULT.values()) == set(TERMINAL_PHASES)
    st = refused_status("x", "why", 1.0)
    assert st.terminal and (st.phase, st.result, st.journal_seq, st.message) == ("Failed", None, None, "why")


def test_boot_id_is_omitted_on_disk_when_unset_and_kept_when_set() -> None:
    assert b"boot_id" not in EVENT_CODEC.encode(OPENED)
    with_id = attrs.evolve(OPENED, boot_id=BOOT)
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(with_id)) == with_id
    assert COMMITTED_RESULT.operation == OP

"""What compaction keeps of dropped episodes: :func:`summarize_history` (design §5 retention).

The journal drops old sealed segments only after a snapshot record summarising them is durable; this is
the summariser it is given. A summary keeps what later decisions and ``history`` need: the operation id
and its published result (operation-id idempotency, design §4.3 step 1), the times, and the candidate's
digest (a rolled-back candidate is never selected again, design §4.6 inv. 6), a signed release's
security version, the seqs of its opening and published result and its boot id (``history`` order and a
republished operation status). Beside the summaries the snapshot keeps the facts of the dropped records
(:class:`~upgrade_core.JournalFacts`: the anti-rollback watermark and trust resets, the known-bad marks, each
slot's version, docs/trust.md), so nothing that ``status``, a trust decision or the next episode reads is
lost with them, whatever ``journal.keep_episodes`` is; and the candidate the dropped records leave staged for
``activate`` (docs/cli.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from . import _events as ev
from ._fold import Folder


def summarize_history(records: Sequence[ev.Recorded]) -> ev.HistorySnapshot:
    """One :class:`~upgrade_core.HistorySnapshot` for ``records``, the oldest records being dropped.

    Args:
        records: a contiguous run of records, oldest first; it may begin with (or contain) an older
            snapshot, whose summaries are carried over first. Only closed episodes are summarised (the
            journal drops nothing else).

    Raises:
        HistoryError: the records are not a legal history (see :class:`~upgrade_core.Folder`).
    """
    folder = Folder()
    folder.apply_all(records)
    view = folder.view()
    summaries = list(view.history)
    for ep in view.episodes.values():
        result = ep.published
        if ep.is_open or result is None:
            continue
        summaries.append(
            ev.EpisodeSummary(
                operation=ep.episode_id,
                result=result,
                opened_at=ep.opened_at,
                closed_at=ep.closed_at if ep.closed_at is not None else ep.opened_at,
                candidate_sha256=ep.candidate_sha256,
                security_version=ep.release.security_version if ep.release is not None else None,
                known_bad=ep.condemns_candidate,
                opened_seq=ep.opened_seq,
                published_seq=ep.published_seq,
                boot_id=ep.boot_id,
                kind=ep.kind,
            )
        )
    summaries.sort(key=lambda s: s.opened_seq or 0)
    staged = view.staged
    kept = None if staged is None else ev.StagedSummary(
        staged.operation, staged.slot, staged.sha256, staged.version, staged.archive_sha256,
        staged.switch_in_window,
    )
    return ev.HistorySnapshot(tuple(summaries), folder.facts(), kept, view.left_stopped)

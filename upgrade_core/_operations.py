"""Managed operations (docs/managed.md): the status of an operation, derived from the journal alone.

A control plane (a spool directory, a Kubernetes ``UpgradeOperation``) asks for an upgrade under an operation
id; the operator runs it as an episode whose id *is* that operation id and reports one terminal status. The
status is never stored anywhere but the source: it is recomputed from the journal every time, so a crash
between the result and its acknowledgement republishes exactly the same fields (same ``journal_seq``,
same times, same boot id) and never runs host effects again.

Phases follow the ``UpgradeOperation`` status contract of design §10: ``Pending`` (seen, not started),
``InProgress`` (its episode is open), and the terminal ``Succeeded`` (``committed``, ``noop``, or ``staged``
for an operation that asked only for staging),
``Failed`` (``aborted``, or refused before any episode opened), ``RolledBack`` and ``NeedsAttention``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final, Literal

import attrs

from ._events import ResultValue, UpgradeResult
from ._fold import EpisodeView, JournalView, OperationStep

__all__ = [
    "PHASE_OF_RESULT",
    "TERMINAL_PHASES",
    "OperationPhase",
    "OperationStatus",
    "OperationStep",
    "operation_status",
    "refused_status",
    "waiting_status",
    "window_waiting_status",
]

OperationPhase = Literal["Pending", "InProgress", "Succeeded", "Failed", "RolledBack", "NeedsAttention"]

TERMINAL_PHASES: Final[frozenset[str]] = frozenset({"Succeeded", "Failed", "RolledBack", "NeedsAttention"})

PHASE_OF_RESULT: Final[dict[ResultValue, OperationPhase]] = {
    "committed": "Succeeded",
    "noop": "Succeeded",
    "aborted": "Failed",
    "rolled_back": "RolledBack",
    "needs_attention": "NeedsAttention",
    "staged": "Succeeded",
    # design §4.7: switched, the unit left stopped as found; a later check (an activate) takes the status over
    "switched_stopped": "Succeeded",
}
"""The terminal phase of each published result (design §7 result values -> design §10 phases)."""


@attrs.frozen
class OperationStatus:
    """What a source is told about one operation.

    Attributes:
        operation: the operation id (``[A-Za-z0-9._-]{1,64}``; the episode id in the journal).
        phase: see the module docstring.
        result: the published result value (``committed``...), None while in progress or when the
            operation was refused before an episode opened.
        from_version / to_version: as the result (or the open episode) names them.
        message: the result's reason, or why the operation was refused; None when there is nothing to say.
        journal_seq: the sequence number of the ``ResultPublished`` record, None when it is not (or no
            longer, after compaction) in the journal, or the operation never reached the journal.
        boot_id: the boot the episode opened in (``EpisodeOpened.boot_id``), None when unknown.
        started_at / finished_at: Unix seconds of ``EpisodeOpened`` / ``EpisodeClosed`` (wall clock,
            informational), None when unknown.
        step: where a running operation stands (:attr:`~upgrade_core.EpisodeView.step`; ``Waiting`` before
            its episode opens, and while it waits for its maintenance window, docs/configuration.md
            ``[schedule]``; ``Staged`` once the operator staged its candidate outside the window).
        attempt: the latest health attempt's number (from 1; :attr:`~upgrade_core.EpisodeView.attempt`),
            None before the first one.
        bytes_fetched: the archive's size in bytes once ``ArchiveFetched`` is journaled, None before (the
            download's progress is not journaled: the field goes from absent to the whole size).

        ``step``, ``attempt`` and ``bytes_fetched`` belong to a running operation only: a terminal status
        leaves them None, so the status republished after compaction has summarised the episode (which keeps
        neither) is the very document published before it.
    """

    operation: str
    phase: OperationPhase
    result: ResultValue | None = None
    from_version: str | None = None
    to_version: str | None = None
    message: str | None = None
    journal_seq: int | None = None
    boot_id: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    step: OperationStep | None = None
    attempt: int | None = None
    bytes_fetched: int | None = None

    @property
    def terminal(self) -> bool:
        """True for ``Succeeded``, ``Failed``, ``RolledBack`` and ``NeedsAttention``."""
        return self.phase in TERMINAL_PHASES


def _terminal(result: UpgradeResult, operation: str) -> OperationStatus:
    return OperationStatus(
        operation, PHASE_OF_RESULT[result.result], result.result, result.from_version, result.to_version,
        result.reason,
    )


def operation_status(view: JournalView, operation: str) -> OperationStatus | None:
    """The status of ``operation`` as the journal tells it; pure.

    An operation the operator staged outside its maintenance window (its episode published ``staged``) is
    ``InProgress`` with step ``Staged`` until an ``activate`` episode switches to that staging; from then
    on its status is that episode's (its result, ``journal_seq`` and boot id; the operation's start time).

    Returns:
        A terminal status once the episode's result is published (``journal_seq`` names that record; for
        an episode compaction has summarised, the summary keeps it, the boot id and the times: a republished
        status is the same; only summaries written before they were kept lack the first two), an
        ``InProgress`` status while its episode is open, None when the journal has never seen it.
    """
    ep = view.episodes.get(operation)
    if ep is not None:
        started_at = ep.opened_at
        if ep.published is not None and ep.published.result == "staged":
            # staged for its maintenance window: the operation goes on in the activate episode that
            # switched to this staging (StagedCandidateChecked.staged_by), once there is one
            activation = _activation_of(view, operation)
            if activation is None:
                return OperationStatus(
                    operation, "InProgress", from_version=ep.from_version, to_version=ep.candidate_version,
                    message=ep.published.reason, boot_id=ep.boot_id, started_at=started_at, step="Staged",
                )
            ep = activation
        if ep.published is not None:
            return attrs.evolve(
                _terminal(ep.published, operation), journal_seq=ep.published_seq, boot_id=ep.boot_id,
                started_at=started_at, finished_at=ep.closed_at,
            )
        return OperationStatus(
            operation, "InProgress", from_version=ep.from_version, to_version=ep.candidate_version,
            boot_id=ep.boot_id, started_at=started_at, step=ep.step, attempt=ep.attempt,
            bytes_fetched=ep.archive_size,
        )
    for summary in reversed(view.history):
        if summary.operation == operation:
            return attrs.evolve(
                _terminal(summary.result, operation), journal_seq=summary.published_seq,
                boot_id=summary.boot_id, started_at=summary.opened_at, finished_at=summary.closed_at,
            )
    result = view.result_of(operation)
    return None if result is None else _terminal(result, operation)


def waiting_status(operation: str, at: float) -> OperationStatus:
    """The ``InProgress`` status of an operation accepted and not yet seen by the journal (step
    ``Waiting``: for the host lock, before its episode opens).

    Args:
        at: Unix seconds it was accepted (``started_at``).
    """
    return OperationStatus(operation, "InProgress", started_at=at, step="Waiting")


def _activation_of(view: JournalView, staged_by: str) -> EpisodeView | None:
    """The latest ``activate`` episode that switched to the candidate operation ``staged_by`` staged."""
    found = None
    for ep in view.episodes.values():
        if ep.kind == "activate" and ep.staged_by == staged_by:
            found = ep
    return found


def window_waiting_status(
    operation: str, opens_at: float | None, at: float, staged: OperationStatus | None = None
) -> OperationStatus:
    """The ``InProgress`` status of an operation waiting for its maintenance window (step ``Waiting``); the
    message says when this host's part of the next window opens (Unix seconds ``opens_at``, None when the
    expression names no later start).

    Args:
        at: Unix seconds the wait was noticed (``started_at``) when nothing of it is journaled.
        staged: its status once its candidate is staged (step ``Staged``): versions, boot id and start kept.
    """
    when = "no later window" if opens_at is None else f"the next opens at {_utc(opens_at)}"
    message = f"waiting for the maintenance window: {when}"
    if staged is not None:
        said = f"{message}; {staged.message}" if staged.message else message
        return attrs.evolve(staged, message=said, step="Waiting")
    return OperationStatus(operation, "InProgress", message=message, started_at=at, step="Waiting")


def _utc(unix_s: float) -> str:
    """RFC 3339 UTC to the second."""
    return datetime.fromtimestamp(int(unix_s), UTC).isoformat().replace("+00:00", "Z")


def refused_status(operation: str, reason: str, at: float) -> OperationStatus:
    """The terminal ``Failed`` status of an operation refused before any episode opened (wrong node or
    agent, bad parameters): the host was not touched and the journal holds nothing of it.

    Args:
        at: Unix seconds of the refusal (``finished_at``).
    """
    return OperationStatus(operation, "Failed", message=reason, finished_at=at)

"""``fold(records) -> JournalView``: the journal's history, derived (design §2, 4.2). Pure, no I/O.

Each record is checked before it is applied (eventsourcing's "validate before mutating"): its ``seq``
must be the previous one + 1, and its event must be legal for its episode by THE rule,
:func:`upgrade_core.next_state` (the table plus the rules that need the episode's facts, given as
:class:`~upgrade_core.EpisodeContext`). Anything else is a :class:`~upgrade_core.errors.HistoryError`:
recovery never guesses over an illegal history. The handlers below only record facts; they check nothing.

Speed: the replay benchmark folds 100k records. The fold therefore works on small mutable builders, one
handler per event type looked up in a dict, and freezes them into :class:`EpisodeView` values once at the
end. :class:`Folder` is the incremental form the orchestrator feeds with its own appends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import attrs

from . import _events as ev
from ._events import EpisodeKind, LeftStoppedCandidate, Slot, UpgradeResult
from ._state import TERMINAL_STATES, EpisodeContext, EpisodeState, next_state
from ._watermark import rollback_refusal as _rollback_refusal
from .errors import HistoryError

_S = EpisodeState
# The states the per-record path compares with, read once: ``EpisodeState.X`` goes through the enum
# metaclass's Python-level ``__getattr__`` hook on every read (about 70 ns, paid per record of the
# 100k-record replay of design §9 ``journal.replay``).
_NEW: Final = _S.NEW
_OPENED: Final = _S.OPENED
_CLOSED: Final = _S.CLOSED

OperationStep = Literal["Waiting", "Fetching", "Verifying", "Staged", "Switching", "Restarting",
                        "HealthChecking", "RollingBack"]
"""Where a running operation stands, for its status (docs/managed.md, "Step by step"). ``Waiting`` belongs to
an operation the journal has not seen yet; the others are :attr:`EpisodeView.step`."""


@attrs.frozen
class EpisodeView:
    """One episode as its events describe it. Every field is a recorded fact; conclusions are properties.

    Attributes:
        episode_id: the episode id (= operation id).
        state: the state after the episode's last event.
        kind: ``upgrade``, ``install``, ``self_upgrade``, ``quarantine``, ``rollback`` or ``activate``.
        source: the redacted archive source (a ``rollback``: ``last-good <slot>``).
        expected_sha256 / expected_version: what the request demanded, if anything.
        from_slot / from_version: what ``current`` named (and its version) when the episode opened.
        max_health_attempts / stability_s / health_timeout_s: the health policy recorded at opening
            (seconds), so a recovery under another configuration spends exactly these attempts.
        archive_sha256 / archive_size: the fetched archive (64 hex / bytes).
        candidate_slot / candidate_sha256 / candidate_size: the staged member (slot, 64 hex, bytes); a
            ``rollback``'s candidate is the last-good slot (from ``SwitchIntended``; digest as expected).
        staging_path: the staging temp file, until it was installed.
        candidate_version: what the candidate's version command reported.
        release: the ``ReleaseTrusted`` fact of a signed release (signer, security_version), or None.
        installed: the staging file was renamed onto the candidate slot.
        switch_intended / switch_landed: ``SwitchIntended`` / ``SwitchCommitted`` were journaled.
        switch_previous_slot / switch_last_good: what ``SwitchIntended`` recorded.
        last_good_slot: the slot ``last-good`` names per this episode's events (None if never recorded).
        mirrors_synced / mirrors: ``MirrorsSynced`` was journaled, and the mirror paths it names.
        restart_unit / restart_requested_monotonic: the latest restart request (CLOCK_MONOTONIC s).
        observed_pid / observed_invocation: the latest ``RestartObserved``.
        attempts_started / attempts_failed: candidate health attempts begun / failed.
        rollback_attempts_started / rollback_attempts_failed: the same, for the last-good's check.
        health_failure: the latest candidate ``HealthFailed`` reason.
        committed_version: version recorded by ``UpgradeCommitted``.
        unchanged_version: version recorded by ``CandidateUnchanged`` (a ``noop`` episode).
        rollback_reason / rollback_slot: from ``RollbackStarted``.
        abort_reason / attention_reason: from ``Aborted`` / ``AttentionNeeded``.
        abort_cause: ``Aborted.cause`` (``"verification"``: the candidate's own version command failed).
        health_failed_own: a candidate ``HealthFailed`` without an environment cause was journaled (the
            binary itself failed, not the probe's network, systemd or an interruption).
        published: the result published (``ResultPublished``), if any.
        recoveries: how many times a recovery took the episode over.
        opened_seq / last_seq: sequence numbers of its first and latest records.
        opened_at / closed_at: wall-clock seconds (informational only).
        boot_id: ``EpisodeOpened.boot_id`` (the boot it opened in), None in older journals.
        published_seq: the sequence number of its ``ResultPublished`` record, once there is one (a managed
            operation's status names it as ``journalSeq``: the exactly-once publication of docs/managed.md).
        below_watermark: ``EpisodeOpened.below_watermark``: a ``rollback`` run with ``--below-watermark``.
        staged_by: an ``activate`` episode's ``StagedCandidateChecked.staged_by``: the operation that staged
            its candidate.
        switch_in_window: a staging episode's ``StagedForActivation.switch_in_window``: the recovery timer,
            not ``activate``, switches to its candidate, inside the maintenance window.
        unit_found_stopped: ``UnitFoundStopped`` was journaled: an ``activate`` that found the agent unit
            stopped on purpose, and so switches without starting it (design §4.7).
        move: a ``host-move`` episode's ``HostMoveIntended`` (the root, the legacy root, the copy's
            directory), or None.
    """

    episode_id: str
    state: EpisodeState
    kind: EpisodeKind
    source: str
    expected_sha256: str | None
    expected_version: str | None
    from_slot: Slot | None
    from_version: str | None
    max_health_attempts: int
    stability_s: float
    health_timeout_s: float
    archive_sha256: str | None = None
    archive_size: int | None = None
    candidate_slot: Slot | None = None
    candidate_sha256: str | None = None
    candidate_size: int | None = None
    staging_path: str | None = None
    candidate_version: str | None = None
    release: ev.ReleaseTrusted | None = None
    installed: bool = False
    switch_intended: bool = False
    switch_landed: bool = False
    switch_previous_slot: Slot | None = None
    switch_last_good: Slot | None = None
    last_good_slot: Slot | None = None
    mirrors_synced: bool = False
    mirrors: tuple[str, ...] = ()
    restart_unit: str | None = None
    restart_requested_monotonic: float | None = None
    observed_pid: int | None = None
    observed_invocation: str | None = None
    attempts_started: int = 0
    attempts_failed: int = 0
    rollback_attempts_started: int = 0
    rollback_attempts_failed: int = 0
    health_failure: str | None = None
    committed_version: str | None = None
    unchanged_version: str | None = None
    rollback_reason: str | None = None
    rollback_slot: Slot | None = None
    abort_reason: str | None = None
    abort_cause: str | None = None
    attention_reason: str | None = None
    health_failed_own: bool = False
    published: UpgradeResult | None = None
    recoveries: int = 0
    opened_seq: int = 0
    last_seq: int = 0
    opened_at: float = 0.0
    closed_at: float | None = None
    boot_id: str | None = None
    published_seq: int | None = None
    below_watermark: bool = False
    staged_by: str | None = None
    switch_in_window: bool = False
    unit_found_stopped: bool = False
    move: ev.HostMoveIntended | None = None

    # -- derived facts ---------------------------------------------------------------------------------
    @property
    def operation(self) -> str:
        """The operation id (the episode id)."""
        return self.episode_id

    @property
    def is_open(self) -> bool:
        """True until ``EpisodeClosed``."""
        return self.state is not _S.CLOSED

    @property
    def switch_committed(self) -> bool:
        """``current`` was durably flipped to the candidate in this episode (``SwitchCommitted`` seen)."""
        return self.switch_landed

    @property
    def candidate_active(self) -> bool:
        """The candidate is active and awaiting its verdict (switched, restarted or healthy)."""
        return self.state in (_S.SWITCHED, _S.RESTARTED, _S.HEALTHY)

    @property
    def health_attempts_left(self) -> int:
        """Candidate health attempts still allowed (recorded policy minus attempts begun), >= 0."""
        return max(0, self.max_health_attempts - self.attempts_started)

    @property
    def health_attempt_open(self) -> bool:
        """A candidate attempt was begun and has no outcome yet (e.g. a crash or reboot inside it)."""
        return self.attempts_started > self.attempts_failed and self.state in (_S.SWITCHED, _S.RESTARTED)

    @property
    def return_slot(self) -> Slot | None:
        """Where an unhealthy candidate goes back to: what ``last-good`` named at ``SwitchIntended``; for a
        ``rollback`` episode (whose candidate IS the last-good slot) the slot ``current`` named before."""
        return self.switch_previous_slot if self.kind == "rollback" else self.switch_last_good

    def unhealthy_reason(self, detail: str) -> str:
        """The one-line reason of an unhealthy candidate (``RollbackStarted``, ``Aborted``), naming both slots
        and versions for a ``rollback`` episode."""
        if self.kind == "rollback":
            return (
                f"last-good {self.candidate_slot} ({self.candidate_version}) unhealthy after "
                f"{self.max_health_attempts} attempt(s): {detail}; back to {self.switch_previous_slot} "
                f"({self.from_version})"
            )
        return f"candidate unhealthy after {self.max_health_attempts} attempt(s): {detail}"

    @property
    def condemns_candidate(self) -> bool:
        """This episode made its candidate's digest known-bad (docs/trust.md). An ``upgrade``, ``install``
        or ``self_upgrade`` (never an operator ``rollback``: its failure says the old release fails in
        today's environment) whose candidate was rolled back (or needed attention) after at least one
        health failure of its own, or that aborted because the candidate's version command failed."""
        if self.kind == "rollback" or self.candidate_sha256 is None:
            return False
        result = self.terminal_result
        if result is None:
            return False
        if result.result in ("rolled_back", "needs_attention"):
            return self.health_failed_own
        if result.result == "aborted":  # an install's unhealthy candidate aborts after the switch
            return self.abort_cause == "verification" or (self.switch_landed and self.health_failed_own)
        return False

    @property
    def rollback_attempts_left(self) -> int:
        """Health attempts left for the last-good during a rollback, >= 0."""
        return max(0, self.max_health_attempts - self.rollback_attempts_started)

    @property
    def step(self) -> OperationStep | None:
        """The step an open episode is in, from its state and recorded facts alone (never a clock or a
        counter kept beside the journal); None once it holds a verdict (committed, unchanged, aborted,
        rolled back, needs attention, published, closed).

        ``Fetching`` until ``ArchiveFetched`` (a ``rollback`` episode fetches nothing: ``Verifying`` from its
        opening); ``Verifying`` through staging, the version command and the signature; ``Staged`` once the
        candidate was installed in the inactive slot (``CandidateInstalled``) and the switch has not begun;
        ``Switching`` from ``SwitchIntended`` until the first health attempt; ``Restarting`` while a health
        attempt's restart has not been observed (or the next attempt is due); ``HealthChecking`` from
        ``RestartObserved`` to the verdict; ``RollingBack`` from ``RollbackStarted``.
        """
        state = self.state
        if state is _OPENED:
            return "Verifying" if self.kind == "rollback" else "Fetching"
        if state in (_S.FETCHED, _S.STAGED):
            return "Verifying"
        if state is _S.VERIFIED:
            return "Staged" if self.installed else "Verifying"
        if state is _S.SWITCHING:
            return "Switching"
        if state is _S.SWITCHED:
            return "Switching" if self.attempts_started == 0 else "Restarting"
        if state in (_S.RESTARTED, _S.HEALTHY):
            return "HealthChecking"
        if state is _S.ROLLING_BACK:
            return "RollingBack"
        return None

    @property
    def attempt(self) -> int | None:
        """The number (from 1) of the latest health attempt begun: the last-good's once a rollback started,
        else the candidate's; None before the first ``HealthAttemptStarted``."""
        if self.rollback_slot is not None or self.state is _S.ROLLING_BACK:
            return self.rollback_attempts_started or None
        return self.attempts_started or None

    @property
    def terminal_result(self) -> UpgradeResult | None:
        """The episode's terminal result, once its state holds one (or the published one); else None."""
        if self.published is not None:
            return self.published
        state = self.state
        if state not in TERMINAL_STATES:
            return None
        if state is _S.COMMITTED:
            return UpgradeResult(
                self.episode_id, "committed", self.from_version, self.committed_version or
                self.candidate_version, self.candidate_slot, None,
            )
        if state is _S.READY:
            return UpgradeResult(
                self.episode_id, "staged", self.from_version, self.candidate_version, self.from_slot,
                f"candidate {self.candidate_version} staged in slot {self.candidate_slot}; "
                + ("the recovery timer switches to it inside the maintenance window" if self.switch_in_window
                   else "activate switches to it"),
            )
        if state is _S.LEFT_STOPPED:
            return UpgradeResult(
                self.episode_id, "switched_stopped", self.from_version, self.candidate_version,
                self.candidate_slot,
                f"current -> {self.candidate_slot} ({self.candidate_version}) with the unit stopped, as "
                "found; not health-checked: recover-agent-upgrade checks it once the unit runs",
            )
        if state is _S.UNCHANGED:
            return UpgradeResult(
                self.episode_id, "noop", self.from_version, self.unchanged_version, self.from_slot, None
            )
        if state is _S.MOVED and self.move is not None:
            return UpgradeResult(
                self.episode_id, "committed", self.from_version, self.from_version, self.from_slot,
                f"host root {self.move.root} is a real directory now, no longer a link to "
                f"{self.move.legacy_root} (whose files are left in place)",
            )
        if state is _S.ROLLED_BACK:
            return UpgradeResult(
                self.episode_id, "rolled_back", self.from_version, self.candidate_version, self.rollback_slot,
                self.rollback_reason,
            )
        if state is _S.NEEDS_ATTENTION:
            return UpgradeResult(
                self.episode_id, "needs_attention", self.from_version, self.candidate_version,
                self.rollback_slot, self.attention_reason,
            )
        slot = self.candidate_slot if self.switch_landed else self.from_slot
        return UpgradeResult(
            self.episode_id, "aborted", self.from_version, self.candidate_version, slot, self.abort_reason
        )



@attrs.frozen
class KnownBad:
    """Why a release digest is refused when offered again (the known-bad memory, docs/trust.md).

    Attributes:
        operation: the latest operation that condemned it.
        failed: ``"health"`` (rolled back or needed attention) or ``"verification"``.
    """

    operation: str
    failed: Literal["health", "verification"]

    def refusal(self, sha256: str) -> str:
        """The one-line reason a refused offer aborts with."""
        how = (
            f"was rolled back by operation {self.operation}" if self.failed == "health"
            else f"failed its verification in operation {self.operation}"
        )
        return f"release {sha256[:12]} {how}; --retry-known-bad to try it again"


@attrs.frozen
class PendingActivation:
    """A candidate ``upgrade --stage`` left in the inactive slot for ``activate`` (docs/cli.md), as the
    journal's durable records say: set by ``StagedForActivation``; forgotten once an episode installs other
    bytes (``CandidateInstalled``), moves ``current`` (``SwitchIntended``, an ``activate``'s own included,
    unless that ``activate`` then aborts with the switch never landed) or finds the slot's bytes changed
    (``StagedCandidateChecked`` without a match).

    Attributes:
        operation: the staging episode.
        slot: the slot it occupies (neither ``current`` nor ``last-good`` names it while it is staged).
        sha256: the member's digest (64 hex).
        version: the version its version command reported.
        archive_sha256: the archive's digest as published (64 hex).
        staged_at: wall-clock Unix seconds of the ``StagedForActivation`` record (informational).
        switch_in_window: the recovery timer switches to it once the maintenance window is open
            (``StagedForActivation.switch_in_window``); False: only ``activate`` does.
    """

    operation: str
    slot: Slot
    sha256: str
    version: str
    archive_sha256: str
    staged_at: float
    switch_in_window: bool = False


@attrs.frozen
class JournalView:
    """Everything the journal says, folded.

    Attributes:
        episodes: every episode still in the journal, in opening order, by episode id.
        open_episode: the one open episode, or None (the lifecycle allows at most one).
        closed_results: operation id -> published result, for closed episodes and history summaries
            (operation-id idempotency, design §4.3 step 1).
        failed_digests: candidate sha256s that were rolled back or needed attention (design §4.6 inv. 6).
        history: summaries kept by compaction (``HistorySnapshot``), oldest first (by the seq of their
            opening, ``EpisodeSummary.opened_seq``).
        slot_versions: slot -> the version its current binary reported, as far as the journal knows (kept
            across compaction and quarantine: ``JournalFacts.slot_versions``).
        installed_digests: slot -> the digest of the bytes an episode of this host last installed in it
            (``CandidateInstalled``; kept across compaction and quarantine with ``slot_versions``); a slot
            missing here holds bytes no episode installed (a legacy layout adopted as it was).
        last_seq: the last sequence number, 0 for an empty journal.
        security_watermark: the highest ``security_version`` of a signed release committed on this host
            since the latest ``TrustReset`` (``UpgradeCommitted`` in an episode with ``ReleaseTrusted``, or
            a raise a snapshot kept), None when none was; a signed release below it is refused
            (docs/trust.md).
        known_bad: candidate sha256 -> the latest operation that condemned it
            (:attr:`EpisodeView.condemns_candidate`) since the latest ``TrustReset``; a later commit of the
            same digest (offered with ``--retry-known-bad``) clears it. Kept across compaction and
            quarantine (``JournalFacts.known_bad``; older snapshots: ``EpisodeSummary.known_bad``).
        signed_security_versions: member sha256 -> the ``security_version`` a verified signature claimed for
            it (the ``ReleaseTrusted`` of the episode that staged it; the latest wins), kept across
            compaction (an ``EpisodeSummary`` carries both), not across quarantine. Keyed by digest, not
            slot: an operator rollback looks up the bytes last-good's slot holds now, and refuses those below
            the watermark.
        staged: the candidate waiting for ``activate`` (:class:`PendingActivation`), or None.
        left_stopped: the unverified candidate ``current`` names since an ``activate`` left the unit stopped
            (:class:`LeftStoppedCandidate`), or None.
    """

    episodes: dict[str, EpisodeView]
    open_episode: EpisodeView | None
    closed_results: dict[str, UpgradeResult]
    failed_digests: frozenset[str]
    history: tuple[ev.EpisodeSummary, ...]
    slot_versions: dict[Slot, str]
    last_seq: int
    security_watermark: int | None = None
    known_bad: dict[str, KnownBad] = attrs.Factory(dict)
    signed_security_versions: dict[str, int] = attrs.Factory(dict)
    staged: PendingActivation | None = None
    left_stopped: LeftStoppedCandidate | None = None
    installed_digests: dict[Slot, str] = attrs.Factory(dict)

    def rollback_refusal(self, slot: Slot, sha256: str | None) -> str | None:
        """Why an operator rollback to ``slot``, whose bytes hash to ``sha256`` (None: unknown), is refused by
        the anti-rollback watermark (:func:`~upgrade_core.rollback_refusal`, docs/trust.md), None when it
        is not: the level signed for those bytes is looked up by digest, so it survives compaction."""
        level = self.signed_security_versions.get(sha256) if sha256 is not None else None
        return _rollback_refusal(self.security_watermark, slot, level)

    def result_of(self, operation: str) -> UpgradeResult | None:
        """The recorded result of a closed episode ``operation``, or None."""
        return self.closed_results.get(operation)


class _Ep:
    """Mutable builder for one episode (frozen into :class:`EpisodeView` at the end)."""

    __slots__ = ("ctx", "episode_id", "fields", "state")

    def __init__(
        self, episode_id: str, state: EpisodeState, fields: dict[str, Any], ctx: EpisodeContext
    ) -> None:
        self.episode_id = episode_id
        self.state = state
        self.fields = fields
        self.ctx = ctx  # the facts next_state needs; rebuilt by _refresh when one of them changes


class Folder:
    """Incremental fold: feed records with :meth:`apply`, read the result with :meth:`view`.

    The orchestrator keeps one and feeds it the records its own appends return, so it never re-reads the
    journal. :func:`fold` is ``Folder`` applied to every record.
    """

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._last_seq = 0
        self._eps: dict[str, _Ep] = {}
        self._open: str | None = None
        self._closed: dict[str, UpgradeResult] = {}
        self._failed: set[str] = set()
        self._history: list[ev.EpisodeSummary] = []
        # The facts a snapshot keeps (ev.JournalFacts), each with the seq it was journaled at: the latest
        # fact per slot / digest wins, whatever order the records holding them are read in.
        self._slot_facts: dict[Slot, ev.SlotVersion] = {}
        self._marks: dict[str, ev.KnownBadMark] = {}
        self._raises: list[ev.WatermarkRaise] = []
        self._reset_seq: int | None = None
        self._signed: dict[str, int] = {}
        self._staged: PendingActivation | None = None
        # an activate's staged candidate from its SwitchIntended on: back in _staged if the switch never lands
        self._activating: PendingActivation | None = None
        self._staged_said = False  # a record (not a snapshot) set or cleared the staged candidate
        self._left_stopped: LeftStoppedCandidate | None = None
        self._left_said = False  # a record (not a snapshot) set or cleared the left-stopped candidate
        self._wall = 0.0
        self._cache: JournalView | None = None

    @property
    def last_seq(self) -> int:
        """The last sequence number applied (0 when none)."""
        return self._last_seq

    def apply(self, record: ev.Recorded) -> None:
        """Apply one record.

        Raises:
            HistoryError: ``seq`` is not the previous + 1, an event for an unknown episode, a second
                open episode, a reused episode id, or an event the episode's state forbids
                (:class:`~upgrade_core.errors.IllegalTransitionError`, naming the ``seq``).
        """
        seq = record.seq
        # The first record may start past 1: compaction drops old records once a snapshot summarises them,
        # and the journal itself refuses any gap a snapshot does not cover (design §5).
        if seq != self._last_seq + 1 and self._last_seq != 0:
            raise HistoryError(f"journal sequence gap: record {seq} follows {self._last_seq}")
        event = record.event
        episode_id = record.episode_id
        self._cache = None
        self._wall = record.wall_time
        if type(event) is ev.HistorySnapshot:
            self._snapshot(event)
            self._last_seq = seq
            return
        ep = self._eps.get(episode_id)
        if ep is None:
            ctx = self.context_of(episode_id)
            next_state(_NEW, ctx, event, seq)  # IllegalTransitionError: unknown episode, reopened, ...
            assert type(event) is ev.EpisodeOpened
            ep = self._opened(episode_id, event, seq, record.wall_time)
            self._eps[episode_id] = ep
            self._open = episode_id
            self._last_seq = seq
            return
        new_state = next_state(ep.state, ep.ctx, event, seq)  # raises IllegalTransitionError
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, ep, event, seq)
        ep.state = new_state
        ep.fields["last_seq"] = seq
        if new_state is _CLOSED:
            ep.fields["closed_at"] = record.wall_time
            self._open = None
        self._last_seq = seq

    def apply_all(self, records: Iterable[ev.Recorded]) -> None:
        """Apply records in order (see :meth:`apply`)."""
        for record in records:
            self.apply(record)

    def view(self) -> JournalView:
        """Freeze what was applied so far into a :class:`JournalView` (cached until the next apply)."""
        if self._cache is None:
            episodes = {k: _freeze(k, ep) for k, ep in self._eps.items()}
            self._cache = JournalView(
                episodes=episodes,
                open_episode=episodes[self._open] if self._open is not None else None,
                closed_results=dict(self._closed),
                failed_digests=frozenset(self._failed),
                history=tuple(sorted(self._history, key=_opened_order)),
                slot_versions={
                    slot: f.version for slot, f in sorted(self._slot_facts.items()) if f.version is not None
                },
                last_seq=self._last_seq,
                security_watermark=self.watermark(),
                known_bad={
                    sha: KnownBad(m.operation, m.failed) for sha, m in sorted(self._marks.items())
                    if m.failed is not None and self._counts(m.seq)
                },
                signed_security_versions=dict(self._signed),
                staged=self._staged,
                left_stopped=self._left_stopped,
                installed_digests={
                    slot: f.sha256 for slot, f in sorted(self._slot_facts.items()) if f.sha256 is not None
                },
            )
        return self._cache

    def _counts(self, seq: int) -> bool:
        """A watermark raise or known-bad mark journaled at ``seq`` still counts (no trust reset after it)."""
        return self._reset_seq is None or seq > self._reset_seq

    def watermark(self) -> int | None:
        """The anti-rollback watermark: the highest raise after the latest trust reset, None when none."""
        counted = [r.security_version for r in self._raises if self._counts(r.seq)]
        return max(counted) if counted else None

    def facts(self) -> ev.JournalFacts:
        """What a snapshot of the records applied so far keeps (:class:`~upgrade_core.JournalFacts`): the
        marks and raises that still count (a raise outranked by a later one at least as high is left out:
        no trust reset can make it the highest again), and the slot versions."""
        raises: list[ev.WatermarkRaise] = []
        for r in sorted(self._raises, key=lambda r: r.seq, reverse=True):
            if self._counts(r.seq) and all(r.security_version > kept.security_version for kept in raises):
                raises.append(r)
        return ev.JournalFacts(
            through_seq=self._last_seq,
            reset_seq=self._reset_seq,
            raises=tuple(reversed(raises)),
            known_bad=tuple(m for _, m in sorted(self._marks.items()) if self._counts(m.seq)),
            slot_versions=tuple(f for _, f in sorted(self._slot_facts.items())),
        )

    def episode(self, episode_id: str) -> EpisodeView:
        """Freeze one episode (cheaper than :meth:`view` when only it is needed).

        Raises:
            KeyError: no such episode.
        """
        return _freeze(episode_id, self._eps[episode_id])

    def state_of(self, episode_id: str) -> EpisodeState:
        """The current state of ``episode_id`` (``new`` if it was never opened)."""
        ep = self._eps.get(episode_id)
        return ep.state if ep is not None else _S.NEW

    def context_of(self, episode_id: str) -> EpisodeContext:
        """The facts :func:`upgrade_core.next_state` needs for the next event of ``episode_id``.

        For an id never opened: the journal's open episode and whether the id was closed before (its
        episode may have been compacted into history).
        """
        ep = self._eps.get(episode_id)
        if ep is not None:
            return ep.ctx
        return EpisodeContext(episode_id, open_episode=self._open, closed_before=episode_id in self._closed)

    def check(self, episode_id: str, event: ev.Event) -> EpisodeState:
        """The state ``event`` would lead ``episode_id`` to; changes nothing (:func:`next_state`).

        Raises:
            IllegalTransitionError: the event breaks a lifecycle rule in this episode's state and context.
        """
        return next_state(self.state_of(episode_id), self.context_of(episode_id), event)

    def reset(self, records: Iterable[ev.Recorded]) -> None:
        """Forget everything applied and fold ``records`` afresh (after another process rewrote the journal).

        Raises:
            HistoryError: as :meth:`apply`.
        """
        self._clear()
        self.apply_all(records)

    # -- handlers ----------------------------------------------------------------------------------------
    def _opened(self, episode_id: str, e: ev.EpisodeOpened, seq: int, wall: float) -> _Ep:
        ctx = EpisodeContext(episode_id, kind=e.kind)
        fields = _VIEW_FIELDS.copy()
        fields.update({
            "kind": e.kind, "source": e.source, "expected_sha256": e.expected_sha256,
            "expected_version": e.expected_version, "from_slot": e.from_slot, "from_version": e.from_version,
            "max_health_attempts": e.max_health_attempts, "stability_s": e.stability_s,
            "health_timeout_s": e.health_timeout_s, "opened_seq": seq, "last_seq": seq, "opened_at": wall,
            "boot_id": e.boot_id, "below_watermark": e.below_watermark,
        })
        return _Ep(episode_id, _OPENED, fields, ctx)

    def _snapshot(self, e: ev.HistorySnapshot) -> None:
        # the snapshot comes after the records compaction kept, which are all newer than the ones it
        # summarises: what those say about the staged candidate wins (design §5, journal compaction)
        staged = e.staged
        if staged is not None and not self._staged_said:
            self._staged = PendingActivation(staged.operation, staged.slot, staged.sha256, staged.version,
                                             staged.archive_sha256, self._wall, staged.switch_in_window)
        if e.left_stopped is not None and not self._left_said:
            self._left_stopped = e.left_stopped
        for summary in e.episodes:
            self._history.append(summary)
            self._closed[summary.operation] = summary.result
            if summary.security_version is not None and summary.candidate_sha256:
                self._signed[summary.candidate_sha256] = summary.security_version
            if summary.candidate_sha256 and summary.result.result in ("rolled_back", "needs_attention"):
                self._failed.add(summary.candidate_sha256)
        if e.facts is not None:
            self._merge(e.facts)
            return
        # Written before snapshots kept their facts: derive what the summaries tell, as the oldest facts
        # (seq 0; among such summaries the later one wins).
        for summary in e.episodes:
            if summary.security_version is not None and summary.result.result == "committed":
                self._raises.append(ev.WatermarkRaise(0, summary.security_version))
            sha = summary.candidate_sha256
            if sha is None:
                continue
            result = summary.result.result
            condemned = summary.known_bad
            if condemned is None:  # written before the known-bad memory: what failed_digests always kept
                condemned = result in ("rolled_back", "needs_attention")
            if condemned:
                how: Literal["health", "verification"] = "verification" if result == "aborted" else "health"
                self._mark(ev.KnownBadMark(0, sha, summary.operation, how))
            elif result == "committed":
                self._mark(ev.KnownBadMark(0, sha, summary.operation, None))

    def _merge(self, facts: ev.JournalFacts) -> None:
        """Add a snapshot's facts: per slot and digest the latest journaled wins; resets and raises add up."""
        reset = facts.reset_seq
        if reset is not None and (self._reset_seq is None or reset > self._reset_seq):
            self._reset_seq = reset
        self._raises.extend(facts.raises)
        for mark in facts.known_bad:
            self._mark(mark)
        for fact in facts.slot_versions:
            self._slot_fact(fact)

    def _mark(self, mark: ev.KnownBadMark) -> None:
        old = self._marks.get(mark.sha256)
        if old is None or mark.seq >= old.seq:
            self._marks[mark.sha256] = mark

    def _slot_fact(self, fact: ev.SlotVersion) -> None:
        old = self._slot_facts.get(fact.slot)
        if old is None or fact.seq >= old.seq:
            self._slot_facts[fact.slot] = fact

    def _condemn(self, ep: _Ep, failed: Literal["health", "verification"], seq: int) -> None:
        sha = ep.fields.get("candidate_sha256")
        if sha and ep.fields["kind"] != "rollback":
            self._mark(ev.KnownBadMark(seq, sha, ep.episode_id, failed))

    def _h_fetched(self, ep: _Ep, e: ev.ArchiveFetched, seq: int) -> None:
        ep.fields["archive_sha256"] = e.sha256
        ep.fields["archive_size"] = e.size

    def _h_staged(self, ep: _Ep, e: ev.CandidateStaged, seq: int) -> None:
        f = ep.fields
        f["candidate_slot"] = e.slot
        f["candidate_sha256"] = e.sha256
        f["candidate_size"] = e.size
        f["staging_path"] = e.staging_path
        f["installed"] = False
        _refresh(ep)

    def _h_verified(self, ep: _Ep, e: ev.CandidateVerified, seq: int) -> None:
        ep.fields["candidate_version"] = e.version
        _refresh(ep)

    def _h_release_trusted(self, ep: _Ep, e: ev.ReleaseTrusted, seq: int) -> None:
        ep.fields["release"] = e
        sha = ep.fields.get("candidate_sha256")
        if sha:
            self._signed[sha] = e.security_version
        _refresh(ep)

    def _h_installed(self, ep: _Ep, e: ev.CandidateInstalled, seq: int) -> None:
        f = ep.fields
        f["installed"] = True
        _refresh(ep)
        f["staging_path"] = None
        self._staged = None  # the inactive slot now holds these bytes, whatever was staged there before
        self._staged_said = True
        self._slot_fact(ev.SlotVersion(seq, e.slot, f.get("candidate_version"), e.sha256))

    def _h_last_good(self, ep: _Ep, e: ev.LastGoodRepointed, seq: int) -> None:
        ep.fields["last_good_slot"] = e.slot

    def _h_switch_intended(self, ep: _Ep, e: ev.SwitchIntended, seq: int) -> None:
        f = ep.fields
        f["switch_intended"] = True
        f["switch_previous_slot"] = e.previous_slot
        f["switch_last_good"] = e.last_good
        # current moves: a staged candidate is the one switched to, or no longer inactive; an activate that
        # aborts before its switch took effect leaves it staged (_h_aborted)
        self._activating = self._staged if f["kind"] == "activate" else None
        self._staged = None
        self._staged_said = True
        self._left_stopped = None  # current moves (or is checked again): no longer left unverified
        self._left_said = True
        if f.get("last_good_slot") is None:
            f["last_good_slot"] = e.last_good
        if f["kind"] == "rollback":
            # The rollback's candidate is the slot last-good names, installed long ago: its digest is the one
            # EpisodeOpened expected, its version the one CandidateVerified just read.
            f["candidate_slot"] = e.candidate_slot
            f["candidate_sha256"] = f["expected_sha256"]
            version = f.get("candidate_version")
            if version is not None:
                installed = self._installed(e.candidate_slot, f["expected_sha256"])
                self._slot_fact(ev.SlotVersion(seq, e.candidate_slot, version, installed))
            _refresh(ep)

    def _h_staged_for_activation(self, ep: _Ep, e: ev.StagedForActivation, seq: int) -> None:
        self._staged = PendingActivation(
            ep.episode_id, e.slot, e.sha256, e.version, e.archive_sha256, self._wall, e.switch_in_window
        )
        ep.fields["switch_in_window"] = e.switch_in_window
        self._staged_said = True

    def _h_staged_checked(self, ep: _Ep, e: ev.StagedCandidateChecked, seq: int) -> None:
        f = ep.fields
        f["staged_by"] = e.staged_by
        f["candidate_slot"] = e.slot
        f["candidate_sha256"] = e.staged_sha256
        f["candidate_version"] = e.version
        f["installed"] = e.matches
        if not e.matches:
            self._staged = None  # the bytes are no longer the ones staged: nothing to activate
            self._staged_said = True
            left = self._left_stopped
            if left is not None and (e.slot, e.staged_sha256) == (left.slot, left.sha256):
                self._left_stopped = attrs.evolve(left, changed=True)  # design §4.7: no check to repeat
                self._left_said = True
        _refresh(ep)

    def _h_unit_found_stopped(self, ep: _Ep, e: ev.UnitFoundStopped, seq: int) -> None:
        ep.fields["unit_found_stopped"] = True
        _refresh(ep)

    def _h_left_stopped(self, ep: _Ep, e: ev.LeftStopped, seq: int) -> None:
        f = ep.fields
        self._left_stopped = LeftStoppedCandidate(
            ep.episode_id, f["staged_by"], e.slot, f["candidate_sha256"], f["candidate_version"],
            f["switch_last_good"],
        )
        self._left_said = True

    def _h_switch_committed(self, ep: _Ep, e: ev.SwitchCommitted, seq: int) -> None:
        ep.fields["switch_landed"] = True
        self._activating = None

    def _h_mirrors(self, ep: _Ep, e: ev.MirrorsSynced, seq: int) -> None:
        ep.fields["mirrors_synced"] = True
        ep.fields["mirrors"] = e.paths

    def _h_restart(self, ep: _Ep, e: ev.RestartRequested, seq: int) -> None:
        ep.fields["restart_unit"] = e.unit
        ep.fields["restart_requested_monotonic"] = e.requested_monotonic

    def _h_observed(self, ep: _Ep, e: ev.RestartObserved, seq: int) -> None:
        ep.fields["observed_pid"] = e.main_pid
        ep.fields["observed_invocation"] = e.invocation_id

    def _h_attempt(self, ep: _Ep, e: ev.HealthAttemptStarted, seq: int) -> None:
        ep.fields["rollback_attempts_started" if e.target == "last_good" else "attempts_started"] = e.attempt
        _refresh(ep)

    def _h_failed(self, ep: _Ep, e: ev.HealthFailed, seq: int) -> None:
        key = "rollback_attempts_failed" if e.target == "last_good" else "attempts_failed"
        ep.fields[key] = ep.fields.get(key, 0) + 1
        if e.target == "candidate":
            ep.fields["health_failure"] = e.reason
            if e.cause is None:
                ep.fields["health_failed_own"] = True

    def _h_committed(self, ep: _Ep, e: ev.UpgradeCommitted, seq: int) -> None:
        ep.fields["committed_version"] = e.version
        release: ev.ReleaseTrusted | None = ep.fields.get("release")
        if release is not None:  # the one-way door: from here on this release is the host's floor
            self._raises.append(ev.WatermarkRaise(seq, release.security_version))
        sha = ep.fields.get("candidate_sha256")
        if sha:  # proven good (offered again with --retry-known-bad); kept as a fact, so that an older
            # mark a snapshot read later carries does not count again
            self._mark(ev.KnownBadMark(seq, sha, ep.episode_id, None))

    def _h_rollback(self, ep: _Ep, e: ev.RollbackStarted, seq: int) -> None:
        ep.fields["rollback_reason"] = e.reason
        ep.fields["rollback_slot"] = e.to_slot

    def _h_rolled_back(self, ep: _Ep, e: ev.RolledBack, seq: int) -> None:
        sha = ep.fields.get("candidate_sha256")
        if sha:
            self._failed.add(sha)
        if ep.fields.get("health_failed_own"):
            self._condemn(ep, "health", seq)

    def _h_attention(self, ep: _Ep, e: ev.AttentionNeeded, seq: int) -> None:
        ep.fields["attention_reason"] = e.reason
        sha = ep.fields.get("candidate_sha256")
        if sha:
            self._failed.add(sha)
        if ep.fields.get("health_failed_own"):
            self._condemn(ep, "health", seq)

    def _h_aborted(self, ep: _Ep, e: ev.Aborted, seq: int) -> None:
        ep.fields["abort_reason"] = e.reason
        ep.fields["abort_cause"] = e.cause
        if ep.fields["kind"] == "activate" and not ep.fields["switch_landed"] and self._activating:
            self._staged = self._activating  # the switch never took effect: the slot holds those bytes
        self._activating = None
        if e.cause == "verification":
            self._condemn(ep, "verification", seq)
        elif ep.fields.get("switch_landed") and ep.fields.get("health_failed_own"):
            self._condemn(ep, "health", seq)  # an install's candidate, unhealthy: nothing to roll back to

    def _h_unchanged(self, ep: _Ep, e: ev.CandidateUnchanged, seq: int) -> None:
        ep.fields["unchanged_version"] = e.version
        ep.fields["staging_path"] = None

    def _h_quarantined(self, ep: _Ep, e: ev.JournalQuarantined, seq: int) -> None:
        ep.fields["unchanged_version"] = e.current_version
        ep.fields["last_good_slot"] = e.last_good_slot
        last_good = self._installed(e.last_good_slot, e.last_good_sha256)
        current = self._installed(e.current_slot, e.current_sha256)
        self._slot_fact(ev.SlotVersion(seq, e.last_good_slot, e.last_good_version, last_good))
        self._slot_fact(ev.SlotVersion(seq, e.current_slot, e.current_version, current))

    def _installed(self, slot: Slot, sha256: str | None) -> str | None:
        """``sha256`` when an episode installed exactly those bytes in ``slot`` (a fact that a record naming
        the slot's digest keeps), else None: the bytes' provenance is not known."""
        old = self._slot_facts.get(slot)
        return sha256 if old is not None and sha256 is not None and old.sha256 == sha256 else None

    def _h_move_intended(self, ep: _Ep, e: ev.HostMoveIntended, seq: int) -> None:
        ep.fields["move"] = e

    def _h_trust_reset(self, ep: _Ep, e: ev.TrustReset, seq: int) -> None:
        self._reset_seq = seq

    def _h_published(self, ep: _Ep, e: ev.ResultPublished, seq: int) -> None:
        ep.fields["published"] = e.result
        ep.fields["published_seq"] = seq
        _refresh(ep)

    def _h_closed(self, ep: _Ep, e: ev.EpisodeClosed, seq: int) -> None:
        published: UpgradeResult = ep.fields["published"]
        self._closed[ep.episode_id] = published

    def _h_recovery(self, ep: _Ep, e: ev.RecoveryStarted, seq: int) -> None:
        ep.fields["recoveries"] = ep.fields.get("recoveries", 0) + 1


_HANDLERS: Final[dict[type[ev.Event], Callable[[Folder, _Ep, Any, int], None]]] = {
    ev.ArchiveFetched: Folder._h_fetched,
    ev.CandidateStaged: Folder._h_staged,
    ev.CandidateVerified: Folder._h_verified,
    ev.ReleaseTrusted: Folder._h_release_trusted,
    ev.CandidateUnchanged: Folder._h_unchanged,
    ev.CandidateInstalled: Folder._h_installed,
    ev.LastGoodRepointed: Folder._h_last_good,
    ev.SwitchIntended: Folder._h_switch_intended,
    ev.SwitchCommitted: Folder._h_switch_committed,
    ev.StagedForActivation: Folder._h_staged_for_activation,
    ev.StagedCandidateChecked: Folder._h_staged_checked,
    ev.UnitFoundStopped: Folder._h_unit_found_stopped,
    ev.LeftStopped: Folder._h_left_stopped,
    ev.MirrorsSynced: Folder._h_mirrors,
    ev.RestartRequested: Folder._h_restart,
    ev.RestartObserved: Folder._h_observed,
    ev.HealthAttemptStarted: Folder._h_attempt,
    ev.HealthFailed: Folder._h_failed,
    ev.UpgradeCommitted: Folder._h_committed,
    ev.RollbackStarted: Folder._h_rollback,
    ev.RolledBack: Folder._h_rolled_back,
    ev.AttentionNeeded: Folder._h_attention,
    ev.Aborted: Folder._h_aborted,
    ev.JournalQuarantined: Folder._h_quarantined,
    ev.TrustReset: Folder._h_trust_reset,
    ev.HostMoveIntended: Folder._h_move_intended,
    ev.ResultPublished: Folder._h_published,
    ev.EpisodeClosed: Folder._h_closed,
    ev.RecoveryStarted: Folder._h_recovery,
}


def _opened_order(summary: ev.EpisodeSummary) -> int:
    """Where a summary goes in ``history``: by its opening's seq (summaries without one were all written
    before any that has one, by older code, and keep their order first)."""
    return summary.opened_seq or 0


def _refresh(ep: _Ep) -> None:
    """Rebuild the episode's :class:`EpisodeContext` after a fact the rules need changed (positional: hot;
    ``open_episode`` and ``closed_before`` keep their defaults, None and False)."""
    f = ep.fields
    published = f["published"]
    ep.ctx = EpisodeContext(
        ep.episode_id, f["kind"], f["candidate_slot"], f["candidate_sha256"], f["installed"],
        f["attempts_started"], f["rollback_attempts_started"],
        published.result if published is not None else None, None, False, f["candidate_version"],
        f["release"] is not None, f["unit_found_stopped"],
    )


_VIEW_FIELDS: Final[dict[str, Any]] = {
    a.name: a.default for a in attrs.fields(EpisodeView) if a.name not in ("episode_id", "state")
}
"""Every :class:`EpisodeView` field after ``episode_id`` and ``state``, in field order, with its default (the
ones without a default are set by ``Folder._opened``): an episode's ``fields`` starts as a copy, so its
values stay in field order and :func:`_freeze` passes them positionally (a keyword call matches ~40 names
against ~55 parameters one by one; design §9 ``journal.replay``)."""


def _freeze(episode_id: str, ep: _Ep) -> EpisodeView:
    return EpisodeView(episode_id, ep.state, *ep.fields.values())


def fold(records: Iterable[ev.Recorded]) -> JournalView:
    """Fold a journal's records (in sequence order) into a :class:`JournalView`. Pure.

    Args:
        records: every durable record, oldest first (``Journal.records()``).

    Returns:
        The view: episodes, the open one, closed results, failed digests, history.

    Raises:
        HistoryError: a sequence gap or an order the lifecycle forbids (see :meth:`Folder.apply`).
    """
    folder = Folder()
    folder.apply_all(records)
    return folder.view()


"""The journal's vocabulary: one frozen attrs class per fact, named in the past tense (design §4.1).

Events hold facts, never conclusions: whether a rollback is needed is derived by ``fold`` + ``decide``
from these facts and what the host shows. The envelope (sequence number, episode id, wall-clock time) is
not part of an event; the journal stores it around each event (see :class:`Recorded`).

Stable tags: each class's tag in the journal is its ``TAG`` (equal to the class name today and pinned by a
golden test). Renaming a class must keep its ``TAG``; removing a class breaks old journals, so don't.
Payload evolution: a class that changes shape bumps ``VERSION`` and ``upgrade_core.codec`` upcasts older
payloads on read.

Units: sizes in bytes, durations in seconds, digests as 64 lowercase hex characters, slots ``"blue"`` or
``"green"``.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Protocol

import attrs

Slot = Literal["blue", "green"]
ResultValue = Literal[
    "committed", "rolled_back", "aborted", "noop", "needs_attention", "staged", "switched_stopped"
]
EpisodeKind = Literal[
    "upgrade", "install", "self_upgrade", "quarantine", "rollback", "trust-reset", "activate", "host-move"
]
Trigger = Literal["boot", "on-failure", "manual", "timer", "upgrade", "resume"]
HealthTarget = Literal["candidate", "last_good"]

SLOTS: tuple[Slot, Slot] = ("blue", "green")


def other_slot(slot: Slot) -> Slot:
    """The other slot of the blue/green pair."""
    return "green" if slot == "blue" else "blue"


class Recorded(Protocol):
    """What a journal hands back for each durable event (the envelope around an event).

    Attributes:
        seq: sequence number, strictly +1 per record across the whole journal; the only order.
        episode_id: the episode (= operation id) the event belongs to.
        wall_time: Unix seconds when appended; informational only, never used for order or windows.
        event: the event itself.
    """

    @property
    def seq(self) -> int: ...

    @property
    def episode_id(self) -> str: ...

    @property
    def wall_time(self) -> float: ...

    @property
    def event(self) -> Event: ...


@attrs.frozen
class Event:
    """Base of all events. ``TAG`` is the stable name stored in the journal."""

    TAG: ClassVar[str] = "Event"
    VERSION: ClassVar[int] = 1


@attrs.frozen
class UpgradeResult:
    """The terminal result of an episode: the ``upgrade``/``recover``/``install`` JSON of design §7.

    Attributes:
        operation: the operation id, or None for a ``recover`` that found nothing open.
        result: one of ``committed``, ``rolled_back``, ``aborted``, ``noop``, ``needs_attention``, or
            ``staged`` (``upgrade --stage``: the candidate waits in the inactive slot for ``activate``), or
            ``switched_stopped`` (``activate`` on a host whose agent unit was stopped on purpose: ``current``
            names the candidate, the unit was left stopped, nothing was health-checked; design §4.7).
        from_version: version running before the episode, if known.
        to_version: the candidate's reported version, if it got that far.
        slot: the slot ``current`` names at the end, or None on a bare host.
        reason: a one-line human reason for anything but ``committed``/``noop``.
    """

    operation: str | None
    result: ResultValue
    from_version: str | None = None
    to_version: str | None = None
    slot: Slot | None = None
    reason: str | None = None


# -- the episode's events, in the order a successful upgrade writes them ----------------------------
@attrs.frozen
class EpisodeOpened(Event):
    """An episode began. Durable before anything is reported as in progress (design §4.3 step 2).

    ``source`` is already redacted (no userinfo, query or fragment). The health policy is recorded here so
    that recovery, perhaps under another configuration, spends exactly the attempts this episode had.

    ``boot_id`` is the kernel's boot id (``/proc/sys/kernel/random/boot_id``) of the boot the episode opened
    in (a managed operation's status reports it, docs/managed.md); None (the default, omitted on disk)
    in journals written before it was recorded.

    ``below_watermark`` is true for a ``rollback`` the operator ran with ``--below-watermark``: its last-good
    was below the host's anti-rollback watermark, or of unknown level, and the operator overrode the refusal
    (docs/trust.md). False (the default, omitted on disk) otherwise.
    """

    TAG: ClassVar[str] = "EpisodeOpened"
    operation: str
    kind: EpisodeKind
    source: str
    expected_sha256: str | None
    expected_version: str | None
    from_slot: Slot | None
    from_version: str | None
    max_health_attempts: int
    stability_s: float
    health_timeout_s: float
    boot_id: str | None = None
    below_watermark: bool = False


@attrs.frozen
class ArchiveFetched(Event):
    """The whole archive was read: its compressed size (bytes) and sha256.

    For a delta upgrade (docs/delta.md) these are the delta's. ``delta_refused`` is set when the delta
    (``EpisodeOpened.source``) was refused and the full archive given beside it was fetched instead, in
    the same episode: the one-line reason the delta was refused; ``size`` and ``sha256`` are then the
    archive's. None (the default, omitted on disk) otherwise.
    """

    TAG: ClassVar[str] = "ArchiveFetched"
    size: int
    sha256: str
    delta_refused: str | None = None


@attrs.frozen
class CandidateStaged(Event):
    """The member was written to the staging temp file of ``slot`` and fsynced (not yet renamed)."""

    TAG: ClassVar[str] = "CandidateStaged"
    slot: Slot
    sha256: str
    size: int
    staging_path: str


@attrs.frozen
class CandidateVerified(Event):
    """The staged candidate's version command exited 0 and reported ``version``."""

    TAG: ClassVar[str] = "CandidateVerified"
    version: str


@attrs.frozen
class ReleaseTrusted(Event):
    """The release's minisign signature was verified over the archive as published (docs/trust.md).

    Journaled after ``CandidateVerified`` and before the switch, so that the anti-rollback watermark
    (docs/trust.md) can be derived from the journal: ``security_version`` of every committed episode.

    Attributes:
        key_id: the signer's key id, 16 upper-case hex digits (minisign's little-endian number).
        name: the agent name the trusted comment names (equal to this agent's).
        version: the version the trusted comment names (equal to the candidate's reported version).
        security_version: the trusted comment's non-negative integer.
    """

    TAG: ClassVar[str] = "ReleaseTrusted"
    key_id: str
    name: str
    version: str
    security_version: int


@attrs.frozen
class CandidateUnchanged(Event):
    """The staged candidate's sha256 equals the slot ``current`` names: nothing to do (result ``noop``).

    Attributes:
        slot: the slot ``current`` names (it stays untouched).
        version: the version the journal knows for that slot, if any.
    """

    TAG: ClassVar[str] = "CandidateUnchanged"
    slot: Slot
    version: str | None


@attrs.frozen
class CandidateInstalled(Event):
    """The staging file was renamed onto ``slot`` and the slot directory fsynced."""

    TAG: ClassVar[str] = "CandidateInstalled"
    slot: Slot
    sha256: str


@attrs.frozen
class LastGoodRepointed(Event):
    """``last-good`` now names ``slot`` (done before the slot it named is overwritten)."""

    TAG: ClassVar[str] = "LastGoodRepointed"
    slot: Slot


@attrs.frozen
class StagedForActivation(Event):
    """``upgrade --stage``: the installed candidate stays in its slot, switched to by a later ``activate``.

    The last event of a staging episode before its result (``staged``). From here on the journal knows a
    staged candidate (:attr:`upgrade_core.JournalView.staged`) until an episode installs other bytes, moves
    ``current``, or finds the slot's bytes changed (:class:`StagedCandidateChecked`).

    Attributes:
        slot: the inactive slot the candidate was renamed onto (never what ``current`` or ``last-good``
            names while it stays staged).
        sha256: the member's digest (64 hex), what ``activate`` checks the slot's bytes against.
        version: the version its version command reported.
        archive_sha256: the digest of the archive as published (64 hex).
        switch_in_window: True when ``upgrade --in-window`` found the host outside its ``[schedule]``
            maintenance window: the switch is left to the recovery timer, which activates the
            candidate once the window is open (docs/configuration.md). False (the default, omitted on disk)
            for ``upgrade --stage``, whose candidate waits for an explicit ``activate``.
    """

    TAG: ClassVar[str] = "StagedForActivation"
    slot: Slot
    sha256: str
    version: str
    archive_sha256: str
    switch_in_window: bool = False


@attrs.frozen
class StagedCandidateChecked(Event):
    """``activate``: the staged slot's bytes were hashed again before the switch (a fact, match or not).

    Attributes:
        staged_by: the operation that staged the candidate (its ``StagedForActivation``).
        slot: the staged slot.
        staged_sha256: the digest staging recorded (64 hex).
        sha256: what the slot's bytes hash to now (64 hex), or None when the slot is missing or empty.
            Anything but ``staged_sha256`` forbids the switch: the episode aborts and the journal forgets
            the staged candidate.
        version: the version staging recorded for it.
    """

    TAG: ClassVar[str] = "StagedCandidateChecked"
    staged_by: str
    slot: Slot
    staged_sha256: str
    sha256: str | None
    version: str

    @property
    def matches(self) -> bool:
        """The bytes in the slot are still the ones staged."""
        return self.sha256 == self.staged_sha256


@attrs.frozen
class UnitFoundStopped(Event):
    """``activate``: before the switch, the agent unit was found stopped on purpose (design §4.7).

    An observation, journaled as read from systemd (``systemctl show``): ``ActiveState=inactive`` is a
    unit an operator (or a ``reset``) stopped; ``failed`` is not stopped on purpose and is never recorded
    here. From this record on, the episode does not start the unit: it switches ``current`` and ends with
    ``LeftStopped``.

    Attributes:
        active_state: the unit's ``ActiveState`` (``inactive``).
        sub_state: its ``SubState`` (``dead`` for a stopped service).
    """

    TAG: ClassVar[str] = "UnitFoundStopped"
    active_state: str
    sub_state: str


@attrs.frozen
class SwitchIntended(Event):
    """Intent: ``current`` is about to be flipped to ``candidate_slot``.

    Attributes:
        candidate_slot: the slot ``current`` will name.
        previous_slot: the slot ``current`` named before (None on a bare host, i.e. install).
        last_good: the slot ``last-good`` names at this point.
    """

    TAG: ClassVar[str] = "SwitchIntended"
    candidate_slot: Slot
    previous_slot: Slot | None
    last_good: Slot | None


@attrs.frozen
class SwitchCommitted(Event):
    """Completion: ``current`` names ``slot`` durably (link renamed, directory fsynced)."""

    TAG: ClassVar[str] = "SwitchCommitted"
    slot: Slot


@attrs.frozen
class MirrorsSynced(Event):
    """Every configured mirror path holds a copy of the candidate, checked by digest."""

    TAG: ClassVar[str] = "MirrorsSynced"
    paths: tuple[str, ...]


@attrs.frozen
class LeftStopped(Event):
    """``activate`` after ``UnitFoundStopped``: ``current`` names ``slot`` and the unit was not started, so
    the candidate has no health evidence; ``last-good`` did not move and the mirrors were not written
    (design §4.7). The episode's result is ``switched_stopped``.

    Attributes:
        slot: the slot ``current`` names (the candidate's).
    """

    TAG: ClassVar[str] = "LeftStopped"
    slot: Slot


@attrs.frozen
class RestartRequested(Event):
    """Intent: a transient unit named ``unit`` was asked to restart the agent unit (design §4.3 step 6).

    Attributes:
        unit: the transient unit's name, ``NAME-restart-<op8>-<attempt>-<rand4>``.
        requested_monotonic: CLOCK_MONOTONIC seconds just before the request; an interpreted agent's main
            process must have started after it.
    """

    TAG: ClassVar[str] = "RestartRequested"
    unit: str
    requested_monotonic: float


@attrs.frozen
class RestartObserved(Event):
    """The agent unit runs a new main process: its MainPID and InvocationID."""

    TAG: ClassVar[str] = "RestartObserved"
    main_pid: int
    invocation_id: str


@attrs.frozen
class HealthAttemptStarted(Event):
    """A health attempt began; durable first, so a crash loop spends its attempts (design §4.3 step 7).

    Attributes:
        attempt: 1-based attempt number for ``target``.
        target: ``candidate`` during the upgrade, ``last_good`` during a rollback.
    """

    TAG: ClassVar[str] = "HealthAttemptStarted"
    attempt: int
    target: HealthTarget = "candidate"


@attrs.frozen
class HealthPassed(Event):
    """The attempt held every health condition for the stability window."""

    TAG: ClassVar[str] = "HealthPassed"
    attempt: int
    target: HealthTarget = "candidate"


@attrs.frozen
class HealthFailed(Event):
    """The attempt failed; ``reason`` is one line (e.g. ``MainPID changed``, ``start-limit-hit``).

    ``cause`` is ``"environment"`` when the failure says nothing about the binary (the probe could not
    connect, systemd could not be asked, the attempt was interrupted by a crash or signal): such a failure
    never makes the candidate known-bad (docs/trust.md). None (the default, omitted on disk): the
    binary's own failure.
    """

    TAG: ClassVar[str] = "HealthFailed"
    attempt: int
    reason: str
    target: HealthTarget = "candidate"
    cause: Literal["environment"] | None = None


@attrs.frozen
class UpgradeCommitted(Event):
    """The one-way door: the candidate is good. Nothing after this may roll back (design §4.6 inv. 4)."""

    TAG: ClassVar[str] = "UpgradeCommitted"
    slot: Slot
    version: str | None


@attrs.frozen
class RollbackStarted(Event):
    """Intent: ``current`` goes back to ``to_slot`` (what ``last-good`` names) because of ``reason``."""

    TAG: ClassVar[str] = "RollbackStarted"
    reason: str
    to_slot: Slot


@attrs.frozen
class RolledBack(Event):
    """Completion: ``current`` names ``slot`` again and that binary passed its health check."""

    TAG: ClassVar[str] = "RolledBack"
    slot: Slot


@attrs.frozen
class AttentionNeeded(Event):
    """The last-good binary failed its own health check after a rollback; an operator must look."""

    TAG: ClassVar[str] = "AttentionNeeded"
    reason: str


@attrs.frozen
class Aborted(Event):
    """The episode stopped before the switch (bad candidate, signal, crash); links were never touched.

    ``cause`` is ``"verification"`` when the candidate's own version command failed (a
    :class:`~upgrade_core.errors.VerifyError` whose ``condemns_release``): its digest becomes known-bad
    (docs/trust.md). None (the default, omitted on disk) for everything else: transport, disk, lock,
    signals, signatures, a refused request.
    """

    TAG: ClassVar[str] = "Aborted"
    reason: str
    cause: Literal["verification"] | None = None


@attrs.frozen
class ResultPublished(Event):
    """The terminal result reached the result sink durably (design §4.3 step 9)."""

    TAG: ClassVar[str] = "ResultPublished"
    result: UpgradeResult


@attrs.frozen
class EpisodeClosed(Event):
    """The episode is over; only after ``ResultPublished`` (design §4.6 inv. 5)."""

    TAG: ClassVar[str] = "EpisodeClosed"
    result: ResultValue


@attrs.frozen
class RecoveryStarted(Event):
    """``recover`` (or a resume, or an upgrade finding another open episode) took over this episode."""

    TAG: ClassVar[str] = "RecoveryStarted"
    trigger: Trigger


@attrs.frozen
class JournalQuarantined(Event):
    """The previous journal directory was moved aside and this journal started from what the host shows
    (``upgrade-agent journal quarantine``, design §10): the only event of a ``quarantine`` episode besides its
    opening, result and close. A fact about the host, read under the host lock: both links, the slots they
    name, each slot's sha256 and the version its binary reported when run for this record.

    Attributes:
        quarantine_path: where the old journal directory now is (``state_dir/quarantine/<UTC>/journal``).
        current_slot / current_sha256 / current_version: what ``current`` names.
        last_good_slot / last_good_sha256 / last_good_version: what ``last-good`` names.
    """

    TAG: ClassVar[str] = "JournalQuarantined"
    quarantine_path: str
    current_slot: Slot
    current_sha256: str
    current_version: str
    last_good_slot: Slot
    last_good_sha256: str
    last_good_version: str


@attrs.frozen
class TrustReset(Event):
    """The operator cleared the anti-rollback watermark and the known-bad memory (``upgrade-agent trust
    reset``, docs/trust.md): the only event of a ``trust-reset`` episode besides its opening, result and
    close. Every watermark raise and known-bad mark journaled before this record stops counting.

    Attributes:
        security_watermark: the watermark it cleared (None: there was none).
        known_bad: the known-bad release digests it cleared (64 hex each), sorted.
    """

    TAG: ClassVar[str] = "TrustReset"
    security_watermark: int | None
    known_bad: tuple[str, ...]


@attrs.frozen
class HostMoveIntended(Event):
    """Intent of ``upgrade-agent host move`` (docs/host.md, "Moving a linked host into a real root"): the
    host root ``root`` is a link to the legacy root ``legacy_root`` that ``install`` adopted, and its layout
    is about to be copied into ``staging_path`` (a new directory beside ``root``), which then takes the link's
    place in one atomic exchange. Durable before anything is created. The slots ``current`` and ``last-good``
    name, with the digests they held when checked (none predates the host root), are recorded so that the
    move is judged against them again before the exchange.

    Attributes:
        root: ``host.root`` (absolute).
        legacy_root: ``host.legacy_root``, what ``root`` links to.
        staging_path: the copy's directory, ``<dirname(root)>/.<basename(root)>.move-<hex>``.
        current_slot / current_sha256: what ``current`` named and the bytes of that slot (64 hex).
        last_good_slot / last_good_sha256: the same for ``last-good``.
    """

    TAG: ClassVar[str] = "HostMoveIntended"
    root: str
    legacy_root: str
    staging_path: str
    current_slot: Slot
    current_sha256: str
    last_good_slot: Slot
    last_good_sha256: str


@attrs.frozen
class HostMoved(Event):
    """Completion of a host move: ``root`` is now a real directory holding the layout (the exchange
    landed and the link it replaced is gone). The legacy root's files are left where they are."""

    TAG: ClassVar[str] = "HostMoved"
    root: str


# -- history kept across compaction -----------------------------------------------------------------
@attrs.frozen
class EpisodeSummary:
    """What retention keeps of a dropped closed episode (for ``history`` and operation-id idempotency).

    Attributes:
        operation / result / opened_at / closed_at: the episode's id, published result and times.
        candidate_sha256: the staged member's digest (known-bad memory, design §4.6 inv. 6).
        security_version: the ``ReleaseTrusted`` security version of a signed release, None for an unsigned
            one (the anti-rollback watermark counts it when ``result`` is committed, docs/trust.md).
            Written only when set, so snapshots without one keep their bytes and old ones decode.
        known_bad: the episode condemned its candidate's digest (the known-bad memory: an ``upgrade``,
            ``install`` or ``self_upgrade`` whose candidate failed its health check for its own reasons,
            or its verification); None in snapshots written before the known-bad memory existed, read
            as "rolled back or needed attention" (docs/trust.md).
        opened_seq: the sequence number of its ``EpisodeOpened`` (``history`` orders by it: a later snapshot
            may carry an older one's summaries after its own); None in older snapshots.
        published_seq: the sequence number of its ``ResultPublished`` (a republished operation status names
            it as ``journalSeq``, docs/managed.md); None in older snapshots.
        boot_id: the boot it opened in (``EpisodeOpened.boot_id``); None when unknown.
        kind: the episode's kind; None in older snapshots.
        (The four are written only when set, like ``security_version``.)
    """

    operation: str
    result: UpgradeResult
    opened_at: float
    closed_at: float
    candidate_sha256: str | None = None
    security_version: int | None = None
    known_bad: bool | None = None
    opened_seq: int | None = None
    published_seq: int | None = None
    boot_id: str | None = None
    kind: EpisodeKind | None = None


@attrs.frozen
class WatermarkRaise:
    """A signed release committed at ``seq`` with ``security_version`` (it raised the watermark then)."""

    seq: int
    security_version: int


@attrs.frozen
class KnownBadMark:
    """The latest known-bad fact about one release digest, journaled at ``seq``.

    Attributes:
        seq: the sequence number of the record that made the fact (0: carried over from a quarantined
            journal, older than every record of this one).
        sha256: the release digest (64 hex).
        operation: the operation that condemned it, or that committed it (which cleared the mark).
        failed: ``"health"`` or ``"verification"`` (how it was condemned); None: cleared by a commit.
    """

    seq: int
    sha256: str
    operation: str
    failed: Literal["health", "verification"] | None


@attrs.frozen
class SlotVersion:
    """What the journal knows of a slot's binary at ``seq``: the version it reported (None: unknown) and,
    when an episode of this host installed the bytes (``CandidateInstalled``), their digest (64 hex; None:
    the bytes came from elsewhere, e.g. a legacy layout adopted as it was, or a snapshot written before
    digests were kept). ``host move`` refuses while a slot holds bytes no episode installed (docs/host.md)."""

    seq: int
    slot: Slot
    version: str | None
    sha256: str | None = None


@attrs.frozen
class JournalFacts:
    """What trust decisions, ``status`` and the next episode need from records a snapshot replaces.

    Each fact carries the sequence number it was journaled at, so snapshots combine in any order (a later
    snapshot may summarise an older one, and a snapshot is read after the newer records it does not
    cover): for a slot or a digest the fact with the highest ``seq`` wins; the watermark is the highest
    raise after the latest trust reset.

    Attributes:
        through_seq: the last sequence number the facts account for.
        reset_seq: the sequence number of the latest ``TrustReset``, None when there was none; raises and
            known-bad marks at or before it no longer count.
        raises: the watermark raises that can still matter (none at or before ``reset_seq``, none that a
            later raise at least as high outranks), oldest first.
        known_bad: the latest mark per digest, by digest.
        slot_versions: the latest version per slot, blue first.
    """

    through_seq: int
    reset_seq: int | None = None
    raises: tuple[WatermarkRaise, ...] = ()
    known_bad: tuple[KnownBadMark, ...] = ()
    slot_versions: tuple[SlotVersion, ...] = ()


@attrs.frozen
class StagedSummary:
    """What retention keeps of a staged candidate (``upgrade --stage``) whose staging episode is dropped.

    Attributes:
        operation: the staging episode.
        slot / sha256 / version / archive_sha256 / switch_in_window: as its ``StagedForActivation`` recorded
            them.
    """

    operation: str
    slot: Slot
    sha256: str
    version: str
    archive_sha256: str
    switch_in_window: bool = False


@attrs.frozen
class LeftStoppedCandidate:
    """The candidate an ``activate`` switched ``current`` to while leaving the stopped unit stopped (result
    ``switched_stopped``, design §4.7), as the journal's durable records say: set by ``LeftStopped``;
    forgotten by the next ``SwitchIntended`` (the check that recovery runs once the unit runs, an operator
    ``rollback``). It has no health evidence: ``last-good`` names the only verified slot meanwhile.

    Attributes:
        operation: the ``activate`` episode that left it stopped.
        staged_by: the operation that staged it (``StagedCandidateChecked.staged_by``).
        slot: the slot ``current`` names.
        sha256: the candidate's digest (64 hex).
        version: the version staging recorded.
        last_good: the slot ``last-good`` named at the switch (where a rollback returns).
        changed: a check found the slot's bytes no longer the candidate's (``StagedCandidateChecked``
            without a match): recovery checks it no more; ``rollback`` is the way out.

    The fold derives it (:attr:`upgrade_core.JournalView.left_stopped`), and a snapshot carries it
    (:attr:`HistorySnapshot.left_stopped`) so that ``journal quarantine`` never turns an unverified
    ``current`` into a verified one.
    """

    operation: str
    staged_by: str
    slot: Slot
    sha256: str
    version: str
    last_good: Slot | None
    changed: bool = False


@attrs.frozen
class HistorySnapshot(Event):
    """Written by compaction before old segments are dropped: summaries of the dropped episodes, and the
    facts those records held (:class:`JournalFacts`: the watermark, known-bad marks, slot versions).

    ``journal quarantine`` writes one as a new journal's first record, carrying the old journal's facts
    (docs/recovery.md). Its episode id is the reserved ``"-"``; fold treats it as history, never as an open
    episode. ``facts`` is None in snapshots written before it existed (the fold then derives the watermark
    and known-bad memory from the summaries, as it always did).

    ``staged`` is the candidate the dropped records leave staged for ``activate``, if any: the fold takes it
    as staged unless a record it kept (newer than every dropped one) already said otherwise. None (the
    default, omitted on disk) when nothing was staged, and in snapshots written before staging existed.

    ``left_stopped`` is the candidate an ``activate`` left stopped that still waits for its check, if any
    (the session does not compact meanwhile; ``journal quarantine`` carries it). None (the default, omitted
    on disk) otherwise.
    """

    TAG: ClassVar[str] = "HistorySnapshot"
    episodes: tuple[EpisodeSummary, ...]
    facts: JournalFacts | None = None
    staged: StagedSummary | None = None
    left_stopped: LeftStoppedCandidate | None = None


SNAPSHOT_EPISODE = "-"

ALL_EVENTS: tuple[type[Event], ...] = (
    EpisodeOpened,
    ArchiveFetched,
    CandidateStaged,
    CandidateVerified,
    ReleaseTrusted,
    CandidateUnchanged,
    CandidateInstalled,
    LastGoodRepointed,
    SwitchIntended,
    SwitchCommitted,
    MirrorsSynced,
    RestartRequested,
    RestartObserved,
    HealthAttemptStarted,
    HealthPassed,
    HealthFailed,
    UpgradeCommitted,
    RollbackStarted,
    RolledBack,
    AttentionNeeded,
    Aborted,
    ResultPublished,
    EpisodeClosed,
    RecoveryStarted,
    HistorySnapshot,
    JournalQuarantined,
    TrustReset,
    StagedForActivation,
    StagedCandidateChecked,
    UnitFoundStopped,
    LeftStopped,
    HostMoveIntended,
    HostMoved,
)

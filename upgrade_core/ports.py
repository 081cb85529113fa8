"""The small ports through which ``upgrade_core`` touches the world (design §2).

``upgrade_core`` never imports ``journal`` or ``agent``; ``agent.session.wiring`` builds real
implementations of
these protocols, and ``tests/sim`` builds simulated ones. Every method documents its units, its errors and
what a cancellation leaves behind (trio style):

- "no effect if cancelled": cancelling the call leaves the host as before the call;
- "may have partly happened": recovery must re-check the host (the orchestrator brackets such calls with
  an intent event before and a completion event after).

:class:`Ports` bundles one implementation of each; every flow takes one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from ._events import Event, Recorded, ReleaseTrusted, Slot, UpgradeResult


@attrs.frozen
class LinkState:
    """What the host's links resolve to right now.

    Attributes:
        current: the slot ``NAME-current`` names, or None when the link is absent (bare host).
        last_good: the slot ``NAME-last-good`` names, or None when absent.
    """

    current: Slot | None
    last_good: Slot | None


@attrs.frozen
class StagedCandidate:
    """A candidate written to a staging temp file and fsynced, not yet renamed onto its slot.

    Attributes:
        slot: the slot it is meant for (always the inactive one).
        staging_path: absolute path of ``R/lib/NAME/.NAME-<slot>.stage-<hex>``.
        sha256: 64 lowercase hex, of the member bytes.
        size: member size in bytes.
        archive_sha256: 64 lowercase hex, of the compressed archive bytes as fetched.
        archive_size: compressed size in bytes.
        release: for a signed release (docs/trust.md), what its verified signature says: the signer's key id
            and the trusted comment's name, version and security_version; None for an unsigned source. The
            orchestrator refuses a name other than the agent's, or a version other than the candidate's,
            before the switch.
        delta_refused: for a delta upgrade that fell back to the full archive (docs/delta.md), the one-line
            reason the delta was refused (journaled in ``ArchiveFetched``); None otherwise.
    """

    slot: Slot
    staging_path: str
    sha256: str
    size: int
    archive_sha256: str
    archive_size: int
    release: ReleaseTrusted | None = None
    delta_refused: str | None = None


@attrs.frozen
class UnitSnapshot:
    """One reading of the agent unit (``systemctl show``) and its main process (``/proc``).

    Attributes:
        active_state: ``ActiveState`` (active, activating, deactivating, failed, inactive, ...).
        sub_state: ``SubState`` (running, auto-restart, exited, dead, ...).
        result: ``Result`` (success, exit-code, signal, start-limit-hit, ...).
        main_pid: ``MainPID``; 0 when there is none.
        invocation_id: ``InvocationID`` (32 hex), "" when none.
        n_restarts: ``NRestarts``.
        main_start_monotonic_s: ``ExecMainStartTimestampMonotonic`` in seconds (CLOCK_MONOTONIC), 0.0 if none.
        exe: ``/proc/<MainPID>/exe`` resolved, or None when unreadable / no process.
        cmdline: ``/proc/<MainPID>/cmdline`` split on NUL, () when unreadable.
        exec_main_code / exec_main_status: ``ExecMainCode`` and ``ExecMainStatus``, how the unit's last main
            process ended (systemd.exec(5), the waitid(2) ``si_code``: 1 ``CLD_EXITED`` with its exit status,
            2 ``CLD_KILLED`` / 3 ``CLD_DUMPED`` with its signal number); 0 and 0 while none has ended, and
            again as soon as systemd starts the next main process (a sample in between, e.g. during
            ``auto-restart``, is the only one that sees them).
        exec_start: the path ``ExecStart=`` runs (its ``path=`` field), "" when unknown.
    """

    active_state: str
    sub_state: str
    result: str
    main_pid: int
    invocation_id: str
    n_restarts: int
    main_start_monotonic_s: float
    exe: str | None
    cmdline: tuple[str, ...]
    exec_main_code: int = 0
    exec_main_status: int = 0
    exec_start: str = ""


class Journal(Protocol):
    """The durable, append-only event log of one host and agent."""

    def records(self) -> Sequence[Recorded]:
        """Every durable record, in sequence order: the replayed history plus this process's appends."""
        ...

    async def append(self, episode_id: str, event: Event) -> Recorded:
        """Append one event; returns only once it is on stable storage.

        Raises:
            upgrade_core.errors.JournalDurabilityError: ENOSPC/EIO; the journal accepts nothing more.

        Cancellation: shielded; when it returns or raises, the record is durable or was never accepted.
        """
        ...

    async def relinquish(self) -> None:
        """Stop writing and release the host lock, so that a handed-off recovery unit can own the episode.

        Called just before :meth:`ServiceManager.hand_off_recovery` (design §4.3 step 6, case C15): the
        transient unit takes the lock non-blocking, so the caller must let it go first. Afterwards only
        :meth:`reread` is allowed (design §4.6 inv. 7: only the lock holder appends).

        Cancellation: no effect beyond the release.
        """
        ...

    async def reread(self) -> Sequence[Recorded]:
        """Read every durable record again from stable storage, including other processes' appends.

        Used by a caller that handed an episode to a transient recovery unit and waits for it to close
        (design §4.3 step 6). Never writes, never repairs a torn tail. Afterwards ``records()`` and the next
        ``append`` continue from what was read (the next ``seq`` follows the last record read).

        Raises:
            upgrade_core.errors.HistoryError: a corrupt record in the middle (names file and offset).

        Cancellation: no effect.
        """
        ...


class IdSource(Protocol):
    """Randomness for unique names (transient units), kept behind a port so the core stays pure."""

    def token_hex(self, nbytes: int) -> str:
        """``2 * nbytes`` lowercase hex characters from a CSPRNG (e.g. ``secrets.token_hex``)."""
        ...


class Clock(Protocol):
    """Time. Windows and timeouts use ``monotonic`` only (case C19); ``wall`` is informational."""

    def monotonic(self) -> float:
        """CLOCK_MONOTONIC seconds (the clock systemd's ``...Monotonic`` properties use)."""
        ...

    def wall(self) -> float:
        """Unix seconds; never used for ordering or windows."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of monotonic time. Cancellation: no effect."""
        ...

    def boot_id(self) -> str | None:
        """The boot the ``monotonic`` readings belong to (Linux: ``/proc/sys/kernel/random/boot_id``,
        random(4)), recorded in ``EpisodeOpened``; None when the host does not tell."""
        ...


class Host(Protocol):
    """The host layout of design §3: two slots, ``current`` and ``last-good`` links, mirrors."""

    def links(self) -> LinkState:
        """Resolve ``current`` and ``last-good``.

        Raises:
            upgrade_core.errors.LayoutConflictError: a link is a real file/directory or names no slot.
        """
        ...

    def slot_path(self, slot: Slot) -> str:
        """Absolute path of the slot file ``R/lib/NAME/NAME-<slot>``."""
        ...

    def current_link_path(self) -> str:
        """Absolute path of ``R/lib/NAME/NAME-current`` (what ``ExecStart`` runs)."""
        ...

    async def slot_sha256(self, slot: Slot) -> str | None:
        """sha256 (64 hex) of the slot file; None when it is missing or zero-length (a crash, C12)."""
        ...

    async def sweep_staging(self) -> list[str]:
        """Remove leftover ``.NAME-<slot>.stage-<hex>`` files; never a slot target. Returns removed paths."""
        ...

    async def prepare_staging(self, slot: Slot) -> str:
        """Check room and ``noexec`` and return a fresh staging path for ``slot`` (not yet created).

        Raises:
            upgrade_core.errors.NoSpaceError: free space does not exceed ``limits.max_member_bytes``.
            upgrade_core.errors.NoExecError: the slot filesystem is mounted ``noexec``.
        """
        ...

    async def discard_staging(self, staging_path: str) -> None:
        """Remove a staging file if present (EROFS-safe). Cancellation: no effect beyond the removal."""
        ...

    async def install_staged(self, staged: StagedCandidate) -> None:
        """Rename the staging file onto its slot, then fsync the slot directory.

        Cancellation: may have partly happened (the rename); re-check with ``slot_sha256``.
        """
        ...

    async def point_current(self, slot: Slot) -> None:
        """Flip ``current`` to ``slot``: temp link + rename + directory fsync (atomic, case C11).

        Cancellation: shielded by the caller; may have happened; re-check with ``links``.
        """
        ...

    async def point_last_good(self, slot: Slot) -> None:
        """Flip ``last-good`` to ``slot``, like ``point_current``."""
        ...

    async def sync_mirrors(self, slot: Slot, sha256: str) -> tuple[str, ...]:
        """Copy the slot to every mirror (temp + fsync + rename), checked by digest; returns the paths.

        Raises:
            upgrade_core.errors.HostError: a mirror could not be written or its digest differs.
        """
        ...


class ArchiveSource(Protocol):
    """Fetches an archive and extracts its member into a staging file in one streaming pass (design §6)."""

    async def stage(self, source: str, expected_sha256: str | None, staging_path: str, slot: Slot) -> (
        StagedCandidate
    ):
        """Fetch ``source``, hash, decompress and extract the member into ``staging_path``; fsync it.

        Args:
            source: URL or path as given (may carry secrets; never printed unredacted).
            expected_sha256: 64 lowercase hex of the compressed bytes, or None.
            staging_path: from ``Host.prepare_staging``; created exclusively, 0755.
            slot: the slot the candidate is for.

        Raises:
            upgrade_core.errors.FetchError, CandidateError, NoSpaceError: the staging file is removed.

        Cancellation: the staging file is removed; no other effect.
        """
        ...


class Verifier(Protocol):
    """Runs a candidate's version command (design §4.3 step 4, case C10)."""

    async def verify(self, path: str, expected_version: str | None) -> str:
        """Run ``path`` with the configured version arguments; return the reported version, normalised
        (without a leading ``v``: ``v1.2.3`` is ``1.2.3``; case C29).

        Raises:
            upgrade_core.errors.VerifyError, VerifyTimeoutError, VersionMismatchError.

        Cancellation: the process group is killed; no other effect.
        """
        ...


class ServiceManager(Protocol):
    """The agent unit under systemd (design §6), via ``systemctl``/``systemd-run``."""

    @property
    def unit(self) -> str:
        """The agent unit's name, e.g. ``demo-agent.service``."""
        ...

    async def snapshot(self) -> UnitSnapshot:
        """Read the unit's properties and its main process.

        Raises:
            upgrade_core.errors.ServiceError: ``systemctl show`` failed or timed out.
        """
        ...

    async def restart(self, transient_name: str) -> None:
        """``reset-failed``, then ask a transient unit ``transient_name`` to restart the agent unit.

        Returns once systemd accepted the job (``--no-block``); never waits for the agent. When
        ``reset-failed`` is refused while the unit is failed, it first waits out the unit's start limit
        (bounded: at most five minutes and a margin) and refuses if the selected binary changed meanwhile;
        the caller's attempt timeout counts from its return.

        Raises:
            upgrade_core.errors.ServiceError.

        Cancellation: may have partly happened; health observation tells.
        """
        ...

    async def restart_done(self, transient_name: str) -> bool:
        """True once the transient unit ``transient_name`` has no job and is no longer running, i.e. its
        ``systemctl restart`` returned (or the unit is gone: ``--collect`` unloads it).

        Until then the agent unit shows the state from before the restart, or the moment between the
        restart job's stop and start (``inactive/dead``, ``Result=success``), and ``Restart=`` may still
        start the previous binary on its own: a health sample taken then says nothing about the new one
        (seen in ``tests/systemd/test_rollback_real.py``: a failing last-good's auto-restart fired between
        the request and the job, and the previous current was judged dead while it started).

        Raises:
            upgrade_core.errors.ServiceError: ``systemctl show`` failed or timed out.
        """
        ...

    def runs_inside_unit(self) -> bool:
        """True when this process lives in the agent unit's own cgroup (``/proc/self/cgroup``, C15)."""
        ...

    async def hand_off_recovery(self, transient_name: str, after_unit: bool) -> None:
        """Start ``recover-agent-upgrade --trigger manual`` in a transient unit (design §4.3 step 6, 4.5).

        Args:
            transient_name: the transient unit's name.
            after_unit: add ``-p After=<agent unit>`` (boot-time recovery).
        """
        ...


class ProbeUnreachable(str):
    """A probe's failure reason saying it never reached the service (the connection could not be made:
    network not up yet, DNS, a connect timeout). A candidate that fails only this way is rolled back but is
    not made known-bad (docs/trust.md): the environment, not the release, may be at fault."""

    __slots__ = ()


class HealthProbe(Protocol):
    """The configured application probe (HTTP 2xx or a command exiting 0); may be a no-op."""

    async def check(self) -> str | None:
        """Probe once. Returns None when healthy, else a one-line reason (a :class:`ProbeUnreachable` when
        the service could not be reached at all). Never raises for a failed probe."""
        ...


class ResultSink(Protocol):
    """Where terminal results go (design §4.3 step 9). Must be idempotent: it may receive a result twice."""

    async def publish(self, result: UpgradeResult) -> None:
        """Make ``result`` durable at the sink before returning.

        Raises:
            upgrade_core.errors.HostError: the sink could not store it (the episode then stays open).
        """
        ...


class HostMover(Protocol):
    """Moves a host root that is a link to the legacy root into a real directory (``upgrade-agent host
    move``, docs/host.md). Each step names the copy's directory ``staging`` that ``HostMoveIntended``
    recorded; every step is idempotent, so recovery may repeat any of them.
    """

    async def copy(self, staging: str) -> dict[Slot, str]:
        """Copy the layout (both slots, the ``current``/``last-good`` links, ``R/bin/NAME``) into
        ``staging``, a new directory beside the root, durably (files, then directories, fsynced), and
        restore its SELinux labels; an earlier partial copy of that name is removed first.

        Returns:
            The sha256 (64 hex) of each slot file copied, read from the copy.

        Raises:
            upgrade_core.errors.HostError: a copy failed (the partial copy is left for :meth:`undo`).

        Cancellation: may have happened in part; :meth:`undo` removes it.
        """
        ...

    async def swap(self, staging: str) -> None:
        """Exchange ``staging`` and the root link in one atomic rename (``RENAME_EXCHANGE``), fsync their
        directory: the root is a real directory from then on, and ``staging`` names the old link.

        Raises:
            upgrade_core.errors.HostError: the exchange was refused; nothing changed.

        Cancellation: shielded; re-check with :meth:`landed`.
        """
        ...

    def landed(self, staging: str) -> bool:
        """True when the root is a real directory holding the layout (the exchange landed)."""
        ...

    async def finish(self, staging: str) -> None:
        """After a landed exchange: remove the old link left at ``staging`` (nothing when absent), fsync.

        Raises:
            upgrade_core.errors.HostError: it cannot be removed.
        """
        ...

    async def undo(self, staging: str) -> None:
        """Before a landed exchange: remove the copy at ``staging`` (only what the copy made; nothing when
        absent). The root link is untouched.

        Raises:
            upgrade_core.errors.HostError: it cannot be removed.
        """
        ...


@attrs.frozen
class Ports:
    """Everything the orchestrator may touch (design §2). ``agent.session.wiring`` and ``tests/sim`` build
    one."""

    journal: Journal
    clock: Clock
    host: Host
    source: ArchiveSource
    verifier: Verifier
    service: ServiceManager
    probe: HealthProbe
    sink: ResultSink
    ids: IdSource
    mover: HostMover | None = None
    """``upgrade-agent host move``'s binding; None where no host root can be moved (the simulator)."""

"""The typed results of the embedding session's readers and maintenance commands (design §7 JSON shapes):
what ``status``, ``upgrade --preflight`` and ``journal quarantine`` report. Plain frozen values; no I/O."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from agent.session.quarantine import CarriedOver
from upgrade_core import (
    Slot,
    UpgradeResult,
)


# -- typed read results ---------------------------------------------------------------------------------
@attrs.frozen
class SlotInfo:
    """One slot as ``status`` shows it (design §7).

    Attributes:
        slot: ``blue`` or ``green``.
        path: the slot file's absolute path.
        sha256: 64 lowercase hex of the slot's bytes, None when missing or empty (C12).
        version: the version its binary reported when installed, as far as the journal knows.
    """

    slot: Slot
    path: str
    sha256: str | None
    version: str | None


@attrs.frozen
class ServiceInfo:
    """The agent unit as systemd shows it; every field None when systemd could not be asked.

    Attributes:
        active_state / sub_state: ``ActiveState`` / ``SubState``.
        main_pid: ``MainPID``, None when there is no main process.
        exe: ``/proc/<MainPID>/exe`` resolved.
    """

    active_state: str | None = None
    sub_state: str | None = None
    main_pid: int | None = None
    exe: str | None = None


@attrs.frozen
class EpisodeInfo:
    """The open episode, if any (design §7 ``status``, docs/cli.md).

    Attributes:
        operation / state: its operation id and lifecycle state (design §4.2).
        upgrader_pid: the pid holding the host lock (the upgrader or recovery running it), None when the
            lock is free or the pid is unknown.
        abandoned: True when no process holds the host lock: its upgrader died (``recover`` finishes it;
            so does ``NAME-recover.timer`` within its period).
    """

    operation: str
    state: str
    upgrader_pid: int | None = None
    abandoned: bool = False


@attrs.frozen
class KnownBad:
    """A release digest the journal condemned (docs/trust.md).

    Attributes:
        sha256: the candidate's member digest (64 lowercase hex).
        operation: the operation whose candidate failed its health check or its verification.
    """

    sha256: str
    operation: str


@attrs.frozen
class StagedInfo:
    """The candidate ``upgrade --stage`` left in the inactive slot for ``activate`` (docs/cli.md), as the
    journal records it (:attr:`upgrade_core.JournalView.staged`).

    Attributes:
        operation: the staging operation.
        slot: the slot it occupies (neither link names it).
        sha256: its member digest (64 lowercase hex), checked again by ``activate``.
        version: the version its version command reported.
        archive_sha256: the archive's digest as published (64 lowercase hex).
        switch_in_window: ``upgrade --in-window`` staged it outside the maintenance window: the recovery
            timer switches to it once the window is open (False: ``activate`` does).
    """

    operation: str
    slot: Slot
    sha256: str
    version: str
    archive_sha256: str
    switch_in_window: bool = False


@attrs.frozen
class Status:
    """What ``status`` reports (design §7), from the journal and the links; no binary is run.

    Attributes:
        agent: NAME.
        current / last_good: the slots the links name, None on a bare host.
        service: the agent unit.
        episode: the open episode, None when every episode is closed.
        missing_units / drifted_units: rendered unit files absent from ``unit_dir`` / present there with
            other contents (docs/cli.md).
        next: what to run next (one line), None when nothing is needed
            (:func:`agent.session.converge.next_step`).
        service_error: why ``service`` is empty, when systemd could not be asked.
        security_watermark: the highest ``security_version`` of a signed release ever committed on this host
            (docs/trust.md), None when none was.
        known_bad: release digests refused when offered again, each with the operation that condemned it
            (docs/trust.md), sorted by digest.
        staged: the candidate waiting for ``activate``, or None (docs/cli.md ``upgrade --stage``).
    """

    agent: str
    current: SlotInfo | None
    last_good: SlotInfo | None
    service: ServiceInfo
    episode: EpisodeInfo | None
    missing_units: tuple[str, ...] = ()
    drifted_units: tuple[str, ...] = ()
    next: str | None = None
    service_error: str | None = None
    security_watermark: int | None = None
    known_bad: tuple[KnownBad, ...] = ()
    staged: StagedInfo | None = None

    def to_json(self) -> dict[str, Any]:
        """The design §7 ``status`` JSON object (design §10 adds ``security_watermark`` and ``known_bad``;
        ``upgrade --stage`` adds ``staged``)."""
        doc = attrs.asdict(self)
        doc.pop("service_error")
        return doc


@attrs.frozen
class Preflight:
    """What ``upgrade --preflight`` reports (design §7).

    Attributes:
        plan: the steps an upgrade would take, one line each.
        inactive_slot: the slot the candidate would be staged into.
        lock: ``free`` or ``busy``.
        open_episode: the operation id of an open episode that would be recovered first, or None.
        episode: that episode with its upgrader's pid / abandoned (as in :class:`Status`), or None.
        missing_units / drifted_units / next: as in :class:`Status`.
    """

    plan: tuple[str, ...]
    inactive_slot: Slot
    lock: Literal["free", "busy"]
    open_episode: str | None
    episode: EpisodeInfo | None = None
    missing_units: tuple[str, ...] = ()
    drifted_units: tuple[str, ...] = ()
    next: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The design §7 ``upgrade --preflight`` JSON object, plus the convergence keys of docs/cli.md."""
        return {"preflight": True, "plan": list(self.plan), "inactive_slot": self.inactive_slot,
                "lock": self.lock, "open_episode": self.open_episode,
                "episode": None if self.episode is None else attrs.asdict(self.episode),
                "missing_units": list(self.missing_units), "drifted_units": list(self.drifted_units),
                "next": self.next}


@attrs.frozen
class Quarantined:
    """What ``journal quarantine`` did (design §10).

    Attributes:
        quarantine_path: where the old journal directory is now.
        result: the new journal's first episode's result (``noop``, reason naming the path).
        current / last_good: the slots recorded (slot, path, sha256, version).
        carried: what the new journal keeps of the old one (watermark, known-bad releases, how far the old
            journal could be read).
    """

    quarantine_path: str
    result: UpgradeResult
    current: SlotInfo
    last_good: SlotInfo
    carried: CarriedOver

    def to_json(self) -> dict[str, Any]:
        """``{"quarantined": path, "operation", "current": {...}, "last_good": {...}, "carried_over":
        {"security_watermark", "known_bad": [sha256...], "read_through_seq", "problem", "source"}}``."""
        c = self.carried
        return {"quarantined": self.quarantine_path, "operation": self.result.operation,
                "current": attrs.asdict(self.current), "last_good": attrs.asdict(self.last_good),
                "carried_over": {"security_watermark": c.watermark, "known_bad": list(c.known_bad),
                                 "read_through_seq": c.read_through, "problem": c.problem,
                                 "source": c.source}}


@attrs.frozen
class TrustCleared:
    """What ``trust reset`` cleared (docs/trust.md).

    Attributes:
        result: the ``trust-reset`` episode's result (``noop``; its operation id names the episode).
        watermark: the watermark cleared, None when there was none.
        known_bad: the known-bad releases cleared (digest and the operation that condemned each).
    """

    result: UpgradeResult
    watermark: int | None
    known_bad: tuple[KnownBad, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"operation", "result": "noop", "cleared": {"security_watermark": int|null,
        "known_bad": [{"sha256", "operation"}]}}``."""
        return {
            "operation": self.result.operation, "result": self.result.result,
            "cleared": {"security_watermark": self.watermark,
                        "known_bad": [attrs.asdict(b) for b in self.known_bad]},
        }

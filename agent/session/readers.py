"""The session's readers: ``status``, the folded journal (``history``), the preflights of ``upgrade`` and
``rollback``, ``journal verify`` and ``journal dump``, and the host root. They take no lock, never write,
never create ``state_dir`` or the lock, and never run a binary (docs/design.md §5, §7, §10); each runs the
writer's ownership checks first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from agent.config.loader import AgentConfig
from agent.errors import journal_error
from agent.host.adapter import AgentHost
from agent.host.lock import probe_lock
from agent.host.ownership import check_host_root, check_state
from agent.host.provision import Provisioner
from agent.session.converge import lock_holder, next_step, unit_drift
from agent.session.frame import require_installed, untrusted
from agent.session.reports import EpisodeInfo, KnownBad, Preflight, ServiceInfo, SlotInfo, StagedInfo, Status
from agent.session.wiring import journal_dir, service_manager
from agent.systemd.units import recover_timer_name
from journal import JournalCorruptError, replay
from journal import JournalStoreError as StoreError
from upgrade_core import (
    EVENT_CODEC,
    JournalView,
    Recorded,
    Slot,
    UpgradeRequest,
    fold,
    other_slot,
    rollback_target,
)
from upgrade_core.errors import HistoryError, UpgradeError

__all__ = ["JournalCheck", "Readers"]


@attrs.frozen
class JournalCheck:
    """What ``journal verify`` found (docs/cli.md): ``ok`` with the record count and any torn tail the next
    writer repairs, or the first corrupt record's file and offset.

    Attributes:
        ok: no corrupt record.
        records: records read (None when corrupt).
        torn_tail: ``(file, offset)`` of a torn final record, or None.
        corrupt: ``(file, offset)`` of the corrupt record, or None.
        error: the one line that names the corrupt record (None when ok); the way out is
            :data:`agent.session.quarantine.HINT`.
    """

    ok: bool
    records: int | None
    torn_tail: tuple[str, int] | None
    corrupt: tuple[str | None, int | None] | None
    error: str | None = None


class Readers:
    """Read-only views of one configuration (see the module doc).

    Args:
        config, config_path, host: the session's.
        units: the rendered unit files, name -> text (for the unit drift ``status`` reports).
    """

    def __init__(
        self, config: AgentConfig, config_path: str, host: AgentHost, units: Callable[[], dict[str, str]]
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.host = host
        self._units = units

    def _checked_journal_dir(self) -> str:
        """``state_dir/journal``, after the writer's checks (design §10: ``state_dir``, the journal's owner,
        the host root); creates nothing.

        Raises:
            HostRefusedError: a path is not ours (exit 4).
            ConfigError: a misplaced agent path, or another configuration's journal (exit 2).
        """
        check_state(self.config)
        check_host_root(self.host)
        return journal_dir(self.config)

    def view(self) -> JournalView:
        """The folded journal, read-only: no lock, nothing written or created (design §5 readers).

        Raises:
            HostRefusedError: ``state_dir``, the journal or a file in it is not ours (exit 4).
            ConfigError: the journal belongs to another configuration (exit 2, naming both).
            JournalError: the journal is corrupt or of a newer format (exit 3, naming file and offset).
            HistoryError: its order of events is illegal (exit 3).
        """
        directory = self._checked_journal_dir()
        try:
            rep = replay(directory, EVENT_CODEC)
        except StoreError as exc:
            raise untrusted(journal_error(exc, directory)) from None
        try:
            return fold(rep.records)
        except HistoryError as exc:
            raise untrusted(exc) from None

    def preflight(self, request: UpgradeRequest) -> Preflight:
        """``upgrade --preflight`` (design §7): the plan, from the links, the journal and a lock probe.

        No fetch, no directory, no lock file created (an existing lock is tested with a shared flock on
        an ``O_RDONLY`` open).

        Raises:
            NotInstalledError, LayoutConflictError: as ``upgrade`` (exit 2).
            JournalError, HistoryError: as :meth:`view` (exit 3).
        """
        require_installed(self.host)
        links = self.host.links()
        assert links.current is not None
        inactive = other_slot(links.current)
        lock = probe_lock(self.config.host.lock_path)
        view = self.view()
        open_ep = view.open_episode.episode_id if view.open_episode else None
        episode, drift, next_ = self.convergence(view, installed=True)
        cfg = self.config
        plan = []
        if open_ep is not None:
            plan.append(f"recover the open episode {open_ep} first")
        prior = view.result_of(request.operation)
        if prior is not None:
            plan.append(
                f"operation {request.operation} already closed as {prior.result}: print it, do nothing"
            )
        else:
            plan += [
                f"fetch {request.source_redacted}"
                + (" and check its sha256" if request.expected_sha256 else ""),
                f"extract {cfg.agent.member} into a staging file for the inactive slot {inactive}",
                "run its version command"
                + (f", expect {request.expected_version}" if request.expected_version else ""),
                f"switch current from {links.current} to {inactive} (last-good stays {links.current})",
                f"restart {cfg.agent.unit} through a transient unit and health-check it "
                f"({cfg.health.max_attempts} attempts, {cfg.health.stability_s} s stable)",
                "commit, or roll back to last-good",
            ]
        return Preflight(
            tuple(plan), inactive, lock, open_ep, episode, drift.missing, drift.drifted, next_
        )

    def rollback_preflight(self, operation: str, *, below_watermark: bool = False) -> Preflight:
        """``rollback --preflight``: the plan, from the links, the journal and a lock probe; changes nothing
        and runs no binary (as :meth:`preflight`). A rollback the anti-rollback watermark refuses plans
        only that refusal; with ``below_watermark``, the override comes first in the plan.

        Raises:
            NotInstalledError, LayoutConflictError, NothingToRollBackError: as ``rollback`` (exit 2).
            JournalError, HistoryError: as :meth:`view` (exit 3).
        """
        require_installed(self.host)
        links = self.host.links()
        view = self.view()
        open_ep = view.open_episode.episode_id if view.open_episode else None
        cfg = self.config
        plan = []
        if open_ep is not None:
            plan.append(f"recover the open episode {open_ep} first (the links may change)")
        prior = view.result_of(operation)
        if prior is not None:
            plan.append(f"operation {operation} already closed as {prior.result}: print it, do nothing")
            target = links.last_good or links.current
        else:
            target = rollback_target(links, self.host.current_link_path())
            current = links.current
            assert current is not None  # rollback_target refuses a host without current
            versions = view.slot_versions
            sha = self.host.slot_sha256_sync(target)
            refusal = view.rollback_refusal(target, sha)
            if refusal is not None:
                plan.append(f"override, journaled (--below-watermark): {refusal}" if below_watermark
                            else f"refuse (aborted, exit 1): {refusal}")
            if refusal is None or below_watermark:
                plan += [
                    f"run the version command of last-good's slot {target} ({versions.get(target, '?')})",
                    f"switch current from {current} ({versions.get(current, '?')}) to {target}; "
                    f"last-good stays {target}",
                    f"restart {cfg.agent.unit} through a transient unit and health-check it "
                    f"({cfg.health.max_attempts} attempts, {cfg.health.stability_s} s stable)",
                    f"commit (both links name {target}), or go back to {links.current} and health-check "
                    "it",
                ]
        episode, drift, next_ = self.convergence(view, installed=True)
        assert target is not None
        return Preflight(tuple(plan), target, probe_lock(cfg.host.lock_path), open_ep, episode, drift.missing,
                         drift.drifted, next_)

    def convergence(
        self, view: JournalView, *, installed: bool
    ) -> tuple[EpisodeInfo | None, Any, str | None]:
        """The open episode with its upgrader's pid, the unit drift and the next step;
        reads only (no lock taken, nothing created)."""
        holder = lock_holder(self.config.host.lock_path)
        ep = view.open_episode
        episode = None
        if ep is not None:
            episode = EpisodeInfo(ep.episode_id, ep.state.value, holder.pid, not holder.busy)
        drift = unit_drift(self.config.host.unit_dir, self._units())
        next_ = next_step(
            installed=installed,
            episode=None if ep is None else ep.episode_id,
            holder=holder,
            drift=drift,
            timer=recover_timer_name(self.config.agent.name),
        )
        return episode, drift, next_

    async def status(self) -> Status:
        """Slots, links, service and open episode (design §7 ``status``); never runs a binary, never writes.

        Raises:
            LayoutConflictError: a real file stands where a link must be (exit 2).
            JournalError, HistoryError: as :meth:`view`.
        """
        view = self.view()
        links = self.host.links()
        slots = {slot for slot in (links.current, links.last_good) if slot is not None}
        digests = {slot: await self.host.slot_sha256(slot) for slot in slots}

        def info(slot: Slot | None) -> SlotInfo | None:
            if slot is None:
                return None
            return SlotInfo(slot, self.host.slot_path(slot), digests[slot], view.slot_versions.get(slot))

        service, error = ServiceInfo(), None
        try:
            snap = await service_manager(self.config, self.config_path).snapshot()
            service = ServiceInfo(snap.active_state, snap.sub_state, snap.main_pid or None, snap.exe)
        except UpgradeError as exc:
            error = str(exc)
        episode, drift, next_ = self.convergence(view, installed=links.current is not None)
        return Status(
            agent=self.config.agent.name,
            current=info(links.current),
            last_good=info(links.last_good),
            service=service,
            episode=episode,
            missing_units=drift.missing,
            drifted_units=drift.drifted,
            next=next_,
            service_error=error,
            security_watermark=view.security_watermark,
            known_bad=tuple(KnownBad(sha, bad.operation) for sha, bad in sorted(view.known_bad.items())),
            staged=None if view.staged is None else StagedInfo(
                view.staged.operation, view.staged.slot, view.staged.sha256, view.staged.version,
                view.staged.archive_sha256, view.staged.switch_in_window,
            ),
        )

    def host_root(self) -> str:
        """The resolved host root (``host-root``); changes nothing."""
        return Provisioner(self.host).host_root()

    def verify_journal(self) -> JournalCheck:
        """``journal verify``: read every record, after the writer's ownership checks; creates nothing.

        Raises:
            HostRefusedError: ``state_dir``, the journal or a file in it is not ours (exit 4).
            ConfigError: the journal belongs to another configuration (exit 2).
            JournalUnreadableError: a record cannot be decoded, or the format is newer (exit 3).
        """
        directory = self._checked_journal_dir()
        try:
            rep = replay(directory, EVENT_CODEC)
        except JournalCorruptError as exc:
            return JournalCheck(False, None, None, (exc.path, exc.offset), str(exc))
        except StoreError as exc:
            raise untrusted(journal_error(exc, directory)) from None
        torn = None if rep.torn_tail is None else (rep.torn_tail.file, rep.torn_tail.offset)
        return JournalCheck(True, len(rep.records), torn, None)

    def journal_records(self) -> list[Recorded]:
        """``journal dump``: every record in order, after the writer's ownership checks; creates nothing.

        Raises:
            As :meth:`verify_journal`, a corrupt record included (exit 3, naming file and offset).
        """
        directory = self._checked_journal_dir()
        try:
            return list(replay(directory, EVENT_CODEC).records)
        except StoreError as exc:
            raise untrusted(journal_error(exc, directory)) from None

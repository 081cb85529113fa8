"""Wiring: build the real ports of :mod:`upgrade_core.ports` from a configuration (design §2).

``upgrade_core`` knows only protocols; this module is the one place that picks the real implementations:
the file journal, the host layout, the archive source, the verifier, systemd, the probe, the clock and the
result sink. It also marks the journal's steps for the documented test-only crash hook of design §8.

Test-only crash hook (:mod:`agent.crashhook`): when ``UPGRADE_AGENT_TEST_KILL_AFTER=TAG`` (or
``TAG#N``) is set, the process SIGKILLs itself right after the journal append of the N-th (default first)
event with stable tag ``TAG`` has returned, i.e. right after that record's fdatasync.
``tests/systemd/test_crash_real.py`` uses it to kill a real upgrade at every event of a recorded run. It
does nothing when the variable is unset.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio
import attrs

from agent.config.loader import AgentConfig
from agent.crashhook import crash_point
from agent.errors import journal_error
from agent.host.adapter import AgentHost
from agent.host.hostmove import RootMover
from agent.host.lock import HostLock
from agent.host.provision import Provisioner
from journal import JournalFullError, JournalPoisonedError, JournalWriter
from upgrade_core import EVENT_CODEC, Event, HistorySnapshot, Policy, Ports, Recorded
from upgrade_core.ports import ArchiveSource

if TYPE_CHECKING:
    from agent.https import Transport
    from agent.release.delta import DeltaSource
    from agent.release.fetch import FetchPolicy
    from agent.release.source import ArchiveSourceImpl
    from agent.release.trust import ReleaseTrust
    from agent.session.request import DeltaPlan
    from agent.systemd.manager import SystemdServiceManager
    from upgrade_core import Slot


def journal_dir(cfg: AgentConfig) -> str:
    """``state_dir/journal``: where the journal's segments live."""
    return os.path.join(cfg.host.state_dir, "journal")


class JournalPort:
    """:class:`upgrade_core.ports.Journal` over a :class:`journal.JournalWriter`.

    Maps the journal's durability failures (ENOSPC, a poisoning fsync error) to
    :class:`~upgrade_core.errors.JournalDurabilityError` (exit 3), naming the journal directory.

    Args:
        writer: an open writer (the caller holds the host lock).
        on_event: called after each durable append (progress lines on stderr).
    """

    def __init__(
        self,
        writer: JournalWriter[Event],
        on_event: Callable[[Recorded], None] | None = None,
        lock: HostLock | None = None,
    ) -> None:
        self._writer = writer
        self._on_event = on_event
        self._lock = lock
        self._reread: Sequence[Recorded] | None = None
        self._relinquished = False

    @property
    def writer(self) -> JournalWriter[Event]:
        """The underlying writer (for sealing and compaction)."""
        return self._writer

    def records(self) -> Sequence[Recorded]:
        """Every durable record in sequence order (as last re-read, after :meth:`relinquish`)."""
        if self._relinquished and self._reread is not None:
            return self._reread
        return self._writer.records()

    @property
    def relinquished(self) -> bool:
        """True after :meth:`relinquish`: this process no longer owns the journal."""
        return self._relinquished

    async def relinquish(self) -> None:
        """Close the writer and release the host lock (a handed-off recovery unit takes both over)."""
        await self._writer.aclose()
        if self._lock is not None:
            self._lock.release()
        self._relinquished = True
        self._reread = self._writer.records()

    async def reread(self) -> Sequence[Recorded]:
        """Replay the journal from disk, read-only (other processes' appends included).

        Raises:
            JournalUnreadableError: a corrupt or undecodable record; names its file and offset (exit 3).
        """
        from journal import JournalStoreError as StoreError
        from journal import replay

        try:
            rep = await anyio.to_thread.run_sync(replay, self._writer.directory, EVENT_CODEC)
        except StoreError as exc:
            raise journal_error(exc, self._writer.directory) from None
        self._reread = rep.records
        return rep.records

    async def append(self, episode_id: str, event: Event) -> Recorded:
        """Append durably; see :meth:`upgrade_core.ports.Journal.append`.

        Raises:
            JournalDurabilityError: ENOSPC, or the journal is poisoned by an fsync error.
        """
        return await self._durably(self._writer.append(episode_id, event), event)

    async def seed(self, snapshot: HistorySnapshot) -> Recorded:
        """Write ``snapshot`` as the first record of this (empty) journal (``journal quarantine``: what the
        old journal established); see :meth:`journal.JournalWriter.seed`.

        Raises:
            JournalDurabilityError: as :meth:`append`.
            ValueError: the journal is not empty.
        """
        return await self._durably(self._writer.seed(snapshot), snapshot)

    async def _durably(self, appended: Awaitable[Recorded], event: Event) -> Recorded:
        try:
            record = await appended
        except (JournalFullError, JournalPoisonedError) as exc:
            raise journal_error(exc, self._writer.directory) from None
        if self._on_event is not None:
            self._on_event(record)
        crash_point(type(event).TAG)
        return record


class Ids:
    """:class:`upgrade_core.ports.IdSource` from :mod:`secrets`."""

    def token_hex(self, nbytes: int) -> str:
        """``2 * nbytes`` lowercase hex characters."""
        return secrets.token_hex(nbytes)


def recover_executable() -> str:
    """Absolute path of the installed ``recover-agent-upgrade`` (beside this interpreter, else on PATH).

    Units and transient units run it by absolute path (design §6).
    """
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "recover-agent-upgrade")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("recover-agent-upgrade")
    return os.path.abspath(found) if found else beside


def policy_from(cfg: AgentConfig) -> Policy:
    """The orchestrator's :class:`~upgrade_core.Policy` from ``[agent]``, ``[health]``, ``[journal]``."""
    return Policy(
        agent=cfg.agent.name,
        unit=cfg.agent.unit,
        stability_s=cfg.health.stability_s,
        health_timeout_s=cfg.health.timeout_s,
        max_attempts=cfg.health.max_attempts,
        keep_episodes=cfg.journal.keep_episodes,
    )


def download_transport(cfg: AgentConfig) -> Transport:
    """The TLS trust, client certificate and proxy of every download (the archive, its signature, the
    keyring) from ``[download]`` (docs/trust.md, TLS): read and checked now, before anything is locked.

    Raises:
        ConfigError: ``ca_file``, ``client_cert`` or ``client_key`` missing, unreadable or not PEM, a key
            that does not match its certificate (exit 2, naming the key).
        HostRefusedError: one of them owned by another user or writable by others, the key readable by
            them (exit 4, naming the path).
    """
    d = cfg.download
    if not (d.ca_file or d.client_cert or d.client_key or d.proxy):
        from agent.https import Transport

        return Transport()  # the system's store: no file to read, and cryptography (~50 ms) stays unloaded
    from agent.release.tls import download_transport as build

    return build(cfg.source, ca_file=d.ca_file, client_cert=d.client_cert, client_key=d.client_key,
                 proxy=d.proxy)


def release_trust(cfg: AgentConfig, download: FetchPolicy, signature: str | None) -> ReleaseTrust | None:
    """``[trust]`` at work for one request (docs/trust.md), or None when no key is configured."""
    if not cfg.trust.root_keys:
        return None  # and neither the trust code nor cryptography is loaded (~9 ms at every start)
    from agent.release.minisign import parse_public_key
    from agent.release.trust import ReleaseTrust

    return ReleaseTrust(
        roots=tuple(parse_public_key(k) for k in cfg.trust.root_keys),
        keyring_source=cfg.trust.keyring,
        require=cfg.trust.required,
        state_dir=cfg.host.state_dir,
        download=download,
        signature=signature,
        allow_legacy=cfg.trust.allow_legacy_signatures,
    )


def service_manager(
    cfg: AgentConfig, config_path: str, host: AgentHost | None = None
) -> SystemdServiceManager:
    """The systemd binding for ``agent.unit`` (``host.systemctl_prefix``, ``host.unit_dir``).

    Args:
        host: the host adapter whose ``current`` link and slot digest tell which binary the unit runs
            (compared around a start-limit wait, :meth:`SystemdServiceManager.wait_out_start_limit`); None:
            the configuration's.
    """
    from agent.systemd.manager import SystemdServiceManager

    adapter = host if host is not None else AgentHost.from_config(cfg)

    async def selection() -> str:
        current = adapter.links().current
        digest = await adapter.slot_sha256(current) if current is not None else None
        return f"current -> {current or 'none'}, sha256 {digest or 'none'}"

    return SystemdServiceManager(
        cfg.agent.unit,
        unit_dir=cfg.host.unit_dir,
        recover_exe=recover_executable(),
        config_path=os.path.abspath(config_path),
        prefix=cfg.host.systemctl_prefix,
        selection=selection,
    )


def delta_source(
    cfg: AgentConfig,
    host: AgentHost,
    archive: ArchiveSourceImpl,
    delta: DeltaPlan,
    trust: ReleaseTrust | None,
) -> DeltaSource:
    """The :class:`~agent.release.delta.DeltaSource` of ``upgrade --delta`` (docs/delta.md).

    Its base is the slot ``current`` names, read whole and at most ``limits.max_member_bytes`` long (zstd
    needs a dictionary as one buffer); the delta's signature is ``<delta>.minisig``; ``archive`` (with
    ``--signature``) is the fall-back when ``delta.archive`` is set.
    """

    from agent.logline import log
    from agent.redact import redact_url
    from agent.release.delta import DeltaSource
    from agent.release.extract import DeltaBase
    from upgrade_core.errors import DeltaBaseError

    limit = cfg.limits.max_member_bytes

    async def read_base(slot: Slot) -> DeltaBase:
        current = host.links().current
        if current is None or current == slot:
            raise DeltaBaseError("no current slot to rebuild the candidate from: a delta needs one")
        label = f"slot {current} ({host.slot_path(current)})"
        content = await host.read_slot(current, limit + 1)
        if not content:
            raise DeltaBaseError(f"{label} is missing or empty: a delta needs the current binary")
        if len(content) > limit:
            raise DeltaBaseError(
                f"{label} is larger than limits.max_member_bytes = {limit} bytes: too large for a "
                "delta's base"
            )
        return DeltaBase(content, label, delta.member_sha256)

    def on_fallback(reason: str) -> None:
        shown = redact_url(delta.archive or "")
        log(f"delta refused: {reason}; fetching the full archive {shown}")

    return DeltaSource(
        deltas=attrs.evolve(archive, trust=trust, member_policy="none"),
        read_base=read_base,
        fallback=archive if delta.archive is not None else None,
        fallback_source=delta.archive,
        fallback_sha256=delta.archive_sha256,
        on_fallback=on_fallback,
    )


@attrs.define
class Wired:
    """The ports of one process plus the objects the CLI needs beyond them."""

    ports: Ports
    policy: Policy
    host: AgentHost
    journal: JournalPort


async def wire(
    cfg: AgentConfig,
    config_path: str,
    *,
    progress: Callable[[int, int | None], None] | None = None,
    on_event: Callable[[Recorded], None] | None = None,
    source_override: ArchiveSource | None = None,
    lock: HostLock | None = None,
    signature: str | None = None,
    transport: Transport | None = None,
    delta: DeltaPlan | None = None,
) -> Wired:
    """Open the journal (the caller holds the host lock) and build every port.

    Args:
        cfg: the loaded configuration.
        config_path: the configuration file (absolute path used in units and hand-offs).
        progress: ``progress(bytes_so_far, total_or_None)`` during downloads.
        on_event: called after each durable journal append.
        source_override: an :class:`~upgrade_core.ports.ArchiveSource` to use instead of the fetcher
            (adoption of a plain binary).
        lock: the host lock the caller holds; released by :meth:`JournalPort.relinquish` on a hand-off.
        signature: ``--signature`` (None: ``<archive>.minisig``), used when ``[trust]`` has keys.
        transport: :func:`download_transport` for a flow that downloads; None for one that never does
            (its fetcher, never called, gets the operating system's trust and no proxy).
        delta: ``upgrade --delta`` (docs/delta.md): the source is a :class:`~agent.release.delta.DeltaSource`
            that rebuilds the candidate from the current slot, with the archive source as its fall-back.

    Raises:
        JournalError: the journal cannot be trusted (corrupt: :class:`JournalUnreadableError` with file and
            offset; a newer format), exit 3.
    """
    from agent.host.clock import SystemClock
    from agent.host.ownership import journal_owner, owner_error, prepare_state
    from agent.host.results import FileResultSink
    from agent.release.extract import ExtractLimits
    from agent.release.fetch import FetchPolicy
    from agent.release.source import ArchiveSourceImpl
    from agent.release.verify import VerifierImpl
    from agent.systemd.probes import make_probe

    host = AgentHost.from_config(cfg)
    # design §3 and 10: missing parents of state_dir are 0755, state_dir itself 0700; an existing one (and
    # every ancestor) is checked before anything is created in it (exit 4).
    prepare_state(cfg)
    from journal import JournalOwnerError
    from journal import JournalStoreError as StoreError

    try:
        writer: JournalWriter[Event] = await JournalWriter.open(
            journal_dir(cfg), EVENT_CODEC, owner=journal_owner(cfg)
        )
    except JournalOwnerError as exc:
        raise owner_error(exc, cfg) from None
    except StoreError as exc:
        raise journal_error(exc, journal_dir(cfg)) from None
    journal = JournalPort(writer, on_event, lock)
    from agent.https import Transport

    download = FetchPolicy(
        allow_http=cfg.download.allow_http,
        max_redirects=cfg.download.max_redirects,
        timeout_s=cfg.download.timeout_s,
        retry_deadline_s=cfg.download.retry_deadline_s,
        transport=transport or Transport(),
    )
    archive = ArchiveSourceImpl(
        download=download,
        limits=ExtractLimits(
            max_archive_bytes=cfg.limits.max_archive_bytes,
            max_member_bytes=cfg.limits.max_member_bytes,
            max_total_bytes=cfg.limits.max_total_bytes,
            max_entries=cfg.limits.max_entries,
            max_zstd_window_bytes=cfg.limits.max_zstd_window_bytes,
        ),
        member=cfg.agent.member,
        member_policy=cfg.agent.member_policy,
        progress=progress,
        trust=release_trust(cfg, download, signature),
    )
    source: ArchiveSource = archive
    if source_override is not None:
        source = source_override
    elif delta is not None:
        source = delta_source(cfg, host, archive, delta, release_trust(cfg, download, None))
    ports = Ports(
        journal=journal,
        clock=SystemClock(),
        host=host,
        source=source,
        verifier=VerifierImpl(
            version_args=cfg.agent.version_args,
            timeout_s=cfg.verify.timeout_s,
            max_output_bytes=cfg.verify.max_output_bytes,
            version_regex=cfg.verify.version_regex,
            host_root_args=cfg.agent.host_root_args,
            host_root=Provisioner(host).host_root() if cfg.agent.host_root_args else "",
        ),
        service=service_manager(cfg, config_path, host),
        probe=make_probe(cfg.health.http_probe, cfg.health.command_probe),
        sink=FileResultSink(cfg.host.state_dir),
        ids=Ids(),
        mover=RootMover(host),
    )
    return Wired(ports=ports, policy=policy_from(cfg), host=host, journal=journal)

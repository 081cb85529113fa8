"""The locked-episode frame every writing method of the session runs in: check the state paths, take the
host lock, open the journal, fold it once, run the flow, compact, close the journal, release the lock, also
when cancelled (docs/design.md §4.3, §5, §10).

It also keeps what a signal handler asks while a flow runs (:attr:`EpisodeFrame.switch_started`,
:attr:`EpisodeFrame.handed_off`, :attr:`EpisodeFrame.last_published`) and applies the errors-by-phase
rule: after ``SwitchIntended`` a failure leaves the episode to ``recover`` (exit 3).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from agent.config.loader import AgentConfig
from agent.groups import sole_error
from agent.host.adapter import AgentHost
from agent.host.lock import HostLock
from agent.host.ownership import check_host_root, check_result, check_state
from agent.logline import WARNING, log
from agent.session.quarantine import HINT
from agent.session.request import DeltaPlan
from agent.session.wiring import Wired, download_transport, wire
from journal import JournalStoreError as StoreError
from upgrade_core import (
    Folder,
    JournalView,
    Policy,
    Ports,
    Recorded,
    ResultPublished,
    UpgradeResult,
    summarize_history,
)
from upgrade_core.errors import (
    CompactionHeldError,
    EpisodeLeftOpenError,
    HistoryError,
    JournalError,
    JournalUnreadableError,
    NotInstalledError,
    UpgradeError,
)

__all__ = ["EpisodeFrame", "EventCallback", "ProgressCallback", "require_installed", "untrusted"]

ProgressCallback = Callable[[int, int | None], None]
EventCallback = Callable[[Recorded], None]
Flow = Callable[[Ports, Policy, Folder], Awaitable[Any]]


def require_installed(host: AgentHost) -> None:
    """Raise before the lock when the host is not installed.

    Raises:
        LayoutConflictError: a file stands where a link must be (exit 2).
        NotInstalledError: no ``current`` link (exit 2).
    """
    host.links()
    if not host.is_installed():
        raise NotInstalledError(f"{host.current_link_path()}: not installed; run `upgrade-agent install`")


class EpisodeFrame:
    """One configuration's locked-episode frame; one write at a time (see the module doc).

    Args:
        config, config_path, host: the session's.
        progress: ``progress(bytes_so_far, total_or_None)`` during downloads.
        on_event: called after each durable journal append.
    """

    def __init__(
        self,
        config: AgentConfig,
        config_path: str,
        host: AgentHost,
        *,
        progress: ProgressCallback | None = None,
        on_event: EventCallback | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.host = host
        self.progress = progress
        self._on_event = on_event
        self._folder: Folder | None = None
        self._journal: Any = None
        self._last_published: UpgradeResult | None = None
        self._running = False
        self.compaction_error: Exception | None = None
        """Why the last run's compaction after its close did not happen (None: it ran)."""

    @property
    def switch_started(self) -> bool:
        """True while the running method's open episode has passed ``SwitchIntended`` (no abort possible)."""
        if self._folder is None:
            return False
        ep = self._folder.view().open_episode
        return ep is not None and ep.switch_intended

    def running_view(self) -> JournalView | None:
        """The journal of the running (or last) write as its flow has folded it so far: every record that
        write appended durably, and those it found; None before the first write. Reads no file."""
        return None if self._folder is None else self._folder.view()

    @property
    def handed_off(self) -> bool:
        """True once the running method handed its episode to a transient unit (and released the lock)."""
        return self._journal is not None and bool(self._journal.relinquished)

    @property
    def last_published(self) -> UpgradeResult | None:
        """The newest result this session published (e.g. ``aborted`` after a cancellation), or None."""
        return self._last_published

    def journal_records(self) -> int:
        """How many records the journal of the last write holds (0 before any write)."""
        return 0 if self._journal is None else len(self._journal.records())

    async def write(
        self,
        flow: Flow,
        *,
        source_override: Any = None,
        operation: str | None = None,
        before_wire: Callable[[], Awaitable[None]] | None = None,
        signature: str | None = None,
        fetches: bool = False,
        delta: DeltaPlan | None = None,
    ) -> Any:
        """Check the state paths, lock, open the journal, fold once, run ``flow``, compact, close, unlock
        (see the module doc).

        Before the host lock is taken, ``state_dir`` (and its ancestors, ``journal/``, ``results/``, the
        result file of ``operation``, the lock's directory) and the journal's owner are checked (design §10):
        the host root (:func:`agent.host.ownership.check_host_root`) and every mirror's directory
        (:meth:`agent.host.adapter.AgentHost.check_mirrors`) likewise: a refusal (exit 4) or a foreign journal
        (exit 2) leaves the host untouched, and a mirror that cannot be walked is named before any switch.
        ``before_wire`` runs under the lock before the journal is opened (``journal quarantine`` moves an
        untrusted journal aside there). With ``fetches`` (the flow downloads a release), ``[download]``'s
        certificates, key and proxy are read and checked before the lock too
        (:func:`~agent.session.wiring.download_transport`: exit 2 or 4, nothing touched); flows that download
        nothing never read them, so a broken download setting cannot stop a recovery or a rollback.
        """
        if self._running:
            raise RuntimeError("Session: one write at a time")
        check_state(self.config)
        check_host_root(self.host)
        self.host.check_mirrors()
        if operation is not None:
            check_result(self.config, operation)
        transport = download_transport(self.config) if fetches else None
        self._running = True
        self._folder, self._journal, self._last_published = None, None, None
        self.compaction_error = None
        try:
            with HostLock(self.config.host.lock_path) as lock:
                if before_wire is not None:
                    await before_wire()
                try:
                    wired = await wire(
                        self.config,
                        self.config_path,
                        progress=self.progress,
                        on_event=self._seen,
                        source_override=source_override,
                        lock=lock,
                        signature=signature,
                        transport=transport,
                        delta=delta,
                    )
                except JournalError as exc:
                    raise untrusted(exc) from None
                self._journal = wired.journal
                try:
                    folder = Folder()
                    try:
                        folder.apply_all(wired.journal.records())
                    except HistoryError as exc:
                        raise untrusted(exc) from None
                    self._folder = folder
                    try:
                        out = await flow(wired.ports, wired.policy, folder)
                    except Exception as exc:
                        raise self._by_phase(exc) from exc
                    await self._compact(wired, folder)
                    return out
                finally:
                    with anyio.CancelScope(shield=True):
                        await wired.journal.writer.aclose()
        finally:
            self._running = False

    def _by_phase(self, exc: Exception) -> Exception:
        """Errors by phase: after ``SwitchIntended`` any failure but a journal one leaves the
        episode to ``recover`` (exit 3), whatever its type; before it the orchestrator has aborted."""
        error = sole_error(exc)
        if isinstance(error, JournalError | StoreError) or not self.switch_started or self.handed_off:
            return error if isinstance(error, Exception) else exc
        return EpisodeLeftOpenError(
            f"{error}; the episode is left open after its switch: run recover-agent-upgrade"
        )

    def _seen(self, record: Recorded) -> None:
        if isinstance(record.event, ResultPublished):
            self._last_published = record.event.result
        if self._on_event is not None:
            self._on_event(record)

    async def _compact(self, wired: Wired, folder: Folder) -> None:
        """Best effort after a close (design §5): the episode is already closed and published."""
        if wired.journal.relinquished:  # a handed-off recovery unit owns the journal now
            return
        view = folder.view()
        # The records the boot reader looks for stay in the live segment while they matter (sealing would
        # leave an empty one and the quick path would answer "nothing to do"): upgrade_core.wire's
        # left_stopped_may_wait and window_switch_may_wait.
        left, staged = view.left_stopped, view.staged
        if left is not None:  # design §4.7
            self.compaction_error = CompactionHeldError(
                f"not compacted while current names {left.slot} ({left.version}), left stopped by activate "
                f"{left.operation} and not checked yet"
            )
            return
        if staged is not None and staged.switch_in_window:  # docs/configuration.md [schedule]
            self.compaction_error = CompactionHeldError(
                f"not compacted while {staged.version}, staged by {staged.operation}, waits for the recovery "
                "timer to switch to it in the maintenance window"
            )
            return

        def is_closed(episode_id: str) -> bool:
            ep = view.episodes.get(episode_id)
            return ep is None or not ep.is_open

        try:
            keep = self.config.journal.keep_episodes
            await wired.journal.writer.compact(keep, is_closed, summarize_history)
        except Exception as exc:  # best effort: report, never fail a finished command
            self.compaction_error = exc
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            log(f"journal compaction skipped: {why}", WARNING)


def untrusted(exc: UpgradeError) -> UpgradeError:
    """A journal that cannot be trusted (corrupt, undecodable, an illegal order) names the way out, design §10
    ``journal quarantine``; a newer format or a failed append does not (another tool version or the disk
    is the fix)."""
    if isinstance(exc, JournalUnreadableError):
        return JournalUnreadableError(exc.path, exc.offset, f"{exc.reason}; {HINT}")
    if isinstance(exc, HistoryError):
        return HistoryError(f"{exc}; {HINT}")
    return exc

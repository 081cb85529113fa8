"""``upgrade-agent operator`` (docs/managed.md): take operations from a source one at a time, run each under
the journal through the embedding :class:`~agent.session.session.Session`, and publish each one's terminal
status once.

The loop, and why it is exactly-once:

1. **Start-up gate.** An episode left open (the operator or a CLI upgrade died) is recovered first
   (``recover``, design §4.5). Then every operation the source holds whose result the journal already has is
   published, before any new operation is accepted.
2. **Derived status.** An operation's status is never stored by the operator: it is
   :func:`upgrade_core.operation_status` of the journal, which names the ``ResultPublished`` record's sequence
   number, the episode's boot id and its times. Publishing it again gives the same document. While an
   operation runs, its ``InProgress`` status (``step``, ``attempt``, bytes fetched: the open episode's
   records) is derived and published again every :data:`PROGRESS_S` seconds when it changed.
3. **Acknowledged means done.** An operation whose source already holds a terminal status for it
   (:func:`.model.held_terminal`) is never published or run again; one the journal knows is published and
   never run again (the session itself also returns a closed operation id's recorded result and does
   nothing).
4. **Refused before the lock.** A document the source could not read, a spec for another node or agent, or
   parameters the request checks refuse: terminal ``Failed`` with the reason; no lock, file or episode.
5. **One at a time**, oldest first; the source is waited on (a Kubernetes watch, a spool poll) only when
   nothing is left to do.

A crash anywhere (SIGKILL after any durable event) therefore leaves one of: nothing journaled (the
operation runs on restart, from the start), an open episode (recovered by the gate, then published), or a
closed one (published by the gate): never a second run of host effects, never two different terminal
statuses.

Stopping (:meth:`Operator.request_stop`, which the CLI calls on SIGTERM/SIGINT/SIGHUP): idle, the loop ends at
once; during an operation before ``SwitchIntended`` the operation is cancelled (the orchestrator aborts and
publishes ``aborted``; the source is told ``Failed``); after it, the operation runs to its terminal state and
is published first (design §4.3 step 10, as the CLI).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

import anyio
import attrs

from agent.crashhook import crash_point
from agent.errors import ConfigError, UsageError
from agent.logline import log
from agent.operations.model import (
    CredentialsRefused,
    Operation,
    OperationRefused,
    OperationSource,
    SourceError,
    check_spec,
    held_terminal,
)
from agent.session.request import DeltaPlan, make_delta_request
from agent.session.session import Session
from agent.session.window import window_now
from upgrade_core import (
    JournalView,
    OperationStatus,
    UpgradeRequest,
    WindowVerdict,
    operation_status,
    refused_status,
    waiting_status,
    window_waiting_status,
)
from upgrade_core.errors import (
    EpisodeLeftOpenError,
    HostError,
    JournalError,
    LockBusyError,
    UpgradeError,
)

__all__ = ["Operator", "open_source"]

IDLE_WAIT_S = 300.0
"""Longest single wait on the source while idle (seconds): a Kubernetes watch's ``timeoutSeconds``."""

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Waits (seconds) after consecutive source errors or a busy host lock; the last one repeats."""

PROGRESS_S = 2.0
"""Seconds between two looks at the journal while an operation runs: its ``InProgress`` status (step,
attempt, bytes fetched) is published again when the journal says something new, so a source is written at
most once per this period (Kubernetes API servers ask controllers not to write a status more often than
needed; a spool status file is one fsynced rename)."""


async def open_source(session: Session) -> OperationSource:
    """The source ``[operations] source`` names.

    Raises:
        ConfigError: ``[operations] source`` is empty, or the Kubernetes configuration cannot be loaded
            (exit 2).
    """
    ops = session.config.operations
    if ops.source == "spool":
        from agent.operations.spool import SpoolSource

        return SpoolSource(ops.spool_dir, ops.poll_s)
    if ops.source == "kubernetes":
        from agent.operations.kubernetes import KubernetesSource

        return await KubernetesSource.create(ops, agent=session.config.agent.name)
    raise ConfigError(
        f'{session.config_path}: operations.source: not configured; set it to "spool" or "kubernetes"'
    )


def _runnable(status: OperationStatus | None) -> bool:
    """The journal knows nothing of the operation yet, or it is staged and waits for its window."""
    return status is None or status.step == "Staged"


class Operator:
    """The managed-operations loop (see the module docstring).

    Args:
        session: the embedding session of this configuration (it runs every episode).
        source: where operations come from and where their status goes.
        wall: Unix-seconds clock for the times of refusals and for the maintenance window (tests pass their
            own).
    """

    def __init__(
        self, session: Session, source: OperationSource, *, wall: Callable[[], float] = time.time
    ) -> None:
        self.session = session
        self.source = source
        self.node = session.config.operations.node
        self._wall = wall
        self._stopping = False
        self._op_scope: anyio.CancelScope | None = None
        self._idle_scope: anyio.CancelScope | None = None
        self._errors = 0
        self._stalled = 0
        self._said: dict[str, str] = {}  # operation -> the last publication problem logged for it

    # -- stopping -----------------------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        """True once :meth:`request_stop` was called."""
        return self._stopping

    def _scope(self) -> anyio.CancelScope:
        """A cancel scope for the next wait or operation, already cancelled when a stop was requested before
        it is entered. :meth:`request_stop` cancels only the scope in place when it is called; a stop that
        lands while the source is being read or a status published (no scope in place) must still end the
        next wait at once, not after it: the spool's idle wait lasts until the directory changes or its 60 s
        rescan is due, a Kubernetes watch until an event or ``IDLE_WAIT_S`` (300 s), and systemd's stop
        timeout is 90 s by default (systemd.service(5), ``TimeoutStopSec=``). Found by a CI run of
        ``tests/cli/test_operator_cli.py``, whose SIGTERM lands as the first look creates the spool."""
        scope = anyio.CancelScope()
        if self._stopping:
            scope.cancel()
        return scope

    def request_stop(self, why: str) -> None:
        """Stop after the current step (see the module docstring); idempotent. ``why`` is logged."""
        self._stopping = True
        if self._op_scope is not None:
            if self.session.switch_started:
                log(f"{why}: the switch has started; finishing the operation first (again: stop now)")
            else:
                log(f"{why}: aborting the running operation before the switch")
                self._op_scope.cancel()
        else:
            log(f"{why}: stopping")
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    # -- the loop -----------------------------------------------------------------------------------------
    async def run(self, *, once: bool = False) -> None:
        """Serve until :meth:`request_stop` (or, with ``once``, until nothing is left to do).

        Raises:
            JournalError, HistoryError: the journal cannot be trusted (exit 3; nothing more is run).
            HostRefusedError: the state paths are not ours (exit 4).
            SourceError: with ``once``, the source cannot be read (exit 3); without, it is retried.
            CredentialsRefused: the API server refused the credentials again after they were read again
                (exit 3, never retried here: systemd's ``Restart=on-failure`` starts a fresh process).
        """
        log(f"operator: node {self.node}, {self.source.label}")
        await self._recover_open_episode()
        while not self._stopping:
            ops = await self._snapshot(once)
            if ops is None:
                await self._pause()
                continue
            # Only operations the source has not acknowledged cost a look at the journal: an idle operator
            # whose source holds only finished operations reads nothing else.
            unacknowledged = [op for op in ops if not held_terminal(op)]
            if unacknowledged:
                view = await self._publish_known(unacknowledged)
                todo = [op for op in unacknowledged if _runnable(operation_status(view, op.operation))]
                outcome = "skipped"
                for op in todo:  # the oldest one that can be taken; one whose status cannot be written
                    if self._stopping:  # (a symlink where it goes...) never blocks those behind it
                        break
                    outcome = await self._run_one(op)
                    if outcome != "skipped":
                        break
                if outcome == "done":
                    self._stalled = 0
                    continue  # look at the source again before the next one
                if outcome == "window" and once:
                    break  # staged, waiting for its maintenance window: nothing more to do now
                if outcome in ("wait", "window") or (todo and not once):
                    self._stalled += 1  # nothing could be taken: back off further each time
                    await self._pause()
                    continue
            if once:
                break
            await self._idle()

    async def _snapshot(self, once: bool) -> Sequence[Operation] | None:
        try:
            ops = await self.source.snapshot()
        except CredentialsRefused:
            raise
        except SourceError as exc:
            if once:  # a one-shot run's first error is its result
                raise
            self._errors += 1
            log(f"operator: {exc} (retrying)")
            return None
        self._errors = 0
        return ops

    async def _pause(self) -> None:
        failures = max(self._errors, self._stalled, 1)
        wait = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1]
        with self._scope() as scope:
            self._idle_scope = scope
            await anyio.sleep(wait)
        self._idle_scope = None

    async def _idle(self) -> None:
        with self._scope() as scope:
            self._idle_scope = scope
            try:
                await self.source.wait_for_change(IDLE_WAIT_S)
            except CredentialsRefused:
                raise
            except SourceError as exc:
                log(f"operator: {exc} (retrying)")
                self._errors += 1
        self._idle_scope = None
        if self._errors and not self._stopping:
            await self._pause()

    async def _recover_open_episode(self) -> None:
        """Gate step 1: close an episode left open (by us or a CLI upgrade) before anything else."""
        while not self._stopping:
            view = self.session.view()
            if view.open_episode is None:
                return
            log(f"operator: episode {view.open_episode.episode_id} was left open; recovering it first")
            try:
                await self.session.recover("manual")
                return
            except LockBusyError as exc:
                self._errors += 1
                log(f"operator: {exc}; waiting for its holder")
                await self._pause()
        self._errors = 0

    async def _publish_known(self, ops: Sequence[Operation]) -> JournalView:
        """Gate step 2 (and every pass): publish what the journal says of every unacknowledged operation it
        knows; an open episode of one of them is recovered first. Returns the journal's view after that (one
        replay per pass when nothing was open: publishing to the source writes no journal record)."""
        view = self.session.view()
        for op in ops:
            status = operation_status(view, op.operation)
            if status is None:
                continue
            if not status.terminal:
                await self._recover_open_episode()
                view = self.session.view()
                status = operation_status(view, op.operation)
                if status is None or not status.terminal:
                    continue
            await self._publish(op, status)
        return view

    async def _publish(self, op: Operation, status: OperationStatus) -> bool:
        try:
            wrote = await self.source.publish(op, status)
        except CredentialsRefused:
            raise
        except SourceError as exc:
            self._errors += 1
            line = f"operator: {op.name}: cannot publish {status.phase}: {exc}"
            if self._said.get(op.operation) != line:  # one line per problem, not one per retry
                self._said[op.operation] = line
                log(line)
            return False
        self._said.pop(op.operation, None)
        if wrote:
            seq = f" (journal seq {status.journal_seq})" if status.journal_seq is not None else ""
            said = f": {status.message}" if status.message else ""
            step = f" ({status.step})" if status.step else ""
            log(f"operator: {op.name}: {status.phase}{step}{seq}{said}")
            crash_point(f"operator-{'terminal' if status.terminal else status.phase}")
        return True

    def _check(self, op: Operation) -> tuple[UpgradeRequest, DeltaPlan | None] | str:
        """The checked request of ``op`` (with its delta, docs/delta.md), or why it cannot run (before any
        lock, file or episode)."""
        if op.problem is not None:
            return op.problem
        cfg = self.session.config
        try:
            spec = check_spec(
                op.spec, agent=cfg.agent.name, node_name=self.node,
                node_required=cfg.operations.source == "kubernetes",
                allow_local_sources=cfg.operations.allow_local_sources,
            )
            if spec.delta_url is not None:
                return make_delta_request(
                    spec.delta_url, allow_http=cfg.download.allow_http, delta_sha256=spec.delta_sha256,
                    member_sha256=spec.delta_member_sha256, archive=spec.url, sha256=spec.sha256,
                    operation=op.operation, expect_version=spec.expect_version, signature=spec.signature_url,
                )
            return self.session.request(
                spec.url, sha256=spec.sha256, operation=op.operation, expect_version=spec.expect_version,
                signature=spec.signature_url,
            ), None
        except (OperationRefused, UsageError) as exc:
            return str(exc)

    async def _upgrade_reporting(self, op: Operation, request: UpgradeRequest, delta: DeltaPlan | None,
                                 started: OperationStatus) -> None:
        """``session.upgrade(request, delta)``, with :meth:`_report_progress` beside it until it ends. Raises
        what the upgrade raises, unwrapped (a task group would wrap it in an exception group)."""
        failure: list[Exception] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._report_progress, op, started)
            try:
                await self.session.upgrade(request, delta)
            except Exception as exc:  # re-raised below, outside the task group
                failure.append(exc)
            finally:
                tg.cancel_scope.cancel()
        if failure:
            raise failure[0]

    async def _report_progress(self, op: Operation, last: OperationStatus) -> None:
        """Every :data:`PROGRESS_S` seconds, derive ``op``'s status from the journal records the running
        upgrade has appended (:meth:`~agent.session.session.Session.running_view`: no file is read, so the
        look costs the upgrade nothing) and publish it when it is still ``InProgress`` and differs from the
        last one published (the terminal status is published by :meth:`_run_one`, after the episode)."""
        while True:
            await anyio.sleep(PROGRESS_S)
            view = self.session.running_view()
            status = None if view is None else operation_status(view, op.operation)
            if status is None or status.terminal or status == last:
                continue
            if await self._publish(op, status):
                last = status

    async def _run_one(self, op: Operation) -> Literal["done", "skipped", "wait", "window"]:
        """Refuse or run ``op`` and publish its status: ``done`` (something was decided and reported),
        ``skipped`` (its status could not be written: nothing was run; try the next one), ``wait`` (the host
        lock is busy: back off before trying anything), ``window`` (it waits for its maintenance window:
        back off, or with ``--once`` stop).

        Outside the ``[schedule]`` window (docs/configuration.md) an operation is staged (``upgrade
        --stage`` under its own id: fetched, verified, installed in the inactive slot, nothing switched) and
        reported ``Waiting``; inside it a staged operation is activated, any other one upgraded at once."""
        staged = operation_status(self.session.view(), op.operation)
        if staged is not None and staged.step == "Staged":
            return await self._activate_staged(op, staged)
        checked = self._check(op)
        if isinstance(checked, str):
            reported = await self._publish(op, refused_status(op.operation, checked, self._wall()))
            return "done" if reported else "skipped"
        request, delta = checked
        window = await self._window()
        if not window.open:
            request = attrs.evolve(request, stage=True)  # staging may happen any time; the switch may not
        started = waiting_status(op.operation, self._wall())
        if not await self._publish(op, started):
            return "skipped"  # never run what could not be reported as started
        what = "stage" if request.stage else "upgrade"
        log(f"operator: {op.name}: {what} {op.operation} from {request.source_redacted}")
        return await self._run_flow(op, lambda: self._upgrade_reporting(op, request, delta, started), window)

    async def _window(self) -> WindowVerdict:
        """:func:`~agent.session.window.window_now` in a worker thread: it runs ``systemd-analyze calendar``,
        which must not hold up the event loop (the operator's stop signals, the status publications)."""
        config, now = self.session.config, self._wall()
        return await anyio.to_thread.run_sync(lambda: window_now(config, now))

    async def _activate_staged(
        self, op: Operation, staged: OperationStatus
    ) -> Literal["done", "skipped", "wait", "window"]:
        """An operation staged outside its window: ``Waiting`` while the window is closed, then ``activate``
        (under a fresh operation id; the journal links it to ``op`` through the staging it switches to)."""
        window = await self._window()
        if not window.open:
            waiting = window_waiting_status(op.operation, window.opens_at, self._wall(), staged)
            await self._publish(op, waiting)
            return "window"
        current = self.session.view().staged
        if current is None or current.operation != op.operation:
            why = "its staged candidate was replaced, switched to or changed before its maintenance window"
            reported = await self._publish(op, refused_status(op.operation, why, self._wall()))
            return "done" if reported else "skipped"
        activation = self.session.activate_operation(None)
        if not await self._publish(op, attrs.evolve(staged, step=None)):
            return "skipped"
        log(f"operator: {op.name}: activate {activation}: the candidate {op.operation} staged")
        return await self._run_flow(op, lambda: self.session.activate(activation), window)

    async def _run_flow(
        self, op: Operation, flow: Callable[[], Awaitable[object]], window: WindowVerdict
    ) -> Literal["done", "skipped", "wait", "window"]:
        """Run ``op``'s episode (``flow``) under the stop rules, then publish its status: terminal, or
        ``Waiting`` when it was staged for a closed window."""
        try:
            with self._scope() as scope:  # a stop during the InProgress publication aborts it at once
                self._op_scope = scope
                await flow()
        except LockBusyError as exc:
            self._errors += 1
            log(f"operator: {op.name}: {exc}; trying again later")
            return "wait"
        except EpisodeLeftOpenError as exc:
            log(f"operator: {op.name}: {exc}; recovering")
            await self._recover_open_episode()
        except JournalError:
            raise
        except (HostError, UpgradeError) as exc:
            if operation_status(self.session.view(), op.operation) is None:
                # refused before any episode opened (not installed, a layout conflict, state paths not
                # ours): the host is untouched and the operation cannot run as the host stands
                await self._publish(op, refused_status(op.operation, str(exc), self._wall()))
                return "done"
            raise
        finally:
            self._op_scope = None
        status = operation_status(self.session.view(), op.operation)
        if status is not None and status.terminal:
            await self._publish(op, status)  # a failure here is retried by the next pass's gate
        elif status is not None and status.step == "Staged":
            waiting = window_waiting_status(op.operation, window.opens_at, self._wall(), status)
            await self._publish(op, waiting)
            return "window"
        return "done"

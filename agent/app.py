"""The command implementations behind :mod:`agent.cli` (SPEC 7).

Each ``cmd_*`` takes the parsed arguments and returns an :class:`Outcome`: the JSON payload (the shapes
SPEC 7 pins), a human summary, and the exit code. Errors are raised, and :func:`describe_error` maps them
to one line and an exit code in one place.

Readers (``status``, ``history``, ``journal verify|dump``, ``units``, ``host-root``) never write and never
create ``state_dir`` or the lock. Writers take the host lock, non-blocking, and hold it until their
episode closes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import attrs

from agent.config import AgentConfig, discover_config_path, load_config
from agent.host import AgentHost
from upgrade_core import EVENT_CODEC, Slot, UpgradeResult, other_slot
from upgrade_core.errors import (
    AlreadyInstalledError,
    EpisodeLeftOpenError,
    Interrupted,
    NotInstalledError,
    UpgradeError,
    UsageError,
)
from upgrade_core.ports import ArchiveSource, UnitSnapshot

RESULT_EXIT = {"committed": 0, "noop": 0, "rolled_back": 1, "aborted": 1, "needs_attention": 3}


@attrs.frozen
class Outcome:
    """What a command prints and returns.

    Attributes:
        payload: the one JSON object printed with ``--json``.
        human: the summary printed to stdout without ``--json``.
        exit_code: the process exit status (SPEC 7).
        stderr: an extra line for stderr (e.g. the reason of a rollback), or None.
    """

    payload: dict[str, Any]
    human: str | None
    exit_code: int = 0
    stderr: str | None = None


# -- errors -------------------------------------------------------------------------------------------
def describe_error(exc: BaseException) -> tuple[int | None, str]:
    """Map an exception to ``(exit code, one line)``; ``(None, ...)`` for an unexpected bug (re-raised).

    Journal errors (corrupt, newer version, poisoned, undecodable) exit 3 naming file and offset.
    """
    from journal import JournalError

    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, UpgradeError):
        return exc.exit_code, str(exc)
    if isinstance(exc, JournalError):
        return 3, str(exc)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return 1, f"{where}{exc.strerror or exc}"
    return None, repr(exc)


# -- helpers ------------------------------------------------------------------------------------------
def _load(args: argparse.Namespace) -> tuple[AgentConfig, str]:
    path = discover_config_path(args.config)
    return load_config(path), os.path.abspath(path)


def _log(message: str) -> None:
    sys.stderr.write(f"upgrade-agent: {message}\n")
    sys.stderr.flush()


def _result_payload(result: UpgradeResult) -> dict[str, Any]:
    return {
        "operation": result.operation,
        "result": result.result,
        "from_version": result.from_version,
        "to_version": result.to_version,
        "slot": result.slot,
        "reason": result.reason,
    }


def _result_outcome(result: UpgradeResult) -> Outcome:
    words: list[str] = [result.result]
    if result.from_version or result.to_version:
        words.append(f"{result.from_version or '?'} -> {result.to_version or '?'}")
    if result.slot:
        words.append(f"(current: {result.slot})")
    human = f"{result.operation or '-'}: {' '.join(words)}"
    if result.reason:
        human += f"\nreason: {result.reason}"
    return Outcome(_result_payload(result), human, RESULT_EXIT[result.result])


def _rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _event_logger(verbose: bool) -> Callable[[Any], None]:
    def log(record: Any) -> None:
        if not verbose:
            return
        event = record.event
        fields = attrs.asdict(event, recurse=False) if attrs.has(type(event)) else {}
        shown = {k: v for k, v in fields.items() if k != "result" and v not in (None, ())}
        detail = " ".join(f"{k}={v}" for k, v in shown.items())
        _log(f"[{record.episode_id[:8]}] {type(event).TAG} {detail}".rstrip())

    return log


# -- progress -----------------------------------------------------------------------------------------
class _Progress:
    """A rich progress bar on a terminal, periodic log lines otherwise (SPEC 7); all on stderr."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._bar: Any = None
        self._task: Any = None
        self._last_log = 0.0
        self._tty = sys.stderr.isatty()

    def __enter__(self) -> _Progress:
        if self._tty:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def __call__(self, done: int, total: int | None) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)
            return
        import time

        now = time.monotonic()
        if now - self._last_log >= 5.0 or (total is not None and done >= total):
            self._last_log = now
            of = f" of {total}" if total else ""
            _log(f"{self.label}: {done}{of} bytes")


# -- signals ------------------------------------------------------------------------------------------
async def _run_with_signals(
    flow: Callable[[], Awaitable[UpgradeResult]],
    switch_started: Callable[[], bool],
    handed_off: Callable[[], bool],
    last_result: Callable[[], UpgradeResult | None],
    json_mode: bool,
) -> UpgradeResult:
    """Run ``flow`` under SPEC 4.3 step 10: SIGINT/SIGTERM before ``switch intended`` cancels it (the
    orchestrator aborts, publishes ``aborted`` and closes; exit 1); after it, the flow carries on to a
    terminal state; a second signal exits 130 at once, leaving the episode to ``recover``.

    Raises:
        Interrupted: cancelled, but no published result could be found (exit 130).
    """
    result: list[UpgradeResult] = []

    async def watch(scope: anyio.CancelScope) -> None:
        count = 0
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                count += 1
                name = signal.Signals(signum).name
                if count >= 2:
                    owner = (
                        "the handed-off recovery unit finishes the episode"
                        if handed_off()
                        else "run recover-agent-upgrade to finish the episode"
                    )
                    _stop_now(f"{name} again: stopping now; {owner}", json_mode)
                if switch_started():
                    _log(f"{name}: the switch has started; carrying on to a terminal state (again: stop now)")
                else:
                    _log(f"{name}: aborting before the switch")
                    scope.cancel()

    try:
        async with anyio.create_task_group() as tg:
            flow_scope = anyio.CancelScope()
            tg.start_soon(watch, flow_scope)
            with flow_scope:
                result.append(await flow())
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The task group wraps the flow's own error; the CLI maps that error, not the group (one line, its
        # documented exit code). Only the flow can fail here: the watcher never raises.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        _defer_late_signals(json_mode)
    if result:
        return result[0]
    aborted = last_result()
    if aborted is None:
        raise Interrupted("interrupted before the switch")
    return aborted


def _stop_now(message: str, json_mode: bool) -> None:
    """The second signal (SPEC 4.3 step 10): one line, the one JSON object, exit 130 at once."""
    _log(message)
    if json_mode:
        sys.stdout.write(json.dumps({"error": message, "exit_code": 130}) + "\n")
        sys.stdout.flush()
    os._exit(130)


def _defer_late_signals(json_mode: bool) -> None:
    """After the flow: the episode has reached its terminal state, so a first SIGINT/SIGTERM must not turn
    a finished ``committed`` into a killed process (exit 143) before its one JSON object is printed; it is
    noted and the command finishes. A second one still exits 130 at once (SPEC 4.3 step 10, SPEC 7)."""
    count = [0]

    def late(signum: int, _frame: object) -> None:
        count[0] += 1
        name = signal.Signals(signum).name
        if count[0] == 1:
            _log(f"{name}: the episode has reached its terminal state; finishing (again: stop now)")
            return
        _stop_now(f"{name} again: stopping now", json_mode)

    signal.signal(signal.SIGINT, late)
    signal.signal(signal.SIGTERM, late)


# -- commands that write ------------------------------------------------------------------------------
def _operation_id(value: str | None) -> str:
    from upgrade_core import OPERATION_ID_RE

    if value is not None and not OPERATION_ID_RE.fullmatch(value):
        raise UsageError(f"--operation {value!r} must match {OPERATION_ID_RE.pattern}")
    return value if value is not None else uuid.uuid4().hex


async def _episode(
    cfg: AgentConfig,
    config_path: str,
    json_mode: bool,
    run: Callable[[Any], Awaitable[UpgradeResult]],
    lock: Any,
    *,
    label: str = "download",
    source_override: ArchiveSource | None = None,
) -> UpgradeResult:
    """Open the journal and ports (``lock`` held by the caller), run ``run(wired)``, then seal best effort."""
    from agent.wiring import wire

    with _Progress(label) as progress:
        wired = await wire(
            cfg,
            config_path,
            progress=progress,
            on_event=_event_logger(True),
            source_override=source_override,
            lock=lock,
        )
        try:
            switch_seen = _switch_probe(wired)
            records_before = len(wired.journal.records())
            try:
                result = await _run_with_signals(
                    lambda: run(wired),
                    switch_seen,
                    lambda: wired.journal.relinquished,
                    lambda: _last_published(wired.journal.records()[records_before:]),
                    json_mode,
                )
            except UpgradeError as exc:
                if exc.exit_code == 1 and switch_seen():
                    # SPEC 7 keeps exit 1 for "the host runs its previous good binary"; past the switch
                    # that is not known, so the episode is left to recovery and the exit says so.
                    raise EpisodeLeftOpenError(
                        f"{exc}; the episode is left open after its switch: run recover-agent-upgrade"
                    ) from None
                raise
            await _seal(wired)
        finally:
            with anyio.CancelScope(shield=True):
                await wired.journal.writer.aclose()
    return result


def _last_published(records: Any) -> UpgradeResult | None:
    """The result of the newest ``ResultPublished`` among ``records`` (this run's appends only), if any."""
    from upgrade_core import ResultPublished

    for record in reversed(records):
        if isinstance(record.event, ResultPublished):
            result: UpgradeResult = record.event.result
            return result
    return None


def _switch_probe(wired: Any) -> Callable[[], bool]:
    def seen() -> bool:
        from upgrade_core import SwitchIntended

        records = wired.journal.records()
        last_open = None
        for rec in reversed(records):
            if isinstance(rec.event, SwitchIntended):
                last_open = rec
                break
        if last_open is None:
            return False
        from upgrade_core import fold

        ep = fold(records).open_episode
        return ep is not None and ep.episode_id == last_open.episode_id

    return seen


async def _seal(wired: Any) -> None:
    """Best effort after a close: seal the live segment and keep ``journal.keep_episodes`` (SPEC 5)."""
    from upgrade_core import fold, summarize_history

    if wired.journal.relinquished:  # a handed-off recovery unit owns the journal now
        return
    view = fold(wired.journal.records())

    def is_closed(episode_id: str) -> bool:
        ep = view.episodes.get(episode_id)
        return ep is None or not ep.is_open

    try:
        await wired.journal.writer.compact(wired.policy.keep_episodes, is_closed, summarize_history)
    except Exception as exc:  # sealing is best effort; the episode is already closed and published
        _log(f"journal compaction skipped: {exc}")


def cmd_upgrade(args: argparse.Namespace) -> Outcome:
    """``upgrade`` (SPEC 4.3) and ``upgrade --preflight``.

    Raises:
        ConfigError, UsageError: bad configuration, ``--sha256`` or ``--operation`` (exit 2).
        NotInstalledError: no ``current`` link (exit 2).
        LockBusyError: another process holds the host lock (exit 75).
        EpisodeLeftOpenError: a failure after ``switch intended`` (exit 3; ``recover`` finishes it).
        JournalDurabilityError, journal.JournalError: the journal cannot be trusted or written (exit 3).
    """
    from agent.fetch import parse_sha256
    from agent.lock import HostLock
    from agent.redact import redact_url
    from upgrade_core import UpgradeRequest, run_upgrade

    cfg, config_path = _load(args)
    host = AgentHost.from_config(cfg)
    sha = parse_sha256(args.sha256)
    request = UpgradeRequest(
        operation=_operation_id(args.operation),
        source=args.archive,
        source_redacted=redact_url(args.archive),
        expected_sha256=sha,
        expected_version=args.expect_version,
    )
    if args.preflight:
        return _preflight(cfg, host, request)
    host.links()  # LayoutConflictError (exit 2) for a real file or directory where a link must be
    if not host.is_installed():
        raise NotInstalledError(f"{host.current_link_path()}: not installed; run `upgrade-agent install`")
    with HostLock(cfg.host.lock_path) as lock:
        _log(f"upgrade {request.operation}: {request.source_redacted}")
        result = anyio.run(
            _episode, cfg, config_path, args.json, lambda w: run_upgrade(w.ports, w.policy, request), lock
        )
    return _result_outcome(result)


def _preflight(cfg: AgentConfig, host: AgentHost, request: Any) -> Outcome:
    """No fetch, no directories, no lock file created; prints the plan (SPEC 7)."""
    from agent.lock import probe_lock
    from agent.wiring import journal_dir
    from journal import replay
    from upgrade_core import fold

    if not host.is_installed():
        raise NotInstalledError(f"{host.current_link_path()}: not installed; run `upgrade-agent install`")
    links = host.links()
    assert links.current is not None
    inactive = other_slot(links.current)
    lock = probe_lock(cfg.host.lock_path)
    view = fold(replay(journal_dir(cfg), EVENT_CODEC).records)
    open_ep = view.open_episode.episode_id if view.open_episode else None
    plan = []
    if open_ep is not None:
        plan.append(f"recover the open episode {open_ep} first")
    prior = view.result_of(request.operation)
    if prior is not None:
        plan.append(f"operation {request.operation} already closed as {prior.result}: print it, do nothing")
    else:
        plan += [
            f"fetch {request.source_redacted}" + (" and check its sha256" if request.expected_sha256 else ""),
            f"extract {cfg.agent.member} into a staging file for the inactive slot {inactive}",
            "run its version command"
            + (f", expect {request.expected_version}" if request.expected_version else ""),
            f"switch current from {links.current} to {inactive} (last-good stays {links.current})",
            f"restart {cfg.agent.unit} through a transient unit and health-check it "
            f"({cfg.health.max_attempts} attempts, {cfg.health.stability_s} s stable)",
            "commit, or roll back to last-good",
        ]
    payload = {
        "preflight": True,
        "plan": plan,
        "inactive_slot": inactive,
        "lock": lock,
        "open_episode": open_ep,
    }
    code = 75 if lock == "busy" else 0
    return Outcome(payload, "\n".join(f"- {p}" for p in plan) + f"\nlock: {lock}", code)


def cmd_recover(args: argparse.Namespace) -> Outcome:
    """``recover`` (SPEC 4.5): exit 0 whenever it leaves no open episode.

    Raises:
        LockBusyError: the holder owns the episode (exit 75, at once).
        HistoryError, journal.JournalError: the journal is corrupt in the middle; links untouched (exit 3).
    """
    from agent.lock import HostLock
    from upgrade_core import recover

    cfg, config_path = _load(args)
    with HostLock(cfg.host.lock_path) as lock:
        result = anyio.run(
            _episode, cfg, config_path, args.json, lambda w: _recover(w, recover, args.trigger), lock
        )
    if result.operation is not None and result.reason == _HANDED_OFF:
        payload = {**_result_payload(result), "handed_off": True}
        return Outcome(payload, f"{result.operation}: health check handed to a transient unit", 0)
    # SPEC 7: recover exits 0 whenever it leaves no open episode, whatever the result it published.
    return attrs.evolve(_result_outcome(result), exit_code=0)


_HANDED_OFF = "boot recovery handed the health check to a transient unit, which owns the episode now"


async def _recover(wired: Any, recover: Any, trigger: str) -> UpgradeResult:
    from upgrade_core import HandedOff

    result = await recover(wired.ports, wired.policy, trigger)
    if isinstance(result, HandedOff):  # boot: a transient unit owns the episode now
        return UpgradeResult(result.operation, "noop", reason=_HANDED_OFF)
    assert isinstance(result, UpgradeResult)
    return result


def cmd_install(args: argparse.Namespace) -> Outcome:
    """``install`` (SPEC 7): bare host -> blue, links, units, start, health; adoption without --archive.

    A failed install (any result but committed/noop, or an error) removes the units and layout it made;
    the journal keeps the episode.

    Raises:
        ConfigError, UsageError: bad configuration or arguments; nothing to adopt (exit 2).
        AlreadyInstalledError: installed with a different binary (exit 2).
        LockBusyError: the host lock is held (exit 75).
    """
    from agent.fetch import parse_sha256
    from agent.lock import HostLock
    from agent.redact import redact_url
    from upgrade_core import UpgradeRequest

    cfg, config_path = _load(args)
    host = AgentHost.from_config(cfg)
    sha = parse_sha256(args.sha256)
    op = uuid.uuid4().hex
    if args.archive is None:
        found = host.find_adoptable()
        if found is None:
            if host.is_installed():
                return _result_outcome(UpgradeResult(None, "noop", slot=host.links().current))
            raise UsageError(
                f"nothing to adopt at {host.layout.bin_link} or under host.legacy_root; pass --archive"
            )
        source, source_override = found.source, _PlainFileSource()
    else:
        found, source, source_override = None, args.archive, None
    request = UpgradeRequest(op, source, redact_url(source), sha, args.expect_version)
    if not host.is_installed() and not (found is not None and found.kind == "legacy_layout"):
        host.check_bare()  # before the lock file too: a refusal leaves the host untouched
    with HostLock(cfg.host.lock_path) as lock:
        if found is not None and found.kind == "legacy_layout":
            host.adopt()
            return anyio.run(_install_units_only, cfg, config_path, host)
        if host.is_installed():
            return anyio.run(_install_again, cfg, config_path, host, request)
        host.check_bare()
        host.create_layout_dirs()
        done = False
        try:
            result = anyio.run(
                functools.partial(
                    _episode,
                    cfg,
                    config_path,
                    args.json,
                    lambda w: _install_flow(w, cfg, config_path, request),
                    lock,
                    source_override=source_override,
                )
            )
            done = result.result in ("committed", "noop")
        finally:
            if not done:  # SPEC 7: a failed install removes what it created (the journal keeps the episode)
                anyio.run(_undo_install, cfg, config_path, host)
    return _result_outcome(result)


async def _install_units(service: Any, cfg: AgentConfig, config_path: str, host: AgentHost) -> None:
    """Write the three units, daemon-reload, enable the agent and the boot-time recovery unit."""
    from agent.systemd import recover_boot_unit_name

    await service.write_units(_render_units(cfg, config_path, host))
    await service.daemon_reload()
    await service.enable(cfg.agent.unit, recover_boot_unit_name(cfg.agent.name))


async def _install_flow(wired: Any, cfg: AgentConfig, config_path: str, request: Any) -> UpgradeResult:
    from upgrade_core import run_install

    await _install_units(wired.ports.service, cfg, config_path, wired.host)
    result: UpgradeResult = await run_install(wired.ports, wired.policy, request)
    if result.result == "committed":
        wired.host.ensure_compat_link()
    return result


async def _install_again(cfg: AgentConfig, config_path: str, host: AgentHost, request: Any) -> Outcome:
    """Already installed: same member digest as ``current`` -> noop; else exit 2 (SPEC 7)."""
    from agent.wiring import wire

    wired = await wire(cfg, config_path)
    try:
        current = host.links().current
        assert current is not None
        inactive = other_slot(current)
        path = await host.prepare_staging(inactive)
        try:
            staged = await wired.ports.source.stage(request.source, request.expected_sha256, path, inactive)
        finally:
            await host.discard_staging(path)
        if staged.sha256 == await host.slot_sha256(current):
            return _result_outcome(UpgradeResult(None, "noop", slot=current))
    finally:
        await wired.journal.writer.aclose()
    raise AlreadyInstalledError(f"{host.current_link_path()}: already installed; use upgrade")


async def _install_units_only(cfg: AgentConfig, config_path: str, host: AgentHost) -> Outcome:
    from agent.wiring import service_manager

    service = service_manager(cfg, config_path)
    await _install_units(service, cfg, config_path, host)
    await service.start()
    current = host.links().current
    return _result_outcome(UpgradeResult(None, "noop", slot=current, reason="adopted legacy layout"))


async def _undo_install(cfg: AgentConfig, config_path: str, host: AgentHost) -> None:
    """A failed install removes what it created: units, slots, links; the journal keeps the episode."""
    await _reset(cfg, config_path, host)
    host.remove_layout()


class _PlainFileSource:
    """An :class:`~upgrade_core.ports.ArchiveSource` for adoption: the "archive" is a plain executable."""

    async def stage(self, source: str, expected_sha256: str | None, staging_path: str, slot: Any) -> Any:
        """Copy ``source`` into ``staging_path`` durably (its digest checked during the copy)."""
        from agent import durable
        from upgrade_core.ports import StagedCandidate

        def copy() -> tuple[str, int]:
            durable.copy_file_durable(source, staging_path, 0o755)
            return durable.file_sha256(staging_path), os.stat(staging_path).st_size

        sha, size = await anyio.to_thread.run_sync(copy)
        return StagedCandidate(slot, staging_path, sha, size, sha, size)


# -- readers ------------------------------------------------------------------------------------------
def _render_units(cfg: AgentConfig, config_path: str, host: AgentHost) -> dict[str, str]:
    from agent.systemd import render_units
    from agent.wiring import recover_executable

    return render_units(
        name=cfg.agent.name,
        unit=cfg.agent.unit,
        current_link=host.current_link_path(),
        exec_args=cfg.agent.exec_args,
        max_attempts=cfg.health.max_attempts,
        recover_exe=recover_executable(),
        config_path=config_path,
    )


def cmd_units(args: argparse.Namespace) -> Outcome:
    """``units``: the three rendered unit files."""
    cfg, config_path = _load(args)
    units = _render_units(cfg, config_path, AgentHost.from_config(cfg))
    human = "\n".join(f"# {name}\n{text}" for name, text in units.items())
    return Outcome({"units": units}, human)


def cmd_host_root(args: argparse.Namespace) -> Outcome:
    """``host-root``: the resolved host root; changes nothing."""
    cfg, _ = _load(args)
    root = AgentHost.from_config(cfg).host_root()
    return Outcome({"host_root": root}, root)


def _read_view(cfg: AgentConfig) -> Any:
    from agent.wiring import journal_dir
    from journal import replay
    from upgrade_core import fold

    return fold(replay(journal_dir(cfg), EVENT_CODEC).records)


def cmd_status(args: argparse.Namespace) -> Outcome:
    """``status``: from the journal and the links; never runs binaries (SPEC 7)."""
    cfg, config_path = _load(args)
    host = AgentHost.from_config(cfg)
    view = _read_view(cfg)
    links = host.links()

    async def gather() -> tuple[dict[Slot, str | None], UnitSnapshot | None]:
        """Each slot hashed once (current and last-good often name the same one), then the unit."""
        from agent.wiring import service_manager

        digests = {slot: await host.slot_sha256(slot) for slot in {links.current, links.last_good} if slot}
        try:
            return digests, await service_manager(cfg, config_path).snapshot()
        except UpgradeError as exc:
            _log(f"service state unavailable: {exc}")
            return digests, None

    digests, snap = anyio.run(gather)

    def slot_info(slot: Any) -> dict[str, Any] | None:
        if slot is None:
            return None
        return {
            "slot": slot,
            "path": host.slot_path(slot),
            "sha256": digests[slot],
            "version": view.slot_versions.get(slot),
        }

    service: dict[str, Any] = {"active_state": None, "sub_state": None, "main_pid": None, "exe": None}
    if snap is not None:
        service = {
            "active_state": snap.active_state,
            "sub_state": snap.sub_state,
            "main_pid": snap.main_pid or None,
            "exe": snap.exe,
        }
    ep = view.open_episode
    payload: dict[str, Any] = {
        "agent": cfg.agent.name,
        "current": slot_info(links.current),
        "last_good": slot_info(links.last_good),
        "service": service,
        "episode": None if ep is None else {"operation": ep.episode_id, "state": ep.state.value},
    }
    lines = [f"agent: {cfg.agent.name}"]
    for key in ("current", "last_good"):
        info: dict[str, Any] | None = payload[key]
        described = "none" if info is None else f"{info['slot']} {info['version'] or '?'} {info['sha256']}"
        lines.append(f"{key}: {described}")
    lines.append(f"service: {service['active_state']}/{service['sub_state']} pid {service['main_pid']}")
    lines.append("episode: " + ("none" if ep is None else f"{ep.episode_id} ({ep.state.value})"))
    return Outcome(payload, "\n".join(lines))


def cmd_history(args: argparse.Namespace) -> Outcome:
    """``history``: episodes newest first, RFC 3339 UTC times."""
    cfg, _ = _load(args)
    view = _read_view(cfg)
    rows: list[dict[str, Any]] = []
    for summary in view.history:
        r = summary.result
        rows.append(
            {
                "operation": summary.operation,
                "result": r.result,
                "from_version": r.from_version,
                "to_version": r.to_version,
                "opened_at": _rfc3339(summary.opened_at),
                "closed_at": _rfc3339(summary.closed_at),
            }
        )
    for ep in view.episodes.values():
        r = ep.published or ep.terminal_result
        rows.append(
            {
                "operation": ep.episode_id,
                "result": r.result if r else None,
                "from_version": r.from_version if r else ep.from_version,
                "to_version": r.to_version if r else ep.candidate_version,
                "opened_at": _rfc3339(ep.opened_at),
                "closed_at": _rfc3339(ep.closed_at),
            }
        )
    rows.reverse()
    human = "\n".join(
        f"{r['opened_at']}  {r['operation']:<32}  {r['result'] or 'open':<15} "
        f"{r['from_version'] or '?'} -> {r['to_version'] or '?'}"
        for r in rows
    )
    return Outcome({"episodes": rows}, human or "no episodes")


def cmd_journal(args: argparse.Namespace) -> Outcome:
    """``journal verify|dump|compact``."""
    from agent.wiring import journal_dir
    from journal import JournalCorruptError, replay

    cfg, config_path = _load(args)
    directory = journal_dir(cfg)
    if args.action == "compact":
        from agent.lock import HostLock

        with HostLock(cfg.host.lock_path):
            return anyio.run(_compact, cfg, config_path)
    if args.action == "verify":
        try:
            rep = replay(directory, EVENT_CODEC)
        except JournalCorruptError as exc:
            payload: dict[str, Any] = {
                "ok": False,
                "records": None,
                "torn_tail": None,
                "corrupt": {"file": exc.path, "offset": exc.offset},
            }
            return Outcome(payload, f"corrupt: {exc}", 3, stderr=f"upgrade-agent: {exc}")
        torn = None if rep.torn_tail is None else {"file": rep.torn_tail.file, "offset": rep.torn_tail.offset}
        payload = {"ok": True, "records": len(rep.records), "torn_tail": torn, "corrupt": None}
        human = f"ok: {len(rep.records)} records" + (
            f"; torn tail at {torn['file']}:{torn['offset']} (repaired by the next writer)" if torn else ""
        )
        return Outcome(payload, human)
    rep = replay(directory, EVENT_CODEC)
    from upgrade_core.codec import to_dict

    records: list[dict[str, Any]] = [
        {
            "seq": r.seq,
            "episode": r.episode_id,
            "time": _rfc3339(r.wall_time),
            "event": to_dict(r.event),
        }
        for r in rep.records
    ]
    human = "\n".join(
        f"{r['seq']:>6} {r['time']} {r['episode'][:12]:<12} {r['event']['_type']} "
        + " ".join(f"{k}={v}" for k, v in r["event"].items() if k != "_type")
        for r in records
    )
    return Outcome({"records": records}, human or "empty journal")


async def _compact(cfg: AgentConfig, config_path: str) -> Outcome:
    from agent.wiring import wire

    wired = await wire(cfg, config_path)
    try:
        await _seal(wired)
        count = len(wired.journal.records())
    finally:
        await wired.journal.writer.aclose()
    return Outcome({"compacted": True, "records": count}, f"compacted; {count} records remain")


# -- removal ------------------------------------------------------------------------------------------
async def _reset(cfg: AgentConfig, config_path: str, host: AgentHost) -> list[str]:
    from agent.wiring import service_manager

    service = service_manager(cfg, config_path)
    names = list(_render_units(cfg, config_path, host))
    for unit in names:
        try:
            await service.stop(unit)
        except UpgradeError as exc:
            _log(f"stop {unit}: {exc}")
    try:
        await service.disable(*names)
    except UpgradeError as exc:
        _log(f"disable: {exc}")
    removed: list[str] = await service.remove_units(names)
    await service.daemon_reload()
    return removed


def cmd_reset(args: argparse.Namespace) -> Outcome:
    """``reset``: stop, disable and remove the three units, daemon-reload."""
    from agent.lock import HostLock

    cfg, config_path = _load(args)
    host = AgentHost.from_config(cfg)
    with HostLock(cfg.host.lock_path):
        removed = anyio.run(_reset, cfg, config_path, host)
    return Outcome({"removed": removed}, "\n".join(f"removed {p}" for p in removed) or "nothing to remove")


def _refuse_read_only(*paths: str) -> None:
    """Refuse, before stopping anything, to uninstall from a read-only mount (C14 rescue views).

    Raises:
        HostError: the nearest existing ancestor of one of ``paths`` is on a read-only mount (exit 1).
    """
    from upgrade_core.errors import HostError

    for path in paths:
        probe = path
        while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        if os.statvfs(probe).f_flag & os.ST_RDONLY:
            raise HostError(f"{path}: on a read-only mount; nothing was stopped or removed")


def cmd_uninstall(args: argparse.Namespace) -> Outcome:
    """``uninstall``: reset, then the layout, ``state_dir`` and the lock; never the legacy root or config."""
    import shutil

    from agent import durable
    from agent.lock import HostLock

    cfg, config_path = _load(args)
    host = AgentHost.from_config(cfg)
    _refuse_read_only(host.layout.agent_dir, cfg.host.state_dir)
    lock = HostLock(cfg.host.lock_path)
    with lock:
        removed = anyio.run(_reset, cfg, config_path, host)
        removed += host.remove_layout()
        if os.path.lexists(cfg.host.state_dir):
            shutil.rmtree(cfg.host.state_dir)
            removed.append(cfg.host.state_dir)
    if durable.remove_if_present(cfg.host.lock_path):
        removed.append(cfg.host.lock_path)
    return Outcome({"removed": removed}, "\n".join(f"removed {p}" for p in removed) or "nothing to remove")


def cmd_demo(args: argparse.Namespace) -> Outcome:
    """``demo``: see :mod:`agent.demo`."""
    from agent import demo

    code = demo.run()
    return Outcome({"demo": code == 0}, None, code)


COMMANDS: dict[str, Callable[[argparse.Namespace], Outcome]] = {
    "install": cmd_install,
    "upgrade": cmd_upgrade,
    "recover": cmd_recover,
    "status": cmd_status,
    "history": cmd_history,
    "journal": cmd_journal,
    "units": cmd_units,
    "host-root": cmd_host_root,
    "reset": cmd_reset,
    "uninstall": cmd_uninstall,
    "demo": cmd_demo,
}


def run_command(args: argparse.Namespace) -> Outcome:
    """Dispatch ``args.command`` to its implementation."""
    return COMMANDS[args.command](args)

"""The frame of a writing command: wire the ports under the held lock, run the flow under the signal
rules, map a failure past the switch, close the journal, and seal it best effort."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from agent.commands.common import log
from agent.commands.progress import Progress, event_logger
from agent.commands.signals import run_with_signals
from agent.config import AgentConfig
from upgrade_core import UpgradeResult
from upgrade_core.errors import EpisodeLeftOpenError, UpgradeError
from upgrade_core.ports import ArchiveSource


def operation_id(value: str | None) -> str:
    return value if value is not None else uuid.uuid4().hex


async def run_episode(
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

    with Progress(label) as progress:
        wired = await wire(
            cfg,
            config_path,
            progress=progress,
            on_event=event_logger(True),
            source_override=source_override,
            lock=lock,
        )
        try:
            switch_seen = _switch_probe(wired)
            records_before = len(wired.journal.records())
            try:
                result = await run_with_signals(
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
            await seal(wired)
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


async def seal(wired: Any) -> None:
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
        log(f"journal compaction skipped: {exc}")

"""SIGINT/SIGTERM during a writing command (design §4.3 step 10, design §7)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import anyio

from agent.groups import sole_error
from agent.logline import log
from upgrade_core import UpgradeResult
from upgrade_core.errors import Interrupted

T = TypeVar("T")


class EpisodeWatch(Protocol):
    """What the signal rules read from the running session (:class:`agent.session.session.Session` has all
    three)."""

    @property
    def switch_started(self) -> bool: ...  # the open episode passed ``SwitchIntended``

    @property
    def handed_off(self) -> bool: ...  # a transient unit owns the episode now

    @property
    def last_published(self) -> UpgradeResult | None: ...  # e.g. ``aborted`` after a cancellation

# SIGHUP is an operator's ssh session dropping: handled as SIGTERM is (case C26).
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


async def run_with_signals(
    session: EpisodeWatch, flow: Callable[[], Awaitable[T]], json_mode: bool
) -> T | UpgradeResult:
    """Run ``flow`` (one of ``session``'s writing methods) under design §4.3 step 10.

    SIGINT, SIGTERM or SIGHUP before ``switch intended`` cancels it (the orchestrator aborts, publishes
    ``aborted`` and closes; that result is returned, exit 1); after it, the flow carries on to a terminal
    state; a second signal exits 130 at once, leaving the episode to ``recover``.

    Raises:
        Interrupted: cancelled, but no published result could be found (exit 130).
    """
    result: list[T] = []

    async def watch(scope: anyio.CancelScope) -> None:
        count = 0
        with anyio.open_signal_receiver(*_SIGNALS) as signals:
            async for signum in signals:
                count += 1
                name = signal.Signals(signum).name
                if count >= 2:
                    owner = (
                        "the handed-off recovery unit finishes the episode"
                        if session.handed_off
                        else "run recover-agent-upgrade to finish the episode"
                    )
                    _stop_now(f"{name} again: stopping now; {owner}", json_mode)
                if session.switch_started:
                    log(f"{name}: the switch has started; carrying on to a terminal state (again: stop now)")
                else:
                    log(f"{name}: aborting before the switch")
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
        error = sole_error(group)
        if error is group:
            raise
        raise error from None
    finally:
        _defer_late_signals(json_mode)
    if result:
        return result[0]
    aborted = session.last_published
    if aborted is None:
        raise Interrupted("interrupted before the switch")
    return aborted


def _stop_now(message: str, json_mode: bool) -> None:
    """The second signal (design §4.3 step 10): one line, the one JSON object, exit 130 at once."""
    log(message)
    if json_mode:
        sys.stdout.write(json.dumps({"error": message, "exit_code": 130}) + "\n")
        sys.stdout.flush()
    os._exit(130)


def _defer_late_signals(json_mode: bool) -> None:
    """After the flow: the episode has reached its terminal state, so a first SIGINT/SIGTERM must not turn
    a finished ``committed`` into a killed process (exit 143) before its one JSON object is printed; it is
    noted and the command finishes. A second one still exits 130 at once (design §4.3 step 10, design §7)."""
    count = [0]

    def late(signum: int, _frame: object) -> None:
        count[0] += 1
        name = signal.Signals(signum).name
        if count[0] == 1:
            log(f"{name}: the episode has reached its terminal state; finishing (again: stop now)")
            return
        _stop_now(f"{name} again: stopping now", json_mode)

    for signum in _SIGNALS:
        signal.signal(signum, late)

"""Errors raised inside a flow reach the CLI as themselves, never as a task group's ExceptionGroup (which
would print a traceback and exit 1): found by filling the state directory's disk during an upgrade."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from agent.cli.commands.signals import run_with_signals
from agent.errors import describe_error
from upgrade_core import UpgradeResult
from upgrade_core.errors import JournalDurabilityError, LockBusyError, NoSpaceError

pytestmark = pytest.mark.anyio


def _watch(*, switch_started: bool) -> SimpleNamespace:
    """What ``run_with_signals`` reads from a session: no hand-off, nothing published."""
    return SimpleNamespace(switch_started=switch_started, handed_off=False, last_published=None)


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Iterator[None]:
    """The wrapper leaves "late signal" handlers installed (the CLI process exits right after); restore
    pytest's own."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize("error", [NoSpaceError("state_dir: no space"), JournalDurabilityError("ENOSPC")])
async def test_a_flow_error_leaves_the_signal_wrapper_unwrapped(error: Exception) -> None:
    async def flow() -> UpgradeResult:
        raise error

    with pytest.raises(type(error)) as info:
        await run_with_signals(_watch(switch_started=False), flow, json_mode=False)
    assert info.value is error


def test_describe_error_looks_inside_a_single_error_group() -> None:
    assert describe_error(ExceptionGroup("tg", [LockBusyError("/run/x.lock: busy")])) == (
        75,
        "/run/x.lock: busy",
    )
    assert describe_error(ExceptionGroup("tg", [JournalDurabilityError("full")]))[0] == 3


async def test_a_signal_after_the_flow_finished_does_not_kill_the_command() -> None:
    """A first SIGTERM landing between the terminal state and the exit is noted, not fatal (exit 143
    would report a finished upgrade as killed)."""
    import os

    done = UpgradeResult("op", "committed")

    async def flow() -> UpgradeResult:
        return done

    assert await run_with_signals(_watch(switch_started=True), flow, json_mode=False) is done
    os.kill(os.getpid(), signal.SIGTERM)  # default disposition would end this process
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)

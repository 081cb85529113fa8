"""Errors raised inside a flow reach the CLI as themselves, never as a task group's ExceptionGroup (which
would print a traceback and exit 1): found by filling the state directory's disk during an upgrade."""

from __future__ import annotations

import pytest

from agent.app import _run_with_signals, describe_error
from upgrade_core import UpgradeResult
from upgrade_core.errors import JournalDurabilityError, LockBusyError, NoSpaceError

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("error", [NoSpaceError("state_dir: no space"), JournalDurabilityError("ENOSPC")])
async def test_a_flow_error_leaves_the_signal_wrapper_unwrapped(error: Exception) -> None:
    async def flow() -> UpgradeResult:
        raise error

    with pytest.raises(type(error)) as info:
        await _run_with_signals(flow, lambda: False, lambda: False, lambda: None, json_mode=False)
    assert info.value is error


def test_describe_error_looks_inside_a_single_error_group() -> None:
    assert describe_error(ExceptionGroup("tg", [LockBusyError("/run/x.lock: busy")])) == (
        75,
        "/run/x.lock: busy",
    )
    assert describe_error(ExceptionGroup("tg", [JournalDurabilityError("full")]))[0] == 3

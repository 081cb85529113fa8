"""The real :class:`upgrade_core.ports.Clock`: CLOCK_MONOTONIC for windows, wall time for display only."""

from __future__ import annotations

import time
from typing import final

import anyio

from agent.fs.regular import read_text
from upgrade_core.ports import Clock

__all__ = ["SystemClock", "read_boot_id"]


@final
class SystemClock:
    """``time.monotonic`` (the clock systemd's ``...Monotonic`` properties use), ``time.time``, anyio sleep.

    Windows and timeouts use :meth:`monotonic` only, so a wall-clock jump cannot shorten or stretch a
    health window (case C19).
    """

    def monotonic(self) -> float:
        """CLOCK_MONOTONIC in seconds."""
        return time.monotonic()

    def wall(self) -> float:
        """Unix time in seconds; informational, never used for ordering or windows."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of monotonic time (anyio). Cancellation: no effect."""
        await anyio.sleep(seconds)

    def boot_id(self) -> str | None:
        """The kernel's boot id (``/proc/sys/kernel/random/boot_id``, random(4)); None when unreadable."""
        return read_boot_id()


def read_boot_id() -> str | None:
    """This boot's id: ``/proc/sys/kernel/random/boot_id`` (random(4)) stripped, None when unreadable."""
    text = read_text("/proc/sys/kernel/random/boot_id", limit=64)
    return (text or "").strip() or None


def _is_a_clock(clock: SystemClock) -> Clock:
    """Static proof (mypy) that :class:`SystemClock` satisfies ``upgrade_core.ports.Clock``."""
    return clock

"""Progress on stderr: a rich bar on a terminal, periodic lines otherwise; the verbose event log."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import attrs

from agent.logline import log


def event_logger(verbose: bool) -> Callable[[Any], None]:
    def log_event(record: Any) -> None:
        if not verbose:
            return
        event = record.event
        fields = attrs.asdict(event, recurse=False) if attrs.has(type(event)) else {}
        shown = {k: v for k, v in fields.items() if k != "result" and v not in (None, ())}
        detail = " ".join(f"{k}={v}" for k, v in shown.items())
        log(f"[{record.episode_id[:8]}] {type(event).TAG} {detail}".rstrip())

    return log_event


class Progress:
    """A rich progress bar on a terminal, periodic log lines otherwise (design §7); all on stderr."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._bar: Any = None
        self._task: Any = None
        self._last_log = 0.0
        self._tty = sys.stderr.isatty()

    def __enter__(self) -> Progress:
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
            log(f"{self.label}: {done}{of} bytes")

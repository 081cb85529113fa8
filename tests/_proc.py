"""Process checks shared by the tests that prove a process group was killed (C10, probes, systemd)."""

from __future__ import annotations

import time
from pathlib import Path


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (``/proc/PID/stat`` state field)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_dead(pid: int, timeout_s: float = 5.0) -> bool:
    """Poll every 10 ms until ``pid`` is gone or a zombie; False if it still lives after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True

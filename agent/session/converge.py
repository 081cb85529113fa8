"""What ``status`` and ``upgrade --preflight`` add so that an operator (or the timer) knows how the host
converges (docs/cli.md): which unit files are missing or drifted, whether an open episode's upgrader is
still alive or abandoned it, and what to run next.

Readers only: nothing here takes the host lock, creates a file or writes. The lock holder is read from
``/proc/locks`` (the kernel's own table of flocks: holder pid, device and inode), so a ``status`` never
takes even a shared flock that could make a concurrent upgrade's non-blocking ``LOCK_EX`` fail; where
``/proc/locks`` cannot be read, a shared-flock probe (:func:`agent.host.lock.probe_lock`) says free or busy
and the pid comes from the holder record the lock holder writes into the lock file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from agent.fs.regular import read_regular_file, read_text
from agent.host.lock import probe_lock

__all__ = ["LockHolder", "UnitDrift", "lock_holder", "next_step", "unit_drift"]


@attrs.frozen
class LockHolder:
    """Who holds the host lock, as far as a reader can tell without taking it.

    Attributes:
        busy: True while a process holds the flock (a live upgrade, recovery or install).
        pid: the holder's pid (in this process's pid namespace when read from ``/proc/locks``), None when
            free or unknown.
    """

    busy: bool
    pid: int | None = None


def _from_proc_locks(path: str, proc_locks: str) -> LockHolder | None:
    """The holder of a flock on ``path`` per ``proc_locks`` (a ``/proc/locks`` file), None if unreadable."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return LockHolder(False)
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    text = read_text(proc_locks)
    if text is None:
        return None
    lines = text.splitlines()
    for line in lines:
        words = line.split()
        # "N: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF"; a blocked waiter has "->" after "N:".
        if len(words) < 6 or words[1] != "FLOCK" or words[5] != want:
            continue
        pid = int(words[4]) if words[4].isdigit() else 0
        return LockHolder(True, pid or None)
    return LockHolder(False)


def lock_holder(path: str, *, proc_locks: str = "/proc/locks") -> LockHolder:
    """Tell whether the host lock at ``path`` is held, and by which pid; creates and locks nothing.

    Raises:
        upgrade_core.errors.HostError: ``/proc/locks`` is unreadable and the lock file exists but cannot be
            opened or probed.
    """
    found = _from_proc_locks(path, proc_locks)
    if found is not None:
        return found
    if probe_lock(path) == "free":
        return LockHolder(False)
    text = (read_text(path, follow=False, limit=32) or "").strip()
    return LockHolder(True, int(text) if text.isdigit() else None)


@attrs.frozen
class UnitDrift:
    """The rendered unit files compared with ``unit_dir``.

    Attributes:
        missing: rendered file names absent from ``unit_dir``.
        drifted: rendered file names present with other contents (edited, or written by another version).
    """

    missing: tuple[str, ...]
    drifted: tuple[str, ...]


def unit_drift(unit_dir: str, units: Mapping[str, str]) -> UnitDrift:
    """Compare ``units`` (file name -> rendered text) with the files in ``unit_dir``; reads only.

    A file that cannot be read as UTF-8 text counts as drifted; a path that is not a regular file (a
    directory, a dangling link) counts as missing.
    """
    missing: list[str] = []
    drifted: list[str] = []
    for name, text in units.items():
        path = os.path.join(unit_dir, name)
        if not os.path.isfile(path):
            missing.append(name)
            continue
        try:
            same = read_regular_file(path).decode("utf-8") == text
        except (OSError, UnicodeDecodeError):
            same = False
        if not same:
            drifted.append(name)
    return UnitDrift(tuple(missing), tuple(drifted))


def next_step(
    *,
    installed: bool,
    episode: str | None,
    holder: LockHolder,
    drift: UnitDrift,
    timer: str,
) -> str | None:
    """The one thing to run next, or None when the host needs nothing.

    Order: a bare host needs ``install``; an open episode whose upgrader died needs ``recover`` (the timer
    would do it within its period); a live upgrade needs waiting; missing or drifted units need
    ``install`` (which repairs them on an installed host).

    Args:
        installed: ``current`` names a slot.
        episode: the open episode's operation id, or None.
        holder: :func:`lock_holder`.
        drift: :func:`unit_drift`.
        timer: ``NAME-recover.timer``, to name it.
    """
    if not installed:
        return "run upgrade-agent install"
    if episode is not None and not holder.busy:
        return (
            f"run recover-agent-upgrade: episode {episode} was abandoned by its upgrader "
            f"({timer} recovers it within its period if it is installed)"
        )
    if episode is not None:
        who = f" (pid {holder.pid})" if holder.pid else ""
        return f"wait: episode {episode} is still running{who}"
    if drift.missing or drift.drifted:
        which = ", ".join([*drift.missing, *drift.drifted])
        return f"run upgrade-agent install to restore the units ({which})"
    return None

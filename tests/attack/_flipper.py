"""The race attacker, run as its own process: ``python _flipper.py DIR_FD NAME [UID]``.

Swaps ``NAME`` and ``NAME.swap`` (a directory and a prepared symlink, both in the directory open as
``DIR_FD``) with ``renameat2(RENAME_EXCHANGE)`` until SIGTERM, then prints how many swaps succeeded. With
``UID`` it first drops to that uid (and its gid, no groups), keeping only the inherited descriptor.

Two triggers, so a check-then-use by path is caught whatever the machine's load:

- reacting: an inotify watch on the real directory; whenever the command touches it (opens, lists,
  creates, removes, renames in it) while it stands at ``NAME``, the symlink is swapped in at once and left
  there for 1 to 30 milliseconds, so the command's next steps by path land outside;
- wandering: from the first event on, between events, a swap after a random dwell (1 microsecond to 1
  millisecond, log-uniform), so any window between two steps has a fair chance of containing a swap.

It waits in ``select`` (never spins) at nice -10, so it wakes ahead of the command when the command touches
the directory, and leaves the machine's cores to everything else.

Standard library only (it must start fast and import nothing of the project). Prints ``ready`` once the
watch is in place.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import random
import select
import signal
import sys
import time

RENAME_EXCHANGE = 2
IN_TOUCHED = 0x000003FF  # access .. delete inside it; not its own move (our swaps) or removal
IN_CLOEXEC = 0o2000000


def main(argv: list[str]) -> int:
    fd, name = int(argv[1]), argv[2]
    swap = name + ".swap"
    os.nice(-10)  # ahead of the command in the scheduler (as root; before any drop)
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    watch = libc.inotify_init1(IN_CLOEXEC)
    if libc.inotify_add_watch(watch, f"/proc/self/fd/{fd}/{name}".encode(), IN_TOUCHED) < 0:
        return 2
    if len(argv) > 3:
        uid = int(argv[3])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    a, b = name.encode(), swap.encode()
    swapped = False  # True while the symlink stands at NAME
    count = reacted = 0
    rnd = random.Random()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    due = float("inf")  # still until the command first touches the directory: its check sees the real one
    while not stop:
        ready = select.select([watch], [], [], min(0.05, max(0.0, due - time.monotonic())))[0]
        touched = bool(ready) and bool(os.read(watch, 65536))
        if touched and swapped:
            continue  # already in place: let it stand its time
        if not touched and time.monotonic() < due:
            continue
        if libc.renameat2(fd, a, fd, b, RENAME_EXCHANGE) == 0:
            swapped = not swapped
            count += 1
            reacted += touched
        # after a reaction the symlink stays a while (1 to 30 ms): the command's next steps come soon
        due = time.monotonic() + 10 ** (rnd.uniform(-3, -1.5) if touched else rnd.uniform(-6, -3))
    sys.stdout.write(f"{reacted} {count}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Waiting for a change in one directory with inotify(7): the spool operator's idle wait (design §9
``operator.idle.spool``: no wake-up while nothing changes).

Through :mod:`ctypes` from the C library (``inotify_init1``, ``inotify_add_watch``; reading the events is
a plain ``read``), not a package: it is two calls of glibc, and the few well-kept wrappers
(``inotify_simple``, ``asyncinotify``) are the same ctypes calls behind an API this one wait does not need,
for one more dependency on every host.

inotify sees what the local kernel writes. On a network or user-space file system (NFS, CIFS, FUSE...) another
machine or process can change the directory without an event, so :meth:`DirectoryWatch.open` answers None
there (see :data:`WATCHABLE_FS`), as it does where inotify is unavailable (no such call, the watch or
instance limit reached: ``fs.inotify.max_user_watches``), and the caller polls as before.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import select

from agent.fs.mounts import fs_type_of, read_mounts

__all__ = ["WATCHABLE_FS", "DirectoryWatch", "fs_type"]

WATCHABLE_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "zfs", "bcachefs", "jfs",
                          "reiserfs", "vfat", "exfat", "overlay"})
"""Local file systems on which every write to a directory goes through this kernel, so inotify reports it."""

# <sys/inotify.h>: the events that change what a scan of the directory would read, and the watch flags
_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF = 0x400, 0x800
_IN_ONLYDIR, _IN_DONT_FOLLOW = 0x01000000, 0x02000000
_MASK = (_IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
         | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR | _IN_DONT_FOLLOW)
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC


def fs_type(path: str) -> str:
    """The file-system type of the mount holding ``path`` (resolved), from this process's mount table
    (:mod:`agent.fs.mounts`); "unknown" when it cannot be read."""
    return fs_type_of(os.path.realpath(path), read_mounts())


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library this process already has loaded, looked up once."""
    return ctypes.CDLL(None, use_errno=True)


class DirectoryWatch:
    """An inotify instance watching one directory (not following a symlink) for entries created, removed,
    renamed, written or changed in mode or owner, and for the directory itself being removed, renamed or
    changed. Close it with :meth:`close`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls, directory: str) -> DirectoryWatch | None:
        """A watch on ``directory``, or None where inotify cannot be trusted to see every change: not a
        :data:`WATCHABLE_FS` file system, no inotify, a limit reached, or ``directory`` not a directory (the
        caller's checked open words that)."""
        if fs_type(directory) not in WATCHABLE_FS:
            return None
        try:
            libc = _libc()
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(directory), ctypes.c_uint32(_MASK)) < 0:
            os.close(fd)
            return None
        return cls(fd)

    def wait(self, timeout_s: float, wake_fd: int) -> bool:
        """Block until the directory changes, ``wake_fd`` becomes readable, or ``timeout_s`` seconds pass.

        Returns:
            True when something happened (events are drained, not returned: the caller reads the directory
            again), False at the timeout.
        """
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(wake_fd, select.POLLIN)
        ready = poller.poll(max(0, int(timeout_s * 1000) + 1))
        if not ready:
            return False
        try:
            while os.read(self._fd, 65536):
                pass
        except BlockingIOError:
            pass
        except OSError as exc:  # pragma: no cover - an inotify read fails only on a bad buffer size
            if exc.errno != errno.EINTR:
                raise
        return True

    def close(self) -> None:
        """Release the inotify instance; idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

"""Two entries of one checked directory exchanged in one atomic rename: ``renameat2(RENAME_EXCHANGE)``
(rename(2), Linux 3.15; ext4, xfs, btrfs, tmpfs, ...), then the directory fsynced.

``host move`` needs it: a directory must take the place of a symbolic link without a moment in which neither
is there (a plain ``rename`` of a directory onto a link is ENOTDIR, and an unlink then rename leaves the path
missing in between, where a restart of the agent unit would fail to find its executable). Through
:mod:`ctypes` from the C library (glibc 2.28 has ``renameat2``), as :mod:`agent.fs.watch` reaches inotify:
one call of glibc; the standard library has no binding and the PyPI wrappers are the same one call.
"""

from __future__ import annotations

import ctypes
import errno
import os

from agent.fs.tree import Dir

__all__ = ["exchange"]

_RENAME_EXCHANGE = 2  # <linux/fs.h>


def exchange(d: Dir, a: str, b: str) -> None:
    """Exchange the entries ``a`` and ``b`` of ``d`` atomically (both must exist), then fsync ``d``.

    Raises:
        OSError: the kernel or file system refused (EINVAL: no exchange support; ENOENT: one is missing;
            ENOSYS: no ``renameat2``); nothing changed.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        call = libc.renameat2
    except AttributeError:
        raise OSError(errno.ENOSYS, "renameat2 is not available in this C library", d.join(a)) from None
    if call(d.fd, os.fsencode(d._name(a)), d.fd, os.fsencode(d._name(b)), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), d.join(a))
    d.fsync()

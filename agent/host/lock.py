"""The host lock (design §4.3 step 1, 4.6 invariant 7): one upgrade or recovery at a time on a host.

``flock(2)`` on ``lock_path``, exclusive and non-blocking. The kernel drops a flock when the last descriptor
of its open file description closes, so a holder killed by SIGKILL or a power cut never leaves a stale lock
(unlike a PID file). The descriptor is ``O_CLOEXEC``: a ``systemd-run`` or version command started by the
holder does not inherit, and so cannot prolong, the lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from types import TracebackType
from typing import Literal

from journal import safefs

__all__ = ["HostLock", "probe_lock"]


# The errors are imported on use: ``recover`` with nothing to do takes this lock, and upgrade_core pulls in
# attrs and cattrs, which that path must not pay for (design §9 ``recover.noop``).
def _host_error(message: str) -> Exception:
    from upgrade_core.errors import HostError

    return HostError(message)


def _refused(path: str, what: str) -> Exception:
    from upgrade_core.errors import HostRefusedError

    return HostRefusedError(path, what)


def _open_lock_file(path: str) -> int:
    """Open (creating 0600) the lock file through its checked directory (design §10): the directory is
    reached by the walk of :func:`agent.fs.tree.open_dir` (created 0755 when missing, with its missing
    parents), and the file must be a regular file of ours, never a symlink, FIFO or hard link
    (:meth:`agent.fs.tree.Dir.open_own`).

    Raises:
        HostRefusedError: a path on the way or the file fails its check, or EACCES/EROFS (exit 4).
    """
    from agent.fs.tree import open_dir

    directory = os.path.dirname(path) or "/"
    try:
        d = open_dir(directory, create=0o755)
        assert d is not None
        with d:
            return d.open_own(os.path.basename(path), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise _refused(e.filename or path, f"cannot open the host lock: {e.strerror or e}") from None


def _busy_error(message: str) -> Exception:
    from upgrade_core.errors import LockBusyError

    return LockBusyError(message)


class HostLock:
    """An exclusive, non-blocking ``flock`` on ``lock_path``; a context manager.

    Args:
        path: ``host.lock_path``. Created 0600 when missing, its missing parents 0755.

    Example::

        with HostLock(cfg.host.lock_path):
            ...  # only the holder appends to the journal or repairs its tail
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """True between a successful :meth:`acquire` and :meth:`release`."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock without waiting.

        Raises:
            upgrade_core.errors.LockBusyError: another process holds it (exit 75); the message names the
                file and, when known, the holder's pid.
            upgrade_core.errors.HostRefusedError: the lock file or a directory on its way is not ours (a
                symlink, FIFO or hard link at ``path``, a foreign owner, writable by others) or cannot be
                created or opened (EACCES, EROFS); exit 4, nothing changed.
            RuntimeError: this object already holds it.
        """
        if self._fd is not None:
            raise RuntimeError(f"{self.path}: already held by this process")
        fd = _open_lock_file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_holder(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                who = f" (pid {holder})" if holder else ""
                raise _busy_error(f"{self.path}: host lock held by another process{who}") from None
            raise _host_error(f"{self.path}: cannot lock: {e.strerror or e}") from None
        try:
            os.fchmod(fd, 0o600)
            # The holder's pid, for the busy message only; the flock is what counts.
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        self._fd = fd

    def release(self) -> None:
        """Release the lock (closing the descriptor); a no-op when not held."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _read_holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except (OSError, ValueError):
        return None


def probe_lock(path: str) -> Literal["free", "busy"]:
    """Tell whether the host lock is held, creating nothing (``upgrade --preflight``, design §7).

    A missing file (or directory) is "free". An existing one is opened ``O_RDONLY`` and tried with a shared,
    non-blocking flock, which conflicts with a holder's exclusive lock but not with other probes; it is
    released at once.

    Raises:
        upgrade_core.errors.HostRefusedError: something other than a regular file stands there (a FIFO is
            opened ``O_NONBLOCK``, never waited on), or it cannot be opened (exit 4).
        upgrade_core.errors.HostError: the file cannot be locked for another reason.
    """
    from agent.fs.tree import open_dir

    try:
        d = open_dir(os.path.dirname(path) or "/")
        if d is None:
            return "free"
        with d:
            fd = d.open_regular(os.path.basename(path))
    except (FileNotFoundError, NotADirectoryError):
        return "free"
    except OSError as e:
        raise _refused(e.filename or path, f"cannot open the host lock: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refused(path, f"is {safefs.kind(st.st_mode)}, not the host lock file; refused")
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return "busy"
        raise _host_error(f"{path}: cannot test the host lock: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return "free"

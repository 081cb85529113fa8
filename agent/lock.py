"""The host lock (SPEC 4.3 step 1, 4.6 invariant 7): one upgrade or recovery at a time on a host.

``flock(2)`` on ``lock_path``, exclusive and non-blocking. The kernel drops a flock when the last descriptor
of its open file description closes, so a holder killed by SIGKILL or a power cut never leaves a stale lock
(unlike a PID file). The descriptor is ``O_CLOEXEC``: a ``systemd-run`` or version command started by the
holder does not inherit, and so cannot prolong, the lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
from types import TracebackType
from typing import Literal

from .durable import make_dirs

__all__ = ["HostLock", "probe_lock"]


# The errors are imported on use: ``recover`` with nothing to do takes this lock, and upgrade_core pulls in
# attrs and cattrs, which that path must not pay for (SPEC 9 ``recover.noop``).
def _host_error(message: str) -> Exception:
    from upgrade_core.errors import HostError

    return HostError(message)


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
            upgrade_core.errors.HostError: the lock file or its directory cannot be created or opened
                (read-only, a symlink at ``path``, ...).
            RuntimeError: this object already holds it.
        """
        if self._fd is not None:
            raise RuntimeError(f"{self.path}: already held by this process")
        try:
            make_dirs(os.path.dirname(self.path) or ".", 0o755)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            raise _host_error(f"{self.path}: cannot open the host lock: {e.strerror or e}") from None
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
    """Tell whether the host lock is held, creating nothing (``upgrade --preflight``, SPEC 7).

    A missing file (or directory) is "free". An existing one is opened ``O_RDONLY`` and tried with a shared,
    non-blocking flock, which conflicts with a holder's exclusive lock but not with other probes; it is
    released at once.

    Raises:
        upgrade_core.errors.HostError: the file exists but cannot be opened or locked for another reason.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return "free"
    except OSError as e:
        raise _host_error(f"{path}: cannot open the host lock: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return "busy"
        raise _host_error(f"{path}: cannot test the host lock: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return "free"

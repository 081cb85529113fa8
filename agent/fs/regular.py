"""Read a regular file and nothing else: never a FIFO, device, socket or directory (standard library only,
so the quick configuration reader of the boot-time recovery can use it)."""

from __future__ import annotations

import os
import stat

__all__ = [
    "NotARegularFileError",
    "UntrustedFileError",
    "list_names",
    "read_fd",
    "read_regular_file",
    "read_text",
    "sha256_fd",
    "write_all",
    "write_all_pieces",
]


class NotARegularFileError(OSError):
    """The path names a FIFO, device, socket or directory; it was not opened for reading."""


class UntrustedFileError(OSError):
    """The file is owned by another user than root or the effective user, or group- or world-writable."""


def read_regular_file(
    path: str, *, follow: bool = True, limit: int | None = None, trusted: bool = False, private: bool = False
) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit`` bytes when given).

    With ``trusted``, the opened file must also be owned by root or the effective user and not be group- or
    world-writable (checked on the open descriptor, so a file swapped in after the check is not read): what
    a root-run tool takes commands and paths from must not be writable by anyone else (the rule of sshd's
    ``StrictModes`` and sudo's sudoers check). With ``private`` (a private key), it must in addition give
    group and others no access at all (OpenSSH's rule for identity files: a key others can read is no longer
    private).

    Never reads a FIFO, device or socket, and never blocks on one: with ``follow`` the link's target is
    ``stat``ed before the open (so no FIFO blocks it and no device's driver sees an open: opening
    ``/dev/watchdog`` arms it); without ``follow`` a link is not opened at all (``O_NOFOLLOW``: ``ELOOP``).
    The open is ``O_NONBLOCK`` and ``fstat`` checks the type again before the read (the path may have been
    replaced in between).

    Raises:
        FileNotFoundError: it does not exist.
        NotARegularFileError: it is not a regular file (``strerror`` says so).
        UntrustedFileError: ``trusted`` or ``private`` and its owner or mode fail the rules above
            (``strerror`` says so).
        OSError: any other failure to open or read it.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if follow:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise _not_regular(path)
    else:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path)
        if (trusted or private) and (st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022):
            raise UntrustedFileError(
                0, f"owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}: it must be owned by "
                   "root (or the user running this) and not writable by group or others", path)
        if private and st.st_mode & 0o077:
            raise UntrustedFileError(
                0, f"mode {stat.S_IMODE(st.st_mode):04o}: a private key must not be readable by group or "
                   "others (chmod 0600)", path)
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int | None = None) -> bytes:
    """The bytes of the open regular file ``fd`` from its current offset, at most ``limit`` (one ``read``),
    else to its end; ``fd`` stays open (the caller's)."""
    if limit is not None:
        return os.read(fd, limit)
    with os.fdopen(os.dup(fd), "rb") as f:
        return f.read()


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to the open file ``fd`` (``os.write`` may write less than asked).

    Raises:
        OSError: as ``write(2)`` (ENOSPC, EIO...).
    """
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_IOV_MAX = 1024  # the buffers one writev(2) takes on Linux (sysconf IOV_MAX); more are written in turns


def write_all_pieces(fd: int, pieces: list[bytes]) -> None:
    """Write ``pieces`` in order to the open file ``fd``, as one ``writev(2)`` when it takes them all.

    Why not a loop of :func:`write_all`: the extraction hands the staging file many pieces of at most
    64 KiB (network reads, decoded as they come); one system call for a whole batch keeps the call count
    of 256 KiB pieces (``fetch.extract``, design §9).

    Raises:
        OSError: as ``writev(2)`` (ENOSPC, EIO...).
    """
    views = [memoryview(p) for p in pieces if p]
    while views:
        done = os.writev(fd, views[:_IOV_MAX])
        while views and done >= len(views[0]):
            done -= len(views.pop(0))
        if views and done:
            views[0] = views[0][done:]


def sha256_fd(fd: int) -> str:
    """sha256 (64 lowercase hex) of the open file ``fd`` from its current offset to its end; ``fd`` stays
    open (the caller's)."""
    import hashlib  # on use: OpenSSL's import costs the lean no-op recovery milliseconds

    with os.fdopen(os.dup(fd), "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_text(path: str, *, follow: bool = True, limit: int | None = None) -> str | None:
    """The text (UTF-8, undecodable bytes replaced) of the regular file ``path`` (a ``/proc`` file, a unit
    file to compare), or None when it is absent, unreadable or not a regular file; see
    :func:`read_regular_file`."""
    try:
        return read_regular_file(path, follow=follow, limit=limit).decode("utf-8", errors="replace")
    except OSError:
        return None


def list_names(directory: str) -> list[str]:
    """The entries of ``directory``, sorted (``.`` and ``..`` excluded); a missing directory has none.

    Raises:
        OSError: it exists but cannot be listed (EACCES, ENOTDIR).
    """
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def _not_regular(path: str) -> NotARegularFileError:
    return NotARegularFileError(0, "not a regular file (a FIFO, device, socket or directory)", path)

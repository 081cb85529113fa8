"""Checked state files: the primitives every module that keeps state under ``state_dir`` uses (the journal's
neighbours, results, the trust cache, a spool's status files). The rules they enforce are stated in
:mod:`agent.host.ownership` and docs/design.md §10: ancestors owned by root (or the effective user) and not
writable by others unless sticky and root-owned; the agent's own directories and files opened relative to a
checked directory descriptor, never following a symlink, never opening a FIFO; files created 0600, written
to a temporary name, fsynced, renamed, the directory fsynced.

A failed check is :class:`~upgrade_core.errors.HostRefusedError` (exit 4). Standard library, the journal's
``safefs`` and the core's errors only.
"""

from __future__ import annotations

import os

from agent.fs import tree
from agent.fs.regular import read_regular_file
from agent.fs.tree import Dir, open_dir
from journal import JournalRefusedError, safefs
from upgrade_core.errors import HostRefusedError

__all__ = [
    "STATE_FILE_MODE",
    "check_ancestors",
    "open_state_dir",
    "read_regular",
    "read_state_file",
    "refused",
    "remove_state_file",
    "write_checked_file",
    "write_state_file",
]


def refused(exc: JournalRefusedError) -> Exception:
    """The :class:`~upgrade_core.errors.HostRefusedError` (exit 4) of a journal-level refusal."""
    return HostRefusedError(exc.path or "?", exc.what)


def _refuse(path: str, what: str) -> Exception:
    return HostRefusedError(path, what)


def check_ancestors(path: str) -> None:
    """Check every existing ancestor of ``path`` (not ``path`` itself) by the ancestor rule, walking from
    ``/`` one component at a time (:func:`agent.fs.tree.check_ancestors`); creates nothing.

    Raises:
        HostRefusedError: an ancestor is owned by another user, or writable by others without being a
            sticky root-owned directory, or a symlink owned by another user (exit 4).
    """
    try:
        tree.check_ancestors(path)
    except OSError as exc:
        where = getattr(exc, "filename", None) or path
        raise _refuse(where, f"cannot inspect: {exc.strerror or exc}") from None


def open_state_dir(state_dir: str, *, create: bool) -> int | None:
    """Open ``state_dir`` checked (see :mod:`agent.host.ownership`), creating it 0700 (missing parents 0755)
    if asked, by the walk of :func:`agent.fs.tree.open_dir`.

    Returns:
        Its descriptor (the caller closes it), or None when it is missing and ``create`` is False.

    Raises:
        HostRefusedError: an ancestor or ``state_dir`` fails its check, or it cannot be created (EACCES,
            EROFS) (exit 4).
    """
    try:
        d = open_dir(state_dir, create=0o700 if create else None)
    except OSError as exc:
        where = getattr(exc, "filename", None) or state_dir
        raise _refuse(where, f"cannot create: {exc.strerror or exc}") from None
    if d is None:
        return None
    try:
        safefs.check_owned(d.fstat(), state_dir, directory=True)
    except JournalRefusedError as exc:
        d.close()
        raise refused(exc) from None
    return d.detach()


STATE_FILE_MODE = 0o600
"""design §10: the mode of every file the agent creates under ``state_dir`` (and of a spool's status
files)."""


def read_regular(path: str, *, follow: bool, limit: int | None = None) -> bytes | None:
    """The bytes of ``path`` (at most ``limit``), or None when it is absent, unreadable or not a regular file
    (:func:`agent.fs.regular.read_regular_file`: never a FIFO, device or socket, never blocking)."""
    try:
        return read_regular_file(path, follow=follow, limit=limit)
    except OSError:
        return None


def write_checked_file(dir_fd: int, path: str, data: bytes) -> bool:
    """Replace ``path`` (in the checked directory ``dir_fd``) with ``data``, durably, mode 0600
    (:meth:`agent.fs.tree.Dir.replace`: temp ``O_EXCL``, fsync, ``renameat``, directory fsync); identical
    content is not rewritten. Whatever stands there first must be a regular file of ours
    (:func:`journal.safefs.check_entry`): a state file is never written over someone else's file.

    Returns:
        True when the file was (re)written, False when it already held exactly ``data``.

    Raises:
        JournalRefusedError: something other than a regular file of ours stands at ``path``.
        OSError: the write failed (ENOSPC, EROFS...).
    """
    name = os.path.basename(path)
    safefs.check_entry(dir_fd, name, path)
    # ``dir_fd`` stays the caller's: the handle is only borrowed, never closed here
    return Dir(dir_fd, os.path.dirname(path)).replace(name, data, STATE_FILE_MODE)


def _state_subdir(state_dir: str, sub: str, *, create: bool) -> int | None:
    """A checked descriptor of ``state_dir/sub`` (``sub`` "" is ``state_dir`` itself), created 0700 when
    missing and ``create``; None when missing otherwise. The caller closes it.

    Raises:
        JournalRefusedError, HostRefusedError: a directory on the way is not ours.
    """
    state_fd = open_state_dir(state_dir, create=create)
    if state_fd is None:
        return None
    if not sub:
        return state_fd
    try:
        path = os.path.join(state_dir, sub)
        if create:
            return safefs.make_dir(state_fd, sub, path, 0o700)
        return safefs.open_dir(path, dir_fd=state_fd, name=sub)
    finally:
        os.close(state_fd)


def write_state_file(state_dir: str, sub: str, name: str, data: bytes) -> bool:
    """Replace ``state_dir/sub/name`` with ``data`` durably, through checked directory handles (design §10):
    the write twin of :func:`read_state_file`; ``sub`` "" writes in ``state_dir`` itself. ``state_dir`` and
    ``sub`` are created 0700 when missing; the file is written by :func:`write_checked_file` (temp 0600 +
    fsync + rename + directory fsync; identical content is not rewritten).

    Returns:
        True when the file was (re)written, False when it already held exactly ``data``.

    Raises:
        HostRefusedError: a path on the way or the file is not ours (symlink, FIFO, hard link, foreign owner,
            group/world-writable): refused, never followed, its target untouched (exit 4).
        OSError: the write failed (ENOSPC, EROFS...): the caller names what it was writing.
    """
    path = os.path.join(state_dir, sub, name)
    try:
        dir_fd = _state_subdir(state_dir, sub, create=True)
        assert dir_fd is not None
        try:
            return write_checked_file(dir_fd, path, data)
        finally:
            os.close(dir_fd)
    except JournalRefusedError as e:
        raise refused(e) from None


def read_state_file(state_dir: str, sub: str, name: str) -> bytes | None:
    """The bytes of ``state_dir/sub/name`` (``sub`` "": in ``state_dir`` itself), read through checked
    directory handles (design §10): None when ``state_dir``, ``sub`` or the file does not exist; creates
    nothing.

    Raises:
        HostRefusedError: a path on the way or the file is not ours (symlink, FIFO, hard link, foreign owner,
            group/world-writable): refused, never followed or waited on (exit 4).
        OSError: the file exists but cannot be read.
    """
    path = os.path.join(state_dir, sub, name)
    try:
        dir_fd = _state_subdir(state_dir, sub, create=False)
        if dir_fd is None:
            return None
        try:
            return safefs.read_file(dir_fd, name, path)
        finally:
            os.close(dir_fd)
    except FileNotFoundError:
        return None
    except JournalRefusedError as e:
        raise refused(e) from None


def remove_state_file(state_dir: str, sub: str, name: str) -> bool:
    """Remove ``state_dir/sub/name`` (``sub`` "": in ``state_dir`` itself) through checked directory handles,
    with ``unlinkat`` on the checked directory, then fsync it; creates nothing.

    Returns:
        True when a file was removed, False when there was none.

    Raises:
        HostRefusedError: a path on the way or the file is not ours: refused, nothing removed (exit 4).
        OSError: the removal failed (EROFS, EBUSY...).
    """
    path = os.path.join(state_dir, sub, name)
    try:
        dir_fd = _state_subdir(state_dir, sub, create=False)
        if dir_fd is None:
            return False
        try:
            if not safefs.check_entry(dir_fd, name, path):
                return False
            os.unlink(name, dir_fd=dir_fd)
            os.fsync(dir_fd)
            return True
        finally:
            os.close(dir_fd)
    except JournalRefusedError as e:
        raise refused(e) from None

"""Durable file operations: every ``rename`` is preceded by a data fsync and followed by a directory fsync.

An atomic rename is not a durable one: after a power cut, a renamed file can come back empty (its data was
never written) or the rename can vanish (the directory was never written). Case C12 fixes the order
used everywhere in the agent::

    file written -> file fsynced -> renamed -> directory fsynced        (files)
    temp link created -> renamed -> directory fsynced                  (links)

and only then may the caller append the journal event that records the effect.

These are plain blocking functions. Async callers run them through ``anyio.to_thread.run_sync`` inside a
shielded cancel scope, so an fsync is never abandoned half way. An fsync error is never retried: after a
failed fsync the kernel may report later fsyncs as successful without having written anything (the 2018
"fsyncgate" finding on Linux), so the error propagates to the caller as the ``OSError`` it is.

Temp names live in the target's own directory (a rename across filesystems is not atomic) and start with
a dot so that nothing globbing the directory picks them up.
"""

from __future__ import annotations

import errno
import os
import stat

from agent.fs.regular import sha256_fd, write_all
from agent.fs.tree import Dir, open_dir, open_parent

__all__ = [
    "atomic_symlink",
    "atomic_write_bytes",
    "copy_file_durable",
    "create_exclusive",
    "file_sha256",
    "make_dirs",
    "missing_dirs",
    "remove_if_present",
    "remove_regular",
]

_CHUNK = 1 << 20  # bytes per read/write when copying or hashing


def file_sha256(path: str) -> str:
    """sha256 of a file's bytes as 64 lowercase hex (``hashlib.file_digest``, no symlink following).

    Raises:
        OSError: the file cannot be read (``ELOOP`` for a symlink).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def _conflict(message: str) -> Exception:
    # Imported on use: the lock and the no-op recovery path import this module and must stay lean
    # (upgrade_core pulls in attrs and cattrs; design §9 ``recover.noop``).
    from upgrade_core.errors import LayoutConflictError

    return LayoutConflictError(message)


def _parent(path: str, owned_from: str | None) -> Dir:
    """The checked directory of ``path`` (:func:`agent.fs.tree.open_parent`); it must exist."""
    d = open_parent(path, owned_from=owned_from)
    if d is None:
        parent = os.path.dirname(os.path.normpath(path)) or "/"
        raise FileNotFoundError(errno.ENOENT, "directory does not exist", parent)
    return d


def create_exclusive(path: str, mode: int, *, owned_from: str | None = None) -> int:
    """Create the new file ``path`` (``O_CREAT | O_EXCL | O_NOFOLLOW``, ``mode`` applied with ``fchmod``)
    inside its checked directory (:meth:`agent.fs.tree.Dir.create`), for a staging file that a stream
    then fills.

    Returns:
        The write descriptor (the caller closes it).

    Raises:
        FileNotFoundError: its directory does not exist.
        FileExistsError: anything already stands at ``path`` (never opened).
        upgrade_core.errors.HostRefusedError: a directory on the way is not the agent's (exit 4).
        OSError: ENOSPC, EROFS, EACCES...
    """
    with _parent(path, owned_from) as d:
        return d.create(os.path.basename(path), mode)


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o644, *, owned_from: str | None = None) -> bool:
    """Replace ``path`` with ``data``: temp file in the same directory + write + fsync + rename + dir fsync,
    all through the directory's checked handle (:meth:`agent.fs.tree.Dir.replace`).

    Rewriting identical content (same bytes, same mode) writes nothing; the file and its directory are
    fsynced anyway, so a rename left un-synced by a crashed predecessor still becomes durable.

    Args:
        path: the file to replace; its directory must exist.
        data: the whole new content.
        mode: permission bits of the file (applied with ``fchmod``, so the umask does not narrow them).
        owned_from: the agent's own directory on the way (default: ``path``'s directory), see
            :func:`agent.fs.tree.open_dir`.

    Returns:
        True when the file was (re)written, False when it already held ``data`` with ``mode``.

    Raises:
        upgrade_core.errors.HostRefusedError: a directory on the way is not the agent's (exit 4).
        upgrade_core.errors.LayoutConflictError: a directory stands at ``path``; nothing was written.
        OSError: a write, fsync or rename failed (``ENOSPC``, ``EROFS``, ``EIO``); the temp file is removed
            and ``path`` is as before.
    """
    with _parent(path, owned_from) as d:
        return d.replace(os.path.basename(path), data, mode)


def atomic_symlink(target: str, link_path: str, *, owned_from: str | None = None) -> bool:
    """Make ``link_path`` a symlink to ``target``: temp link + rename + directory fsync (cases C11, C12),
    through the directory's checked handle (:meth:`agent.fs.tree.Dir.symlink`).

    ``ln -sfn`` unlinks then creates, so a concurrent reader can find no link at all; a rename over the old
    link is atomic, so a reader sees either the old target or the new one. When the link already names
    ``target`` nothing changes (the directory is still fsynced).

    Args:
        target: the link's content, stored verbatim (keep it relative so the layout resolves when the host
            root is mounted elsewhere, case C14).
        link_path: where the link goes; its directory must exist.
        owned_from: see :func:`atomic_write_bytes`.

    Returns:
        True when the link was created or changed, False when it already named ``target``.

    Raises:
        upgrade_core.errors.HostRefusedError: a directory on the way is not the agent's (exit 4).
        upgrade_core.errors.LayoutConflictError: a real file or directory stands at ``link_path``; nothing
            was changed (design §6 "Switch").
        OSError: creating, renaming or fsyncing failed; the temp link is removed and ``link_path`` is as
            before.
    """
    with _parent(link_path, owned_from) as d:
        return d.symlink(target, os.path.basename(link_path))


def remove_if_present(path: str, *, sync_dir: bool = True, owned_from: str | None = None) -> bool:
    """Remove a file or symlink if it exists, with ``unlinkat`` on its checked directory (case C14: on a
    read-only mount ``unlink`` of a missing name fails with ``EROFS``; the ``fstatat`` first says whether
    there is anything to remove).

    Args:
        path: a regular file or symlink (never followed).
        sync_dir: fsync the parent directory after a removal.
        owned_from: see :func:`atomic_write_bytes`.

    Returns:
        True when something was removed, False when nothing (or no directory) was there.

    Raises:
        upgrade_core.errors.HostRefusedError: a directory on the way is not the agent's (exit 4).
        IsADirectoryError: a directory stands at ``path``; nothing was removed.
        OSError: the removal failed for another reason (``EROFS`` on an existing file, ``EACCES``).
    """
    d = open_parent(path, owned_from=owned_from)
    if d is None:
        return False
    with d:
        return d.remove(os.path.basename(path), sync=sync_dir)


def remove_regular(path: str) -> bool:
    """Remove ``path`` only when it is a regular file (a lock file, never a link, FIFO or directory someone
    put in its place), with ``unlinkat`` on its checked directory, then fsync the directory.

    Returns:
        True when a regular file was removed; False when nothing, or something else, stands there.

    Raises:
        upgrade_core.errors.HostRefusedError: a directory on the way is not the agent's (exit 4).
        OSError: EROFS, EACCES...
    """
    d = open_parent(path)
    if d is None:
        return False
    with d:
        st = d.lstat(os.path.basename(path))
        if st is None or not stat.S_ISREG(st.st_mode):
            return False
        return d.remove(os.path.basename(path))


def copy_file_durable(
    src: str, dst: str, mode: int = 0o755, expected_sha256: str | None = None, *, into: Dir | None = None
) -> bool:
    """Copy ``src`` onto ``dst`` durably: temp beside ``dst`` + fsync + digest check + rename + dir fsync.

    ``dst`` itself is never opened for writing, so a process executing it is unaffected (case C09); it is
    replaced by the rename, inside ``dst``'s checked directory (``into`` when the caller walked to it, e.g.
    a confined mirror tree; else :func:`agent.fs.tree.open_parent`). A ``dst`` that already holds ``src``'s
    bytes with ``mode`` is left as it is (idempotent adoption and mirror sync).

    Args:
        src: the regular file to copy (a symlink is refused with ``ELOOP``).
        dst: the destination path (its basename is the entry written in its directory).
        mode: permission bits of the copy.
        expected_sha256: 64 lowercase hex the copied bytes must hash to, or None.
        into: the already-checked directory of ``dst``.

    Returns:
        True when ``dst`` was written, False when it already held the same bytes and mode.

    Raises:
        ValueError: the bytes read from ``src`` do not hash to ``expected_sha256``; ``dst`` is unchanged.
        upgrade_core.errors.HostRefusedError: ``dst``'s directory is not the agent's (exit 4).
        upgrade_core.errors.LayoutConflictError: a directory stands at ``dst``.
        OSError: reading, writing, fsync or rename failed; the temp file is removed, ``dst`` unchanged.
    """
    import hashlib

    src_sha = file_sha256(src)
    if expected_sha256 is not None and src_sha != expected_sha256:
        raise ValueError(f"{src}: sha256 {src_sha} differs from the expected {expected_sha256}")
    d = into if into is not None else _parent(dst, None)
    try:
        name = os.path.basename(dst)
        dst_st = d.lstat(name)
        if dst_st is not None and stat.S_ISDIR(dst_st.st_mode):
            raise _conflict(f"{dst}: a directory stands where a file must be copied")
        if (
            dst_st is not None
            and stat.S_ISREG(dst_st.st_mode)
            and stat.S_IMODE(dst_st.st_mode) == mode
            and dst_st.st_size == os.stat(src).st_size
            and d.sha256(name) == src_sha
        ):
            fd = d.open_regular(name)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            d.fsync()
            return False
        tmp = d.temp_name(name, "tmp")
        try:
            digest = hashlib.sha256()
            in_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                out_fd = d.create(tmp, mode)
                try:
                    while chunk := os.read(in_fd, _CHUNK):
                        digest.update(chunk)
                        write_all(out_fd, chunk)
                    os.fsync(out_fd)
                finally:
                    os.close(out_fd)
            finally:
                os.close(in_fd)
            if digest.hexdigest() != src_sha:
                # src changed while it was copied: refuse rather than install bytes nobody checked.
                raise ValueError(f"{src}: content changed while it was copied to {dst}")
            d.rename(tmp, name)
        except BaseException:
            d.discard(tmp)
            raise
        d.fsync()
        return True
    finally:
        if into is None:
            d.close()


def missing_dirs(path: str) -> list[str]:
    """The directories on the way to ``path`` (``path`` included) that do not exist yet, outermost first:
    what :func:`make_dirs` creates, so a caller can record them before they exist (intent before effect)."""
    missing: list[str] = []
    p = os.path.normpath(path)
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return list(reversed(missing))


def make_dirs(path: str, mode: int = 0o755, leaf_mode: int | None = None, *, owned_from: str | None = None
              ) -> list[str]:
    """Create ``path`` and its missing parents durably (design §3: missing parents are created 0755), by the
    checked walk of :func:`agent.fs.tree.open_dir` (one component at a time, never following a link the
    walk does not trust).

    Each created directory gets its mode with ``fchmod`` (so the umask does not narrow it) and its parent is
    fsynced. Existing directories are left as they are, modes included.

    Args:
        path: absolute directory path.
        mode: mode of created parents.
        leaf_mode: mode of ``path`` itself when created (e.g. 0o700 for ``state_dir``); None: ``mode``.
        owned_from: the agent's own directory on the way (default ``path``), see
            :func:`agent.fs.tree.open_dir`.

    Returns:
        The directories created, outermost first.

    Raises:
        upgrade_core.errors.HostRefusedError: a directory on the way fails its rule (exit 4).
        OSError: creation or fsync failed (``EROFS``, ``EACCES``, ``ENOSPC``).
    """
    created: list[str] = []
    d = open_dir(path, owned_from=owned_from, create=leaf_mode if leaf_mode is not None else mode,
                 parents=mode, made=created)
    assert d is not None
    d.close()
    return created

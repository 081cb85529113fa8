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

import contextlib
import errno
import os
import stat

__all__ = [
    "atomic_symlink",
    "atomic_write_bytes",
    "copy_file_durable",
    "file_sha256",
    "fsync_dir",
    "fsync_file",
    "make_dirs",
    "missing_dirs",
    "remove_if_present",
]

_CHUNK = 1 << 20  # bytes per read/write when copying or hashing


def fsync_dir(path: str) -> None:
    """fsync a directory so that renames, creations and removals inside it survive a power cut.

    Args:
        path: the directory.

    Raises:
        OSError: the directory cannot be opened or the fsync failed (never retried, see module docstring).
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    """fsync an existing regular file's data and metadata (an O_RDONLY descriptor is enough on Linux).

    Raises:
        OSError: the file cannot be opened or the fsync failed.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: str) -> str:
    """sha256 of a file's bytes as 64 lowercase hex (``hashlib.file_digest``, no symlink following).

    Raises:
        OSError: the file cannot be read (``ELOOP`` for a symlink).
    """
    import hashlib  # on use: OpenSSL's import costs the lean no-op recovery path milliseconds

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _temp_name(path: str, kind: str) -> str:
    head, base = os.path.split(path)
    return os.path.join(head, f".{base}.{kind}-{os.urandom(8).hex()}")


def _conflict(message: str) -> Exception:
    # Imported on use: the lock and the no-op recovery path import this module and must stay lean
    # (upgrade_core pulls in attrs and cattrs; design §9 ``recover.noop``).
    from upgrade_core.errors import LayoutConflictError

    return LayoutConflictError(message)


def _same_regular_file_content(path: str, data: bytes, mode: int) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != len(data) or stat.S_IMODE(st.st_mode) != mode:
        return False
    with open(path, "rb") as f:
        return f.read(len(data) + 1) == data


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o644) -> bool:
    """Replace ``path`` with ``data``: temp file in the same directory + write + fsync + rename + dir fsync.

    Rewriting identical content (same bytes, same mode) writes nothing; the file and its directory are
    fsynced anyway, so a rename left un-synced by a crashed predecessor still becomes durable.

    Args:
        path: the file to replace; its directory must exist.
        data: the whole new content.
        mode: permission bits of the file (applied with ``fchmod``, so the umask does not narrow them).

    Returns:
        True when the file was (re)written, False when it already held ``data`` with ``mode``.

    Raises:
        upgrade_core.errors.LayoutConflictError: a directory stands at ``path``; nothing was written.
        OSError: a write, fsync or rename failed (``ENOSPC``, ``EROFS``, ``EIO``); the temp file is removed
            and ``path`` is as before.
    """
    if os.path.isdir(path) and not os.path.islink(path):
        raise _conflict(f"{path}: a directory stands where a file must be written")
    parent = os.path.dirname(path) or "."
    if _same_regular_file_content(path, data, mode):
        fsync_file(path)
        fsync_dir(parent)
        return False
    tmp = _temp_name(path, "tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        try:
            os.fchmod(fd, mode)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        _discard_temp(tmp)
        raise
    fsync_dir(parent)
    return True


def _discard_temp(tmp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def atomic_symlink(target: str, link_path: str) -> bool:
    """Make ``link_path`` a symlink to ``target``: temp link + rename + directory fsync (cases C11, C12).

    ``ln -sfn`` unlinks then creates, so a concurrent reader can find no link at all; a rename over the old
    link is atomic, so a reader sees either the old target or the new one. When the link already names
    ``target`` nothing changes (the directory is still fsynced).

    Args:
        target: the link's content, stored verbatim (keep it relative so the layout resolves when the host
            root is mounted elsewhere, case C14).
        link_path: where the link goes; its directory must exist.

    Returns:
        True when the link was created or changed, False when it already named ``target``.

    Raises:
        upgrade_core.errors.LayoutConflictError: a real file or directory stands at ``link_path``; nothing
            was changed (design §6 "Switch").
        OSError: creating, renaming or fsyncing failed; the temp link is removed and ``link_path`` is as
            before.
    """
    parent = os.path.dirname(link_path) or "."
    try:
        st = os.lstat(link_path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISLNK(st.st_mode):
            kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
            raise _conflict(f"{link_path}: a real {kind} stands where a symlink must be; refused")
        if os.readlink(link_path) == target:
            fsync_dir(parent)
            return False
    tmp = _temp_name(link_path, "link")
    os.symlink(target, tmp)
    try:
        os.rename(tmp, link_path)
    except BaseException:
        _discard_temp(tmp)
        raise
    fsync_dir(parent)
    return True


def remove_if_present(path: str, *, sync_dir: bool = True) -> bool:
    """Remove a file or symlink if it exists, deciding by ``lstat`` (case C14).

    On a read-only mount, ``unlink`` of a path that does not exist fails with ``EROFS`` rather than
    ``ENOENT``; ``lstat`` says whether there is anything to remove, so a missing path is never an error.

    Args:
        path: a regular file or symlink (never followed).
        sync_dir: fsync the parent directory after a removal.

    Returns:
        True when something was removed, False when nothing was there.

    Raises:
        IsADirectoryError: a directory stands at ``path``; nothing was removed.
        OSError: the removal failed for another reason (``EROFS`` on an existing file, ``EACCES``).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory, not removed", path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        if e.errno == errno.EROFS and not os.path.lexists(path):
            return False
        raise
    if sync_dir:
        fsync_dir(os.path.dirname(path) or ".")
    return True


def copy_file_durable(src: str, dst: str, mode: int = 0o755, expected_sha256: str | None = None) -> bool:
    """Copy ``src`` onto ``dst`` durably: temp beside ``dst`` + fsync + digest check + rename + dir fsync.

    ``dst`` itself is never opened for writing, so a process executing it is unaffected (case C09); it is
    replaced by the rename. A ``dst`` that already holds ``src``'s bytes with ``mode`` is left as it is
    (idempotent adoption and mirror sync).

    Args:
        src: the regular file to copy (a symlink is refused with ``ELOOP``).
        dst: the destination path; its directory must exist.
        mode: permission bits of the copy.
        expected_sha256: 64 lowercase hex the copied bytes must hash to, or None.

    Returns:
        True when ``dst`` was written, False when it already held the same bytes and mode.

    Raises:
        ValueError: the bytes read from ``src`` do not hash to ``expected_sha256``; ``dst`` is unchanged.
        upgrade_core.errors.LayoutConflictError: a directory stands at ``dst``.
        OSError: reading, writing, fsync or rename failed; the temp file is removed, ``dst`` unchanged.
    """
    import hashlib

    if os.path.isdir(dst) and not os.path.islink(dst):
        raise _conflict(f"{dst}: a directory stands where a file must be copied")
    src_sha = file_sha256(src)
    if expected_sha256 is not None and src_sha != expected_sha256:
        raise ValueError(f"{src}: sha256 {src_sha} differs from the expected {expected_sha256}")
    try:
        dst_st = os.lstat(dst)
    except FileNotFoundError:
        dst_st = None
    parent = os.path.dirname(dst) or "."
    if (
        dst_st is not None
        and stat.S_ISREG(dst_st.st_mode)
        and stat.S_IMODE(dst_st.st_mode) == mode
        and dst_st.st_size == os.stat(src).st_size
        and file_sha256(dst) == src_sha
    ):
        fsync_file(dst)
        fsync_dir(parent)
        return False
    tmp = _temp_name(dst, "tmp")
    try:
        digest = hashlib.sha256()
        in_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        out_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        try:
            os.fchmod(out_fd, mode)
            while chunk := os.read(in_fd, _CHUNK):
                digest.update(chunk)
                _write_all(out_fd, chunk)
            os.fsync(out_fd)
        finally:
            os.close(out_fd)
            os.close(in_fd)
        if digest.hexdigest() != src_sha:
            # src changed while it was copied: refuse rather than install bytes nobody checked.
            raise ValueError(f"{src}: content changed while it was copied to {dst}")
        os.rename(tmp, dst)
    except BaseException:
        _discard_temp(tmp)
        raise
    fsync_dir(parent)
    return True


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


def make_dirs(path: str, mode: int = 0o755, leaf_mode: int | None = None) -> list[str]:
    """Create ``path`` and its missing parents durably (design §3: missing parents are created 0755).

    Each created directory gets its mode with ``chmod`` (so the umask does not narrow it) and its parent is
    fsynced. Existing directories are left as they are, modes included.

    Args:
        path: absolute directory path.
        mode: mode of created parents.
        leaf_mode: mode of ``path`` itself when created (e.g. 0o700 for ``state_dir``); None: ``mode``.

    Returns:
        The directories created, outermost first.

    Raises:
        NotADirectoryError: a non-directory stands on the way.
        OSError: creation or fsync failed (``EROFS``, ``EACCES``, ``ENOSPC``).
    """
    missing = missing_dirs(path)
    created: list[str] = []
    for d in missing:
        want = leaf_mode if (d == missing[-1] and leaf_mode is not None) else mode
        os.mkdir(d, want)
        os.chmod(d, want)
        fsync_dir(os.path.dirname(d))
        created.append(d)
    return created

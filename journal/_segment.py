"""Blocking file-system steps of the writer (run in worker threads): durable create, write, truncate,
rename and remove. The order of every step follows case C12: file data fsynced -> renamed -> directory
fsynced; a segment created, renamed or removed is followed by a directory fsync (design §5).

Every step works relative to the writer's checked, locked directory descriptor (``dir_fd``) and checks each
file through :mod:`journal.safefs` before changing it: a symlink, FIFO, device, directory or hard link where a
segment belongs is refused (:class:`~journal.errors.JournalRefusedError`), never followed, truncated or
removed (design §10, case C23). ``path`` arguments are the full paths, for messages; the entry used is their
base name.
"""

from __future__ import annotations

import contextlib
import os

from . import safefs
from ._framing import encode_segment_header


def _name(path: str) -> str:
    return os.path.basename(path)


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``os.pwrite`` may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def open_live(dir_fd: int, path: str) -> int:
    """Open an existing live segment for appending (checked: a regular file of ours)."""
    return safefs.open_file(dir_fd, _name(path), os.O_WRONLY, path)


def create_live(dir_fd: int, path: str, first_seq: int) -> tuple[int, int]:
    """Create a live segment holding only its header, durably (file fsync + directory fsync).

    Returns:
        (an O_WRONLY fd on it, the header's CRC = the chain seed).

    Raises:
        FileExistsError: something already stands at ``path`` (never opened).
    """
    header = encode_segment_header(first_seq)
    fd = safefs.open_file(dir_fd, _name(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, path)
    try:
        pwrite_all(fd, header, 0)
        os.fsync(fd)
        os.fsync(dir_fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, int.from_bytes(header[28:32], "little")


def rewrite_header(dir_fd: int, path: str, first_seq: int) -> int:
    """Repair a last segment whose header is torn: truncate it to 0 and write the header, durably.

    Returns:
        The header's CRC.
    """
    header = encode_segment_header(first_seq)
    fd = safefs.open_file(dir_fd, _name(path), os.O_WRONLY, path)
    try:
        os.ftruncate(fd, 0)
        pwrite_all(fd, header, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return int.from_bytes(header[28:32], "little")


def truncate_durable(dir_fd: int, path: str, length: int) -> None:
    """Cut a torn tail: truncate ``path`` to ``length`` bytes and fsync it (size is metadata: fsync)."""
    fd = safefs.open_file(dir_fd, _name(path), os.O_WRONLY, path)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_durable(dir_fd: int, paths: list[str]) -> None:
    """Remove ``paths`` in the given order (missing ones are fine), then fsync their directory.

    Each one is checked first: only a regular file of ours is removed.
    """
    if not paths:
        return
    for path in paths:
        if safefs.check_entry(dir_fd, _name(path), path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_name(path), dir_fd=dir_fd)
    os.fsync(dir_fd)


def remove_leftover(dir_fd: int, path: str) -> None:
    """Remove a leftover temp file about to be created again (checked first; no directory fsync: the
    creation that follows is made durable)."""
    if safefs.check_entry(dir_fd, _name(path), path):
        os.unlink(_name(path), dir_fd=dir_fd)


def rename_durable(dir_fd: int, src: str, dst: str) -> None:
    """Rename ``src`` over ``dst`` in the directory (both checked first), then fsync the directory."""
    safefs.check_entry(dir_fd, _name(src), src)
    safefs.check_entry(dir_fd, _name(dst), dst)
    os.replace(_name(src), _name(dst), src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)

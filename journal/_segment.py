"""Blocking file-system steps of the writer (run in worker threads): durable create, write, truncate,
rename and remove. The order of every step follows case C12: file data fsynced -> renamed -> directory
fsynced; a segment created, renamed or removed is followed by a directory fsync (SPEC 5).
"""

from __future__ import annotations

import contextlib
import os

from ._framing import encode_segment_header

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def fsync_dir(path: str) -> None:
    """fsync the directory ``path`` so that entries created, renamed or removed in it are durable."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mkdir_durable(path: str) -> None:
    """Create ``path`` (0700) and any missing parents (0700), each made durable by fsyncing its parent."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        mkdir_durable(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    fsync_dir(parent)


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``os.pwrite`` may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def create_live(path: str, first_seq: int) -> tuple[int, int]:
    """Create a live segment holding only its header, durably (file fsync + directory fsync).

    Returns:
        (an O_WRONLY fd on it, the header's CRC = the chain seed).
    """
    header = encode_segment_header(first_seq)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        pwrite_all(fd, header, 0)
        os.fsync(fd)
        fsync_dir(os.path.dirname(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, int.from_bytes(header[28:32], "little")


def rewrite_header(path: str, first_seq: int) -> int:
    """Repair a last segment whose header is torn: truncate it to 0 and write the header, durably.

    Returns:
        The header's CRC.
    """
    header = encode_segment_header(first_seq)
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, 0)
        pwrite_all(fd, header, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return int.from_bytes(header[28:32], "little")


def truncate_durable(path: str, length: int) -> None:
    """Cut a torn tail: truncate ``path`` to ``length`` bytes and fsync it (size is metadata: fsync)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_durable(paths: list[str]) -> None:
    """Remove ``paths`` in the given order (missing ones are fine), then fsync their directory."""
    if not paths:
        return
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    fsync_dir(os.path.dirname(paths[0]))

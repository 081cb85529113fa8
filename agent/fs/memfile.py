"""Bytes already read and checked, handed to a library that only takes a path (standard library only)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from agent.fs.regular import write_all

__all__ = ["memory_file"]


@contextmanager
def memory_file(data: bytes, name: str) -> Iterator[str]:
    """A path whose contents are ``data``, valid for the block: an anonymous memory file (memfd_create(2)).

    ``ssl.SSLContext.load_cert_chain`` reads a client certificate and key only from paths. Handing it the
    configured path again would read the file a second time, after its owner, mode and contents were
    checked: a file swapped in between would be loaded unchecked. The memory file holds exactly the checked
    bytes, never touches a file system, and is gone when the block ends.

    Args:
        data: the bytes (e.g. a PEM certificate or key).
        name: a label for the file (shown only in ``/proc/self/fd``), not a path.

    Yields:
        ``/proc/self/fd/N``, readable by this process only.

    Raises:
        OSError: the memory file could not be made or written (no memory, no ``/proc``).
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        write_all(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)

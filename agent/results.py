"""The default result sink: ``state_dir/results/<operation>.json`` (SPEC 4.3 step 9, SPEC 7).

The orchestrator publishes a terminal result here *before* it appends ``result published`` and closes the
episode, so a crash in between re-publishes the same bytes: rewriting an identical result changes nothing
(SPEC 4.6 invariant 5: the sink may receive a result more than once). Each write is temp + fsync + rename
+ directory fsync (case C12).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from typing import Any, cast, get_args

import anyio
import anyio.to_thread

from journal import JournalRefusedError, safefs
from upgrade_core import OPERATION_ID_RE, SLOTS, ResultValue, Slot, UpgradeResult
from upgrade_core.errors import HostError, HostRefusedError, NoSpaceError

from .ownership import open_state_dir, read_state_file, refused

__all__ = ["FileResultSink", "read_result", "result_path", "write_checked_file"]

_MODE = 0o600  # SPEC 10: files the agent creates under state_dir are 0600
_KEYS = ("operation", "result", "from_version", "to_version", "slot", "reason")


def result_path(state_dir: str, operation: str) -> str:
    """``state_dir/results/<operation>.json``.

    Raises:
        HostError: ``operation`` does not match ``[A-Za-z0-9._-]{1,64}`` (SPEC 4.3 step 1).
    """
    if not OPERATION_ID_RE.fullmatch(operation):
        raise HostError(f"{operation!r}: not an operation id ([A-Za-z0-9._-]{{1,64}})")
    return os.path.join(state_dir, "results", f"{operation}.json")


def encode_result(result: UpgradeResult) -> bytes:
    """The SPEC 7 ``upgrade`` JSON of ``result``: fixed keys in a fixed order, one trailing newline."""
    doc = {k: getattr(result, k) for k in _KEYS}
    return (json.dumps(doc, indent=2) + "\n").encode()


class FileResultSink:
    """Publishes results as files under ``state_dir/results`` (implements ``upgrade_core.ports.ResultSink``).

    Args:
        state_dir: ``host.state_dir``; created 0700 (missing parents 0755) on first publish, checked
            (SPEC 10, :mod:`agent.ownership`) on every publish.
    """

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir

    def publish_sync(self, result: UpgradeResult) -> str | None:
        """Blocking form of :meth:`publish`; returns the file written, None for a result without operation.

        ``state_dir`` and ``results/`` are opened checked (created 0700 when missing) and the file is
        written relative to the ``results/`` descriptor: a temp file (0600, ``O_EXCL | O_NOFOLLOW``) is
        fsynced and renamed over the result, then the directory is fsynced. An existing result must be a
        regular file of ours (SPEC 10): a symlink, FIFO, directory or hard link there is refused (exit 4)
        and its target keeps its bytes.
        """
        if result.operation is None:
            return None
        path = result_path(self.state_dir, result.operation)
        try:
            state_fd = open_state_dir(self.state_dir, create=True)
            assert state_fd is not None
            try:
                dir_fd = safefs.make_dir(state_fd, "results", os.path.dirname(path), 0o700)
            finally:
                os.close(state_fd)
            try:
                write_checked_file(dir_fd, path, encode_result(result))
            finally:
                os.close(dir_fd)
        except JournalRefusedError as e:
            raise refused(e) from None
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise NoSpaceError(f"{path}: no space left to publish the result") from None
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise HostRefusedError(path, f"cannot publish the result: {e.strerror or e}") from None
            raise HostError(f"{path}: cannot publish the result: {e.strerror or e}") from None
        return path

    async def publish(self, result: UpgradeResult) -> None:
        """Make ``result`` durable as ``results/<operation>.json``; identical content is not rewritten.

        A result without an operation (a ``recover`` that found nothing open) belongs to no episode and is
        not stored.

        Raises:
            NoSpaceError: ENOSPC while writing; the previous file (if any) is intact.
            HostRefusedError: a path on the way is not ours, or EACCES/EPERM/EROFS (exit 4).
            HostError: the file or directories cannot be written, or the operation id is malformed.

        Cancellation: shielded; the write completes (or fails) before the cancellation is delivered.
        """
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.publish_sync, result)


def write_checked_file(dir_fd: int, path: str, data: bytes) -> bool:
    """Replace ``path`` (in the checked directory ``dir_fd``) with ``data``, durably; identical content
    (a regular file of ours, mode 0600) is not rewritten (the file and directory are fsynced anyway).

    Returns:
        True when the file was (re)written, False when it already held exactly ``data``.
    """
    name = os.path.basename(path)
    if safefs.check_entry(dir_fd, name, path):
        fd = safefs.open_file(dir_fd, name, os.O_RDONLY, path)
        try:
            same = os.pread(fd, len(data) + 1, 0) == data and stat.S_IMODE(os.fstat(fd).st_mode) == _MODE
            if same:
                os.fsync(fd)
        finally:
            os.close(fd)
        if same:
            os.fsync(dir_fd)
            return False
    tmp = f".{name}.tmp-{os.urandom(8).hex()}"
    tmp_path = os.path.join(os.path.dirname(path), tmp)
    fd = safefs.open_file(dir_fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, tmp_path, _MODE)
    try:
        try:
            os.fchmod(fd, _MODE)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        safefs.check_entry(dir_fd, name, path)  # still nothing foreign at the target
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)
    return True


def read_result(state_dir: str, operation: str) -> UpgradeResult | None:
    """Read a published result for whoever consumes the sink's files (a control plane); creates nothing.

    Returns:
        The result, or None when none was published for ``operation``.

    Raises:
        HostRefusedError: ``state_dir``, ``results/`` or the file is not ours (a symlink, FIFO, hard link,
            foreign owner...): refused, never followed (exit 4).
        HostError: the file exists but is unreadable or not a result document (names the file).
    """
    path = result_path(state_dir, operation)
    try:
        data = read_state_file(state_dir, "results", os.path.basename(path))
        if data is None:
            return None
        doc: Any = json.loads(data)
    except (OSError, ValueError) as e:
        raise HostError(f"{path}: unreadable result: {e}") from None
    if not isinstance(doc, dict):
        raise HostError(f"{path}: unreadable result: not a JSON object")
    value, slot = doc.get("result"), doc.get("slot")
    texts = [doc.get(k) for k in ("operation", "from_version", "to_version", "reason")]
    if (
        value not in get_args(ResultValue)
        or slot not in (None, *SLOTS)
        or not all(t is None or isinstance(t, str) for t in texts)
    ):
        raise HostError(f"{path}: unreadable result: unexpected values")
    return UpgradeResult(
        operation=texts[0],
        result=cast(ResultValue, value),
        from_version=texts[1],
        to_version=texts[2],
        slot=cast(Slot | None, slot),
        reason=texts[3],
    )

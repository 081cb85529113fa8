"""The default result sink: ``state_dir/results/<operation>.json`` (design §4.3 step 9, design §7).

The orchestrator publishes a terminal result here *before* it appends ``result published`` and closes the
episode, so a crash in between re-publishes the same bytes: rewriting an identical result changes nothing
(design §4.6 invariant 5: the sink may receive a result more than once). Each write is temp + fsync + rename
+ directory fsync (case C12).
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any, cast, get_args

import anyio
import anyio.to_thread

from agent.fs.statefile import read_state_file, write_state_file
from upgrade_core import OPERATION_ID_RE, SLOTS, ResultValue, Slot, UpgradeResult
from upgrade_core.errors import HostError, HostRefusedError, NoSpaceError

__all__ = ["FileResultSink", "read_result", "result_path"]

_KEYS = ("operation", "result", "from_version", "to_version", "slot", "reason")


def result_path(state_dir: str, operation: str) -> str:
    """``state_dir/results/<operation>.json``.

    Raises:
        HostError: ``operation`` does not match ``[A-Za-z0-9._-]{1,64}`` (design §4.3 step 1).
    """
    if not OPERATION_ID_RE.fullmatch(operation):
        raise HostError(f"{operation!r}: not an operation id ([A-Za-z0-9._-]{{1,64}})")
    return os.path.join(state_dir, "results", f"{operation}.json")


def encode_result(result: UpgradeResult) -> bytes:
    """The design §7 ``upgrade`` JSON of ``result``: fixed keys in a fixed order, one trailing newline."""
    doc = {k: getattr(result, k) for k in _KEYS}
    return (json.dumps(doc, indent=2) + "\n").encode()


class FileResultSink:
    """Publishes results as files under ``state_dir/results`` (implements ``upgrade_core.ports.ResultSink``).

    Args:
        state_dir: ``host.state_dir``; created 0700 (missing parents 0755) on first publish, checked
            (design §10, :mod:`agent.host.ownership`) on every publish.
    """

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir

    def publish_sync(self, result: UpgradeResult) -> str | None:
        """Blocking form of :meth:`publish`; returns the file written, None for a result without operation.

        ``state_dir`` and ``results/`` are opened checked (created 0700 when missing) and the file is
        written relative to the ``results/`` descriptor: a temp file (0600, ``O_EXCL | O_NOFOLLOW``) is
        fsynced and renamed over the result, then the directory is fsynced. An existing result must be a
        regular file of ours (design §10): a symlink, FIFO, directory or hard link there is refused (exit 4)
        and its target keeps its bytes.
        """
        if result.operation is None:
            return None
        path = result_path(self.state_dir, result.operation)
        try:
            write_state_file(self.state_dir, "results", os.path.basename(path), encode_result(result))
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

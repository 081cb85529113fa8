"""The spool source (design §10, docs/managed.md): a directory of operations, on any host.

``[operations] spool_dir`` holds ``<id>.json`` (an operation's spec, see :mod:`.model`) placed atomically by
whoever drives the host (cloud-init, Ignition, a configuration manager, a human: write a temp file, then
rename it), and the operator writes ``<id>.status.json`` beside it (temp + fsync + rename + directory fsync,
case C12). ``<id>`` is the operation id (``[A-Za-z0-9._-]{1,64}``, not ending in ``.status``); names
starting with ``.`` (temp files) and anything else are ignored, each logged once.

An id ending in ``.status`` collides with a status file name: ``X.status.json`` is where the status of
operation ``X`` goes. Such a file is the status of ``X`` when ``X.json`` is beside it or when it holds a
status of ``X`` (one left after ``X.json`` was removed); otherwise it is refused as an operation (its own
status, in ``X.status.status.json``, says why). The operator never replaces a ``<id>.status.json`` that
holds anything but a status of ``<id>``: that operation is not run, and the log says why once.

The spool is root's: the directory and every file in it must be owned by the effective user and not
writable by group or others, and each file a regular file with one link (design §10's rule for state paths, so
nobody else can slip an operation in or turn a status write against another file). A file that breaks it
is refused (its status says why, when one can be written); nothing is followed, opened as a FIFO or
removed: the operator never deletes an operation or a status file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread

from agent.fs.statefile import open_state_dir, write_checked_file
from agent.fs.tree import Dir
from agent.fs.watch import DirectoryWatch
from agent.logline import log
from agent.operations.model import Operation, SourceError, spool_status
from journal import JournalRefusedError, safefs
from upgrade_core import OPERATION_ID_RE, OperationStatus

__all__ = ["MAX_OPERATION_BYTES", "SpoolSource", "encode_status"]

MAX_OPERATION_BYTES = 64 * 1024
"""An operation file larger than this (bytes) is refused unread: a spec is a few hundred bytes."""

_STATUS_SUFFIX = ".status.json"

RESCAN_S = 60.0
"""Seconds after which an unchanged-looking spool is read again anyway (a file edited in place, which the
directory's mtime does not show, and which inotify may have reported before the watch existed)."""


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """``(st_dev, st_ino, st_mtime_ns, st_ctime_ns)`` of the spool directory: another directory, or a rename,
    chmod or chown in or of it, gives another value."""
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns


class _Waker:
    """A stop flag a thread blocked in ``poll`` can see: set from any thread, closed by the waiting thread
    when it is done (so a late :meth:`set` never writes into a reused descriptor)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._event = threading.Event()
        self._closed = False

    def fileno(self) -> int:
        return self._read

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        return self._event.wait(max(0.0, timeout_s))

    def set(self) -> None:
        with self._lock:
            self._event.set()
            if not self._closed:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._write, b"x")

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read)
                os.close(self._write)


def _decoded(data: bytes | None) -> Any:
    """The JSON value of ``data``, None when there is none or it is not JSON."""
    if data is None:
        return None
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return None


def _is_status_of(doc: Any, op_id: str) -> bool:
    """True when ``doc`` is a status document of operation ``op_id`` (as :func:`encode_status` writes)."""
    return isinstance(doc, dict) and doc.get("operation") == op_id and "phase" in doc


def encode_status(status: OperationStatus, generation: int = 1) -> bytes:
    """The bytes of ``<id>.status.json``: :func:`.model.spool_status` as indented JSON, one trailing
    newline (deterministic: the same status gives the same bytes)."""
    return (json.dumps(spool_status(status, generation), indent=2) + "\n").encode()


class SpoolSource:
    """:class:`~.model.OperationSource` over ``spool_dir`` (created 0700 when missing, never removed).

    Args:
        spool_dir: absolute, normalised (``[operations] spool_dir``).
        poll_s: seconds between scans while idle (:meth:`wait_for_change`).
    """

    def __init__(self, spool_dir: str, poll_s: float) -> None:
        self.spool_dir = spool_dir
        self.poll_s = poll_s
        self.label = f"spool {spool_dir}"
        self._ignored: set[str] = set()
        self._seen: tuple[int, int, int, int] | None = None  # _identity() of the directory last read
        self._cached: list[Operation] = []
        self._scanned_at = 0.0

    # -- reading ------------------------------------------------------------------------------------------
    def _open(self) -> int:
        try:
            fd = open_state_dir(self.spool_dir, create=True)
        except Exception as exc:  # HostRefusedError: one line naming the path
            raise SourceError(f"{self.label}: {exc}") from None
        assert fd is not None
        return fd

    def _read(self, dir_fd: int, name: str) -> tuple[bytes | None, str | None, float]:
        """(bytes, problem, mtime) of one spool file, read checked and bounded."""
        path = os.path.join(self.spool_dir, name)
        try:
            fd = safefs.open_file(dir_fd, name, os.O_RDONLY, path)
        except FileNotFoundError:
            return None, None, 0.0
        except JournalRefusedError as exc:
            return None, str(exc), 0.0
        try:
            st = os.fstat(fd)
            if st.st_size > MAX_OPERATION_BYTES:
                too_big = f"{path}: {st.st_size} bytes, more than {MAX_OPERATION_BYTES}; refused"
                return None, too_big, st.st_mtime
            data = os.read(fd, MAX_OPERATION_BYTES + 1)
            return data, None, st.st_mtime
        except OSError as exc:
            return None, f"{path}: cannot read: {exc.strerror or exc}", 0.0
        finally:
            os.close(fd)

    def _unchanged(self, now: float) -> bool:
        """True when the spool was read less than RESCAN_S seconds ago and the directory at ``spool_dir``
        is still the one read then, with the same mtime and ctime. Operations and statuses arrive by rename,
        which changes both; a chmod or chown of the directory changes its ctime. So an idle poll costs one
        ``lstat`` instead of the ancestors' walk and the checked open (~0.5 ms of CPU on a cold cache).
        Nothing is read on this path: whatever is read next comes through the checked open."""
        if self._seen is None or now - self._scanned_at >= RESCAN_S:
            return False
        try:
            st = os.lstat(self.spool_dir)
        except OSError:
            return False  # gone or unreadable: the checked open says why
        return _identity(st) == self._seen

    def _scan(self) -> list[Operation]:
        now = time.monotonic()
        if self._unchanged(now):
            return self._cached
        dir_fd = self._open()
        try:
            st = os.fstat(dir_fd)
            seen = _identity(st)
            names = Dir(dir_fd, self.spool_dir).names()  # the descriptor stays ours: closed below
            ops = []
            present = set(names)
            for name in sorted(names):
                if name.startswith(".") or not name.endswith(".json"):
                    continue
                op_id = name[: -len(".json")]
                owner = op_id[: -len(".status")] if name.endswith(_STATUS_SUFFIX) else None
                if owner is not None and owner + ".json" in present:
                    continue  # the status file of the operation beside it
                path = os.path.join(self.spool_dir, name)
                if not OPERATION_ID_RE.fullmatch(op_id):
                    if name not in self._ignored:
                        self._ignored.add(name)
                        log(f"{path}: ignored: the name is not <operation id>.json ([A-Za-z0-9._-]{{1,64}})")
                    continue
                data, problem, mtime = self._read(dir_fd, name)
                if data is None and problem is None:
                    continue  # renamed away between listdir and open
                spec: Any = None
                if data is not None:
                    try:
                        spec = json.loads(data)
                    except (UnicodeDecodeError, ValueError) as exc:
                        problem = f"{path}: not a JSON document: {exc}"
                if owner is not None:
                    if problem is None and _is_status_of(spec, owner):
                        continue  # a status whose operation file was removed: a record, not an operation
                    problem = problem or (
                        f"{path}: refused: the operation id {op_id} ends in .status, which makes its file "
                        f"the status file of operation {owner}; give the operation another id"
                    )
                status_bytes, status_problem, _ = self._read(dir_fd, op_id + _STATUS_SUFFIX)
                status = _decoded(status_bytes)
                if status_problem is not None:
                    problem = problem or status_problem
                ops.append(Operation(
                    operation=op_id, name=path, spec=spec,
                    status=status if isinstance(status, dict) else None, problem=problem,
                    order=(mtime, name),
                ))
            ops.sort(key=lambda o: o.order)
            self._seen, self._cached, self._scanned_at = seen, ops, now
            return ops
        finally:
            os.close(dir_fd)

    async def snapshot(self) -> Sequence[Operation]:
        """Every ``<id>.json`` in the spool, oldest first (mtime, then name), with its status file.

        Raises:
            SourceError: the spool directory is not ours or cannot be opened.
        """
        return await anyio.to_thread.run_sync(self._scan)

    def _watch(self, timeout_s: float, waker: _Waker) -> None:
        deadline = time.monotonic() + timeout_s
        watch = DirectoryWatch.open(self.spool_dir)
        try:
            while True:
                now = time.monotonic()
                # checked after the watch exists: a rename since the last read is seen here, a later one
                # by the watch
                if now >= deadline or waker.is_set() or not self._unchanged(now):
                    return
                if watch is None:  # polling: inotify would not see every writer here
                    if waker.wait(min(self.poll_s, deadline - now)):
                        return
                elif watch.wait(min(deadline, self._scanned_at + RESCAN_S) - now, waker.fileno()):
                    if not waker.is_set():
                        self._seen = None  # an event (an edit in place too): the next snapshot reads it all
                    return
        finally:
            if watch is not None:
                watch.close()
            waker.close()

    async def wait_for_change(self, timeout_s: float) -> None:
        """Return once the spool may hold something new: an entry created, renamed, removed or written, the
        directory changed or replaced; or once RESCAN_S seconds have passed since it was last read (an edit
        the events could have missed), or after ``timeout_s`` seconds.

        On a local file system (:data:`agent.fs.watch.WATCHABLE_FS`) one worker thread sleeps in inotify(7)
        until then: no wake-up at all while nothing changes, where the former 2 s poll cost the budget of 2
        CPU seconds an hour by itself on the benchmark VM (docs/benchmarks-history.md). Where inotify cannot
        see every writer (NFS, FUSE...) or is unavailable, the thread polls every ``poll_s`` seconds with one
        ``lstat`` of the directory, as before.

        Cancellation: returns at once; the thread is woken through a pipe and ends within microseconds.
        """
        waker = _Waker()
        try:
            await anyio.to_thread.run_sync(self._watch, timeout_s, waker, abandon_on_cancel=True)
        finally:
            waker.set()

    # -- writing ------------------------------------------------------------------------------------------
    def _write(self, op: Operation, data: bytes) -> bool:
        name = op.operation + _STATUS_SUFFIX
        path = os.path.join(self.spool_dir, name)
        dir_fd = self._open()
        try:
            held, _problem, _ = self._read(dir_fd, name)  # a file that is not ours: the write refuses it
            if held is not None and not _is_status_of(_decoded(held), op.operation):
                raise SourceError(
                    f"{path}: holds no status of operation {op.operation} (an operation whose id ends in "
                    ".status?); not replaced"
                )
            if not write_checked_file(dir_fd, path, data):  # it already held exactly these bytes
                return False
            self._seen = None  # our own rename changed the directory: read it again next time
            return True
        except JournalRefusedError as exc:
            raise SourceError(f"{self.label}: {exc}") from None
        except OSError as exc:
            what = "no space left" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
            raise SourceError(f"{path}: cannot write the status: {what}") from None
        finally:
            os.close(dir_fd)

    async def publish(self, op: Operation, status: OperationStatus) -> bool:
        """Write ``<id>.status.json`` durably unless it already holds exactly these bytes.

        Raises:
            SourceError: the spool or the status file is not ours (a symlink, FIFO, hard link...: refused,
                never followed), the status file holds something else than a status of this operation
                (never replaced), or the write failed (ENOSPC...); the previous file is intact.

        Cancellation: shielded; the write completes (or fails) first.
        """
        data = encode_status(status, op.generation)
        with anyio.CancelScope(shield=True):
            wrote = await anyio.to_thread.run_sync(self._write, op, data)
        return wrote

    async def aclose(self) -> None:
        """Nothing to release (no descriptor is kept between calls)."""

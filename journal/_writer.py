"""The journal writer: durable appends with group commit, torn-tail repair, sealing and compaction.

Only the host-lock holder creates a :class:`JournalWriter` (design §4.6 rule 7); readers use
:func:`journal.replay`. Every blocking step runs off the event loop, and an append or a seal that has
started finishes: the caller's wait is shielded and a cancellation is delivered after it (trio's rule that a
cancelled operation either had no effect or completed is kept by making the write itself uncancellable).

Appends go to one long-lived writer thread per open writer (``journal-writer``), not through a generic
worker-thread hop per append: the event loop encodes each record and adds it to the open batch (one
:class:`_Batch` shared by every append made before the thread takes it); the thread takes the whole batch,
frames it, writes it with one ``pwrite`` and one ``fdatasync``, and completes every waiter of the batch at
once with a single call back into the event loop. A batch is taken only when the thread is free, so the
appends that arrive while a batch is being synced form the next group commit. A failed sync poisons the
writer: the thread fails that batch and every later one without touching the file again. Opening, sealing
and compaction (rare) still use ``anyio.to_thread``; they run only once no batch is in flight.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel
import attrs

from . import _segment, safefs
from ._framing import MAX_EPISODE_ID, MAX_PAYLOAD, SEGMENT_HEADER_SIZE, encode_envelope, encode_frame
from ._reader import TMP_SUFFIX, Scan, decode_records, gc_paused, read_owner_at, scan, segment_name
from ._records import SNAPSHOT_EPISODE, Codec, Record, TornTail
from .errors import (
    JournalBusyError,
    JournalClosedError,
    JournalFullError,
    JournalOwnerError,
    JournalPoisonedError,
)

T = TypeVar("T")

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


@attrs.frozen
class CompactStats:
    """What :meth:`JournalWriter.compact` did.

    Attributes:
        sealed: the live segment was sealed first.
        dropped_segments: sealed segment files removed.
        dropped_records: records summarised by the snapshot and removed with them.
        snapshot_seq: sequence number of the snapshot record, or None when nothing was dropped.
    """

    sealed: bool
    dropped_segments: int
    dropped_records: int
    snapshot_seq: int | None


class _Pending:
    __slots__ = ("covers_through", "episode_id", "event", "payload", "record", "wall_time")

    def __init__(
        self, episode_id: str, wall_time: float, event: Any, payload: bytes, covers_through: int | None
    ) -> None:
        self.episode_id = episode_id
        self.wall_time = wall_time
        self.event = event
        self.payload = payload
        self.covers_through = covers_through
        self.record: Record[Any] | None = None


class _Batch:
    """Appends committed together: one write and one fdatasync (a group commit).

    Created on the event loop by the first append that finds no open batch; later appends join it until
    the writer thread takes it. The thread fills in ``error`` or every entry's ``record``, then has
    :meth:`JournalWriter._settle` run on the event loop ``token`` names, which sets ``done``.
    """

    __slots__ = ("chain", "done", "end", "entries", "error", "poisons", "token")

    def __init__(self, token: anyio.lowlevel.EventLoopToken) -> None:
        self.entries: list[_Pending] = []
        self.done = anyio.Event()
        self.error: BaseException | None = None  # raised to every waiter of the batch
        self.poisons: JournalPoisonedError | None = None  # what later appends raise after this batch
        self.token = token
        self.end = 0  # once written: the live segment's length and chain CRC after this batch
        self.chain = 0


class _Refused(Exception):
    """A batch write failed and was cut off again; nothing of it is on disk."""


class _Broken(Exception):
    """An fsync failed, or a failed write could not be cut off: the writer is poisoned."""


@attrs.define
class _Live:
    fd: int
    path: str
    offset: int
    chain: int


OWNER_FILE = "owner.json"
"""The journal's owner record in its directory (design §10): a JSON object of strings (the agent writes
``{"agent": NAME, "unit": UNIT}``), written 0600 and atomically when the journal is created, or by the first
writer of a journal that has none (one written before owners were recorded is adopted, never refused)."""


def _lock_dir(dir_fd: int, directory: str) -> None:
    """Take the journal directory's own exclusive lock, non-blocking: one writer per journal (design §10).

    Independent of any host lock: two configurations that share a journal directory never interleave.
    """
    import errno
    import fcntl

    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise JournalBusyError(
                f"{directory}: the journal is open for writing by another process", directory
            ) from None
        raise


def _check_owner(dir_fd: int, directory: str, owner: dict[str, str] | None) -> bool:
    """Compare the recorded owner with ``owner``; True when none is recorded yet (the caller records it)."""
    recorded = read_owner_at(dir_fd, directory)
    if recorded is None:
        return owner is not None
    if owner is not None and recorded != owner:
        raise JournalOwnerError(directory, recorded, owner)
    return False


def _record_owner(dir_fd: int, directory: str, owner: dict[str, str]) -> None:
    """Write ``owner.json`` atomically: temp (0600) + fsync + rename + directory fsync."""
    import json

    tmp = os.path.join(directory, OWNER_FILE + TMP_SUFFIX)
    _segment.remove_leftover(dir_fd, tmp)
    fd = safefs.open_file(dir_fd, OWNER_FILE + TMP_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_EXCL, tmp)
    try:
        _segment.pwrite_all(fd, (json.dumps(owner, sort_keys=True) + "\n").encode(), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    _segment.rename_durable(dir_fd, tmp, os.path.join(directory, OWNER_FILE))


def _open_dir(directory: str) -> int:
    """Create (0700) or open the journal directory through its checked parent, and check it. The parent is
    reached by :func:`journal.safefs.walk_to` (from ``/``, one component at a time, each checked; missing
    ones created 0700), so no directory on the way is trusted by path."""
    parent = os.path.dirname(directory) or "/"
    pfd = safefs.walk_to(parent, create=0o700)
    assert pfd is not None
    try:
        return safefs.make_dir(pfd, os.path.basename(directory), directory)
    finally:
        os.close(pfd)


def _prepare(directory: str, owner: dict[str, str] | None) -> tuple[Scan, TornTail | None, _Live, int]:
    """Blocking part of :meth:`JournalWriter.open`: create, lock, check the owner, scan, clean leftovers,
    repair, open the live segment, record the owner. Returns the locked directory descriptor last."""
    dir_fd = _open_dir(directory)
    try:
        _lock_dir(dir_fd, directory)
        unowned = _check_owner(dir_fd, directory, owner)  # before anything is repaired or removed
        result, repaired, live = _prepare_locked(dir_fd, directory)
        if unowned:
            assert owner is not None
            try:
                _record_owner(dir_fd, directory, owner)
            except BaseException:
                os.close(live.fd)
                raise
        return result, repaired, live, dir_fd
    except BaseException:
        os.close(dir_fd)
        raise


def _prepare_locked(dir_fd: int, directory: str) -> tuple[Scan, TornTail | None, _Live]:
    with gc_paused():
        result = scan(directory, dir_fd=dir_fd)
    # Leftovers of an interrupted seal or compaction. Never the last segment.
    covered = [s.path for s in result.segments[:-1] if s.last_seq <= result.covers_through]
    _segment.remove_durable(dir_fd, result.temps + result.shadowed + covered)
    result.segments = [s for s in result.segments if s.path not in covered]
    repaired: TornTail | None = None
    last = result.segments[-1] if result.segments else None
    if result.torn is not None:
        assert last is not None and last.path == result.torn[0]
        path, offset = result.torn
        if offset == 0:
            last.chain = _segment.rewrite_header(dir_fd, path, last.first_seq)
            last.end = len(_segment.encode_segment_header(last.first_seq))
        else:
            _segment.truncate_durable(dir_fd, path, offset)
        repaired = TornTail(path, offset)
    if last is not None and not last.sealed:
        fd = _segment.open_live(dir_fd, last.path)
        return result, repaired, _Live(fd, last.path, last.end, last.chain)
    path = os.path.join(directory, segment_name(result.next_seq, sealed=False))
    fd, chain = _segment.create_live(dir_fd, path, result.next_seq)
    from ._reader import Segment

    seg = Segment(path, result.next_seq, sealed=False)
    seg.end, seg.chain = os.fstat(fd).st_size, chain
    result.segments.append(seg)
    return result, repaired, _Live(fd, path, seg.end, chain)


def _decode(result: Scan, codec: Codec[T]) -> list[Record[T]]:
    with gc_paused():
        return decode_records(result.visible(), codec)


class JournalWriter(Generic[T]):
    """The append side of a journal directory (design §5). Create with :meth:`open`.

    Attributes:
        directory: absolute path of the journal directory.
        repaired: the torn tail that :meth:`open` truncated, or None.
    """

    def __init__(self, directory: str, codec: Codec[T], wall_clock: Callable[[], float]) -> None:
        self.directory = directory
        self.repaired: TornTail | None = None
        self._codec = codec
        self._clock = wall_clock
        # Event-loop side. ``_busy``: a seal, compaction or close holds the files (appends park on ``_idle``
        # meanwhile); ``_unsettled``: batches handed to the thread whose waiters are not completed yet (the
        # exclusive steps wait on ``_drained`` until it is 0).
        self._busy = False
        self._idle: anyio.Event | None = None
        self._unsettled = 0
        self._drained: anyio.Event | None = None
        self._records: list[Record[T]] = []
        self._scan: Scan
        self._live: _Live
        self._next_seq = 1
        self._poisoned: JournalPoisonedError | None = None
        self._closed = False
        self._dir_fd = -1
        # Shared with the writer thread: the open batch (under ``_lock``) and the batches to write, in order
        # (``None`` tells the thread to stop). ``_write_seq`` and ``_live``'s offset and chain belong to the
        # thread while a batch is in flight, to the event loop once drained.
        self._lock = threading.Lock()
        self._open: _Batch | None = None
        self._queue: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._write_seq = 1

    @classmethod
    async def open(
        cls,
        directory: str | os.PathLike[str],
        codec: Codec[T],
        *,
        wall_clock: Callable[[], float] = time.time,
        owner: Mapping[str, str] | None = None,
    ) -> JournalWriter[T]:
        """Open (creating if needed) a journal directory for appending.

        Creates the directory (0700, parents too, each made durable) or checks the existing one (ours, not
        group/world-writable, not a symlink; its parent owned by root or us and not writable by others),
        takes its exclusive lock (held until :meth:`aclose`: one writer per journal), compares the recorded
        owner with ``owner``, replays it, removes leftovers of an interrupted seal or compaction, truncates a
        torn tail durably (exposed as :attr:`repaired`), makes sure a live segment exists and records
        ``owner`` when none is recorded yet. Every file is checked before it is opened or changed (design
        §10).
        Then starts the writer's thread (``journal-writer <directory>``), which every append goes through
        until :meth:`aclose`. Cancellation: shielded; it completes, then the cancel is seen.

        Args:
            directory: the journal directory (``state_dir/journal``).
            codec: encodes and decodes the caller's events.
            wall_clock: Unix seconds for each record's informational ``wall_time``.
            owner: who the journal belongs to (the agent passes ``{"agent": NAME, "unit": UNIT}``); None
                neither checks nor records an owner.

        Raises:
            JournalBusyError: another writer holds the directory's lock (nothing read or changed).
            JournalOwnerError: the journal records another owner (nothing changed).
            JournalRefusedError: the directory, its parent or a file in it is not ours (nothing changed
                through it).
            JournalCorruptError: corruption that is not a torn tail (nothing is truncated or removed).
            JournalVersionError: a segment of a newer format version.
            JournalDecodeError: a record the codec cannot decode.
            OSError: the directory cannot be created or read.
        """
        self = cls(os.path.abspath(os.fspath(directory)), codec, wall_clock)
        with anyio.CancelScope(shield=True):
            owned = dict(owner) if owner is not None else None
            result, repaired, live, dir_fd = await anyio.to_thread.run_sync(_prepare, self.directory, owned)
            try:
                self._records = await anyio.to_thread.run_sync(_decode, result, codec)
            except BaseException:
                os.close(live.fd)
                os.close(dir_fd)
                raise
        self._scan, self.repaired, self._live, self._dir_fd = result, repaired, live, dir_fd
        self._next_seq = self._write_seq = result.next_seq
        # A daemon: a writer left open does not keep the process alive (an append that has not returned
        # was never promised durable); aclose() stops and joins it. The thread holds the writer only while
        # it writes a batch, so one that is dropped without aclose() is collected and its thread ends.
        name = f"journal-writer {directory}"
        self._thread = threading.Thread(target=_serve, args=(self._queue, weakref.ref(self)), name=name)
        self._thread.daemon = True
        weakref.finalize(self, self._queue.put, None)
        self._thread.start()
        return self

    async def __aenter__(self) -> JournalWriter[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def records(self) -> Sequence[Record[T]]:
        """Every visible record, replayed and appended, in sequence order (a snapshot of the list)."""
        return tuple(self._records)

    @property
    def next_seq(self) -> int:
        """The sequence number the next appended record will get."""
        return self._next_seq

    def _check_usable(self) -> None:
        if self._closed:
            raise JournalClosedError(f"journal {self.directory} is closed", self.directory)
        if self._poisoned is not None:
            raise self._poisoned

    async def append(self, episode_id: str, event: T) -> Record[T]:
        """Append one event; return only when it is on stable storage (written and fdatasynced).

        Concurrent calls are group-committed: one write and one fdatasync per batch.

        Args:
            episode_id: the episode (operation id); non-empty, at most 65535 UTF-8 bytes, not ``"-"``.
            event: the event; encoded with the codec before anything is written.

        Returns:
            The durable record with its sequence number.

        Raises:
            ValueError: a bad episode id, or an encoded record above 16 MiB (nothing written).
            JournalFullError: ENOSPC/EDQUOT; the record is not in the journal, which stays readable and
                usable once space is freed.
            JournalPoisonedError: an fsync failed now or earlier; nothing more is accepted.
            JournalClosedError: :meth:`aclose` was called.
            Exception: whatever ``codec.encode`` raises (nothing written).

        Cancellation: shielded. When the call returns the record is durable; a cancel that arrives while
        it runs takes effect afterwards.
        """
        if episode_id == SNAPSHOT_EPISODE:
            raise ValueError(f"episode id {SNAPSHOT_EPISODE!r} is reserved for compaction snapshots")
        return await self._append(episode_id, event, None)

    async def seed(self, event: T) -> Record[T]:
        """Append ``event`` as a snapshot record that covers no record, as an empty journal's first record.

        For a journal started afresh (``journal quarantine``, design §10): the snapshot carries what an
        earlier journal established (the caller's facts), and compaction summarises it like any other
        snapshot. Durable like :meth:`append`.

        Raises:
            ValueError: the journal already holds a record (nothing written).
            JournalFullError, JournalPoisonedError, JournalClosedError: as :meth:`append`.
        """
        if self._next_seq != 1 or self._records:
            raise ValueError("only an empty journal can be seeded")
        return await self._append(SNAPSHOT_EPISODE, event, 0)

    async def _append(self, episode_id: str, event: T, covers_through: int | None) -> Record[T]:
        self._check_usable()
        eid = episode_id.encode("utf-8")
        if not eid or len(eid) > MAX_EPISODE_ID:
            raise ValueError(f"episode id must be 1..{MAX_EPISODE_ID} UTF-8 bytes, got {len(eid)}")
        wall_time = self._clock()
        payload = encode_envelope(eid, wall_time, self._codec.encode(event), covers_through)
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"journal record of {len(payload)} bytes exceeds {MAX_PAYLOAD} bytes")
        pending = _Pending(episode_id, wall_time, event, payload, covers_through)
        with anyio.CancelScope(shield=True):
            if self._busy:
                while self._busy:
                    await self._wait_idle()
                self._check_usable()  # closed or poisoned while we waited: nothing was written
            batch = self._join(pending)
            await batch.done.wait()
        if batch.error is not None:
            raise batch.error
        assert pending.record is not None
        return pending.record

    def _join(self, pending: _Pending) -> _Batch:
        """Add ``pending`` to the open batch (a new one, queued for the thread, when there is none)."""
        with self._lock:
            batch = self._open
            if batch is not None:
                batch.entries.append(pending)
                return batch
            batch = self._open = _Batch(anyio.lowlevel.current_token())
            batch.entries.append(pending)
        self._unsettled += 1
        self._queue.put(batch)
        return batch

    async def _wait_idle(self) -> None:
        if self._idle is None:
            self._idle = anyio.Event()
        await self._idle.wait()

    async def _acquire(self) -> None:
        """Become the only task touching the files (seal, compact, close): no append waits for the thread
        and none starts until :meth:`_release`. Callers are shielded."""
        while self._busy:
            await self._wait_idle()
        self._busy = True
        while self._unsettled:
            if self._drained is None:
                self._drained = anyio.Event()
            await self._drained.wait()

    def _release(self) -> None:
        self._busy = False
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.set()

    def _process(self, batch: _Batch, broken: JournalPoisonedError | None) -> JournalPoisonedError | None:
        """In the writer thread: write ``batch`` (or fail it with ``broken``, the error of an earlier failed
        sync), then have it settled on its event loop; returns what later batches must fail with.

        Every batch is settled exactly once, whatever happens here. An exception that is not a write or
        sync failure (a bug, or a test standing for a crash) is raised to the batch's waiters as it is and
        poisons the writer: what reached the file is unknown.
        """
        with self._lock:
            if self._open is batch:
                self._open = None  # from here on the batch is ours alone; later appends open the next one
        if broken is not None:
            batch.error = broken
        else:
            try:
                self._commit(batch)
            except BaseException as exc:
                path = self._live.path
                batch.error = exc
                batch.poisons = JournalPoisonedError(
                    f"journal {path}: an append failed unexpectedly ({exc!r}); no further appends", path
                )
                batch.poisons.__cause__ = exc
            if isinstance(batch.error, JournalPoisonedError):
                batch.poisons = batch.error
            broken = batch.poisons
        token = batch.token
        # The event loop may be gone (its run ended with the append still parked): nobody waits then.
        with contextlib.suppress(Exception):
            token.backend_class.run_sync_soon(self._settle, (batch,), token.native_token)
        return broken

    def _commit(self, batch: _Batch) -> None:
        """Frame ``batch``, write it with one pwrite and one fdatasync, and make its records (or set its
        error). Runs in the writer thread."""
        live = self._live
        first = seq = self._write_seq
        chain = live.chain
        frames = []
        for p in batch.entries:
            frame, chain = encode_frame(seq, p.payload, chain)
            frames.append(frame)
            seq += 1
        data = b"".join(frames)
        try:
            self._write_sync(live.fd, data, live.offset)
        except _Refused as exc:
            cause = exc.__cause__
            error = JournalFullError(f"journal {live.path}: no space left to append ({cause})", live.path)
            error.__cause__ = cause
            batch.error = error
            return
        except _Broken as exc:
            cause = exc.__cause__
            poisoned = JournalPoisonedError(
                f"journal {live.path}: {exc}; no further appends (fsync is never retried)", live.path
            )
            poisoned.__cause__ = cause
            batch.error = poisoned
            return
        live.offset += len(data)
        live.chain = chain
        batch.end, batch.chain = live.offset, chain
        self._write_seq = seq
        for p in batch.entries:
            p.record = Record(first, p.episode_id, p.wall_time, p.event)
            first += 1

    def _settle(self, batch: _Batch) -> None:
        """On the event loop: take in a batch the thread finished, in the order batches were written, and
        wake its waiters."""
        self._unsettled -= 1
        if batch.error is None:
            seg = self._scan.segments[-1]
            records = self._records
            for p in batch.entries:
                assert p.record is not None
                records.append(p.record)
                seg.episodes.add(p.episode_id)
            seg.last_seq = records[-1].seq
            self._next_seq = seg.last_seq + 1
            seg.end, seg.chain = batch.end, batch.chain
        elif batch.poisons is not None and self._poisoned is None:
            self._poisoned = batch.poisons
        batch.done.set()
        if self._unsettled == 0 and self._drained is not None:
            drained, self._drained = self._drained, None
            drained.set()

    @staticmethod
    def _write_sync(fd: int, data: bytes, offset: int) -> None:
        try:
            _segment.pwrite_all(fd, data, offset)
        except OSError as exc:
            # Cut the partial batch off so that nothing half-written is on disk or accepted on replay.
            try:
                os.ftruncate(fd, offset)
                os.fdatasync(fd)
            except OSError as exc2:
                raise _Broken(f"write failed ({exc}) and could not be cut off") from exc2
            if exc.errno in _FULL_ERRNOS:
                raise _Refused() from exc
            raise _Broken(f"write failed and was cut off ({exc})") from exc
        try:
            os.fdatasync(fd)
        except OSError as exc:
            raise _Broken(f"fdatasync failed ({exc})") from exc

    async def seal(self, is_closed: Callable[[str], bool]) -> bool:
        """Seal the live segment into a zstd segment if all its records belong to closed episodes.

        Crash-safe order: the compressed copy is written to a temp file, fsynced, checked, renamed to
        ``<first>.jnl.zst`` and the directory fsynced (from here replay reads the sealed copy and ignores the
        live file); then the live file is removed (directory fsync) and a new live segment created. At
        no point does replay see a record twice or miss one.

        Args:
            is_closed: tells whether an episode id is closed (snapshot records count as closed).

        Returns:
            True if a segment was sealed; False if the live segment is empty or holds a record of an open
            episode.

        Raises:
            JournalPoisonedError: a step after the sealed copy's rename failed (the writer is poisoned;
                the next :meth:`open` finishes the seal), or the writer was poisoned before.
            JournalClosedError: the writer is closed.
            OSError: writing the sealed copy failed before its rename (nothing changed; appends go on).
        """
        self._check_usable()
        sealed = False
        with anyio.CancelScope(shield=True):
            await self._acquire()
            try:
                self._check_usable()
                sealed = await self._seal_locked(is_closed)
            finally:
                self._release()
        return sealed

    async def _seal_locked(self, is_closed: Callable[[str], bool]) -> bool:
        seg = self._scan.segments[-1]
        if seg.last_seq < seg.first_seq:
            return False
        if not all(e == SNAPSHOT_EPISODE or is_closed(e) for e in seg.episodes):
            return False
        live = self._live
        sealed_path = os.path.join(self.directory, segment_name(seg.first_seq, sealed=True))
        new_path = os.path.join(self.directory, segment_name(self._next_seq, sealed=False))
        tmp_path = sealed_path + TMP_SUFFIX
        # Until the rename, a failure changes nothing (the temp file is removed, appends go on).
        dir_fd = self._dir_fd
        await anyio.to_thread.run_sync(_write_sealed_tmp, dir_fd, live.fd, live.path, live.offset, tmp_path)
        try:
            fd, chain = await anyio.to_thread.run_sync(
                _publish_sealed, dir_fd, tmp_path, sealed_path, live.fd, live.path, new_path, self._next_seq
            )
        except OSError as exc:
            # Past the rename, replay may read the sealed copy and ignore the live file: appending to it
            # would lose records. Refuse everything; the next open() finishes the seal from the disk.
            self._poisoned = JournalPoisonedError(
                f"journal {live.path}: sealing failed after the sealed copy was made ({exc}); "
                "reopen the journal to finish",
                live.path,
            )
            raise self._poisoned from exc
        from ._reader import Segment

        seg.sealed, seg.path = True, sealed_path
        new = Segment(new_path, self._next_seq, sealed=False)
        new.end, new.chain = SEGMENT_HEADER_SIZE, chain
        self._live = _Live(fd, new_path, SEGMENT_HEADER_SIZE, chain)
        self._scan.segments.append(new)
        return True

    async def compact(
        self,
        keep_episodes: int,
        is_closed: Callable[[str], bool],
        summarize: Callable[[Sequence[Record[T]]], T],
    ) -> CompactStats:
        """Seal, then drop the oldest sealed segments that hold only old closed episodes (design §5).

        An episode is old when it is closed and not among the newest ``keep_episodes`` closed episodes
        (ordered by their last record). Only a prefix of the sealed segments is dropped, and only segments
        whose every record is of an old episode or an earlier snapshot. Before anything is removed, one
        snapshot record whose event is ``summarize(records being dropped)`` is appended durably under the
        episode id ``"-"``; it hides the records it covers from replay, so a crash at any point leaves each
        record visible exactly once (leftover files are removed by the next :meth:`open`).

        Args:
            keep_episodes: closed episodes to keep in full (``journal.keep_episodes``), >= 0.
            is_closed: tells whether an episode id is closed.
            summarize: builds the snapshot event from the records being dropped (they may include an
                earlier snapshot).

        Returns:
            :class:`CompactStats`.

        Raises:
            ValueError: ``keep_episodes`` < 0.
            JournalFullError, JournalPoisonedError, JournalClosedError: as for :meth:`append` and
                :meth:`seal`; nothing was removed.
            OSError: removing the dropped segment files failed after the snapshot was durable; replay
                already hides them and the next :meth:`open` removes them.
        """
        if keep_episodes < 0:
            raise ValueError(f"keep_episodes must be >= 0, got {keep_episodes}")
        sealed = await self.seal(is_closed)
        stats = CompactStats(sealed, 0, 0, None)
        with anyio.CancelScope(shield=True):
            await self._acquire()
            try:
                self._check_usable()
                stats = await self._compact_locked(sealed, keep_episodes, is_closed, summarize)
            finally:
                self._release()
        return stats

    async def _compact_locked(
        self,
        sealed: bool,
        keep_episodes: int,
        is_closed: Callable[[str], bool],
        summarize: Callable[[Sequence[Record[T]]], T],
    ) -> CompactStats:
        last_of: dict[str, int] = {}
        for r in self._records:
            if r.episode_id != SNAPSHOT_EPISODE:
                last_of[r.episode_id] = r.seq
        closed = sorted((s, e) for e, s in last_of.items() if is_closed(e))
        # The newest ``keep_episodes`` closed episodes (all of them while there are fewer): the start is
        # clamped at 0, a negative slice start would count from the end and keep too few.
        keep = {e for _, e in closed[max(0, len(closed) - keep_episodes) :]} if keep_episodes else set()
        old = {e for _, e in closed} - keep
        old.add(SNAPSHOT_EPISODE)
        drop = []
        for seg in self._scan.segments[:-1]:
            if not seg.sealed or not seg.episodes <= old:
                break
            drop.append(seg)
        if not drop:
            return CompactStats(sealed, 0, 0, None)
        covers = drop[-1].last_seq
        dropped = [r for r in self._records if r.seq <= covers]
        summary = summarize(dropped)
        eid = SNAPSHOT_EPISODE.encode()
        wall_time = self._clock()
        payload = encode_envelope(eid, wall_time, self._codec.encode(summary), covers)
        pending = _Pending(SNAPSHOT_EPISODE, wall_time, summary, payload, covers)
        batch = self._join(pending)  # we hold the files: the batch is this record alone
        await batch.done.wait()
        if batch.error is not None:
            raise batch.error
        assert pending.record is not None
        self._records = [r for r in self._records if r.seq > covers]
        self._scan.segments = self._scan.segments[len(drop) :]
        # Oldest first; a crash part-way leaves covered leftovers that replay hides.
        await anyio.to_thread.run_sync(_segment.remove_durable, self._dir_fd, [s.path for s in drop])
        return CompactStats(sealed, len(drop), len(dropped), pending.record.seq)

    async def aclose(self) -> None:
        """Wait for the appends in flight, stop the writer thread, then close the live segment; later calls
        raise Closed.

        Idempotent. Cancellation: shielded.
        """
        with anyio.CancelScope(shield=True):
            await self._acquire()
            try:
                if self._closed:
                    return
                self._closed = True
                thread, self._thread = self._thread, None
                if thread is not None:
                    self._queue.put(None)
                    await anyio.to_thread.run_sync(thread.join)
                try:
                    os.close(self._live.fd)
                finally:
                    os.close(self._dir_fd)  # releases the journal directory's lock
            finally:
                self._release()


def _serve(batches: queue.SimpleQueue[_Batch | None], ref: weakref.ReferenceType[JournalWriter[Any]]) -> None:
    """The writer thread: process the queued batches in order until told to stop (``None``, put by
    :meth:`JournalWriter.aclose` or when the writer is collected)."""
    broken: JournalPoisonedError | None = None
    while (batch := batches.get()) is not None:
        writer = ref()
        if writer is None:  # cannot happen while an append waits: it holds the writer
            return
        broken = writer._process(batch, broken)
        del writer


def _write_sealed_tmp(dir_fd: int, live_fd: int, live_path: str, length: int, tmp_path: str) -> None:
    """Compress the live segment's first ``length`` bytes into ``tmp_path`` and fsync it, checked by a
    round trip; on failure the temp file is removed and nothing else has changed.

    The live bytes are read through the writer's own descriptor (opened ``O_WRONLY``: a second, checked
    read-only descriptor is opened relative to the directory)."""
    import zstandard

    del live_fd
    fd = safefs.open_file(dir_fd, os.path.basename(live_path), os.O_RDONLY, live_path)
    try:
        content = os.pread(fd, length, 0)
    finally:
        os.close(fd)
    if len(content) != length:
        raise OSError(errno.EIO, f"live segment shorter than its {length} committed bytes", live_path)
    compressed = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(content)
    if zstandard.ZstdDecompressor().decompress(compressed) != content:
        raise OSError(errno.EIO, "zstd round trip of the sealed segment differs", tmp_path)
    _segment.remove_leftover(dir_fd, tmp_path)
    name = os.path.basename(tmp_path)
    fd = safefs.open_file(dir_fd, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, tmp_path)
    try:
        _segment.pwrite_all(fd, compressed, 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    os.close(fd)


def _publish_sealed(
    dir_fd: int, tmp_path: str, sealed_path: str, old_fd: int, old_path: str, new_path: str, first_seq: int
) -> tuple[int, int]:
    """Rename the sealed copy into place (directory fsync), remove the now shadowed live file (directory
    fsync) and create the next live segment. Returns its fd and chain seed."""
    _segment.rename_durable(dir_fd, tmp_path, sealed_path)
    _segment.remove_durable(dir_fd, [old_path])
    created = _segment.create_live(dir_fd, new_path, first_seq)
    os.close(old_fd)  # only on success: on failure the writer still owns it and aclose() closes it
    return created

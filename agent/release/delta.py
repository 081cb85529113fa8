"""Delta upgrades (docs/delta.md): the candidate rebuilt from the current slot's bytes and a zstd delta.

A delta is one standard zstd frame (RFC 8878) compressed with the old binary as a raw-content dictionary,
what ``zstd --patch-from=OLD NEW`` writes and what :func:`make_delta` writes with the ``zstandard`` library.
:class:`DeltaSource` is an :class:`upgrade_core.ports.ArchiveSource`: it fetches the delta and decodes it
against the current slot in one streaming pass into the staging file (``agent.release.extract``), checks
the delta's sha256 and the rebuilt member's, and, when a full archive was given beside the delta, falls
back to it in the same episode if the delta is refused for any reason of its own (another base, corrupt,
cut, over a limit, unsigned, unreachable). The reason is carried in
:attr:`~upgrade_core.ports.StagedCandidate.delta_refused` and journaled in ``ArchiveFetched``.

Memory: the base is loaded whole (libzstd takes a dictionary as one contiguous buffer, and a match in the
delta may refer to any offset of it), so it is bounded by ``limits.max_member_bytes``; the decoder's window
by ``2 * limits.max_member_bytes`` (:func:`agent.release.extract.delta_window_limit`), its buffer by the
frame's content size when the frame names one; the output is written one zstd block (128 KiB at most) at
a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs

from agent.fs import durable
from agent.fs.regular import read_regular_file
from agent.release.extract import DeltaBase, first_line
from agent.release.source import ArchiveSourceImpl
from upgrade_core.errors import CandidateError, FetchError
from upgrade_core.ports import StagedCandidate

if TYPE_CHECKING:
    from upgrade_core import Slot

__all__ = ["DeltaMade", "DeltaSource", "make_delta"]

BaseReader = Callable[["Slot"], Awaitable[DeltaBase]]
"""Given the slot being staged, the current slot's bytes as a :class:`DeltaBase` (the session's host
reads them; this layer never names a host path)."""


@attrs.define
class DeltaSource:
    """The :class:`upgrade_core.ports.ArchiveSource` of ``upgrade --delta`` (docs/delta.md).

    ``stage(source, expected_sha256, ...)`` is called with the delta's source and sha256 (the request's).

    Attributes:
        deltas: fetches and decodes the delta (``[download]``, ``[limits]``, and ``[trust]`` with the
            signature at ``<delta>.minisig``).
        read_base: the current slot's bytes, given the slot being staged (see :data:`BaseReader`).
        fallback: stages the full archive (its own ``--signature``), or None when no archive was given.
        fallback_source: ``--archive`` as given (may carry secrets), or None.
        fallback_sha256: ``--sha256``, or None.
        on_fallback: called with the one-line reason before the fall-back starts (a log line).
    """

    deltas: ArchiveSourceImpl
    read_base: BaseReader
    fallback: ArchiveSourceImpl | None = None
    fallback_source: str | None = None
    fallback_sha256: str | None = None
    on_fallback: Callable[[str], None] | None = None

    async def stage(
        self, source: str, expected_sha256: str | None, staging_path: str, slot: Slot
    ) -> StagedCandidate:
        """Rebuild the candidate from the current slot and the delta at ``source``; fall back if refused.

        Returns:
            The staged candidate: the rebuilt member (``archive_*`` are the delta's), or the full archive's
            member with ``delta_refused`` set to the reason the delta was refused.

        Raises:
            DeltaBaseError, DigestMismatchError, ArchiveLimitError, ArchiveTruncatedError,
            ArchiveRejectedError, SignatureError, FetchError: the delta was refused and no archive was
            given (or the archive was refused too: its own error). NoSpaceError, HostError: the host's
            failures never fall back (the archive would meet them too).

        Cancellation: the staging file is removed; no other effect.
        """
        try:
            base = await self.read_base(slot)
            return await self.deltas.stage_from(source, expected_sha256, staging_path, slot, base)
        except (CandidateError, FetchError) as exc:
            if self.fallback is None or self.fallback_source is None:
                raise
            reason = first_line(exc)
        if self.on_fallback is not None:
            self.on_fallback(reason)
        staged = await self.fallback.stage(self.fallback_source, self.fallback_sha256, staging_path, slot)
        return attrs.evolve(staged, delta_refused=reason)


@attrs.frozen
class DeltaMade:
    """What :func:`make_delta` wrote.

    Attributes:
        delta_sha256: 64 lowercase hex of the delta file (``upgrade --delta-sha256``).
        delta_size: the delta's size, bytes.
        member_sha256: 64 lowercase hex of the target (``upgrade --member-sha256``).
        member_size: the target's size, bytes.
    """

    delta_sha256: str
    delta_size: int
    member_sha256: str
    member_size: int


def make_delta(old: str, new: str, out: str, *, level: int = 19) -> DeltaMade:
    """``delta make``: write at ``out`` a zstd frame of ``new`` made with ``old`` as a raw-content dictionary.

    The frame is what ``zstd --patch-from=OLD NEW`` writes (``zstd -d --patch-from=OLD`` decodes it): the
    window covers the larger of the two files (the next power of two above it, at least 1 KiB, as zstd's
    own patch-from mode picks), long-distance matching on, content size and checksum written, no
    dictionary id. Both files are read whole (a publisher's machine, not a host).

    Args:
        old: the binary the hosts run (the base).
        new: the target binary.
        out: the delta file, written atomically (mode 0644).
        level: zstd level, 1-22.

    Returns:
        The :class:`DeltaMade` digests and sizes.

    Raises:
        OSError: ``old`` or ``new`` cannot be read (not a regular file, missing), ``out`` cannot be written.
        ValueError: either file is empty or larger than 2 GiB (zstd's dictionary and window ceiling here).
    """
    import zstandard

    base = read_regular_file(old)
    target = read_regular_file(new)
    for path, data in ((old, base), (new, target)):
        if not data:
            raise ValueError(f"{path}: the file is empty")
        if len(data) > (1 << 31):
            raise ValueError(f"{path}: larger than 2 GiB")
    window_log = max(10, max(len(base), len(target)).bit_length())
    params = zstandard.ZstdCompressionParameters.from_level(
        level, source_size=len(target), dict_size=len(base), window_log=window_log, enable_ldm=True,
        write_checksum=1, write_content_size=1, write_dict_id=0,
    )
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    delta = zstandard.ZstdCompressor(dict_data=dictionary, compression_params=params).compress(target)
    durable.atomic_write_bytes(out, delta, 0o644)
    return DeltaMade(
        delta_sha256=hashlib.sha256(delta).hexdigest(),
        delta_size=len(delta),
        member_sha256=hashlib.sha256(target).hexdigest(),
        member_size=len(target),
    )

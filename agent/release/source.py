"""``ArchiveSourceImpl``: the real :class:`upgrade_core.ports.ArchiveSource` (design §4.3 step 3, design §6).

Fetch (:mod:`agent.release.fetch`) and extraction (:mod:`agent.release.extract`) run as one streaming pass:
the archive is never stored whole, its sha256 is taken on the way (over the file as published: a content
coding the
server applied is undone first), and only the member (or, with member policy ``none``, the file itself)
reaches the disk, in the staging file the host prepared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from agent.fs import durable
from agent.redact import redact_url
from agent.release.extract import DeltaBase, ExtractLimits, MemberPolicy, extract, member_parts
from agent.release.fetch import ChunkSink, CodingSink, FetchPolicy, ProgressCallback, fetch
from agent.release.sources import parse_sha256
from upgrade_core.ports import StagedCandidate

# agent.release.trust loads the whole of upgrade_core and the minisign code: only with a [trust]
if TYPE_CHECKING:
    from agent.release.trust import ReleaseTrust
    from upgrade_core import Slot

__all__ = ["ArchiveSourceImpl"]


@attrs.define
class ArchiveSourceImpl:
    """Fetches an archive and stages its member, enforcing ``[download]`` and ``[limits]``.

    Attributes:
        download: ``[download]`` rules (http policy, redirects, timeouts, TLS trust and proxy).
        limits: ``[limits]`` bounds, bytes and entries.
        member: ``agent.member`` with ``{name}``/``{arch}`` already substituted.
        member_policy: ``"exact"``, ``"select"`` (design §6) or ``"none"`` (the file itself is the
            candidate, no archive).
        progress: optional ``progress(bytes_so_far, total_or_None)`` for the CLI's bar or log lines.
        headers: extra request headers (e.g. ``Authorization``), sent to the source's origin only.
        trust: ``[trust]`` at work (docs/trust.md): the release's minisign signature is fetched and its key
            checked before the archive, and verified over the archive as published before ``stage``
            returns; None when no key is configured.

    Raises:
        ConfigError: at construction, when ``member`` is absolute or contains ``..``.
    """

    download: FetchPolicy = attrs.field(factory=FetchPolicy)
    limits: ExtractLimits = attrs.field(factory=ExtractLimits)
    member: str = "agent"
    member_policy: MemberPolicy = "exact"
    progress: ProgressCallback | None = None
    headers: Mapping[str, str] | None = None
    trust: ReleaseTrust | None = None

    def __attrs_post_init__(self) -> None:
        member_parts(self.member)

    async def stage(
        self, source: str, expected_sha256: str | None, staging_path: str, slot: Slot
    ) -> StagedCandidate:
        """Fetch ``source``, hash, decompress and extract the member into ``staging_path``; fsync it.

        Args:
            source: URL or path (may carry secrets; only ``redact_url(source)`` is ever shown).
            expected_sha256: over the file as published (any content coding the server applied is undone
                first); 64 hex, ``sha256:`` prefix accepted; or None.
            staging_path: from ``Host.prepare_staging``; created here exclusively, mode 0755.
            slot: the (inactive) slot the candidate is for.

        Returns:
            The :class:`~upgrade_core.ports.StagedCandidate` (member and archive digests and sizes).

        Raises:
            UsageError: malformed ``expected_sha256`` or unsupported source scheme.
            FetchError: and subclasses (HTTP status, redirect, length, timeout), see
            ``agent.release.fetch.fetch``.
            CandidateError: ArchiveRejectedError, ArchiveTruncatedError, ArchiveLimitError,
                DigestMismatchError, see ``agent.release.extract.extract_sync``.
            NoSpaceError: the staging filesystem filled up.
            HostError: the staging file could not be created or written.
            SignatureError, KeyringError: the release's signature is missing (when required), malformed,
                by a key this host does not trust, or does not match the archive (no staging file is left).

        Cancellation: the staging file is removed; no other effect.
        """
        return await self.stage_from(source, expected_sha256, staging_path, slot)

    async def stage_from(
        self,
        source: str,
        expected_sha256: str | None,
        staging_path: str,
        slot: Slot,
        delta_base: DeltaBase | None = None,
    ) -> StagedCandidate:
        """:meth:`stage`, or with ``delta_base`` a delta's (docs/delta.md): ``source`` is one zstd frame made
        against ``delta_base.content``, decoded in the same streaming pass into ``staging_path`` and checked
        against ``delta_base.member_sha256``; its signature (``[trust]``) is over the delta as published.

        Raises:
            Everything :meth:`stage` raises; with a delta also DeltaBaseError (the delta is the file its
            digest names but was made against other bytes) and DigestMismatchError for the rebuilt member.
        """
        digest = parse_sha256(expected_sha256)
        signed = await self.trust.release_signature(source) if self.trust is not None else None
        hasher = signed[0].message_hasher() if signed is not None else None

        async def feed(sink: ChunkSink, coding: CodingSink) -> object:
            return await fetch(
                source,
                self.download,
                sink,
                headers=self.headers,
                max_bytes=self.limits.max_archive_bytes,
                progress=self.progress,
                content_coding=coding,
            )

        result = await extract(
            feed,
            staging_path,
            member=self.member,
            policy=self.member_policy,
            limits=self.limits,
            expected_sha256=digest,
            source_name=redact_url(source),
            observe=hasher.update if hasher is not None else None,
            delta_base=delta_base,
        )
        release = None
        if signed is not None and hasher is not None:
            from agent.release.trust import trusted_release

            try:
                release = trusted_release(signed[0], signed[1], hasher)
            except BaseException:
                with contextlib.suppress(OSError):
                    durable.remove_if_present(staging_path, sync_dir=False)
                raise
        return StagedCandidate(
            slot=slot,
            staging_path=staging_path,
            sha256=result.member_sha256,
            size=result.member_size,
            archive_sha256=result.archive_sha256,
            archive_size=result.archive_size,
            release=release,
        )

"""User input -> :class:`upgrade_core.UpgradeRequest`, checked before the lock and before any episode.

Bad input never opens an episode (docs/cli.md): the source (scheme, URL syntax, ``download.allow_http``, a
local file that must exist), the digest, the operation id and the expected version are all checked here,
before the host lock is taken and before ``EpisodeOpened`` is journaled. Every refusal is one
:class:`~agent.errors.UsageError` line (exit 2) that names the option and shows the source only in
its redacted form (case C08). Nothing here opens a file: a local source is ``stat``-ed, never read, so a
FIFO planted as the "archive" cannot make the command wait.
"""

from __future__ import annotations

import os
import stat
import uuid

import attrs

from agent.errors import UsageError
from agent.redact import redact_url
from agent.release.sources import AllowHttp, check_http_allowed, parse_sha256, parse_source
from upgrade_core import OPERATION_ID_RE, UpgradeRequest
from upgrade_core.errors import FetchError

__all__ = ["DeltaPlan", "check_source", "make_delta_request", "make_request"]

_MAX_VERSION_CHARS = 128


def check_source(source: str, allow_http: AllowHttp, option: str = "--archive") -> str:
    """Check an archive source before anything is locked or journaled.

    Args:
        source: ``--archive``: an ``https://``/``http://``/``file://`` URL or a plain path.
        allow_http: ``download.allow_http`` (plain http is refused here as it would be by the fetch).

    Returns:
        The redacted source (userinfo, query and fragment removed), the only form that is printed or stored.

    Raises:
        UsageError: an unsupported scheme, a malformed URL, plain http the policy refuses, or a local path
            that does not exist or is not a regular file (exit 2).
    """
    shown = redact_url(source)
    target = parse_source(source)
    if target.local_path is None:
        try:
            check_http_allowed(source, allow_http)
        except FetchError as exc:
            raise UsageError(f"{option} {exc}") from None
        return shown
    try:
        st = os.stat(target.local_path)
    except OSError as exc:
        raise UsageError(f"{option} {shown}: {exc.strerror or exc}") from None
    except ValueError:  # a NUL byte: no such path can exist
        raise UsageError(f"{option} {shown}: not a valid path") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{option} {shown}: not a regular file")
    return shown


def operation_id(operation: str | None) -> str:
    """``--operation``, checked (design §4.3 step 1), or a fresh uuid4 hex when None.

    Raises:
        UsageError: not ``[A-Za-z0-9._-]{1,64}`` (exit 2).
    """
    op = uuid.uuid4().hex if operation is None else operation
    if not OPERATION_ID_RE.fullmatch(op):
        raise UsageError(f"--operation {op!r}: must match [A-Za-z0-9._-]{{1,64}}")
    return op


def make_request(
    archive: str,
    *,
    allow_http: AllowHttp,
    sha256: str | None = None,
    operation: str | None = None,
    expect_version: str | None = None,
    signature: str | None = None,
    retry_known_bad: bool = False,
    option: str = "--archive",
    stage: bool = False,
) -> UpgradeRequest:
    """Build a checked :class:`~upgrade_core.UpgradeRequest` from what an operator or a caller typed.

    Args:
        archive: the source (see :func:`check_source`).
        allow_http: ``download.allow_http``.
        sha256: 64 hex digits, optionally prefixed ``sha256:``; None or "" for none.
        operation: ``[A-Za-z0-9._-]{1,64}`` (design §4.3 step 1); None for a fresh uuid4 hex.
        expect_version: a version token as the verifier reads it (an optional ``v``, two or more
            dot-separated numbers, an optional ``-pre.release`` and ``+build`` metadata; see
            ``agent.release.verify.normalise_version``), at most 128 characters; None for any. It is compared
            with the candidate's version after both are normalised (no leading ``v``).
        signature: ``--signature``, a source as ``archive`` is (checked the same way); None for
            ``<archive>.minisig`` when ``[trust]`` has keys.
        retry_known_bad: ``--retry-known-bad``: offer a release the journal knows as bad anyway.
        option: the option ``archive`` came from, named in refusals (``--archive``, ``--delta``).
        stage: ``--stage``: stop once the candidate is verified and installed in the inactive slot.

    Returns:
        The request; its ``source_redacted`` is the only form of ``archive`` that is journaled.

    Raises:
        UsageError: any of the above is malformed (exit 2). Nothing was locked, created or journaled.
    """
    source_redacted = check_source(archive, allow_http, option)
    if signature is not None:
        check_source(signature, allow_http, "--signature")
    from agent.release.verify import normalise_version

    digest = parse_sha256(sha256)
    op = operation_id(operation)
    if expect_version is not None and (
        len(expect_version) > _MAX_VERSION_CHARS or normalise_version(expect_version) is None
    ):
        shown = expect_version[:_MAX_VERSION_CHARS].encode("unicode_escape").decode("ascii")
        raise UsageError(f"--expect-version \"{shown}\": not a version such as 1.2.3 or v1.2.3-rc.1+build.7")
    return UpgradeRequest(
        op, archive, source_redacted, digest, expect_version, signature, retry_known_bad, stage
    )


@attrs.frozen
class DeltaPlan:
    """What ``upgrade --delta`` adds to its :class:`~upgrade_core.UpgradeRequest` (docs/delta.md); the
    request's own source and digest are the delta's.

    Attributes:
        member_sha256: ``--member-sha256``, 64 lowercase hex of the rebuilt binary, or None: the frame's own
            content checksum is checked instead (:class:`agent.release.extract.DeltaBase`).
        archive: ``--archive`` as given (may carry secrets), the fall-back; or None.
        archive_sha256: ``--sha256``, the fall-back archive's, or None.
    """

    member_sha256: str | None
    archive: str | None = None
    archive_sha256: str | None = None


def make_delta_request(
    delta: str,
    *,
    allow_http: AllowHttp,
    delta_sha256: str | None,
    member_sha256: str | None,
    archive: str | None = None,
    sha256: str | None = None,
    operation: str | None = None,
    expect_version: str | None = None,
    signature: str | None = None,
    retry_known_bad: bool = False,
    stage: bool = False,
) -> tuple[UpgradeRequest, DeltaPlan]:
    """``upgrade --delta SRC --delta-sha256 HEX [--member-sha256 HEX] [--archive SRC [--sha256 HEX]]``,
    checked like :func:`make_request`; the request's source is the delta, its fall-back the archive.

    ``--delta-sha256`` is required. A delta carries no name of its base, so the rebuilt binary is told from
    one rebuilt against another base by ``--member-sha256`` when given, else by the frame's own content
    checksum, which the delta's sha256 pins (a frame without one is then refused; docs/delta.md).

    Raises:
        UsageError: a bad ``--delta`` (as ``--archive``), a missing or malformed ``--delta-sha256``, a
            malformed ``--member-sha256``, a ``--sha256`` without ``--archive``, or anything
            :func:`make_request` refuses (exit 2). Nothing was locked, created or journaled.
    """
    digests: list[str | None] = []
    for option, value in (("--delta-sha256", delta_sha256), ("--member-sha256", member_sha256)):
        if not value:
            if option == "--delta-sha256":
                raise UsageError(f"upgrade --delta needs {option} HEX")
            digests.append(None)
            continue
        try:
            digests.append(parse_sha256(value))
        except UsageError:
            raise UsageError(f"{option}: expected 64 hex digits (optionally 'sha256:' first)") from None
    if sha256 and archive is None:
        raise UsageError("--sha256 is the fall-back archive's: it needs --archive")
    fallback_sha256 = None
    if archive is not None:
        check_source(archive, allow_http)
        fallback_sha256 = parse_sha256(sha256)
    request = make_request(
        delta, allow_http=allow_http, sha256=digests[0], operation=operation, expect_version=expect_version,
        signature=signature, retry_known_bad=retry_known_bad, option="--delta", stage=stage,
    )
    return request, DeltaPlan(digests[1], archive, fallback_sha256)

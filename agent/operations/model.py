"""One managed operation as a source holds it, the port sources implement, and the status documents.

An operation's *spec* has the same keys in both sources (design §10, the ``UpgradeOperation`` spec)::

    {"nodeName": "web-1", "agent": "demo-agent",
     "archive": {"url": "https://releases.example/demo-agent-1.1.0.tar.gz", "sha256": "<64 hex>",
                 "signatureURL": "https://releases.example/demo-agent-1.1.0.tar.gz.minisig"},
     "expectVersion": "1.1.0",
     "delta": {"url": "https://releases.example/demo-agent-1.0.0-1.1.0.zst", "sha256": "<64 hex>",
               "memberSHA256": "<64 hex>"}}

``archive.url``, ``archive.sha256`` and ``agent`` are required (a control plane always knows the digest it
asks for); ``nodeName`` is required by Kubernetes (the CRD) and optional in a spool file; ``signatureURL``
and ``expectVersion`` are optional. ``delta`` is optional (docs/delta.md): the candidate is then rebuilt from
the current slot and the delta, and ``archive`` is its fall-back; its ``url`` and ``sha256`` are required,
``memberSHA256`` (the rebuilt binary's digest, ``upgrade --member-sha256``) optional: without it the
frame's own content checksum tells a wrong base (docs/delta.md).
A spec that fails these checks, names another node or agent, or that
:func:`agent.session.request.make_request` refuses, is refused before any lock or episode: terminal
``Failed``, host untouched.

A control plane is trusted less than root (docs/managed.md, "A control plane is not root"): its sources
must be http(s) URLs unless ``[operations] allow_local_sources = true`` (otherwise whoever may write an
operation could make root read any local file), at most :data:`MAX_SOURCE_CHARS` characters (the CRD's
bound) and free of control characters; every value of a spec quoted in a refusal passes
:func:`agent.sanitize.clean_text`.

The status document is rendered from an :class:`~upgrade_core.OperationStatus` alone (deterministic: the
same status renders the same bytes; ``step``, ``attempt`` and bytes fetched included, each derived from the
journal's records, docs/managed.md "Step by step"), in camelCase for the Kubernetes status subresource and in
snake_case for the spool's ``<id>.status.json``; times are RFC 3339 UTC with seconds (``metav1.Time``). Its
text fields pass :func:`agent.sanitize.clean_text` within the CRD's bounds (:data:`MAX_STATUS_MESSAGE_CHARS`
for the message, 128 characters for a version, 64 for the boot id), so the API server accepts every status
and the spool's own reader (64 KiB per file) reads every status file back.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final, Protocol

import attrs

from agent.redact import redact_url
from agent.sanitize import clean_text
from upgrade_core import TERMINAL_PHASES, OperationStatus
from upgrade_core.errors import UpgradeError

__all__ = [
    "K8S_STATUS_MAX_BYTES",
    "MAX_SOURCE_CHARS",
    "MAX_STATUS_MESSAGE_CHARS",
    "SPEC_KEYS",
    "CredentialsRefused",
    "Operation",
    "OperationRefused",
    "OperationSource",
    "OperationSpec",
    "SourceError",
    "check_spec",
    "clamp",
    "held_terminal",
    "k8s_status",
    "rfc3339",
    "spool_status",
]

SPEC_KEYS = frozenset({"nodeName", "agent", "archive", "expectVersion", "delta"})
ARCHIVE_KEYS = frozenset({"url", "sha256", "signatureURL"})
DELTA_KEYS = frozenset({"url", "sha256", "memberSHA256"})

MAX_SOURCE_CHARS = 4096
"""Longest ``archive.url`` or ``archive.signatureURL`` (characters): the CRD's ``maxLength``, applied to
the spool too."""

MAX_STATUS_MESSAGE_CHARS = 2048
"""Longest status ``message`` (characters, after escaping). The CRD allows 32768; a spool status holds
the message twice (also in its condition), and JSON writes a character outside ASCII as up to 12 bytes,
so 2048 keeps every status file under the spool reader's 64 KiB (``spool.MAX_OPERATION_BYTES``)."""

_VERSION_CHARS = 128  # the CRD's maxLength of fromVersion and toVersion
_BOOT_ID_CHARS = 64  # the CRD's maxLength of bootID


@attrs.frozen
class Operation:
    """One operation a source holds for this node.

    Attributes:
        operation: the operation id (``[A-Za-z0-9._-]{1,64}``): the spool file's stem, or the Kubernetes
            object's ``metadata.uid``; the journal's episode id.
        name: what a human calls it in messages: the spool file's path, ``namespace/name`` in Kubernetes.
        spec: the decoded spec (any JSON value; :func:`check_spec` checks it).
        generation: ``metadata.generation`` (Kubernetes), 1 for a spool file; reported as
            ``observedGeneration``.
        status: the status document the source holds now (its own style), None when it holds none.
        problem: the source could not read the document (not JSON, too large, not a regular file...);
            the operation is refused with this line.
        order: the sort key the operator takes operations in (creation time, then name).
    """

    operation: str
    name: str
    spec: Any
    generation: int = 1
    status: Mapping[str, Any] | None = None
    problem: str | None = None
    order: tuple[float, str] = (0.0, "")


class OperationSource(Protocol):
    """Where operations come from and where their status goes (the spool, Kubernetes).

    Every method may raise :class:`SourceError` (the source is unreachable or refuses us; the operator
    logs it and tries again after a bounded back-off) and nothing else for a transport problem.
    """

    label: str
    """What to call the source in one log line (``spool /var/spool/...``, ``kubernetes ns/...``)."""

    async def snapshot(self) -> Sequence[Operation]:
        """Every operation addressed to this node, in :attr:`Operation.order`.

        Cancellation: no effect.
        """
        ...

    async def wait_for_change(self, timeout_s: float) -> None:
        """Return when the source may have changed, or after ``timeout_s`` seconds at the latest.

        Cancellation: no effect.
        """
        ...

    async def publish(self, op: Operation, status: OperationStatus) -> bool:
        """Make ``status`` the operation's status, rendered in the source's own style (:func:`k8s_status`
        with ``op.generation``, :func:`spool_status`); idempotent: a status the source already holds is not
        written again.

        Returns:
            True when written, False when the source already held exactly this status or the operation is
            gone (deleted in the meantime: nothing to report to).

        Cancellation: the write either landed or did not; publishing again is always safe.
        """
        ...

    async def aclose(self) -> None:
        """Release connections; idempotent."""
        ...


class SourceError(UpgradeError):
    """The source could not be read or written (network, API error, a spool directory not ours).

    The message is one line naming the source (URLs redacted). The long-running operator retries with
    back-off; ``operator --once`` stops with it (exit 3: nothing was run, the source needs attention).

    Attributes:
        http_status: the API server's HTTP status when it answered with an error (409, 404, 410...), for
            the callers that act on it; None for a transport failure or a spool source.
    """

    exit_code: ClassVar[int] = 3

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status


class CredentialsRefused(SourceError):
    """The API server refused the operator's credentials (401 Unauthorized) again after they were read
    again from where the configuration says (kubeconfig, token file, exec plugin, service account): a token
    revoked or expired and not renewed. Not retried: the operator stops (exit 3) with this one line, and
    systemd's ``Restart=on-failure`` starts it again, reading everything anew."""


class OperationRefused(Exception):
    """An operation the operator will not run (wrong node or agent, bad spec): terminal ``Failed``."""


@attrs.frozen
class OperationSpec:
    """A checked spec (see the module docstring); ``signature_url``/``expect_version`` may be None, and so
    are the ``delta_*`` fields when the spec names no delta."""

    agent: str
    url: str
    sha256: str
    node_name: str | None = None
    signature_url: str | None = None
    expect_version: str | None = None
    delta_url: str | None = None
    delta_sha256: str | None = None
    delta_member_sha256: str | None = None


def _text(doc: Mapping[str, Any], key: str, where: str, *, required: bool) -> str | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise OperationRefused(f"{where}{key}: required")
        return None
    if not isinstance(value, str) or not value:
        raise OperationRefused(f"{where}{key}: must be a non-empty string")
    return value


def _source(value: str | None, key: str, allow_local: bool) -> None:
    """Refuse ``value`` unless it is a source a control plane may name (see the module docstring)."""
    if value is None:
        return
    if len(value) > MAX_SOURCE_CHARS:
        raise OperationRefused(f"{key}: {len(value)} characters, more than {MAX_SOURCE_CHARS}")
    escaped = clean_text(value, MAX_SOURCE_CHARS * 6)  # escaped first: urlsplit drops a newline or tab
    shown = clean_text(redact_url(escaped))
    if escaped != value:
        raise OperationRefused(f"{key}: {shown}: contains control or invisible characters")
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if not allow_local and scheme not in ("http", "https"):
        raise OperationRefused(
            f"{key}: {shown}: not an http(s) URL; a control plane may name a local file only with "
            "[operations] allow_local_sources = true"
        )


def check_spec(
    spec: Any, *, agent: str, node_name: str, node_required: bool, allow_local_sources: bool = False
) -> OperationSpec:
    """Check an operation's spec against this host (before any lock, file or episode).

    Args:
        agent: ``[agent] name`` of this configuration.
        node_name: this host's node name (``[operations] node_name``).
        node_required: True for Kubernetes (the CRD requires ``nodeName``).
        allow_local_sources: ``[operations] allow_local_sources``: a local path or ``file://`` URL may be
            the archive or the signature (else only http(s) URLs).

    Raises:
        OperationRefused: one line naming the key: not an object, an unknown key, a missing or non-string
            value, another node, another agent, a ``delta`` that is not an object or lacks one of its three
            keys, a source that is not an http(s) URL (unless allowed),
            longer than :data:`MAX_SOURCE_CHARS` or holding control characters. Quoted values are cleaned
            (:func:`agent.sanitize.clean_text`).
    """
    if not isinstance(spec, Mapping):
        raise OperationRefused("spec: must be an object")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise OperationRefused(f"spec: unknown key {clean_text(unknown[0])}")
    archive = spec.get("archive")
    if not isinstance(archive, Mapping):
        raise OperationRefused("spec.archive: required, an object with url and sha256")
    unknown = sorted(set(archive) - ARCHIVE_KEYS)
    if unknown:
        raise OperationRefused(f"spec.archive: unknown key {clean_text(unknown[0])}")
    node = _text(spec, "nodeName", "spec.", required=node_required)
    name = _text(spec, "agent", "spec.", required=True)
    url = _text(archive, "url", "spec.archive.", required=True)
    sha256 = _text(archive, "sha256", "spec.archive.", required=True)
    assert name is not None and url is not None and sha256 is not None
    if node is not None and node != node_name:
        raise OperationRefused(f"spec.nodeName: addressed to node {clean_text(node)}, this is {node_name}")
    if name != agent:
        raise OperationRefused(f"spec.agent: addressed to agent {clean_text(name)}, this is {agent}")
    signature_url = _text(archive, "signatureURL", "spec.archive.", required=False)
    _source(url, "spec.archive.url", allow_local_sources)
    _source(signature_url, "spec.archive.signatureURL", allow_local_sources)
    delta: dict[str, str | None] = {"url": None, "sha256": None, "memberSHA256": None}
    if "delta" in spec:
        given = spec["delta"]
        if not isinstance(given, Mapping):
            raise OperationRefused("spec.delta: must be an object with url and sha256 (and memberSHA256)")
        unknown = sorted(set(given) - DELTA_KEYS)
        if unknown:
            raise OperationRefused(f"spec.delta: unknown key {clean_text(unknown[0])}")
        delta = {key: _text(given, key, "spec.delta.", required=key != "memberSHA256")
                 for key in sorted(DELTA_KEYS)}
        _source(delta["url"], "spec.delta.url", allow_local_sources)
    return OperationSpec(
        agent=name,
        url=url,
        sha256=sha256,
        node_name=node,
        signature_url=signature_url,
        expect_version=_text(spec, "expectVersion", "spec.", required=False),
        delta_url=delta["url"],
        delta_sha256=delta["sha256"],
        delta_member_sha256=delta["memberSHA256"],
    )


def held_terminal(op: Operation) -> bool:
    """True when the source already holds a terminal status for this very operation (acknowledged: it is
    never written again, and the operation never runs again)."""
    held = op.status
    return (
        isinstance(held, Mapping)
        and held.get("phase") in TERMINAL_PHASES
        and held.get("operation") == op.operation
    )


def rfc3339(unix_s: float | None) -> str | None:
    """``2026-11-30T14:05:06Z`` (UTC, whole seconds, as ``metav1.Time``), None for None."""
    if unix_s is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s))


K8S_STATUS_MAX_BYTES: Final = {"operation": 64, "fromVersion": 128, "toVersion": 128, "bootID": 64,
                               "message": 32768}
"""The ``maxLength`` of each string of the ``UpgradeOperation`` status (deploy/kubernetes/crd.yaml; a
condition's ``message`` has the same bound as ``message``). The apiserver counts characters; bounding the
UTF-8 bytes instead is never longer."""

ELLIPSIS: Final = "..."


def clamp(text: str, max_bytes: int) -> str:
    """``text`` when its UTF-8 encoding fits in ``max_bytes`` bytes; else its longest prefix (whole
    characters) that fits with ``...`` appended, so a reader sees it was cut. Pure.

    Used on every string the status subresource has a ``maxLength`` for (:data:`K8S_STATUS_MAX_BYTES`):
    a status the API server would refuse with 422 Invalid would never be written, and the object would
    stay ``InProgress`` while the host is fine.
    """
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    room = max(0, max_bytes - len(ELLIPSIS))
    return data[:room].decode("utf-8", errors="ignore") + ELLIPSIS[: max_bytes - room]


def _conditions(status: OperationStatus, generation: int) -> list[dict[str, Any]]:
    """One ``metav1.Condition`` in the Job convention: ``Complete`` True on success, ``Failed`` True with
    the phase as reason on any other terminal phase, ``Complete`` False while running. Every field
    ``metav1.Condition`` requires is present (``message`` may be empty; ``lastTransitionTime`` falls back to
    the start, which a status always has once an episode opened)."""
    if status.phase == "Succeeded":
        kind, value, when = "Complete", "True", status.finished_at
    elif status.terminal:
        kind, value, when = "Failed", "True", status.finished_at
    else:
        kind, value, when = "Complete", "False", status.started_at
    if when is None:
        when = status.started_at if status.started_at is not None else 0.0
    return [{
        "type": kind, "status": value, "reason": status.phase, "message": _clean(status.message) or "",
        "observedGeneration": generation, "lastTransitionTime": rfc3339(when),
    }]


def _clean(text: str | None, limit: int = MAX_STATUS_MESSAGE_CHARS) -> str | None:
    """A status text field, cleaned and bounded (:func:`agent.sanitize.clean_text`); None stays None."""
    return None if text is None else clean_text(text, limit)


def k8s_status(status: OperationStatus, generation: int) -> dict[str, Any]:
    """The ``UpgradeOperation`` status subresource (design §10, camelCase); unknown fields are left out (the
    CRD's schema has no nullable fields). Text fields are cleaned (:func:`agent.sanitize.clean_text`), then
    every string is within the CRD's ``maxLength`` (:func:`clamp`, :data:`K8S_STATUS_MAX_BYTES`): a
    candidate's long version output or a long reason is cut, never a reason for the API server to refuse
    the status."""
    doc: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": status.phase,
        "operation": status.operation,
        "fromVersion": _clean(status.from_version, _VERSION_CHARS),
        "toVersion": _clean(status.to_version, _VERSION_CHARS),
        "journalSeq": status.journal_seq,
        "bootID": _clean(status.boot_id, _BOOT_ID_CHARS),
        "startedAt": rfc3339(status.started_at),
        "finishedAt": rfc3339(status.finished_at),
        "message": _clean(status.message),
        "step": status.step,
        "attempt": status.attempt,
        "bytesFetched": status.bytes_fetched,
        "conditions": _conditions(status, generation),
    }
    for key, bound in K8S_STATUS_MAX_BYTES.items():
        if isinstance(doc[key], str):
            doc[key] = clamp(doc[key], bound)
    for condition in doc["conditions"]:
        condition["message"] = clamp(condition["message"], K8S_STATUS_MAX_BYTES["message"])
    return {k: v for k, v in doc.items() if v is not None}


def spool_status(status: OperationStatus, generation: int = 1) -> dict[str, Any]:
    """The spool's ``<id>.status.json`` (design §10: the same fields in snake_case, every key present, null
    when unknown), plus ``result`` (the design §7 result value); text fields cleaned as in
    :func:`k8s_status`."""
    return {
        "operation": status.operation,
        "phase": status.phase,
        "result": status.result,
        "from_version": _clean(status.from_version, _VERSION_CHARS),
        "to_version": _clean(status.to_version, _VERSION_CHARS),
        "message": _clean(status.message),
        "journal_seq": status.journal_seq,
        "boot_id": _clean(status.boot_id, _BOOT_ID_CHARS),
        "started_at": rfc3339(status.started_at),
        "finished_at": rfc3339(status.finished_at),
        "observed_generation": generation,
        "step": status.step,
        "attempt": status.attempt,
        "bytes_fetched": status.bytes_fetched,
        "conditions": _conditions(status, generation),
    }

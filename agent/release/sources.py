"""The syntax of an archive source and its digest (design §6 Fetch): what is checked before anything is
fetched, locked or journaled.

The command line, the session's request checks (:mod:`agent.session.request`), install's digest check and
Ignition's renderer refuse a bad ``--archive``, ``--signature`` or ``--sha256`` here, and the fetch
(:mod:`agent.release.fetch`) applies the same rules to every URL it requests. This module loads no network
library: an idle operator holds a session, whose checks load it, without paying for httpx (design §9
``operator.idle``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal
from urllib.parse import unquote, urlsplit

import attrs

from agent.errors import UsageError
from agent.redact import redact_url
from upgrade_core.errors import FetchError

__all__ = ["AllowHttp", "SourceTarget", "check_http_allowed", "parse_sha256", "parse_source"]

AllowHttp = Literal["never", "loopback", "always"]
"""``download.allow_http``: plain ``http://`` is fetched never, from loopback hosts only, or always."""

_SHA256_RE = re.compile(r"[0-9a-fA-F]{64}")


def parse_sha256(value: str | None) -> str | None:
    """Validate an expected archive digest given on the command line.

    Args:
        value: 64 hex digits, optionally prefixed ``sha256:``; None or "" for "no digest".

    Returns:
        64 lowercase hex, or None.

    Raises:
        UsageError: any other syntax (exit 2).
    """
    if value is None or value == "":
        return None
    digest = value[len("sha256:") :] if value.lower().startswith("sha256:") else value
    if not _SHA256_RE.fullmatch(digest):
        raise UsageError(f"--sha256: expected 64 hex digits (optionally 'sha256:' first), got {value!r}")
    return digest.lower()


@attrs.frozen
class SourceTarget:
    """Where a source points, from its syntax alone (nothing is opened or resolved).

    Attributes:
        scheme: ``https``, ``http``, ``file``, or ``path`` for a plain path.
        local_path: the local file for ``file://`` URLs and plain paths; None for http(s).
    """

    scheme: Literal["https", "http", "file", "path"]
    local_path: str | None


def parse_source(source: str) -> SourceTarget:
    """Classify an archive source by its syntax (design §6 Fetch): the one place that knows the schemes.

    Args:
        source: ``https://``/``http://``/``file://`` URL or a plain path; may carry secrets.

    Returns:
        The :class:`SourceTarget`.

    Raises:
        UsageError: an empty source, an unsupported scheme (``ftp:``, ``data:``, ...), an http(s) URL with
            no host or an unparsable port, or a ``file://`` URL naming a host. The message shows the
            redacted source only (case C08).
    """
    shown = redact_url(source)
    if not source:
        raise UsageError("the archive source is empty")
    if "://" not in source:
        return SourceTarget("path", source)
    scheme = source.split("://", 1)[0].lower()
    try:
        parts = urlsplit(source)
        host, _port = parts.hostname, parts.port
    except ValueError:
        raise UsageError(f"{shown}: not a valid URL") from None
    if scheme in ("http", "https"):
        if not host or any(c.isspace() or c in "<>\"\\^`{|}" for c in host):
            raise UsageError(f"{shown}: the URL names no valid host")
        return SourceTarget("https" if scheme == "https" else "http", None)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise UsageError(f"{shown}: file:// URLs must name a local path (no host)")
        return SourceTarget("file", unquote(parts.path))
    raise UsageError(f"{shown}: unsupported source scheme {scheme!r} (https, http, file or a path)")


def _is_loopback_host(host: str) -> bool:
    host = host.lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_http_allowed(url: str, allow_http: AllowHttp) -> None:
    """Refuse a plain ``http://`` URL that ``download.allow_http`` does not allow.

    Args:
        url: the URL about to be requested.
        allow_http: the policy; ``"loopback"`` accepts 127.0.0.0/8, ``::1`` and ``localhost`` only,
            judged from the host literal (no DNS lookup, which an attacker could answer).

    Raises:
        FetchError: plain http refused by the policy (message names the redacted URL).
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "http" or allow_http == "always":
        return
    if allow_http == "loopback" and _is_loopback_host(parts.hostname or ""):
        return
    raise FetchError(
        f"{redact_url(url)}: plain http is not allowed (download.allow_http = {allow_http!r}); use https"
    )

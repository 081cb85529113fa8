"""Redaction of source URLs before they are printed, stored or put in an exception (design §6, case C08).

A source such as ``https://user:SECRET@host/a.tar.gz?sig=TOKEN#frag`` may carry a password in its
userinfo and a signed token in its query. Only scheme, host, port and path survive redaction, so the
result can go to logs, the journal, results and error messages.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_url"]

_UNPARSABLE = "<unparsable URL>"


def redact_url(s: str) -> str:
    """Return ``s`` without userinfo, query and fragment; plain paths pass unchanged.

    Args:
        s: a URL (``scheme://[user[:password]@]host[:port]/path[?query][#fragment]``) or a plain path.

    Returns:
        ``scheme://host[:port]/path`` for a URL; ``s`` itself when it has no ``scheme://`` prefix (a plain
        path such as ``/srv/a.tar.gz`` or ``./a.tar.gz``). A URL whose authority cannot be parsed (e.g. a
        non-numeric port) is reduced to ``scheme://<unparsable URL>`` rather than risk echoing a secret.
    """
    if "://" not in s:
        return s
    try:
        parts = urlsplit(s)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        scheme = s.split("://", 1)[0]
        return f"{scheme}://{_UNPARSABLE}" if scheme.isalnum() else _UNPARSABLE
    if not parts.scheme:  # "://" but no valid scheme before it (e.g. "my_scheme://u:pw@h"): show nothing
        return _UNPARSABLE
    if ":" in host:  # IPv6 literal: urlsplit strips the brackets
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

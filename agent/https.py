"""How the agent's https requests reach a server: the one place an httpx client is built (docs/trust.md, TLS).

Every request the agent makes over the network (the archive, its signature, the keyring, the health probe)
goes through a client from :meth:`Transport.client`, so they all trust the same certificates and none of them
picks up settings from the environment by surprise.

Trust: the operating system's store, through ``truststore``. Fleets add their internal certificate
authorities to that store (``update-ca-certificates``, ``update-ca-trust``); the CA list bundled with httpx
(certifi) knows none of them and is updated only with the Python package, so a host that trusts a CA for
curl, apt and its other tools would otherwise refuse it here. On Linux ``truststore`` hands OpenSSL its
default verify paths, which honour ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` exactly as ``curl`` and
``openssl s_client`` on the same host do (a systemd unit's environment holds neither unless the unit sets
them).

Environment: ``trust_env`` is off. ``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY``, ``NO_PROXY`` and
``~/.netrc`` are never read: a variable left in an operator's shell, or injected into a unit, must not send
release downloads (and the credentials in their URLs) through another machine. A proxy is used only when
given explicitly (``download.proxy``).
"""

from __future__ import annotations

import re
import ssl

import attrs
import httpx
import truststore

from agent.redact import redact_url

__all__ = ["Transport", "os_trust_context", "tls_failure"]

_LIBRARY_TEXT = re.compile(r"^\[[A-Z]+: [A-Z0-9_]+\] (?P<text>.*?)(?: \(_ssl\.c:\d+\))?$")


def os_trust_context() -> ssl.SSLContext:
    """A client TLS context that verifies servers against the operating system's trust store.

    Returns:
        A ``truststore.SSLContext`` (TLS 1.2 or later, hostname checked, certificate required); callers may
        add certificates (``load_verify_locations``) and a client certificate (``load_cert_chain``), which
        OpenSSL uses beside the system's store.
    """
    ctx = truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


@attrs.frozen(eq=False)
class Transport:
    """The TLS context and proxy of the agent's requests.

    Attributes:
        ssl_context: the trust (and, for mutual TLS, the client certificate) of https requests.
        proxy: an ``http://`` or ``https://`` proxy URL (may carry credentials: only ever shown redacted),
            or None to connect directly. https requests are tunnelled through it with ``CONNECT`` (TLS runs
            end to end, the proxy sees only the host and port); an https proxy is verified with
            ``ssl_context`` too.
        client_certificate: whether ``ssl_context`` holds a client certificate (for messages only).
    """

    ssl_context: ssl.SSLContext = attrs.field(factory=os_trust_context)
    proxy: str | None = None
    client_certificate: bool = False

    def client(self, timeout_s: float) -> httpx.AsyncClient:
        """A new httpx client: this trust and proxy, no redirects followed, nothing from the environment.

        Args:
            timeout_s: bound on each single network wait (connect, read, write, pool), seconds.

        Returns:
            An ``httpx.AsyncClient`` the caller closes (``async with``).
        """
        return httpx.AsyncClient(
            follow_redirects=False,
            timeout=httpx.Timeout(timeout_s),
            verify=self.ssl_context,
            trust_env=False,
            proxy=self._proxy(),
        )

    def _proxy(self) -> httpx.Proxy | None:
        if self.proxy is None:
            return None
        if self.proxy.lower().startswith("https://"):  # the proxy's own certificate: the same trust
            return httpx.Proxy(self.proxy, ssl_context=self.ssl_context)
        return httpx.Proxy(self.proxy)

    @property
    def shown_proxy(self) -> str:
        """The proxy URL redacted (no credentials), or "" when there is none."""
        return redact_url(self.proxy) if self.proxy else ""


def _library_text(exc: ssl.SSLError) -> str:
    """OpenSSL's words without the ``[SSL: CODE]`` prefix and the ``(_ssl.c:N)`` suffix."""
    text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    found = _LIBRARY_TEXT.match(text)
    return found.group("text") if found else text


def tls_failure(exc: BaseException) -> str | None:
    """What went wrong in TLS, when ``exc`` (or an exception it was raised from) is a TLS failure.

    httpx wraps the ``ssl`` module's errors (``httpx.ConnectError`` from an ``SSLCertVerificationError``);
    an alert the server sends after the handshake (TLS 1.3 checks the client's certificate then) arrives as
    a bare ``ssl.SSLError``, or behind an anyio or trio ``BrokenResourceError``.

    Args:
        exc: the exception a request raised.

    Returns:
        ``"certificate verify failed: <OpenSSL's reason>"`` when the server's certificate was refused (e.g.
        "unable to get local issuer certificate", "certificate has expired", "Hostname mismatch, ..."),
        ``"TLS handshake refused by the server: <alert>"`` when the server ended the handshake with an alert
        (e.g. "tlsv13 alert certificate required"), ``"TLS handshake failed: <reason>"`` for another TLS
        error (e.g. "wrong version number": no TLS on that port), or None when ``exc`` is no TLS failure.
        A connection closed without TLS's goodbye (``SSLEOFError``) is a cut connection, not a TLS failure:
        None.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"certificate verify failed: {cause.verify_message or _library_text(cause)}"
        if isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            return None
        if isinstance(cause, ssl.SSLError):
            text = _library_text(cause)
            if "ALERT" in (cause.reason or ""):
                return f"TLS handshake refused by the server: {text}"
            return f"TLS handshake failed: {text}"
        cause = cause.__cause__ or cause.__context__
    return None

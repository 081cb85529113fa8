"""Fetching an archive from ``https://``, ``http://``, ``file://`` or a plain path (design §6 Fetch, K3, K4).

The bytes are handed, as they arrive, to an async *sink* (the extraction pipeline of
:mod:`agent.release.extract`), so nothing is buffered whole. Rules enforced here:

- ``http://`` only as ``download.allow_http`` says: ``"never"``, ``"loopback"`` (127.0.0.0/8, ``::1``,
  ``localhost``; decided from the URL's host literal, never from DNS) or ``"always"``. The rule is checked
  for the first URL and for every redirect hop.
- Redirects are followed here, not by httpx (``follow_redirects=False``), so that each hop is checked: at
  most ``max_redirects``; a hop keeps its scheme or goes http -> https; https -> http, ``ftp:``, ``file:``
  or anything else is refused (:class:`~upgrade_core.errors.FetchRedirectError`, case C08). Credentials
  (the source URL's userinfo, turned into a Basic ``Authorization`` header, and any caller-supplied
  ``Authorization``) are sent only to the source's own origin (scheme, host, port), never to another
  origin a redirect leads to; userinfo inside a ``Location`` is dropped, never used.
- Length (case C06): a body shorter or longer than its ``Content-Length`` fails, and so does a chunked
  body cut before its terminating chunk (h11 reports both; we also count the bytes ourselves, because
  ``http.client``-style readers return short reads silently). A body with neither ``Content-Length`` nor
  chunked framing ends when the server closes the connection: HTTP/1.1 (RFC 9112 section 6.3, rule 8)
  gives no way to tell a complete body from a cut one. We accept it here and rely on the archive's own end
  checks (gzip trailer with CRC32 and ISIZE, zstd frame end, tar end-of-archive blocks; see
  :mod:`agent.release.extract`), which make every truncation fail anyway.
- Content codings (case C27): every request asks for ``Accept-Encoding: identity``. A server or proxy
  that applies a ``Content-Encoding`` anyway (``gzip``/``x-gzip``, ``deflate``, ``zstd``, in any
  combination) has its codings announced to the consumer (``content_coding``) before the first chunk;
  the consumer (:mod:`agent.release.extract`) undoes them in its worker thread, before hashing, so the
  sha256 is always over the file as published. ``br`` (no brotli decoder among our dependencies) and any other
  coding are refused, naming the coding. Content-Length, ``max_bytes`` and the truncation rules apply to
  the bytes on the wire (the raw stream, never httpx's decoded one).
- TLS and proxy (docs/trust.md): every request goes through the policy's :class:`~agent.https.Transport`:
  the operating system's trust store plus ``download.ca_file``, the client certificate of mutual TLS, and
  ``download.proxy`` when set; never a proxy, ``.netrc`` or CA list from the environment. A certificate the
  trust refuses is :class:`~upgrade_core.errors.FetchCertificateError` ("certificate verify failed:
  <OpenSSL's reason>"), a handshake the server refuses names its alert.
- Transient failures (design §11; ``retry_deadline_s``): a connection refused, reset or cut, a timeout, a body
  ended early, HTTP 408, 429 and 5xx are tried again, with exponential back-off and full jitter (or the
  server's ``Retry-After``), until ``retry_deadline_s`` after the start. Bytes already handed to the sink are
  never asked for again: the next request carries ``Range: bytes=N-`` and ``If-Range`` with the first
  response's strong ETag (else its Last-Modified); a 206 from byte N continues the file, a 200 with the same
  validators is read from byte N on, anything else means the file changed and fails. Without a validator a
  cut body is not resumed (and fails). Any other 4xx, a TLS or proxy refusal, a redirect, length or coding
  problem fails at once. The consumer sees each byte of the file once, in order, so the sha256 is over the
  whole file. None of this is a property of the release: such failures abort before staging, never mark a
  release known-bad and never roll back.
- Time: ``timeout_s`` bounds the whole transfer (including time the sink spends), and an idle timeout
  (default 30 s) bounds every single wait for the network: :class:`~upgrade_core.errors.FetchTimeoutError`.
- Foreign errors (``httpx.*``, ``OSError``) are translated here, with the redacted URL, ``from None``:
  httpx messages quote the full URL, query token included.

The sha256 over the compressed bytes is computed by the consumer (:mod:`agent.release.extract`) in its worker
thread, so that hashing never blocks the event loop; :func:`agent.release.sources.parse_sha256` validates the
expected value, and :mod:`agent.release.sources` holds the syntax rules of a source.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import email.utils
import os
import random
import re
import stat
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, cast
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

import aiofiles
import anyio
import attrs
import httpx

from agent.https import Transport, tls_failure
from agent.redact import redact_url
from agent.release.sources import AllowHttp, check_http_allowed, parse_source
from agent.sanitize import clean_text
from upgrade_core.errors import (
    ArchiveLimitError,
    FetchCertificateError,
    FetchContentEncodingError,
    FetchError,
    FetchHTTPError,
    FetchLengthMismatchError,
    FetchRedirectError,
    FetchTimeoutError,
)

__all__ = [
    "SUPPORTED_CODINGS",
    "ChunkSink",
    "CodingSink",
    "FetchPolicy",
    "FetchResult",
    "ProgressCallback",
    "check_redirect",
    "fetch",
    "same_origin",
]

ChunkSink = Callable[[bytes], Awaitable[None]]
"""Receives each chunk of the body, in order; may apply backpressure by awaiting."""
CodingSink = Callable[[tuple[str, ...]], Awaitable[None]]
"""Receives the response's content codings (lower case, in the order applied), once, before any chunk."""
ProgressCallback = Callable[[int, int | None], None]
"""Called as ``progress(bytes_so_far, total_bytes_or_None)`` after each chunk; must not block."""

_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_CONTENT_RANGE = re.compile(r"bytes (?P<start>[0-9]{1,18})-(?P<end>[0-9]{1,18})/(?P<total>[0-9]{1,18}|\*)")
_DEFAULT_PORTS = {"http": 80, "https": 443}
SUPPORTED_CODINGS = frozenset({"gzip", "x-gzip", "deflate", "zstd"})
"""Content codings a consumer can undo (agent.release.extract); ``identity`` is no coding at all."""


@attrs.frozen
class FetchPolicy:
    """The ``[download]`` rules of design §3 as the fetcher needs them.

    Attributes:
        allow_http: ``"never"``, ``"loopback"`` or ``"always"``.
        max_redirects: the most redirect hops followed (0 refuses any redirect).
        timeout_s: whole-transfer bound, seconds.
        idle_timeout_s: bound on each single network wait (connect, read), seconds.
        retry_deadline_s: seconds, from the fetch's start, during which a transient failure is tried
            again (``download.retry_deadline_s``, 300 in the agent's configuration; this class's default 0
            is one attempt). ``timeout_s`` still bounds the whole transfer, attempts and waits included.
        retry_backoff_s: the bound of the first back-off, seconds; each next one doubles, at most 30 s.
        chunk_bytes: the size of each read of a local file handed to the sink, bytes (an http(s) body is
            handed over as the network delivers it, in pieces of at most 64 KiB).
        transport: the TLS trust, client certificate and proxy of http(s) requests (default: the
            operating system's trust store, no client certificate, no proxy);
            :func:`agent.release.tls.download_transport` builds it from ``[download]``.
    """

    allow_http: AllowHttp = "loopback"
    max_redirects: int = attrs.field(default=5, validator=attrs.validators.ge(0))
    retry_deadline_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    retry_backoff_s: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))
    timeout_s: float = attrs.field(default=600.0, validator=attrs.validators.gt(0))
    idle_timeout_s: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    chunk_bytes: int = attrs.field(default=256 * 1024, validator=attrs.validators.gt(0))
    transport: Transport = attrs.field(factory=Transport, eq=False)


@attrs.frozen
class FetchResult:
    """What a completed fetch delivered.

    Attributes:
        url: the final location, redacted (after redirects); the path for local sources.
        size: bytes delivered to the sink.
        content_length: the announced length in bytes, or None (chunked, close-delimited, local file).
        redirects: redirect hops followed.
    """

    url: str
    size: int
    content_length: int | None
    redirects: int


def content_codings(values: list[str], shown: str) -> tuple[str, ...]:
    """The content codings of a response, in the order the server applied them (RFC 9110 8.4).

    Args:
        values: every ``Content-Encoding`` header value, in order.
        shown: the redacted URL, for messages.

    Returns:
        Lower-case codings without ``identity``, e.g. ``("gzip",)``; ``()`` for an unencoded body.

    Raises:
        FetchContentEncodingError: a coding outside :data:`SUPPORTED_CODINGS` (``br``: no brotli decoder
            is among our dependencies), named in the message, or more than four codings.
    """
    codings = tuple(
        c for value in values for c in (p.strip().lower() for p in value.split(",")) if c and c != "identity"
    )
    for c in codings:
        if c == "br":
            raise FetchContentEncodingError(
                f"{shown}: the server applied Content-Encoding br (brotli), which this agent cannot "
                "decode (no brotli decoder installed); serve the file unencoded (identity was asked)"
            )
        if c not in SUPPORTED_CODINGS:
            shown_c = c.encode("ascii", "backslashreplace").decode("ascii")[:40]
            raise FetchContentEncodingError(
                f"{shown}: unsupported Content-Encoding {shown_c} (gzip, deflate and zstd are undone; "
                "identity was asked)"
            )
    if len(codings) > 4:
        raise FetchContentEncodingError(f"{shown}: more than four content codings ({', '.join(codings)})")
    return codings


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def same_origin(a: str, b: str) -> bool:
    """True when both URLs have the same scheme, host and (effective) port (RFC 6454 origin)."""
    return _origin(a) == _origin(b)


def check_redirect(from_url: str, to_url: str) -> None:
    """Apply design §6's scheme rule to one redirect hop (case C08).

    A hop may keep its scheme (http -> http, https -> https) or upgrade http -> https. Everything else
    (https -> http, any hop to ``ftp:``, ``file:``, ``data:`` ...) is refused.

    Args:
        from_url: the URL that answered with the redirect.
        to_url: the absolute target (``Location`` resolved against ``from_url``).

    Raises:
        FetchRedirectError: the hop breaks the rule.
    """
    src = urlsplit(from_url).scheme.lower()
    dst = urlsplit(to_url).scheme.lower()
    if (src, dst) in {("http", "http"), ("https", "https"), ("http", "https")}:
        return
    raise FetchRedirectError(
        f"{redact_url(from_url)}: refused redirect from {src}: to {dst or '(no scheme)'}: "
        f"{redact_url(to_url)} (only same scheme or http -> https)"
    )


def _strip_userinfo(url: str) -> tuple[str, str | None]:
    """Split ``url`` into (url without userinfo, Basic credentials header value or None)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    token = f"{unquote(user)}:{unquote(password) if sep else ''}".encode()
    bare = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return bare, "Basic " + base64.b64encode(token).decode("ascii")


async def fetch(
    source: str,
    policy: FetchPolicy,
    sink: ChunkSink,
    *,
    headers: Mapping[str, str] | None = None,
    max_bytes: int | None = None,
    progress: ProgressCallback | None = None,
    content_coding: CodingSink | None = None,
) -> FetchResult:
    """Stream ``source`` into ``sink`` chunk by chunk, as the bytes arrive on the wire.

    Args:
        source: ``https://``/``http://`` URL (userinfo becomes Basic auth for the source's origin only),
            ``file://`` URL, or a plain path. May carry secrets: only its redacted form is ever printed.
        policy: the ``[download]`` rules.
        sink: awaited with each chunk, in order. Its exceptions propagate untouched.
        headers: extra request headers (e.g. ``Authorization``); credentials among them follow the
            same origin rule as userinfo.
        max_bytes: ``limits.max_archive_bytes``: a longer announced or delivered body fails early.
        progress: called with (bytes so far, total or None) after each chunk.
        content_coding: awaited once, before the first chunk, when the server applied a
            ``Content-Encoding`` although we asked for identity; the chunks are then the encoded bytes
            and the consumer must undo the codings. None: such a response is refused.

    Returns:
        A :class:`FetchResult`; by then every byte was handed to ``sink`` (once each, in order, whatever the
        attempts) and the length rules held.

    Raises (a transient failure only once ``policy.retry_deadline_s`` has passed, its line then ending with
    ``; gave up after N attempts (...)``):
        UsageError: unsupported scheme or malformed URL.
        FetchError: http refused by policy, connection or read failure, a TLS handshake the server
            refused, the proxy unreachable or refusing the tunnel, a local file unreadable.
        FetchCertificateError: the server's certificate failed verification
            (``"<URL>: certificate verify failed: <reason>"``).
        FetchHTTPError: a non-2xx final status (``status`` attribute).
        FetchRedirectError: a refused or excess redirect (C08).
        FetchLengthMismatchError: body length differs from ``Content-Length`` or the chunked body was
            cut (C06).
        FetchTimeoutError: ``timeout_s`` or the idle timeout ran out.
        FetchContentEncodingError: a ``Content-Encoding`` we cannot undo (``br``, ``compress``, ...),
            or any one when ``content_coding`` is None; the message names it.
        ArchiveLimitError: the body exceeds ``max_bytes``.

    Cancellation: no effect beyond the chunks already handed to ``sink``.
    """
    shown = redact_url(source)
    target = parse_source(source)
    try:
        with anyio.fail_after(policy.timeout_s):
            if target.local_path is None:
                return await _fetch_http(source, policy, sink, headers, max_bytes, progress, content_coding)
            return await _fetch_file(target.local_path, shown, policy, sink, max_bytes, progress)
    except TimeoutError:
        raise FetchTimeoutError(
            f"{shown}: transfer did not finish within download.timeout_s = {policy.timeout_s:g} s"
        ) from None


class _AsyncBinaryFile(Protocol):
    async def read(self, size: int = -1, /) -> bytes: ...

    async def close(self) -> None: ...

    def fileno(self) -> int: ...


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _open_binary(path: str) -> _AsyncBinaryFile:
    """Open ``path`` for async reading: aiofiles on asyncio (the agent's loop, design §2).

    aiofiles needs a running asyncio loop, so under trio (which the library's tests also exercise) the
    same reads go through ``anyio.open_file``; both run each read in a worker thread.
    """
    if _on_asyncio():
        return cast(_AsyncBinaryFile, await aiofiles.open(path, "rb"))
    wrapped = await anyio.open_file(path, "rb")
    return cast(_AsyncBinaryFile, _AnyioFile(wrapped))


@attrs.define
class _AnyioFile:
    _f: anyio.AsyncFile[bytes]

    async def read(self, size: int = -1, /) -> bytes:
        return await self._f.read(size)

    async def close(self) -> None:
        await self._f.aclose()

    def fileno(self) -> int:
        return self._f.wrapped.fileno()


async def _fetch_file(
    path: str,
    shown: str,
    policy: FetchPolicy,
    sink: ChunkSink,
    max_bytes: int | None,
    progress: ProgressCallback | None,
) -> FetchResult:
    try:
        f = await _open_binary(path)
    except OSError as exc:
        raise FetchError(f"{shown}: cannot open: {exc.strerror or exc}") from None
    try:
        try:
            st = await anyio.to_thread.run_sync(os.fstat, f.fileno())
        except OSError as exc:
            raise FetchError(f"{shown}: cannot stat: {exc.strerror or exc}") from None
        if not stat.S_ISREG(st.st_mode):
            raise FetchError(f"{shown}: not a regular file")
        total = st.st_size
        if max_bytes is not None and total > max_bytes:
            raise ArchiveLimitError(
                f"{shown}: archive is {total} bytes, above limits.max_archive_bytes = {max_bytes}"
            )
        size = 0
        while True:
            try:
                chunk = await f.read(policy.chunk_bytes)
            except OSError as exc:
                raise FetchError(f"{shown}: read failed at offset {size}: {exc.strerror or exc}") from None
            if not chunk:
                break
            size += len(chunk)
            if max_bytes is not None and size > max_bytes:
                raise ArchiveLimitError(f"{shown}: archive exceeds limits.max_archive_bytes = {max_bytes}")
            await sink(chunk)
            if progress is not None:
                progress(size, total)
        return FetchResult(url=shown, size=size, content_length=None, redirects=0)
    finally:
        with anyio.CancelScope(shield=True):
            await f.close()


def _translate_httpx(exc: Exception, url: str, policy: FetchPolicy, received: int | None) -> FetchError:
    """Map an httpx failure to our error, naming only the redacted URL (httpx's text quotes the URL)."""
    shown = redact_url(url)
    tls = tls_failure(exc)
    if tls is not None:
        if tls.startswith("certificate verify failed"):
            return FetchCertificateError(f"{shown}: {tls}")
        if "certificate required" in tls and not policy.transport.client_certificate:
            tls += "; set download.client_cert and download.client_key"
        return FetchError(f"{shown}: {tls}")
    if isinstance(exc, httpx.ProxyError):  # the proxy's status line, e.g. "407 Proxy Authentication Required"
        status = clean_text(" ".join(str(exc).split()), 80) or "no status"
        proxy = policy.transport.shown_proxy
        return FetchError(f"{shown}: download.proxy {proxy} refused the tunnel ({status})")
    if policy.transport.proxy is not None and isinstance(exc, httpx.ConnectError) and received is None:
        return FetchError(f"{shown}: connection failed (through download.proxy "
                          f"{policy.transport.shown_proxy})")
    if isinstance(exc, httpx.TimeoutException):
        return FetchTimeoutError(
            f"{shown}: no data for {policy.idle_timeout_s:g} s (idle timeout, {type(exc).__name__})"
        )
    if received is not None and isinstance(exc, httpx.RemoteProtocolError):
        return FetchLengthMismatchError(
            f"{shown}: body ended early after {received} bytes (connection closed mid-body)"
        )
    if isinstance(exc, httpx.InvalidURL):
        return FetchError(f"{shown}: invalid URL")
    what = "connection failed" if isinstance(exc, httpx.ConnectError | OSError) else type(exc).__name__
    return FetchError(f"{shown}: {what}")


_MAX_BACKOFF_S = 30.0
"""The longest back-off between two attempts, seconds (``Retry-After`` may ask for longer)."""


class _Retryable(Exception):
    """A transient failure (see the module doc): ``error`` is what the fetch raises once no attempt is left.

    Attributes:
        error: the failure, in the project's terms.
        retry_after: the server's ``Retry-After``, seconds, or None.
    """

    def __init__(self, error: FetchError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


@attrs.define
class _Delivered:
    """What the attempts of one fetch have handed to the sink so far, and how to ask for the rest.

    Attributes:
        received: bytes of the file handed to the sink.
        total: the file's length from the first response (``Content-Length``), or None.
        etag, last_modified: the first response's validators (RFC 9110 section 8.8).
        codings: the first response's content codings; None before the first response's headers.
        attempts: requests made (redirect hops not counted).
    """

    received: int = 0
    total: int | None = None
    etag: str | None = None
    last_modified: str | None = None
    codings: tuple[str, ...] | None = None
    attempts: int = 0

    @property
    def validator(self) -> str | None:
        """The ``If-Range`` value: a strong ETag, else Last-Modified (RFC 9110 section 13.1.5), else None."""
        if self.etag and not self.etag.startswith("W/"):
            return self.etag
        return self.last_modified

    def same_representation(self, response: httpx.Response) -> bool:
        """True when a full response carries the validators of the first one (the same file)."""
        etag, modified = response.headers.get("etag"), response.headers.get("last-modified")
        if self.etag or etag:
            return bool(self.etag) and etag == self.etag and not etag.startswith("W/")
        return self.last_modified is not None and modified == self.last_modified


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds from now (delay-seconds or an HTTP-date, RFC 9110 section 10.2.3)."""
    value = response.headers.get("retry-after", "").strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def _transient(exc: BaseException) -> bool:
    """A transport failure worth another attempt: a timeout, a connection refused, reset or cut, a body
    ended early. Never a TLS refusal, a proxy's refusal, a bad URL or a protocol error of our own."""
    if tls_failure(exc) is not None:
        return False
    if isinstance(exc, httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError):
        return True
    return isinstance(exc, OSError)


def _transport_failure(exc: Exception, url: str, policy: FetchPolicy, received: int | None) -> Exception:
    error = _translate_httpx(exc, url, policy, received)
    return _Retryable(error) if _transient(exc) else error


def _with_note(error: FetchError, note: str) -> FetchError:
    if isinstance(error, FetchHTTPError):
        return FetchHTTPError(f"{error}; {note}", error.status)
    return type(error)(f"{error}; {note}")


def _next_delay(failure: _Retryable, got: _Delivered, policy: FetchPolicy, deadline: float) -> float:
    """Seconds to wait before the next attempt; raises the failure's error when there is none.

    Back-off: "full jitter" (a uniform delay between 0 and ``retry_backoff_s * 2**(attempt-1)``, at most
    :data:`_MAX_BACKOFF_S`), so that a fleet refused together does not come back together; a server's
    ``Retry-After`` is honoured instead (RFC 9110 section 10.2.3).
    """
    if policy.retry_deadline_s == 0:
        raise failure.error from None
    if got.received and got.validator is None:
        raise _with_note(failure.error, f"not resumed: the server gave no ETag or Last-Modified for the "
                                        f"{got.received} bytes already received") from None
    left = deadline - anyio.current_time()
    gave_up = (f"gave up after {got.attempts} attempts "
               f"(download.retry_deadline_s = {policy.retry_deadline_s:g} s)")
    if left <= 0:
        raise _with_note(failure.error, gave_up) from None
    if failure.retry_after is not None:
        if failure.retry_after > left:
            raise _with_note(failure.error, f"Retry-After {failure.retry_after:g} s is past "
                                            f"download.retry_deadline_s; {gave_up}") from None
        return failure.retry_after
    ceiling = min(_MAX_BACKOFF_S, policy.retry_backoff_s * 2 ** (got.attempts - 1))
    return min(random.uniform(0, ceiling), left)


async def _fetch_http(
    source: str,
    policy: FetchPolicy,
    sink: ChunkSink,
    headers: Mapping[str, str] | None,
    max_bytes: int | None,
    progress: ProgressCallback | None,
    content_coding: CodingSink | None,
) -> FetchResult:
    url, basic = _strip_userinfo(source)
    plain_headers = {
        k: v for k, v in (headers or {}).items()
        if k.lower() not in ("authorization", "accept-encoding", "range", "if-range")
    }
    plain_headers["Accept-Encoding"] = "identity"  # C27: the file as published, not a re-encoding of it
    credentials = {k: v for k, v in (headers or {}).items() if k.lower() == "authorization"}
    if basic is not None and not credentials:
        credentials = {"Authorization": basic}
    got = _Delivered()
    deadline = anyio.current_time() + policy.retry_deadline_s
    async with policy.transport.client(policy.idle_timeout_s) as client:
        while True:
            got.attempts += 1
            try:
                return await _attempt(
                    client, url, plain_headers, credentials, policy, sink, max_bytes, progress,
                    content_coding, got,
                )
            except _Retryable as failure:
                await anyio.sleep(_next_delay(failure, got, policy, deadline))


async def _attempt(
    client: httpx.AsyncClient,
    home: str,
    plain_headers: dict[str, str],
    credentials: dict[str, str],
    policy: FetchPolicy,
    sink: ChunkSink,
    max_bytes: int | None,
    progress: ProgressCallback | None,
    content_coding: CodingSink | None,
    got: _Delivered,
) -> FetchResult:
    """One request from the source URL on, redirects followed; resumes after ``got.received`` bytes.

    Raises:
        _Retryable: a transient failure (another attempt may follow).
    """
    url = home
    for hop in range(policy.max_redirects + 1):
        check_http_allowed(url, policy.allow_http)
        send_headers = dict(plain_headers)
        if same_origin(url, home):
            send_headers.update(credentials)
        if got.received and got.validator is not None:
            # RFC 9110 sections 14.2 and 13.1.5: the rest, if the file is still the same; else all of it
            send_headers["Range"] = f"bytes={got.received}-"
            send_headers["If-Range"] = got.validator
        try:
            request = client.build_request("GET", url, headers=send_headers)
            response = await client.send(request, stream=True)
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
            raise _transport_failure(exc, url, policy, None) from None
        try:
            status = response.status_code
            if status in _REDIRECT_STATUSES:
                location = response.headers.get("location")
                if not location:
                    raise FetchRedirectError(f"{redact_url(url)}: HTTP {status} without a Location header")
                try:
                    target, _dropped = _strip_userinfo(urljoin(url, location))
                except ValueError:
                    raise FetchRedirectError(f"{redact_url(url)}: unparsable Location header") from None
                check_redirect(url, target)
                url = target
                continue
            shown = redact_url(url)
            error = FetchHTTPError(f"{shown}: HTTP {status} {response.reason_phrase}".rstrip(), status)
            if status in (408, 429) or 500 <= status <= 599:
                raise _Retryable(error, _retry_after(response))
            if status == 206 and got.received:
                start = _range_start(response, got, redact_url(url))
            elif status == 200:
                start = 0
                if got.received and not got.same_representation(response):
                    raise FetchError(
                        f"{redact_url(url)}: the file changed while it was being downloaded (its ETag or "
                        f"Last-Modified differs after {got.received} bytes); nothing was kept"
                    )
            else:
                raise error
            return await _stream_body(
                response, url, policy, sink, max_bytes, progress, hop, content_coding, got, start
            )
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()
    raise FetchRedirectError(
        f"{redact_url(home)}: more than download.max_redirects = {policy.max_redirects} redirects"
    )


def _range_start(response: httpx.Response, got: _Delivered, shown: str) -> int:
    """The first byte of a 206 answer to ``Range: bytes=N-``: it must be N, of a file of the same length."""
    found = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", "").strip())
    if found is None:
        raise FetchError(f"{shown}: HTTP 206 without a valid Content-Range")
    start, total = int(found.group("start")), found.group("total")
    if start != got.received:
        raise FetchError(f"{shown}: HTTP 206 starts at byte {start}, not at {got.received} as asked")
    if got.total is not None and total not in ("*", str(got.total)):
        raise FetchError(f"{shown}: the file changed while it was being downloaded (it was {got.total} "
                         f"bytes, Content-Range says {total})")
    if got.total is None and total != "*":
        got.total = int(total)
    return start


async def _first_headers(
    response: httpx.Response, shown: str, max_bytes: int | None, content_coding: CodingSink | None,
    got: _Delivered,
) -> None:
    """Record the first full response's length, validators and codings (checked against the limits)."""
    codings = content_codings(response.headers.get_list("content-encoding"), shown)
    if codings and content_coding is None:
        raise FetchContentEncodingError(
            f"{shown}: the server applied Content-Encoding {', '.join(codings)} although identity was asked"
        )
    length_header = response.headers.get("content-length")
    if length_header is not None and "chunked" not in response.headers.get("transfer-encoding", "").lower():
        if not length_header.strip().isdigit():
            raise FetchError(f"{shown}: invalid Content-Length {length_header!r}")
        got.total = int(length_header)
        if max_bytes is not None and got.total > max_bytes:
            raise ArchiveLimitError(
                f"{shown}: Content-Length {got.total} is above limits.max_archive_bytes = {max_bytes}"
            )
    got.etag, got.last_modified = response.headers.get("etag"), response.headers.get("last-modified")
    got.codings = codings
    if codings and content_coding is not None:
        await content_coding(codings)


async def _stream_body(
    response: httpx.Response,
    url: str,
    policy: FetchPolicy,
    sink: ChunkSink,
    max_bytes: int | None,
    progress: ProgressCallback | None,
    redirects: int,
    content_coding: CodingSink | None,
    got: _Delivered,
    start: int,
) -> FetchResult:
    """Hand the body to ``sink``; ``start`` is the file offset of its first byte (0 for a full response,
    whose first ``got.received`` bytes were handed over by an earlier attempt and are dropped)."""
    shown = redact_url(url)
    if got.codings is None:
        await _first_headers(response, shown, max_bytes, content_coding, got)
    elif content_codings(response.headers.get_list("content-encoding"), shown) != got.codings:
        raise FetchError(f"{shown}: the resumed response has another Content-Encoding than the first")
    offset = start
    # The wire bytes, as each network read returns them (httpx decodes nothing here). Not
    # aiter_raw(chunk_bytes): httpx would re-chunk them through a BytesIO, which costs as much CPU as the
    # whole transfer; the consumer (agent.release.extract) batches chunks itself.
    chunks = response.aiter_raw()
    while True:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            break
        except (httpx.HTTPError, httpx.StreamError, OSError) as exc:
            if isinstance(exc, httpx.StreamError):
                raise FetchError(f"{shown}: stream error ({type(exc).__name__})") from None
            raise _transport_failure(exc, url, policy, got.received) from None
        if offset < got.received:  # an earlier attempt delivered these already
            drop = min(len(chunk), got.received - offset)
            offset, chunk = offset + drop, chunk[drop:]
            if not chunk:
                continue
        offset += len(chunk)
        if got.total is not None and offset > got.total:
            raise FetchLengthMismatchError(f"{shown}: body longer than Content-Length {got.total}")
        if max_bytes is not None and offset > max_bytes:
            raise ArchiveLimitError(f"{shown}: body exceeds limits.max_archive_bytes = {max_bytes}")
        got.received = offset
        await sink(chunk)
        if progress is not None:
            progress(offset, got.total)
    if got.total is not None and got.received != got.total:
        raise _Retryable(FetchLengthMismatchError(
            f"{shown}: received {got.received} bytes, Content-Length announced {got.total}"
        ))
    return FetchResult(url=shown, size=got.received, content_length=got.total, redirects=redirects)

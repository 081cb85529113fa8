"""agent.release.fetch and agent.release.source against real loopback HTTP(S) servers: C06, C08, the
allow_http policy,
redirects, digests, progress, and local sources. Runs on asyncio and trio."""

from __future__ import annotations

import hashlib
import os
import ssl
import traceback
from pathlib import Path

import pytest

from agent.errors import UsageError
from agent.https import Transport
from agent.redact import redact_url
from agent.release.extract import ExtractLimits
from agent.release.fetch import FetchPolicy, check_redirect, fetch, same_origin
from agent.release.source import ArchiveSourceImpl
from agent.release.sources import check_http_allowed, parse_sha256
from upgrade_core.errors import (
    ArchiveLimitError,
    ArchiveTruncatedError,
    DigestMismatchError,
    FetchError,
    FetchHTTPError,
    FetchLengthMismatchError,
    FetchRedirectError,
    FetchTimeoutError,
)

from ._archives import Entry, compress, tar_bytes, tree
from ._servers import LoopbackServer, body, cut_chunked, redirect, short_body
from .conftest import MEMBER

BINARY = os.urandom(300_000)
# Built at run time so that a traceback's quoted source lines cannot contain them by accident.
SECRET = "".join(["pass", "W0rd", "-", "s3"])
TOKEN = "".join(["sig", "T0ken", "-", "q7"])
ARCHIVE = compress(tar_bytes([Entry(MEMBER, data=BINARY)]), "gzip")


def _source(**kw: object) -> ArchiveSourceImpl:
    return ArchiveSourceImpl(member=MEMBER, **kw)  # type: ignore[arg-type]


async def _collect(source: str, policy: FetchPolicy | None = None, **kw: object) -> bytes:
    out = bytearray()

    async def sink(chunk: bytes) -> None:
        out.extend(chunk)

    await fetch(source, policy or FetchPolicy(), sink, **kw)  # type: ignore[arg-type]
    return bytes(out)


# -- pure rules ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("src", "dst", "ok"),
    [
        ("http://a/x", "http://b/y", True),
        ("https://a/x", "https://b/y", True),
        ("http://a/x", "https://a/x", True),
        ("https://a/x", "http://a/x", False),
        ("https://a/x", "ftp://a/x", False),
        ("http://a/x", "ftp://a/x", False),
        ("https://a/x", "file:///etc/shadow", False),
        ("http://a/x", "file:///etc/shadow", False),
        ("https://a/x", "data:text/plain,hi", False),
    ],
)
def test_redirect_scheme_rule(src: str, dst: str, ok: bool) -> None:
    if ok:
        check_redirect(src, dst)
    else:
        with pytest.raises(FetchRedirectError):
            check_redirect(src, dst)


@pytest.mark.parametrize(
    ("url", "policy", "ok"),
    [
        ("http://127.0.0.1/a", "loopback", True),
        ("http://127.8.9.10:81/a", "loopback", True),
        ("http://[::1]:8080/a", "loopback", True),
        ("http://localhost/a", "loopback", True),
        ("http://10.0.0.1/a", "loopback", False),
        ("http://example.com/a", "loopback", False),
        ("http://localhost.example.com/a", "loopback", False),
        ("http://127.0.0.1/a", "never", False),
        ("http://example.com/a", "always", True),
        ("https://example.com/a", "never", True),
    ],
)
def test_allow_http_policy(url: str, policy: str, ok: bool) -> None:
    if ok:
        check_http_allowed(url, policy)  # type: ignore[arg-type]
    else:
        with pytest.raises(FetchError, match="plain http"):
            check_http_allowed(url, policy)  # type: ignore[arg-type]


def test_same_origin_uses_default_ports() -> None:
    assert same_origin("https://H/a", "https://h:443/b")
    assert not same_origin("http://h/a", "https://h/a")
    assert not same_origin("http://h:1/a", "http://h:2/a")


@pytest.mark.parametrize(
    ("given", "want"),
    [("A" * 64, "a" * 64), ("sha256:" + "b" * 64, "b" * 64), ("SHA256:" + "C" * 64, "c" * 64), ("", None)],
)
def test_parse_sha256_accepts(given: str, want: str | None) -> None:
    assert parse_sha256(given) == want


@pytest.mark.parametrize(
    "given", ["a" * 63, "a" * 65, "g" * 64, "sha1:" + "a" * 40, "sha256:", " " + "a" * 64]
)
def test_parse_sha256_rejects_with_usage_error(given: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_sha256(given)
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("https://user:SECRET@host/a.tar.gz?sig=TOKEN#frag", "https://host/a.tar.gz"),
        ("http://user@[::1]:8080/p?q=1", "http://[::1]:8080/p"),
        ("file:///srv/a.tar.gz?x", "file:///srv/a.tar.gz"),
        ("/srv/a?b.tar.gz", "/srv/a?b.tar.gz"),
        ("http://u:SECRET@h:notaport/x", "http://<unparsable URL>"),
    ],
)
def test_redact_url(given: str, want: str) -> None:
    assert redact_url(given) == want


# -- happy paths ---------------------------------------------------------------------------------------
pytestmark = pytest.mark.anyio


async def test_stage_over_http_with_digest_and_progress(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/a.tar.gz"] = body(ARCHIVE)
    seen: list[tuple[int, int | None]] = []
    src = _source(progress=lambda n, total: seen.append((n, total)))
    staged = await src.stage(
        server.url("/a.tar.gz"), "sha256:" + hashlib.sha256(ARCHIVE).hexdigest(), str(tmp_path / "s"), "green"
    )
    assert (tmp_path / "s").read_bytes() == BINARY
    assert staged.sha256 == hashlib.sha256(BINARY).hexdigest()
    assert staged.archive_sha256 == hashlib.sha256(ARCHIVE).hexdigest()
    assert (staged.size, staged.archive_size, staged.slot) == (len(BINARY), len(ARCHIVE), "green")
    assert seen[-1] == (len(ARCHIVE), len(ARCHIVE))
    assert [n for n, _ in seen] == sorted(n for n, _ in seen)


async def test_stage_digest_mismatch_removes_staging(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/a.tar.gz"] = body(ARCHIVE)
    with pytest.raises(DigestMismatchError):
        await _source().stage(server.url("/a.tar.gz"), "f" * 64, str(tmp_path / "s"), "blue")
    assert list(tmp_path.iterdir()) == []


async def test_stage_bad_digest_syntax_is_usage_error_before_any_request(
    server: LoopbackServer, tmp_path: Path
) -> None:
    with pytest.raises(UsageError):
        await _source().stage(server.url("/a.tar.gz"), "xyz", str(tmp_path / "s"), "blue")
    assert server.requests == []


@pytest.mark.parametrize("form", ["path", "file-url"])
async def test_stage_local_sources(tmp_path: Path, form: str) -> None:
    archive = tmp_path / "a b.tar.zst"
    archive.write_bytes(compress(tar_bytes([Entry(MEMBER, data=BINARY)]), "zstd"))
    src = str(archive) if form == "path" else "file://" + str(archive).replace(" ", "%20")
    await _source().stage(src, None, str(tmp_path / "s"), "blue")
    assert (tmp_path / "s").read_bytes() == BINARY


async def test_missing_local_file_is_fetch_error(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="cannot open"):
        await _source().stage(str(tmp_path / "nope.tar.gz"), None, str(tmp_path / "s"), "blue")
    assert not (tmp_path / "s").exists()


async def test_unsupported_scheme(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unsupported source scheme"):
        await _source().stage("ftp://127.0.0.1/a.tar.gz", None, str(tmp_path / "s"), "blue")


async def test_same_scheme_redirects_followed_up_to_the_limit(server: LoopbackServer) -> None:
    server.routes["/a"] = redirect("/b", 301)
    server.routes["/b"] = redirect(server.url("/c"), 307)
    server.routes["/c"] = body(b"payload")
    assert await _collect(server.url("/a"), FetchPolicy(max_redirects=2)) == b"payload"
    with pytest.raises(FetchRedirectError, match="max_redirects"):
        await _collect(server.url("/a"), FetchPolicy(max_redirects=1))


async def test_http_error_status(server: LoopbackServer) -> None:
    with pytest.raises(FetchHTTPError) as info:
        await _collect(server.url("/missing"))
    assert info.value.status == 404


async def test_connection_refused_is_fetch_error(server: LoopbackServer) -> None:
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    with pytest.raises(FetchError, match="connection failed"):
        await _collect(f"http://127.0.0.1:{port}/a")


async def test_http_not_allowed_is_refused_without_a_request(server: LoopbackServer) -> None:
    with pytest.raises(FetchError, match="plain http"):
        await _collect(server.url("/a"), FetchPolicy(allow_http="never"))
    assert server.requests == []


async def test_content_length_above_archive_limit(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/a.tar.gz"] = body(ARCHIVE)
    src = _source(limits=ExtractLimits(max_archive_bytes=1000))
    with pytest.raises(ArchiveLimitError, match="Content-Length"):
        await src.stage(server.url("/a.tar.gz"), None, str(tmp_path / "s"), "blue")
    assert list(tmp_path.iterdir()) == []


async def test_idle_timeout(server: LoopbackServer) -> None:
    import threading

    release = threading.Event()

    def stall(h):  # type: ignore[no-untyped-def]
        release.wait(30)

    server.routes["/slow"] = stall
    try:
        with pytest.raises(FetchTimeoutError, match="idle"):
            await _collect(server.url("/slow"), FetchPolicy(idle_timeout_s=0.3))
    finally:
        release.set()


async def test_whole_transfer_timeout(server: LoopbackServer) -> None:
    import threading

    release = threading.Event()

    def trickle(h):  # type: ignore[no-untyped-def]
        h.send_response(200)
        h.send_header("Content-Length", "1000000")
        h.end_headers()
        while not release.wait(0.05):
            h.wfile.write(b"x")
            h.wfile.flush()

    server.routes["/trickle"] = trickle
    try:
        with pytest.raises(FetchTimeoutError, match="timeout_s"):
            await _collect(server.url("/trickle"), FetchPolicy(timeout_s=0.5, idle_timeout_s=10))
    finally:
        release.set()


# -- K3 C06: short bodies ------------------------------------------------------------------------------
async def test_c06_content_length_5000000_closing_after_1_mib(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/a.tar"] = short_body(5_000_000, tar_bytes([Entry(MEMBER, data=BINARY * 4)])[: 1 << 20])
    with pytest.raises(FetchLengthMismatchError):
        await _collect(server.url("/a.tar"))
    # Through the whole pipeline, without a digest: the same error, staging removed.
    with pytest.raises(FetchLengthMismatchError):
        await _source().stage(server.url("/a.tar"), None, str(tmp_path / "s"), "blue")
    assert list(tmp_path.iterdir()) == []


async def test_c06_chunked_body_cut_before_the_last_chunk(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/a.tar.gz"] = cut_chunked(ARCHIVE)  # every byte sent, only the 0-chunk missing
    with pytest.raises(FetchLengthMismatchError):
        await _source().stage(server.url("/a.tar.gz"), None, str(tmp_path / "s"), "blue")
    assert list(tmp_path.iterdir()) == []


async def test_c06_close_delimited_body_cut_fails_on_the_archive_end(
    server: LoopbackServer, tmp_path: Path
) -> None:
    # Without length or chunking, HTTP cannot tell a cut body (documented); the archive end checks do.
    server.routes["/full"] = body(ARCHIVE, length=False)
    server.routes["/cut"] = body(ARCHIVE[: len(ARCHIVE) // 2], length=False)
    await _source().stage(server.url("/full"), None, str(tmp_path / "s"), "blue")
    with pytest.raises(ArchiveTruncatedError):
        await _source().stage(server.url("/cut"), None, str(tmp_path / "t"), "blue")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


# -- K4 C08: redirects and secrets ---------------------------------------------------------------------
@pytest.mark.parametrize("target", ["http://127.0.0.1:{port}/a", "ftp://127.0.0.1/a", "file:///etc/shadow"])
async def test_c08_https_redirect_downgrade_refused(
    https_server: LoopbackServer,
    server: LoopbackServer,
    tls_pair: tuple[ssl.SSLContext, ssl.SSLContext],
    tmp_path: Path,
    target: str,
) -> None:
    server.routes["/a"] = body(ARCHIVE)
    https_server.routes["/a.tar.gz"] = redirect(target.format(port=server.server_address[1]))
    https_server.routes["/ok.tar.gz"] = body(ARCHIVE)
    src = _source(download=FetchPolicy(allow_http="always", transport=Transport(ssl_context=tls_pair[1])))
    await src.stage(https_server.url("/ok.tar.gz"), None, str(tmp_path / "ok"), "blue")  # TLS works
    with pytest.raises(FetchRedirectError, match="refused redirect"):
        await src.stage(https_server.url("/a.tar.gz"), None, str(tmp_path / "s"), "blue")
    assert server.requests == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok"]


@pytest.mark.parametrize("target", ["ftp://127.0.0.1/a", "file:///etc/shadow"])
async def test_c08_http_redirect_to_other_schemes_refused(server: LoopbackServer, target: str) -> None:
    server.routes["/a"] = redirect(target)
    with pytest.raises(FetchRedirectError):
        await _collect(server.url("/a"))


async def test_c08_http_to_https_upgrade_allowed(
    server: LoopbackServer, https_server: LoopbackServer, tls_pair: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    server.routes["/a"] = redirect(https_server.url("/b"))
    https_server.routes["/b"] = body(b"over tls")
    policy = FetchPolicy(transport=Transport(ssl_context=tls_pair[1]))
    assert await _collect(server.url("/a"), policy) == b"over tls"


async def test_c08_credentials_never_reach_another_origin(
    server: LoopbackServer, other_server: LoopbackServer
) -> None:
    server.routes["/a"] = redirect("/b")  # same origin: credentials kept
    server.routes["/b"] = redirect(other_server.url("/c"))  # another port: another origin
    other_server.routes["/c"] = body(b"payload")
    url = server.url("/a").replace("http://", "http://user:SECRET@") + "?sig=TOKEN"
    got = await _collect(url, headers={"Authorization": "Bearer SECRET2", "X-Trace": "t"})
    assert got == b"payload"
    assert [h.get("authorization") for _, h in server.requests] == ["Bearer SECRET2", "Bearer SECRET2"]
    (path, headers), = other_server.requests
    assert "authorization" not in headers and headers.get("x-trace") == "t"
    assert "SECRET" not in repr(headers) and "TOKEN" not in path


async def test_c08_userinfo_becomes_basic_auth_for_the_same_origin_only(
    server: LoopbackServer, other_server: LoopbackServer
) -> None:
    server.routes["/a"] = redirect(other_server.url("/c").replace("http://", "http://evil:PW@"))
    other_server.routes["/c"] = body(b"x")
    await _collect(server.url("/a").replace("http://", "http://user:SECRET@"))
    assert server.requests[0][1]["authorization"] == "Basic dXNlcjpTRUNSRVQ="  # user:SECRET
    assert "authorization" not in other_server.requests[0][1]


async def test_c08_secrets_absent_from_the_404_error(server: LoopbackServer, tmp_path: Path) -> None:
    port = server.server_address[1]
    url = f"http://user:{SECRET}@127.0.0.1:{port}/a.tar.gz?sig={TOKEN}"
    for call in (_collect(url), _source().stage(url, None, str(tmp_path / "s"), "blue")):
        with pytest.raises(FetchHTTPError) as info:
            await call
        text = "".join(traceback.format_exception(info.value))
        assert f"http://127.0.0.1:{port}/a.tar.gz" in str(info.value)
        for secret in (SECRET, TOKEN, "user:"):
            assert secret not in text


async def test_c08_secrets_absent_from_transport_errors(server: LoopbackServer) -> None:
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    with pytest.raises(FetchError) as info:
        await _collect(f"http://user:{SECRET}@127.0.0.1:{port}/a?sig={TOKEN}")
    text = "".join(traceback.format_exception(info.value))
    assert SECRET not in text and TOKEN not in text


async def test_nothing_written_outside_staging_on_http_failure(
    server: LoopbackServer, tmp_path: Path
) -> None:
    before = tree(str(tmp_path))
    server.routes["/a"] = short_body(len(ARCHIVE) + 10, ARCHIVE)
    with pytest.raises(FetchLengthMismatchError):
        await _source().stage(server.url("/a"), None, str(tmp_path / "s"), "blue")
    assert tree(str(tmp_path)) == before

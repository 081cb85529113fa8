"""Downloads over TLS as fleets run them (docs/trust.md, TLS), against real loopback HTTPS servers whose CA is
made in the test: the operating system's store by default, ``download.ca_file`` beside it, ``SSL_CERT_FILE``
as OpenSSL reads it, mutual TLS, an explicit CONNECT proxy and no proxy from the environment."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from agent.https import Transport
from agent.release.fetch import FetchPolicy, fetch
from agent.release.source import ArchiveSourceImpl
from agent.release.tls import download_transport
from upgrade_core.errors import FetchCertificateError, FetchError

from ._archives import Entry, compress, tar_bytes
from ._servers import LoopbackServer, body, serve
from ._tls import Authority, ConnectProxy
from .conftest import MEMBER

pytestmark = pytest.mark.anyio

BINARY = os.urandom(100_000)
ARCHIVE = compress(tar_bytes([Entry(MEMBER, data=BINARY)]), "gzip")
SECRET = "".join(["prox", "yPa55"])  # built at run time: no traceback line can quote it by accident
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


@pytest.fixture(autouse=True)
def _no_environment_trust(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's own environment must not decide these tests: no CA file or proxy from it."""
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", *_PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority.make(tmp_path / "pki")


@pytest.fixture
def served(ca: Authority) -> LoopbackServer:
    with serve(ca.server_context()) as server:
        server.routes["/a.tar.gz"] = body(ARCHIVE)
        yield server  # type: ignore[misc]


async def _fetched(url: str, transport: Transport) -> bytes:
    out = bytearray()

    async def sink(chunk: bytes) -> None:
        out.extend(chunk)

    await fetch(url, FetchPolicy(transport=transport), sink)
    return bytes(out)


async def test_the_operating_system_store_refuses_a_ca_it_does_not_hold(served: LoopbackServer) -> None:
    url = served.url("/a.tar.gz")
    secret_url = url.replace("https://", f"https://user:{SECRET}@") + "?sig=TOKEN"
    with pytest.raises(FetchCertificateError) as info:
        await _fetched(secret_url, Transport())
    assert str(info.value) == f"{url}: certificate verify failed: unable to get local issuer certificate"
    assert served.requests == []  # the handshake failed: no request was sent


async def test_ca_file_makes_the_test_ca_trusted_end_to_end(
    ca: Authority, served: LoopbackServer, tmp_path: Path
) -> None:
    source = ArchiveSourceImpl(member=MEMBER, download=FetchPolicy(
        transport=download_transport("test.toml", ca_file=str(ca.cert))))
    staged = tmp_path / "staged"
    candidate = await source.stage(served.url("/a.tar.gz"), hashlib.sha256(ARCHIVE).hexdigest(), str(staged),
                                   "blue")
    assert staged.read_bytes() == BINARY
    assert candidate.sha256 == hashlib.sha256(BINARY).hexdigest()
    assert [path for path, _ in served.requests] == ["/a.tar.gz"]


async def test_ca_file_is_trusted_beside_the_operating_system_store(
    ca: Authority, served: LoopbackServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operating system's store, as OpenSSL reads it, is SSL_CERT_FILE here: a second CA stands for the
    # host's own. ca_file adds the first CA; the host's CA must still be trusted.
    host_ca = Authority.make(tmp_path / "host-pki", "host store CA")
    monkeypatch.setenv("SSL_CERT_FILE", str(host_ca.cert))
    transport = download_transport("test.toml", ca_file=str(ca.cert))
    with serve(host_ca.server_context()) as other:
        other.routes["/b"] = body(b"signed by the host's CA")
        assert await _fetched(other.url("/b"), transport) == b"signed by the host's CA"
    assert await _fetched(served.url("/a.tar.gz"), transport) == ARCHIVE


async def test_ssl_cert_file_is_honoured_as_openssl_honours_it(
    ca: Authority, served: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = served.url("/a.tar.gz")
    with pytest.raises(FetchCertificateError):
        await _fetched(url, Transport())
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert))
    assert await _fetched(url, Transport()) == ARCHIVE


async def test_mutual_tls_with_the_client_certificate_and_key(ca: Authority) -> None:
    client = ca.issue("client", server=False)
    transport = download_transport("test.toml", ca_file=str(ca.cert), client_cert=str(client.cert),
                                   client_key=str(client.key))
    with serve(ca.server_context(client_ca=ca.cert)) as server:
        server.routes["/a.tar.gz"] = body(ARCHIVE)
        assert await _fetched(server.url("/a.tar.gz"), transport) == ARCHIVE


async def _refused_by_a_mutual_tls_server(ca: Authority, transport: Transport) -> tuple[str, str]:
    """(URL, the error's text) of a fetch the server (which requires a client certificate of ``ca``) refused
    before any request reached it."""
    with serve(ca.server_context(client_ca=ca.cert)) as server:
        server.routes["/a.tar.gz"] = body(ARCHIVE)
        url = server.url("/a.tar.gz")
        with pytest.raises(FetchError) as info:
            await _fetched(url, transport)
        assert server.requests == []
    return url, str(info.value)


async def test_mutual_tls_without_a_client_certificate_fails_naming_the_keys(ca: Authority) -> None:
    without = download_transport("test.toml", ca_file=str(ca.cert))
    url, error = await _refused_by_a_mutual_tls_server(ca, without)
    assert error == (
        f"{url}: TLS handshake refused by the server: tlsv13 alert certificate required; "
        "set download.client_cert and download.client_key"
    )


async def test_mutual_tls_with_a_certificate_the_server_does_not_accept(
    ca: Authority, tmp_path: Path
) -> None:
    stranger = Authority.make(tmp_path / "other-pki", "another CA").issue("client", server=False)
    transport = download_transport("test.toml", ca_file=str(ca.cert), client_cert=str(stranger.cert),
                                   client_key=str(stranger.key))
    url, error = await _refused_by_a_mutual_tls_server(ca, transport)
    assert error == f"{url}: TLS handshake refused by the server: tlsv1 alert unknown ca"


async def test_the_explicit_proxy_carries_the_download_and_the_environment_proxy_is_ignored(
    ca: Authority, served: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = served.url("/a.tar.gz")
    with ConnectProxy.running() as configured, ConnectProxy.running() as from_environment:
        for name in _PROXY_VARIABLES:
            monkeypatch.setenv(name, from_environment.url)
        transport = download_transport("test.toml", ca_file=str(ca.cert), proxy=configured.url)
        assert await _fetched(url, transport) == ARCHIVE
        assert configured.tunnels == [f"127.0.0.1:{served.server_address[1]}"]
        # without download.proxy: straight to the server, whatever the environment says
        assert await _fetched(url, download_transport("test.toml", ca_file=str(ca.cert))) == ARCHIVE
        assert from_environment.requests == []
        assert configured.tunnels == [f"127.0.0.1:{served.server_address[1]}"]
    assert len(served.requests) == 2


async def test_a_proxy_refusing_the_tunnel_is_named_without_its_credentials(
    ca: Authority, served: LoopbackServer
) -> None:
    url = served.url("/a.tar.gz")
    with ConnectProxy.running() as proxy:
        proxy.refuse = "407 Proxy Authentication Required"
        with_credentials = proxy.url.replace("http://", f"http://agent:{SECRET}@")
        transport = download_transport("test.toml", ca_file=str(ca.cert), proxy=with_credentials)
        with pytest.raises(FetchError) as info:
            await _fetched(url, transport)
        (line, headers), = proxy.requests
    assert str(info.value) == (
        f"{url}: download.proxy {proxy.url} refused the tunnel (407 Proxy Authentication Required)")
    assert line.startswith("CONNECT 127.0.0.1:") and headers["proxy-authorization"].startswith("Basic ")
    assert served.requests == []

"""Fixtures for the fetch/extract/verify tests: loopback servers, a self-signed TLS pair, archive feeds."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.release.extract import ExtractLimits, ExtractResult, MemberPolicy, extract

from ._servers import LoopbackServer, serve

MEMBER = "demo-agent-linux-amd64"


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with serve() as s:
        yield s


@pytest.fixture
def other_server() -> Iterator[LoopbackServer]:
    """A second loopback server: another port, hence another origin."""
    with serve() as s:
        yield s


@pytest.fixture(scope="session")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context) for a self-signed 127.0.0.1 certificate made with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: the https redirect rules are covered by check_redirect tests")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    return server_ctx, client_ctx


@pytest.fixture
def https_server(tls_pair: tuple[ssl.SSLContext, ssl.SSLContext]) -> Iterator[LoopbackServer]:
    with serve(tls_pair[0]) as s:
        yield s


def feed_bytes(data: bytes, chunk: int = 65536):  # type: ignore[no-untyped-def]
    """A feed for ``agent.release.extract.extract`` delivering ``data`` in ``chunk``-byte pieces."""

    async def feed(sink, _coding) -> None:  # type: ignore[no-untyped-def]
        for i in range(0, len(data), chunk):
            await sink(data[i : i + chunk])

    return feed


async def run_extract(
    data: bytes,
    staging: Path,
    *,
    member: str = MEMBER,
    policy: MemberPolicy = "exact",
    limits: ExtractLimits | None = None,
    expected_sha256: str | None = None,
) -> ExtractResult:
    return await extract(
        feed_bytes(data),
        str(staging),
        member=member,
        policy=policy,
        limits=limits or ExtractLimits(),
        expected_sha256=expected_sha256,
        source_name="test.tar",
    )


@pytest.fixture
def staging(tmp_path: Path) -> Path:
    """``tmp_path/slots/.NAME-green.stage-0001`` in an otherwise empty directory."""
    d = tmp_path / "slots"
    d.mkdir()
    os.chmod(d, 0o755)
    return d / f".{MEMBER}-green.stage-0001"

"""Downloads that survive a flaky network (``download.retry_deadline_s``, agent/release/fetch.py), against a
real loopback server that cuts connections mid-body, answers 503 or 429 first, or ignores ``Range``. Each test
reads what was staged, how many requests the server saw and the ``Range``/``If-Range`` headers it got."""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import time
from pathlib import Path

import pytest

from agent.release.fetch import FetchPolicy
from agent.release.source import ArchiveSourceImpl
from agent.release.tls import download_transport
from upgrade_core.errors import FetchError, FetchHTTPError, FetchLengthMismatchError

from ._archives import Entry, compress, tar_bytes
from ._servers import Handler, LoopbackServer, serve
from ._tls import Authority
from .conftest import MEMBER

pytestmark = pytest.mark.anyio

BINARY = os.urandom(400_000)  # random: gzip cannot shrink it, so a cut lands mid-member
ARCHIVE = compress(tar_bytes([Entry(MEMBER, data=BINARY)]), "gzip")
DIGEST = hashlib.sha256(ARCHIVE).hexdigest()
ETAG = '"release-2.0.0"'
CUT_AT = len(ARCHIVE) // 3
_RANGE = re.compile(r"bytes=(\d+)-")


def flaky(steps: list[str], data: bytes = ARCHIVE, etag: str | None = ETAG) -> tuple[Handler, list[float]]:
    """A route answering its n-th request by ``steps[n]`` (the last step repeats), and the monotonic time of
    each request. Steps: a status such as ``503`` or ``404`` (``429`` with ``Retry-After: 1``); ``ok``
    (honours ``Range`` when ``If-Range`` matches, as RFC 9110 says); ``cut`` (the whole length announced, a
    third of the body, then the connection closed); ``part`` (as ``ok``, but closed after half of that);
    ``full`` (always the whole file with 200); ``changed`` (200 with another ETag)."""
    seen: list[float] = []

    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        seen.append(time.monotonic())
        step = steps[min(len(seen), len(steps)) - 1]
        if step.isdigit():
            h.send_response(int(step))
            if step == "429":
                h.send_header("Retry-After", "1")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        asked = _RANGE.fullmatch(h.headers.get("Range", ""))
        ranged = asked is not None and step in ("ok", "part") and h.headers.get("If-Range") == etag
        start = int(asked.group(1)) if ranged and asked else 0
        h.send_response(206 if start else 200)
        if etag is not None:
            h.send_header("ETag", '"another"' if step == "changed" else etag)
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        stop = {"cut": CUT_AT, "part": start + CUT_AT // 2}.get(step, len(data))
        h.wfile.write(data[start:stop])
        h.wfile.flush()
        h.close_connection = stop < len(data)

    return handle, seen


def _ranges(server: LoopbackServer) -> list[tuple[str | None, str | None]]:
    return [(h.get("range"), h.get("if-range")) for _, h in server.requests]


def _source(deadline_s: float = 30.0) -> ArchiveSourceImpl:
    return ArchiveSourceImpl(member=MEMBER, download=FetchPolicy(retry_deadline_s=deadline_s,
                                                                 retry_backoff_s=0.05))


async def _stage(server: LoopbackServer, tmp_path: Path, deadline_s: float = 30.0) -> Path:
    staged = tmp_path / "staged"
    candidate = await _source(deadline_s).stage(server.url("/a.tar.gz"), DIGEST, str(staged), "blue")
    assert candidate.archive_sha256 == DIGEST and candidate.archive_size == len(ARCHIVE)
    return staged


@pytest.mark.parametrize("then", ["ok", "full"], ids=["206 from the cut", "200 read on from the cut"])
async def test_a_body_cut_midway_is_resumed_from_the_bytes_received(
    server: LoopbackServer, tmp_path: Path, then: str
) -> None:
    server.routes["/a.tar.gz"], _ = flaky(["cut", then])
    assert (await _stage(server, tmp_path)).read_bytes() == BINARY
    assert _ranges(server) == [(None, None), (f"bytes={CUT_AT}-", ETAG)]


async def test_cut_twice_then_resumed_each_time_from_where_it_stopped(
    server: LoopbackServer, tmp_path: Path
) -> None:
    server.routes["/a.tar.gz"], _ = flaky(["part", "part", "ok"])  # the second answer a cut 206 itself
    assert (await _stage(server, tmp_path)).read_bytes() == BINARY
    half = CUT_AT // 2
    assert _ranges(server) == [(None, None), (f"bytes={half}-", ETAG), (f"bytes={2 * half}-", ETAG)]


async def test_a_body_cut_over_https_is_resumed_as_over_http(tmp_path: Path) -> None:
    """The server closes its TLS connection without TLS's goodbye mid-body: a cut connection, not a TLS
    refusal (agent.https.tls_failure), so it is resumed."""
    ca = Authority.make(tmp_path / "pki")
    transport = download_transport("test.toml", ca_file=str(ca.cert))
    source = ArchiveSourceImpl(member=MEMBER, download=FetchPolicy(
        retry_deadline_s=30, retry_backoff_s=0.05, transport=transport))
    with serve(ca.server_context()) as server:
        server.routes["/a.tar.gz"], _ = flaky(["cut", "ok"])
        await source.stage(server.url("/a.tar.gz"), DIGEST, str(tmp_path / "staged"), "blue")
        assert _ranges(server) == [(None, None), (f"bytes={CUT_AT}-", ETAG)]
    assert (tmp_path / "staged").read_bytes() == BINARY


async def test_503_then_200_is_fetched_whole_on_the_second_request(
    server: LoopbackServer, tmp_path: Path
) -> None:
    server.routes["/a.tar.gz"], _ = flaky(["503", "ok"])
    assert (await _stage(server, tmp_path)).read_bytes() == BINARY
    assert _ranges(server) == [(None, None), (None, None)]


async def test_429_waits_as_long_as_retry_after_says(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/a.tar.gz"], seen = flaky(["429", "ok"])
    assert (await _stage(server, tmp_path)).read_bytes() == BINARY
    assert len(seen) == 2 and seen[1] - seen[0] >= 0.95  # Retry-After: 1, not the 0.05 s back-off


async def test_a_file_that_changed_between_attempts_fails_and_stages_nothing(
    server: LoopbackServer, tmp_path: Path
) -> None:
    server.routes["/a.tar.gz"], _ = flaky(["cut", "changed"])
    with pytest.raises(FetchError, match="the file changed while it was being downloaded"):
        await _stage(server, tmp_path)
    assert len(server.requests) == 2 and list(tmp_path.iterdir()) == []


async def test_a_cut_without_validators_is_not_resumed(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/a.tar.gz"], _ = flaky(["cut", "ok"], etag=None)
    with pytest.raises(FetchLengthMismatchError) as info:
        await _stage(server, tmp_path)
    assert str(info.value).endswith(
        f"; not resumed: the server gave no ETag or Last-Modified for the {CUT_AT} bytes already received")
    assert len(server.requests) == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("status", ["404", "403", "410"])
async def test_a_4xx_other_than_408_or_429_fails_at_once(
    server: LoopbackServer, tmp_path: Path, status: str
) -> None:
    server.routes["/a.tar.gz"], _ = flaky([status, "ok"])
    with pytest.raises(FetchHTTPError) as info:
        await _stage(server, tmp_path)
    assert info.value.status == int(status) and len(server.requests) == 1


async def test_the_deadline_ends_the_attempts_and_says_so(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/a.tar.gz"], seen = flaky(["503"])
    started = time.monotonic()
    with pytest.raises(FetchHTTPError) as info:
        await _stage(server, tmp_path, deadline_s=1.0)
    assert time.monotonic() - started < 5.0
    assert len(seen) >= 3
    assert str(info.value) == (f"{server.url('/a.tar.gz')}: HTTP 503 Service Unavailable; gave up after "
                               f"{len(seen)} attempts (download.retry_deadline_s = 1 s)")


async def test_retry_after_past_the_deadline_gives_up_at_once(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/a.tar.gz"], _ = flaky(["429", "ok"])
    with pytest.raises(FetchHTTPError, match=r"Retry-After 1 s is past download\.retry_deadline_s"):
        await _stage(server, tmp_path, deadline_s=0.5)
    assert len(server.requests) == 1


async def test_a_zero_deadline_makes_one_attempt(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/a.tar.gz"], _ = flaky(["503", "ok"])
    with pytest.raises(FetchHTTPError) as info:
        await _stage(server, tmp_path, deadline_s=0)
    assert str(info.value) == f"{server.url('/a.tar.gz')}: HTTP 503 Service Unavailable"
    assert len(server.requests) == 1

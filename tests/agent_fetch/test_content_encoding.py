"""C27: what the server sent versus the file. A server or proxy that applies a ``Content-Encoding`` to a
release although we asked for ``identity``: the coding is undone before hashing and extracting, so the
sha256 is over the file as published; Content-Length and truncation rules apply to the wire bytes.
Real loopback HTTP servers; asyncio and trio."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import zlib
from pathlib import Path

import pytest
import zstandard

from agent.release.extract import ExtractLimits
from agent.release.fetch import FetchPolicy, fetch
from agent.release.source import ArchiveSourceImpl
from upgrade_core.errors import (
    ArchiveLimitError,
    ArchiveRejectedError,
    ArchiveTruncatedError,
    DigestMismatchError,
    FetchContentEncodingError,
    FetchLengthMismatchError,
)

from ._archives import Entry, compress, tar_bytes, tar_header, tree
from ._servers import Handler, LoopbackServer
from .conftest import MEMBER

pytestmark = pytest.mark.anyio

BINARY = b"\x7fELF" + os.urandom(200_000) + bytes(50_000)
TAR_GZ = compress(tar_bytes([Entry(MEMBER, data=BINARY)]), "gzip")  # the file as published
TAR_GZ_SHA = hashlib.sha256(TAR_GZ).hexdigest()


def encoded(wire: bytes, coding: str, announced: int | None = None) -> Handler:
    """200 with ``Content-Encoding: coding`` and the wire bytes; Content-Length = ``announced`` or theirs."""

    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/gzip")
        h.send_header("Content-Encoding", coding)
        h.send_header("Content-Length", str(len(wire) if announced is None else announced))
        h.end_headers()
        h.wfile.write(wire)
        h.wfile.flush()
        if announced is not None:
            h.close_connection = True

    return handle


async def _stage(
    server: LoopbackServer, tmp_path: Path, path: str, sha: str | None = TAR_GZ_SHA, **kw: object
):  # type: ignore[no-untyped-def]
    src = ArchiveSourceImpl(member=MEMBER, **kw)  # type: ignore[arg-type]
    return await src.stage(server.url(path), sha, str(tmp_path / "stage"), "green")


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


CODINGS = [
    ("gzip", lambda d: gzip.compress(d, mtime=0)),
    ("x-gzip", lambda d: gzip.compress(d, mtime=0)),
    ("deflate", zlib.compress),  # RFC 9110: a zlib stream
    ("deflate", _raw_deflate),  # what some servers send instead
    ("zstd", lambda d: zstandard.ZstdCompressor(write_checksum=True).compress(d)),
    ("gzip, zstd", lambda d: zstandard.ZstdCompressor().compress(gzip.compress(d))),  # applied in this order
    ("identity", lambda d: d),
]


@pytest.mark.parametrize(("coding", "encode"), CODINGS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CODINGS)])
async def test_c27_encoded_response_commits_with_the_files_sha256(
    server: LoopbackServer, tmp_path: Path, coding: str, encode
) -> None:  # type: ignore[no-untyped-def]
    """Expected: staged = the member; archive_sha256 = sha256 of the .tar.gz as published (not of the wire
    bytes); we asked for identity."""
    wire = encode(TAR_GZ)
    server.routes["/r.tar.gz"] = encoded(wire, coding)
    staged = await _stage(server, tmp_path, "/r.tar.gz")
    assert (tmp_path / "stage").read_bytes() == BINARY
    assert staged.sha256 == hashlib.sha256(BINARY).hexdigest()
    assert (staged.archive_sha256, staged.archive_size) == (TAR_GZ_SHA, len(TAR_GZ))
    assert server.requests[-1][1]["accept-encoding"] == "identity"


async def test_c27_gzip_encoded_bare_executable(server: LoopbackServer, tmp_path: Path) -> None:
    server.routes["/agent"] = encoded(gzip.compress(BINARY), "gzip")
    staged = await _stage(
        server, tmp_path, "/agent", sha=hashlib.sha256(BINARY).hexdigest(), member_policy="none"
    )
    assert (tmp_path / "stage").read_bytes() == BINARY and staged.archive_sha256 == staged.sha256


async def test_c27_the_digest_of_the_wire_bytes_is_not_the_files(
    server: LoopbackServer, tmp_path: Path
) -> None:
    wire = gzip.compress(TAR_GZ)
    server.routes["/r.tar.gz"] = encoded(wire, "gzip")
    with pytest.raises(DigestMismatchError):
        await _stage(server, tmp_path, "/r.tar.gz", sha=hashlib.sha256(wire).hexdigest())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("coding", ["br", "compress", "aes128gcm", "gzip, br"])
async def test_c27_a_coding_we_cannot_undo_is_refused_naming_it(
    server: LoopbackServer, tmp_path: Path, coding: str
) -> None:
    server.routes["/r.tar.gz"] = encoded(TAR_GZ, coding)
    with pytest.raises(FetchContentEncodingError) as info:
        await _stage(server, tmp_path, "/r.tar.gz")
    message = str(info.value)
    named = coding.split(", ")[-1] if coding != "gzip, br" else "br"
    assert f"Content-Encoding {named}" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


async def test_c27_plain_fetch_without_a_decoder_refuses_an_encoded_body(server: LoopbackServer) -> None:
    server.routes["/r"] = encoded(gzip.compress(b"x"), "gzip")

    async def sink(chunk: bytes) -> None:
        raise AssertionError("no byte of an encoded body reaches a sink that cannot undo it")

    with pytest.raises(FetchContentEncodingError, match="Content-Encoding gzip"):
        await fetch(server.url("/r"), FetchPolicy(), sink)


async def test_c27_content_length_counts_wire_bytes(server: LoopbackServer, tmp_path: Path) -> None:
    """Content-Length announces more wire bytes than are sent: the length rule fires (C06), although the
    bytes that did arrive decode to more than the announced length."""
    wire = gzip.compress(TAR_GZ)
    server.routes["/r.tar.gz"] = encoded(wire[: len(wire) // 2], "gzip", announced=len(wire))
    with pytest.raises(FetchLengthMismatchError):
        await _stage(server, tmp_path, "/r.tar.gz")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("coding", ["gzip", "deflate", "zstd"])
async def test_c27_a_cut_coding_is_the_truncation_error(
    server: LoopbackServer, tmp_path: Path, coding: str
) -> None:
    """The wire body is complete by its Content-Length, but the coding inside it stops before its end."""
    encode = {
        "gzip": gzip.compress,
        "deflate": zlib.compress,
        "zstd": lambda d: zstandard.ZstdCompressor(write_checksum=True).compress(d),
    }[coding]
    wire = encode(TAR_GZ)
    server.routes["/r.tar.gz"] = encoded(wire[:-3], coding)
    with pytest.raises(ArchiveTruncatedError, match=f"Content-Encoding {coding}: archive truncated/corrupt"):
        await _stage(server, tmp_path, "/r.tar.gz", sha=None)
    assert list(tmp_path.iterdir()) == []


async def test_c27_trailing_bytes_after_the_coding_are_refused(
    server: LoopbackServer, tmp_path: Path
) -> None:
    server.routes["/r.tar.gz"] = encoded(gzip.compress(TAR_GZ) + b"junk", "gzip")
    with pytest.raises(ArchiveRejectedError, match="trailing data"):
        await _stage(server, tmp_path, "/r.tar.gz", sha=None)


async def test_c27_decoded_bytes_are_bounded_by_max_archive_bytes(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """A 64 MiB plain tar (one member of zeros) gzip-encoded to ~64 KiB on the wire: the decoded file
    passes max_archive_bytes (1 MiB) and is refused long before it is decoded whole."""
    wire = gzip.compress(tar_header(MEMBER, 64 << 20) + bytes(64 << 20), compresslevel=9)
    assert len(wire) < 128 << 10
    server.routes["/r.tar.gz"] = encoded(wire, "gzip")
    before = tree(str(tmp_path))
    with pytest.raises(ArchiveLimitError, match="max_archive_bytes"):
        await _stage(server, tmp_path, "/r.tar.gz", sha=None, limits=ExtractLimits(max_archive_bytes=1 << 20))
    assert tree(str(tmp_path)) == before


async def test_bare_body_declared_8_gib_is_refused_by_the_size_bound_before_download(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """Expected: ArchiveLimitError naming Content-Length and max_archive_bytes (default 256 MiB), from the
    headers alone: the server sends the headers and 16 bytes, then holds the connection; no staging file."""

    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(8 << 30))
        h.end_headers()
        h.wfile.write(b"\x7fELF" + bytes(12))
        h.wfile.flush()
        h.close_connection = True

    server.routes["/agent"] = handle
    with pytest.raises(
        ArchiveLimitError, match=f"Content-Length {8 << 30} is above limits.max_archive_bytes"
    ):
        await _stage(server, tmp_path, "/agent", sha=None, member_policy="none")
    assert list(tmp_path.iterdir()) == []

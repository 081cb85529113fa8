"""Published releases fetched from a package registry and cached (``agent.testing.published``, shared by the
real-input tests and the ``fetch.delta`` benchmark): the registry's own ``dist.integrity`` decides what is
cached, the recorded sha256 what is reused, and an unreachable registry with nothing cached is a skip with its
reason, never a figure. The registry is a loopback server answering as npm's does (a version document whose
``dist`` names the tarball and its sha512 in Subresource Integrity form)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent.testing.published import PublishedMismatch, RegistryUnreachable, npm_tarball

from ._servers import LoopbackServer, body

PACKAGE = "@esbuild/linux-x64"
ROOT = Path(__file__).resolve().parents[2]


def _publish(server: LoopbackServer, version: str, tarball: bytes, integrity_of: bytes | None = None) -> None:
    """Serve ``tarball`` as ``PACKAGE@version`` with the sha512 SRI of ``integrity_of`` (default: itself)."""
    sri = "sha512-" + base64.b64encode(hashlib.sha512(integrity_of or tarball).digest()).decode()
    path = f"/-/linux-x64-{version}.tgz"
    document = {"name": PACKAGE, "version": version, "dist": {"tarball": server.url(path), "integrity": sri}}
    server.routes[f"/{PACKAGE}/{version}"] = body(json.dumps(document).encode())
    server.routes[path] = body(tarball)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_tarball_matching_dist_integrity_is_cached_with_its_sha256_then_used_offline(
    server: LoopbackServer, tmp_path: Path
) -> None:
    tarball = os.urandom(4096)
    _publish(server, "1.2.3", tarball)
    path, digest = npm_tarball(PACKAGE, "1.2.3", tmp_path, registry=server.url(""))
    assert path == tmp_path / "linux-x64-1.2.3.tgz" and path.read_bytes() == tarball
    assert digest == hashlib.sha256(tarball).hexdigest()
    assert (tmp_path / "linux-x64-1.2.3.tgz.sha256").read_text() == f"{digest}  linux-x64-1.2.3.tgz\n"
    assert sorted(os.listdir(tmp_path)) == ["linux-x64-1.2.3.tgz", "linux-x64-1.2.3.tgz.sha256"]

    asked = len(server.requests)
    again = npm_tarball(PACKAGE, "1.2.3", tmp_path, registry=f"http://127.0.0.1:{_closed_port()}")
    assert again == (path, digest) and len(server.requests) == asked


def test_a_tarball_not_matching_dist_integrity_is_refused_and_nothing_is_cached(
    server: LoopbackServer, tmp_path: Path
) -> None:
    _publish(server, "1.2.4", b"what the mirror served", integrity_of=b"what the publisher published")
    with pytest.raises(PublishedMismatch, match=r"^@esbuild/linux-x64@1\.2\.4: tarball does not match the "):
        npm_tarball(PACKAGE, "1.2.4", tmp_path, registry=server.url(""))
    assert os.listdir(tmp_path) == []


def test_a_cached_tarball_changed_since_it_was_recorded_is_refused(
    server: LoopbackServer, tmp_path: Path
) -> None:
    _publish(server, "1.2.5", b"published bytes")
    path, digest = npm_tarball(PACKAGE, "1.2.5", tmp_path, registry=server.url(""))
    path.write_bytes(b"changed on disk")
    with pytest.raises(PublishedMismatch, match=f"differs from the recorded {digest}; delete it to refetch$"):
        npm_tarball(PACKAGE, "1.2.5", tmp_path, registry=server.url(""))


def test_an_unreachable_registry_with_nothing_cached_names_the_registry_and_the_package(
    tmp_path: Path,
) -> None:
    registry = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(
        RegistryUnreachable, match=f"^{registry} \\(@esbuild/linux-x64@0\\.28\\.1\\): Connect"
    ):
        npm_tarball(PACKAGE, "0.28.1", tmp_path, registry=registry)
    assert os.listdir(tmp_path) == []


def test_the_fetch_delta_row_is_skipped_with_the_reason_when_the_registry_is_unreachable(
    tmp_path: Path,
) -> None:
    """``python -m benchmarks --json fetch.delta`` with an empty cache and every HTTPS request sent to a
    proxy that refuses connections: one JSON line, ``skipped`` with the reason, no figure; exit 0."""
    env = dict(
        os.environ,
        UPGRADE_CORE_REAL_INPUT_CACHE=str(tmp_path / "cache"),
        HTTPS_PROXY=f"http://127.0.0.1:{_closed_port()}",
        NO_PROXY="",
    )
    for lower in ("https_proxy", "no_proxy"):  # lower case wins (urllib.request.getproxies)
        env.pop(lower, None)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--json", "fetch.delta"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    row = json.loads(line)
    assert set(row) == {"name", "skipped", "reason", "met"}
    assert (row["name"], row["skipped"], row["met"]) == ("fetch.delta", True, None)
    assert row["reason"].startswith(
        "package registry unreachable and nothing cached: https://registry.npmjs.org (@esbuild/"
    ), row["reason"]
    assert not (tmp_path / "cache").exists() or os.listdir(tmp_path / "cache") == []

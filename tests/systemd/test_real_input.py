"""Real input end to end (SPEC 8, issue 6 part 2): a third-party daemon from its published release archives.

The daemon is esbuild (its ``--serve`` mode is a real HTTP server) from the npm registry's
``@esbuild/linux-<x64|arm64>`` packages, in the publisher's own layout: a gzip tarball whose member
``package/bin/esbuild`` sits beside ``package/package.json`` and ``package/README.md``, so the agent runs with
``member_policy = "select"``. The CLI installs 0.20.2, upgrades to 0.21.5 (committed), then to a broken
candidate built from 0.21.5's archive (same layout; the binary replaced by a script that answers
``--version`` with a plausible version and exits 1 when asked to serve), which must roll back to 0.21.5,
still serving.

Archives are cached between runs under ``$UPGRADE_CORE_REAL_INPUT_CACHE`` (default
``~/.cache/upgrade-core/real-input``) with their sha256 recorded beside them; a fresh download is checked
against the registry's own ``dist.integrity`` (sha512, Subresource Integrity format) before it is cached.
Only an unreachable registry (and no cache) skips, with the reason; ``REQUIRE_REAL_INPUT=1`` (set by
``.ci/run``) turns that skip into a failure.

Note on ``--watch=forever``: esbuild's serve mode exits 0 as soon as its stdin reaches end of file, and a
systemd service's stdin is ``/dev/null``; ``--watch=forever`` is esbuild's documented switch to keep running
without stdin, so it is part of ``exec_args``.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import io
import json
import os
import platform
import secrets
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.harness.sandbox import PrivateSystemd, free_port

from .conftest import wait_for

pytestmark = [pytest.mark.systemd]

REGISTRY = "https://registry.npmjs.org"
VERSION_A = "0.20.2"
VERSION_B = "0.21.5"
BROKEN_VERSION = "0.21.6"
MEMBER = "package/bin/esbuild"
WORKTREE = Path(__file__).resolve().parents[2]

_NPM_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


class RegistryUnreachable(Exception):
    """The package registry could not be reached (DNS, connect, TLS or timeout); the reason is the message."""


def _cache_dir() -> Path:
    default = Path.home() / ".cache" / "upgrade-core" / "real-input"
    return Path(os.environ.get("UPGRADE_CORE_REAL_INPUT_CACHE", str(default)))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_published(package: str, version: str, cache: Path) -> tuple[Path, str]:
    """The published tarball of ``package@version`` from the cache, else from the registry.

    Returns:
        (path of the cached ``.tgz``, its sha256 hex).

    Raises:
        RegistryUnreachable: the archive is not cached and the registry cannot be reached.
        AssertionError: a cached archive no longer matches its recorded sha256, or a download does not
            match the registry's ``dist.integrity``.
    """
    base = package.rsplit("/", 1)[-1]
    archive = cache / f"{base}-{version}.tgz"
    recorded = archive.with_name(archive.name + ".sha256")
    if archive.exists() and recorded.exists():
        want = recorded.read_text().split()[0]
        got = _sha256(archive)
        assert got == want, f"{archive}: sha256 {got} differs from the recorded {want}; delete it to refetch"
        return archive, got
    cache.mkdir(parents=True, exist_ok=True)
    try:
        with httpx.Client(timeout=httpx.Timeout(60.0, connect=15.0), follow_redirects=True) as client:
            meta = client.get(f"{REGISTRY}/{package}/{version}")
            meta.raise_for_status()
            dist = meta.json()["dist"]
            tarball = client.get(dist["tarball"])
            tarball.raise_for_status()
    except (httpx.TransportError, httpx.HTTPStatusError) as exc:
        raise RegistryUnreachable(f"{REGISTRY} ({package}@{version}): {exc!r}") from exc
    body = tarball.content
    algorithm, _, expected = dist["integrity"].partition("-")
    assert algorithm == "sha512", f"{package}@{version}: unexpected integrity algorithm {algorithm!r}"
    actual = base64.b64encode(hashlib.sha512(body).digest()).decode()
    assert actual == expected, f"{package}@{version}: tarball does not match the registry's dist.integrity"
    tmp = archive.with_name(f".{archive.name}.{secrets.token_hex(4)}")
    tmp.write_bytes(body)
    os.replace(tmp, archive)
    digest = hashlib.sha256(body).hexdigest()
    recorded.write_text(f"{digest}  {archive.name}\n")
    return archive, digest


@pytest.fixture(scope="module")
def published() -> dict[str, tuple[Path, str]]:
    """Both published esbuild archives for this machine: version -> (cached path, sha256)."""
    arch = _NPM_ARCH.get(platform.machine().lower())
    if arch is None:
        pytest.skip(f"esbuild publishes no npm package for machine {platform.machine()!r} in this test")
    package = f"@esbuild/linux-{arch}"
    try:
        return {v: _fetch_published(package, v, _cache_dir()) for v in (VERSION_A, VERSION_B)}
    except RegistryUnreachable as exc:
        reason = f"real input: package registry unreachable and nothing cached: {exc}"
        if os.environ.get("REQUIRE_REAL_INPUT") == "1":
            pytest.fail(f"{reason} (REQUIRE_REAL_INPUT=1 turns this skip into a failure)")
        pytest.skip(reason)


def _broken_from(good: Path, out: Path) -> Path:
    """A candidate in the publisher's layout, built from ``good``: same members, order, modes and owners;
    ``package/bin/esbuild`` replaced by a script that prints a plausible version and exits 1 otherwise."""
    script = (
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then echo {BROKEN_VERSION}; exit 0; fi\n'
        'echo "esbuild: simulated bad release" >&2\n'
        "exit 1\n"
    ).encode()
    with tarfile.open(good, "r:gz") as src, tarfile.open(out, "w:gz") as dst:
        for info in src:
            if info.name == MEMBER:
                info.size = len(script)
                dst.addfile(info, io.BytesIO(script))
            else:
                dst.addfile(info, src.extractfile(info) if info.isfile() else None)
    return out


def _layout(archive: Path) -> list[tuple[str, int]]:
    """Member names and modes of a gzip tarball, in order."""
    with gzip.open(archive) as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
        return [(m.name, m.mode) for m in tar]


@pytest.fixture
def archive_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server over a fresh directory: (base URL, directory)."""
    root = tmp_path / "releases"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _get(url: str) -> tuple[int, str]:
    try:
        response = httpx.get(url, timeout=2.0)
    except httpx.TransportError:
        return 0, ""
    return response.status_code, response.text


def test_esbuild_installed_upgraded_and_rolled_back_from_its_published_archives(
    sandbox: PrivateSystemd,
    tmp_path: Path,
    published: dict[str, tuple[Path, str]],
    archive_server: tuple[str, Path],
) -> None:
    base_url, served = archive_server
    urls: dict[str, tuple[str, str]] = {}
    for version, (path, digest) in published.items():
        (served / path.name).write_bytes(path.read_bytes())
        urls[version] = (f"{base_url}/{path.name}", digest)
    broken = _broken_from(published[VERSION_B][0], served / f"{published[VERSION_B][0].stem}-broken.tgz")
    urls[BROKEN_VERSION] = (f"{base_url}/{broken.name}", _sha256(broken))
    assert _layout(broken) == _layout(published[VERSION_B][0])  # the publisher's layout, kept

    name = f"esb-{secrets.token_hex(4)}"
    port = free_port()
    www = tmp_path / "www"
    www.mkdir()
    page = f"<!doctype html><title>{name}</title><p>served by esbuild</p>\n"
    (www / "index.html").write_text(page)
    root = tmp_path / "root"
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f"""[agent]
name = "{name}"
exec_args = ["--serve=127.0.0.1:{port}", "--servedir={www}", "--watch=forever"]
version_args = ["--version"]
member = "{MEMBER}"
member_policy = "select"

[host]
root = "{root}"
state_dir = "{tmp_path}/state"
lock_path = "{tmp_path}/run/{name}.lock"
unit_dir = "{sandbox.unit_dir}"
systemctl_prefix = {json.dumps(list(sandbox.prefix))}

[health]
stability_s = 0.5
timeout_s = 10.0
max_attempts = 2
http_probe = "http://127.0.0.1:{port}/"
"""
    )
    cli = [sys.executable, "-m", "agent.cli", "--config", str(config), "--json"]

    def run(*argv: str) -> tuple[int, dict[str, Any]]:
        done = subprocess.run([*cli, *argv], cwd=WORKTREE, capture_output=True, text=True, timeout=120)
        # pytest shows what is printed only when the test fails: the CLI's own account of each step
        print(f"$ upgrade-agent {' '.join(argv)}  -> exit {done.returncode}\n{done.stdout}{done.stderr}")
        lines = done.stdout.strip().splitlines()
        assert lines, f"{argv[0]}: no JSON on stdout (exit {done.returncode}); stderr:\n{done.stderr}"
        return done.returncode, json.loads(lines[-1])

    def archive(version: str) -> list[str]:
        return ["--archive", urls[version][0], "--sha256", urls[version][1]]

    lib = root / "lib" / name
    try:
        rc, out = run("install", *archive(VERSION_A), "--expect-version", VERSION_A)
        assert (rc, out["result"], out["to_version"], out["slot"]) == (0, "committed", VERSION_A, "blue"), out
        home = f"http://127.0.0.1:{port}/"
        wait_for(lambda: _get(home) == (200, page), what=f"esbuild {VERSION_A} serving {home}")

        rc, out = run("upgrade", *archive(VERSION_B), "--operation", "to-b")
        assert (rc, out["result"], out["from_version"], out["to_version"], out["slot"]) == (
            0, "committed", VERSION_A, VERSION_B, "green"), out
        rc, status = run("status")
        assert rc == 0
        assert status["current"]["version"] == VERSION_B and status["current"]["slot"] == "green"
        assert status["last_good"]["version"] == VERSION_A
        assert status["service"]["active_state"] == "active"
        assert status["service"]["exe"] == str(lib / f"{name}-green")  # a native binary: exe is the slot
        green_pid = status["service"]["main_pid"]
        green_sha = status["current"]["sha256"]
        assert (lib / f"{name}-green").read_bytes()[:4] == b"\x7fELF"
        assert _get(f"http://127.0.0.1:{port}/") == (200, page)

        rc, out = run("upgrade", *archive(BROKEN_VERSION), "--operation", "to-broken")
        assert (rc, out["result"], out["from_version"], out["to_version"]) == (
            1, "rolled_back", VERSION_B, BROKEN_VERSION), out
        rc, status = run("status")
        assert rc == 0 and status["episode"] is None
        assert status["current"]["version"] == VERSION_B and status["current"]["slot"] == "green"
        assert status["current"]["sha256"] == green_sha
        assert os.readlink(lib / f"{name}-current") == f"{name}-green"
        assert status["service"]["active_state"] == "active"
        assert status["service"]["exe"] == str(lib / f"{name}-green")
        assert status["service"]["main_pid"] != green_pid  # the rollback restarted the real 0.21.5
        assert _get(f"http://127.0.0.1:{port}/") == (200, page)

        rc, hist = run("history")
        assert [(e["operation"], e["result"]) for e in hist["episodes"][:2]] == [
            ("to-broken", "rolled_back"), ("to-b", "committed")]
    finally:
        unit_state = sandbox.run("systemctl", "status", "--no-pager", f"{name}.service", check=False)
        print(unit_state.stdout, unit_state.stderr)  # shown by pytest only when the test failed
        subprocess.run([*cli, "uninstall"], cwd=WORKTREE, capture_output=True, timeout=60, check=False)
    assert not lib.exists()
    assert not any(p.name.startswith(name) for p in sandbox.unit_dir.iterdir())

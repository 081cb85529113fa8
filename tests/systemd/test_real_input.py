"""Real input end to end (design §8): a third-party daemon from its published release
archives.

The daemon is esbuild (its ``--serve`` mode is a real HTTP server) from the npm registry's
``@esbuild/linux-<x64|arm64>`` packages, in the publisher's own layout: a gzip tarball whose member
``package/bin/esbuild`` sits beside ``package/package.json`` and ``package/README.md``, so the agent runs with
``member_policy = "select"``. The CLI installs 0.20.2, upgrades to 0.21.5 (committed), then to a broken
candidate built from 0.21.5's archive (same layout; the binary replaced by a script that answers
``--version`` with a plausible version and exits 1 when asked to serve), which must roll back to 0.21.5,
still serving.

Archives are fetched and cached by :mod:`agent.testing.published` (shared with the ``fetch.delta``
benchmark): under ``$UPGRADE_CORE_REAL_INPUT_CACHE`` (default ``~/.cache/upgrade-core/real-input``) with
their sha256 recorded beside them; a fresh download is checked against the registry's own ``dist.integrity``
(sha512, Subresource Integrity format) before it is cached.
Only an unreachable registry (and no cache) skips, with the reason; ``REQUIRE_REAL_INPUT=1`` (set by
``.ci/run``) turns that skip into a failure.

Note on ``--watch=forever``: esbuild's serve mode exits 0 as soon as its stdin reaches end of file, and a
systemd service's stdin is ``/dev/null``; ``--watch=forever`` is esbuild's documented switch to keep running
without stdin, so it is part of ``exec_args``.
"""

from __future__ import annotations

import gzip
import http.server
import io
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.testing.published import (
    ESBUILD_MEMBER,
    RegistryUnreachable,
    cached_sha256,
    esbuild_package,
    npm_tarball,
    real_input_cache,
    tar_member,
)
from agent.testing.releases import sha256_file
from agent.testing.sandbox import PrivateSystemd, free_port

from .conftest import wait_for

pytestmark = [pytest.mark.systemd]

VERSION_A = "0.20.2"
VERSION_B = "0.21.5"
BROKEN_VERSION = "0.21.6"
MEMBER = ESBUILD_MEMBER
WORKTREE = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def published() -> dict[str, tuple[Path, str]]:
    """Both published esbuild archives for this machine: version -> (cached path, sha256)."""
    package = esbuild_package()
    if package is None:
        pytest.skip(f"esbuild publishes no npm package for machine {platform.machine()!r} in this test")
    try:
        return {v: npm_tarball(package, v) for v in (VERSION_A, VERSION_B)}
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
    urls[BROKEN_VERSION] = (f"{base_url}/{broken.name}", sha256_file(broken))
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
    cli = [sys.executable, "-m", "agent.cli.main", "--config", str(config), "--json"]

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
            0,
            "committed",
            VERSION_A,
            VERSION_B,
            "green",
        ), out
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
            1,
            "rolled_back",
            VERSION_B,
            BROKEN_VERSION,
        ), out
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
            ("to-broken", "rolled_back"),
            ("to-b", "committed"),
        ]
    finally:
        unit_state = sandbox.run("systemctl", "status", "--no-pager", f"{name}.service", check=False)
        print(unit_state.stdout, unit_state.stderr)  # shown by pytest only when the test failed
        subprocess.run([*cli, "uninstall"], cwd=WORKTREE, capture_output=True, timeout=60, check=False)
    assert not lib.exists()
    assert not any(p.name.startswith(name) for p in sandbox.unit_dir.iterdir())


# -- Debian releases: a data.tar.xz served as the archive, and a bare executable ------------
# Fetched with ``apt-get download`` from the machine's configured Debian archive. How the digest is
# checked: apt verifies a downloaded .deb against the SHA256 of the Packages index, which is itself
# authenticated by the archive's signed InRelease file; the test then checks the .deb once more against
# the ``SHA256:`` field that ``apt-cache show PKG=VERSION`` prints from that same index, and records the
# digest beside the cached copy (``~/.cache/upgrade-core/real-input``), re-checked on every later run.
#
# Versions: Debian 12's archive offers exactly one build of jq (``apt-cache madison jq``: 1.6-2.1+deb12u2
# only) and older builds are not downloadable through apt, so jq (``./usr/bin/jq`` from the package's own
# data.tar.xz, member_policy "select") is installed and version-checked (jq prints ``jq-1.6``, recorded as
# ``1.6``); a second release of the *same* published binary in another encoding (the data.tar
# re-compressed as a two-stream xz) is the agent's documented ``noop``; a broken candidate in the
# publisher's layout rolls back. jq is not a daemon: it runs under systemd as a real jq process reading its
# input from a FIFO nobody writes to (it waits in open(2)).
#
# The bare executable (member_policy "none") is esbuild's own binary from each of its two published npm
# releases, served as a plain file: two real versions, a real server. (A Debian binary was tried first:
# busybox/busybox-static are two builds of one version, but BusyBox chooses its applet from argv[0] and
# the version command runs the staging file, whose name starts with ".", so it answers "applet not found".)
DEB_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def _apt_show(package: str) -> tuple[str, str]:
    """(version, SHA256) of the candidate ``package`` in the configured archive's Packages index."""
    done = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", package], capture_output=True, text=True, check=False
    )
    fields = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line and line[0] != " ")
    if done.returncode != 0 or "SHA256" not in fields:
        raise RegistryUnreachable(f"apt-cache show {package}: {done.stderr.strip() or 'no such package'}")
    return fields["Version"], fields["SHA256"]


def _fetch_deb(package: str, cache: Path) -> tuple[Path, str]:
    """The package's .deb from the cache, else ``apt-get download``; (path, version)."""
    if shutil.which("apt-get") is None:
        raise RegistryUnreachable("apt-get is not available on this machine")
    version, want = _apt_show(package)
    deb = cache / f"{package}_{version.replace(':', '%3a')}.deb"
    cached = cached_sha256(deb)
    if cached is not None:
        assert cached == want, f"{deb}: not the Packages index's SHA256 {want}; delete it"
        return deb, version
    cache.mkdir(parents=True, exist_ok=True)
    work = cache / f".apt-{secrets.token_hex(4)}"
    work.mkdir()
    try:
        done = subprocess.run(
            ["apt-get", "download", f"{package}={version}"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        got = list(work.glob("*.deb"))
        if done.returncode != 0 or len(got) != 1:
            raise RegistryUnreachable(f"apt-get download {package}={version}: {done.stderr.strip()[-300:]}")
        assert sha256_file(got[0]) == want, f"{package}={version}: not the Packages index's SHA256"
        os.replace(got[0], deb)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    deb.with_name(deb.name + ".sha256").write_text(f"{want}  {deb.name}\n")
    return deb, version


def _ar_member(deb: Path, prefix: str) -> bytes:
    """A member of a .deb (an ar archive) whose name starts with ``prefix``, read with the stdlib."""
    data = deb.read_bytes()
    assert data[:8] == b"!<arch>\n", f"{deb}: not an ar archive"
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
        if name.startswith(prefix):
            return data[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size % 2)
    raise AssertionError(f"{deb}: no member {prefix}*")


def _tar_xz_member(data_tar_xz: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data_tar_xz), mode="r:xz") as tar:
        f = tar.extractfile(name)
        assert f is not None, name
        return f.read()


@pytest.fixture(scope="module")
def debs() -> dict[str, tuple[Path, str]]:
    """package -> (cached .deb, Debian version), for jq."""
    if DEB_ARCH.get(platform.machine().lower()) is None:
        pytest.skip(f"no Debian binary packages for machine {platform.machine()!r} in this test")
    try:
        return {p: _fetch_deb(p, real_input_cache()) for p in ("jq",)}
    except RegistryUnreachable as exc:
        reason = f"real input: Debian archive unreachable and nothing cached: {exc}"
        if os.environ.get("REQUIRE_REAL_INPUT") == "1":
            pytest.fail(f"{reason} (REQUIRE_REAL_INPUT=1 turns this skip into a failure)")
        pytest.skip(reason)


def _agent(sandbox: PrivateSystemd, tmp_path: Path, name: str, agent_toml: str, extra: str = "") -> list[str]:
    root = tmp_path / "root"
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f"""[agent]
name = "{name}"
{agent_toml}
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
{extra}"""
    )
    return [sys.executable, "-m", "agent.cli.main", "--config", str(config), "--json"]


def _runner(cli: list[str]):  # type: ignore[no-untyped-def]
    def run(*argv: str) -> tuple[int, dict[str, Any]]:
        done = subprocess.run([*cli, *argv], cwd=WORKTREE, capture_output=True, text=True, timeout=120)
        print(f"$ upgrade-agent {' '.join(argv)}  -> exit {done.returncode}\n{done.stdout}{done.stderr}")
        lines = done.stdout.strip().splitlines()
        assert lines, f"{argv[0]}: no JSON on stdout (exit {done.returncode}); stderr:\n{done.stderr}"
        assert "Traceback" not in done.stderr
        return done.returncode, json.loads(lines[-1])

    return run


def _cleanup(sandbox: PrivateSystemd, cli: list[str], name: str, lib: Path) -> None:
    unit_state = sandbox.run("systemctl", "status", "--no-pager", f"{name}.service", check=False)
    print(unit_state.stdout, unit_state.stderr)
    subprocess.run([*cli, "uninstall"], cwd=WORKTREE, capture_output=True, timeout=60, check=False)


def test_jq_data_tar_xz_from_its_debian_package(
    sandbox: PrivateSystemd,
    tmp_path: Path,
    debs: dict[str, tuple[Path, str]],
    archive_server: tuple[str, Path],
) -> None:
    """Expected: install of ./usr/bin/jq from jq's own data.tar.xz -> committed, version 1.6 (printed
    ``jq-1.6``), running under systemd; the same binary re-released as a two-stream tar.xz -> noop;
    a broken candidate in the same layout -> rolled_back, jq running again."""
    base_url, served = archive_server
    deb, deb_version = debs["jq"]
    data_tar_xz = _ar_member(deb, "data.tar.xz")
    assert data_tar_xz[:6] == b"\xfd7zXZ\x00"
    (served / "jq-data.tar.xz").write_bytes(data_tar_xz)
    jq = _tar_xz_member(data_tar_xz, "./usr/bin/jq")
    with tarfile.open(fileobj=io.BytesIO(data_tar_xz), mode="r:xz") as tar:
        plain = io.BytesIO()
        with tarfile.open(fileobj=plain, mode="w", format=tarfile.GNU_FORMAT) as out:
            broken_plain = io.BytesIO()
            with tarfile.open(fileobj=broken_plain, mode="w", format=tarfile.GNU_FORMAT) as bad:
                script = b'#!/bin/sh\nif [ "$1" = --version ]; then echo jq-1.7; exit 0; fi\nexit 1\n'
                for info in tar:
                    f = tar.extractfile(info) if info.isfile() else None
                    content = f.read() if f is not None else None
                    out.addfile(info, io.BytesIO(content) if content is not None else None)
                    if info.name == "./usr/bin/jq":
                        info.size = len(script)
                        content = script
                    bad.addfile(info, io.BytesIO(content) if content is not None else None)
    raw = plain.getvalue()
    half = len(raw) // 2
    import lzma

    (served / "jq-repacked.tar.xz").write_bytes(
        lzma.compress(raw[:half]) + bytes(4) + lzma.compress(raw[half:])
    )
    (served / "jq-broken.tar.xz").write_bytes(lzma.compress(broken_plain.getvalue()))

    name = f"jq-{secrets.token_hex(4)}"
    fifo = tmp_path / "input.fifo"
    os.mkfifo(fifo)
    cli = _agent(
        sandbox,
        tmp_path,
        name,
        f"""exec_args = [".", "{fifo}"]
version_args = ["--version"]
member = "./usr/bin/jq"
member_policy = "select"
""",
    )
    run = _runner(cli)
    lib = tmp_path / "root" / "lib" / name

    def url(file: str) -> list[str]:
        return ["--archive", f"{base_url}/{file}", "--sha256", sha256_file(served / file)]

    try:
        rc, out = run("install", *url("jq-data.tar.xz"), "--expect-version", "1.6")
        assert (rc, out["result"], out["to_version"], out["slot"]) == (0, "committed", "1.6", "blue"), out
        assert (lib / f"{name}-blue").read_bytes() == jq
        rc, status = run("status")
        assert status["service"]["active_state"] == "active", (deb_version, status)
        assert status["service"]["exe"] == str(lib / f"{name}-blue")

        rc, out = run(
            "upgrade", *url("jq-repacked.tar.xz"), "--expect-version", "v1.6", "--operation", "again"
        )
        assert (rc, out["result"]) == (0, "noop"), out  # the same published binary: nothing to switch

        rc, out = run("upgrade", *url("jq-broken.tar.xz"), "--operation", "to-broken")
        assert (rc, out["result"], out["from_version"], out["to_version"]) == (
            1,
            "rolled_back",
            "1.6",
            "1.7",
        ), out
        rc, status = run("status")
        assert status["current"]["slot"] == "blue" and status["current"]["version"] == "1.6"
        assert status["service"]["active_state"] == "active"
        assert status["service"]["exe"] == str(lib / f"{name}-blue")
        assert (lib / f"{name}-blue").read_bytes() == jq
    finally:
        _cleanup(sandbox, cli, name, lib)
    assert not lib.exists()


def test_esbuild_bare_executable_two_published_versions(
    sandbox: PrivateSystemd,
    tmp_path: Path,
    published: dict[str, tuple[Path, str]],
    archive_server: tuple[str, Path],
) -> None:
    """A bare executable release (member_policy "none"): the esbuild binary of each published npm
    release (digest checked against dist.integrity), served as a plain file. Expected: 0.20.2 installed ->
    committed, serving; upgraded to 0.21.5 -> committed, the service's exe is the new slot; a broken bare
    candidate -> rolled_back, 0.21.5 serving again."""
    base_url, served = archive_server
    builds = {}
    for version, (path, _digest) in published.items():
        builds[version] = tar_member(path, MEMBER)
        (served / f"esbuild-{version}").write_bytes(builds[version])  # a plain file, no archive
    (served / "esbuild-broken").write_bytes(
        f'#!/bin/sh\nif [ "$1" = --version ]; then echo {BROKEN_VERSION}; exit 0; fi\nexit 1\n'.encode()
    )

    name = f"bare-{secrets.token_hex(4)}"
    port = free_port()
    www = tmp_path / "www"
    www.mkdir()
    page = f"<p>{name} served by a bare esbuild</p>\n"
    (www / "index.html").write_text(page)
    cli = _agent(
        sandbox,
        tmp_path,
        name,
        f"""exec_args = ["--serve=127.0.0.1:{port}", "--servedir={www}", "--watch=forever"]
version_args = ["--version"]
member_policy = "none"
""",
        extra=f'http_probe = "http://127.0.0.1:{port}/"\n\n[verify]\nversion_regex = "^(\\\\S+)$"\n',
    )
    run = _runner(cli)
    lib = tmp_path / "root" / "lib" / name
    home = f"http://127.0.0.1:{port}/"

    def url(file: str) -> list[str]:
        return ["--archive", f"{base_url}/{file}", "--sha256", sha256_file(served / file)]

    try:
        rc, out = run("install", *url(f"esbuild-{VERSION_A}"), "--expect-version", VERSION_A)
        assert (rc, out["result"], out["to_version"], out["slot"]) == (0, "committed", VERSION_A, "blue"), out
        wait_for(lambda: _get(home) == (200, page), what=f"bare esbuild {VERSION_A} serving {home}")

        rc, out = run("upgrade", *url(f"esbuild-{VERSION_B}"), "--operation", "to-b")
        assert (rc, out["result"], out["to_version"], out["slot"]) == (0, "committed", VERSION_B, "green"), (
            out
        )
        rc, status = run("status")
        assert status["service"]["exe"] == str(lib / f"{name}-green")
        assert (lib / f"{name}-green").read_bytes() == builds[VERSION_B]
        assert _get(home) == (200, page)

        rc, out = run("upgrade", *url("esbuild-broken"), "--operation", "to-broken")
        assert (rc, out["result"], out["to_version"]) == (1, "rolled_back", BROKEN_VERSION), out
        rc, status = run("status")
        assert status["current"]["slot"] == "green" and status["episode"] is None
        assert status["service"]["exe"] == str(lib / f"{name}-green")
        assert _get(home) == (200, page)
    finally:
        _cleanup(sandbox, cli, name, lib)
    assert not lib.exists()

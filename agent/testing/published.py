"""Published releases of real third-party binaries, fetched once from a package registry and cached (design
§8, real input; the ``fetch.delta`` benchmark).

The cache is ``$UPGRADE_CORE_REAL_INPUT_CACHE`` (default ``~/.cache/upgrade-core/real-input``). Each cached
file has its sha256 recorded beside it (``FILE.sha256``, the ``sha256sum`` line format), written only after a
fresh download matched the registry's own integrity field, and checked again on every later use. Only an
unreachable registry with nothing cached is a reason to go without (:class:`RegistryUnreachable`, carrying
the reason); a digest that does not match is never one (:class:`PublishedMismatch`).

npm (``https://registry.npmjs.org``): a version's document (``GET /<package>/<version>``) names the tarball
at ``dist.tarball`` and its digest at ``dist.integrity``, a Subresource Integrity string
(``sha512-<base64>``, the W3C SRI format npm has written since npm 5).
"""

from __future__ import annotations

import base64
import hashlib
import os
import platform
import secrets
import tarfile
from pathlib import Path

from agent.testing.releases import sha256_file

NPM_REGISTRY = "https://registry.npmjs.org"
ESBUILD_MEMBER = "package/bin/esbuild"
"""Where esbuild's ``@esbuild/linux-<arch>`` tarballs hold the binary (beside ``package/package.json``)."""

_NPM_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


class RegistryUnreachable(Exception):
    """The package registry could not be reached (DNS, connect, TLS, timeout, an HTTP error) and nothing is
    cached; the message is the reason, naming the registry and the package."""


class PublishedMismatch(Exception):
    """A cached file no longer matches its recorded sha256, or a download does not match the registry's
    integrity field; the message names the file or the package."""


def real_input_cache() -> Path:
    """``$UPGRADE_CORE_REAL_INPUT_CACHE``, else ``~/.cache/upgrade-core/real-input`` (maybe not created)."""
    default = Path.home() / ".cache" / "upgrade-core" / "real-input"
    return Path(os.environ.get("UPGRADE_CORE_REAL_INPUT_CACHE", str(default)))


def esbuild_package(machine: str | None = None) -> str | None:
    """esbuild's npm package for ``machine`` (``platform.machine()`` by default), e.g.
    ``@esbuild/linux-x64``; None for a machine esbuild's npm packages are not used for here."""
    arch = _NPM_ARCH.get((machine or platform.machine()).lower())
    return None if arch is None else f"@esbuild/linux-{arch}"


def cached_sha256(path: Path) -> str | None:
    """The sha256 of a cached ``path`` once it is checked against ``path.sha256``; None when either is
    missing (not cached yet).

    Raises:
        PublishedMismatch: the file's sha256 differs from the recorded one (delete both to fetch again).
    """
    recorded = path.with_name(path.name + ".sha256")
    if not (path.exists() and recorded.exists()):
        return None
    want = recorded.read_text().split()[0]
    got = sha256_file(path)
    if got != want:
        raise PublishedMismatch(
            f"{path}: sha256 {got} differs from the recorded {want}; delete it to refetch"
        )
    return got


def record(path: Path, body: bytes) -> str:
    """Write ``body`` at ``path`` (a temporary name, then a rename) and its sha256 at ``path.sha256``; the
    sha256. Only for bytes already checked against their registry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    tmp.write_bytes(body)
    os.replace(tmp, path)
    digest = hashlib.sha256(body).hexdigest()
    path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    return digest


def npm_tarball(
    package: str, version: str, cache: Path | None = None, *, registry: str = NPM_REGISTRY
) -> tuple[Path, str]:
    """The published tarball of ``package@version``: from the cache, else from the registry, checked
    against its ``dist.integrity`` (sha512) before it is cached as ``<package's last part>-<version>.tgz``.

    Args:
        cache: the cache directory; :func:`real_input_cache` by default.
        registry: the registry's base URL.

    Returns:
        (path of the cached ``.tgz``, its sha256 hex).

    Raises:
        RegistryUnreachable: not cached, and the registry cannot be reached or answers with an error.
        PublishedMismatch: a cached tarball no longer matches its recorded sha256; a download does not match
            ``dist.integrity``, or that field is not a sha512 SRI string.
    """
    import httpx

    cache = real_input_cache() if cache is None else cache
    archive = cache / f"{package.rsplit('/', 1)[-1]}-{version}.tgz"
    digest = cached_sha256(archive)
    if digest is not None:
        return archive, digest
    try:
        with httpx.Client(timeout=httpx.Timeout(60.0, connect=15.0), follow_redirects=True) as client:
            meta = client.get(f"{registry}/{package}/{version}")
            meta.raise_for_status()
            dist = meta.json()["dist"]
            tarball = client.get(dist["tarball"])
            tarball.raise_for_status()
    except (httpx.TransportError, httpx.HTTPStatusError) as exc:
        raise RegistryUnreachable(f"{registry} ({package}@{version}): {type(exc).__name__}: {exc}") from exc
    body = tarball.content
    algorithm, _, expected = str(dist.get("integrity", "")).partition("-")
    if algorithm != "sha512":
        raise PublishedMismatch(f"{package}@{version}: dist.integrity is not sha512 ({algorithm or 'none'})")
    if base64.b64encode(hashlib.sha512(body).digest()).decode() != expected:
        raise PublishedMismatch(f"{package}@{version}: tarball does not match the registry's dist.integrity")
    return archive, record(archive, body)


def tar_member(archive: Path, member: str) -> bytes:
    """The bytes of regular file ``member`` of the gzip tarball ``archive``.

    Raises:
        KeyError: no such member. ValueError: it is not a regular file.
    """
    with tarfile.open(archive, "r:gz") as tar:
        f = tar.extractfile(member)
        if f is None:
            raise ValueError(f"{archive}: {member} is not a regular file")
        return f.read()

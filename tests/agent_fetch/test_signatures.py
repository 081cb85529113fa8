"""Signed releases (docs/trust.md): releases signed with Debian's real ``minisign``, verified with the
project's code.

Each attack leaves no staging file behind (the source refuses before ``stage`` returns, so the orchestrator
aborts before the switch); keys are made with ``minisign -G -W`` (no password).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.release.minisign import parse_public_key, parse_signature
from agent.release.source import ArchiveSourceImpl
from agent.release.trust import ReleaseTrust
from upgrade_core.errors import FetchRedirectError, KeyringError, SignatureError

from ._archives import Entry, compress, tar_bytes
from ._servers import LoopbackServer, body, redirect
from .conftest import MEMBER

# No skip when minisign is missing: scripts/bootstrap.sh installs it, and a silent skip would hide that.
pytestmark = pytest.mark.anyio
NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
CLAIMS = "name=demo-agent version=1.2.0 security_version=3"


def keypair(d: Path, name: str) -> tuple[Path, str]:
    pub, sec = d / f"{name}.pub", d / f"{name}.key"
    subprocess.run(["minisign", "-G", "-W", "-p", str(pub), "-s", str(sec)], check=True, capture_output=True)
    return sec, pub.read_text().splitlines()[1]


def sign(sec: Path, path: Path, comment: str = CLAIMS, legacy: bool = False) -> Path:
    argv = ["minisign", "-S", "-s", str(sec), "-m", str(path), "-t", comment] + (["-l"] if legacy else [])
    subprocess.run(argv, check=True, capture_output=True)
    return Path(str(path) + ".minisig")


def release(d: Path, data: bytes = b"\x7fELF binary 1.2.0\n") -> Path:
    path = d / "demo-agent.tar.gz"
    path.write_bytes(compress(tar_bytes([Entry(MEMBER, data=data)]), "gzip"))
    return path


def trust(d: Path, roots: list[str], keyring: str = "", **kw: object) -> ReleaseTrust:
    state = d / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    kw.setdefault("now", lambda: NOW)
    return ReleaseTrust(
        roots=tuple(parse_public_key(k) for k in roots), keyring_source=keyring, require=True,
        state_dir=str(state), **kw,  # type: ignore[arg-type]
    )


async def stage(d: Path, source: str, t: ReleaseTrust):  # type: ignore[no-untyped-def]
    staging = d / "stage"
    return await ArchiveSourceImpl(member=MEMBER, trust=t).stage(source, None, str(staging), "green")


def no_staging(d: Path) -> bool:
    return not (d / "stage").exists()


RING_EXPIRES = "2026-07-01T00:00:00Z"
"""The keyrings' own expiry: a month after ``NOW``."""


def keyring_doc(
    serial: int, keys: list[tuple[str, str]], revoked: list[str] = (),  # type: ignore[assignment]
    expires: str | None = RING_EXPIRES,
) -> bytes:
    doc: dict[str, object] = {"serial": serial}
    if expires is not None:
        doc["expires"] = expires
    doc.update({"keys": [{"public_key": k, "expires": e} for k, e in keys], "revoked": list(revoked)})
    return json.dumps(doc).encode()


def key_id(pub: str) -> str:
    return parse_public_key(pub).key_id_hex


@pytest.mark.parametrize("legacy", [False, True], ids=["ED-prehashed", "Ed-legacy"])
async def test_real_minisign_release_is_trusted(tmp_path: Path, legacy: bool) -> None:
    sec, pub = keypair(tmp_path, "root")
    path = release(tmp_path)
    sig = sign(sec, path, legacy=legacy)
    assert parse_signature(sig.read_bytes()).algorithm == ("Ed" if legacy else "ED")
    staged = await stage(tmp_path, str(path), trust(tmp_path, [pub], allow_legacy=legacy))
    assert staged.release is not None
    assert (staged.release.name, staged.release.version, staged.release.security_version) == (
        "demo-agent", "1.2.0", 3)
    assert staged.release.key_id == key_id(pub)


async def test_tampered_archive_with_the_original_signature(tmp_path: Path) -> None:
    sec, pub = keypair(tmp_path, "root")
    path = release(tmp_path)
    sign(sec, path)
    path.write_bytes(compress(tar_bytes([Entry(MEMBER, data=b"\x7fELF evil\n")]), "gzip"))
    with pytest.raises(SignatureError, match="does not match the file as published"):
        await stage(tmp_path, str(path), trust(tmp_path, [pub]))
    assert no_staging(tmp_path)


async def test_valid_signature_by_an_unknown_key(tmp_path: Path) -> None:
    _, pub = keypair(tmp_path, "root")
    other, _ = keypair(tmp_path, "other")
    path = release(tmp_path)
    sign(other, path)
    with pytest.raises(SignatureError, match="unknown key"):
        await stage(tmp_path, str(path), trust(tmp_path, [pub]))
    assert no_staging(tmp_path)


async def test_signature_missing_when_required(tmp_path: Path) -> None:
    _, pub = keypair(tmp_path, "root")
    path = release(tmp_path)
    with pytest.raises(SignatureError, match=r"no signature.*requires signed releases"):
        await stage(tmp_path, str(path), trust(tmp_path, [pub]))
    assert no_staging(tmp_path)


async def test_changed_trusted_comment_is_refused(tmp_path: Path) -> None:
    sec, pub = keypair(tmp_path, "root")
    path = release(tmp_path)
    sig = sign(sec, path)
    lines = sig.read_text().splitlines()
    lines[2] = "trusted comment: name=demo-agent version=1.2.0 security_version=9"
    sig.write_text("\n".join(lines) + "\n")
    with pytest.raises(SignatureError, match="trusted comment does not match"):
        await stage(tmp_path, str(path), trust(tmp_path, [pub]))


async def test_signature_url_redirecting_off_the_allowed_schemes(
    tmp_path: Path, server: LoopbackServer
) -> None:
    sec, pub = keypair(tmp_path, "root")
    path = release(tmp_path)
    sign(sec, path)
    server.routes["/a.tar.gz"] = body(path.read_bytes())
    server.routes["/a.tar.gz.minisig"] = redirect(f"file://{path}.minisig")
    with pytest.raises(FetchRedirectError):
        await stage(tmp_path, server.url("/a.tar.gz"), trust(tmp_path, [pub]))
    assert no_staging(tmp_path)


async def test_signature_over_http_and_explicit_source(tmp_path: Path, server: LoopbackServer) -> None:
    sec, pub = keypair(tmp_path, "root")
    path = release(tmp_path)
    sig = sign(sec, path)
    server.routes["/a.tar.gz"] = body(path.read_bytes())
    server.routes["/sigs/a.minisig"] = body(sig.read_bytes())
    staged = await stage(tmp_path, server.url("/a.tar.gz"),
                         trust(tmp_path, [pub], signature=server.url("/sigs/a.minisig")))
    assert staged.release is not None


# -- the keyring ------------------------------------------------------------------------------------------
def publish_keyring(d: Path, root_sec: Path, doc: bytes) -> Path:
    ring = d / "keyring.json"
    ring.write_bytes(doc)
    sign(root_sec, ring, comment="keyring")
    return ring


async def test_keyring_key_signs_releases_and_the_keyring_is_cached(tmp_path: Path) -> None:
    root_sec, root_pub = keypair(tmp_path, "root")
    sec, pub = keypair(tmp_path, "signing")
    ring = publish_keyring(tmp_path, root_sec, keyring_doc(1, [(pub, "2027-01-01T00:00:00Z")]))
    path = release(tmp_path)
    sign(sec, path)
    staged = await stage(tmp_path, str(path), trust(tmp_path, [root_pub], str(ring)))
    assert staged.release is not None and staged.release.key_id == key_id(pub)
    cache = tmp_path / "state" / "trust" / "keyring.json"
    assert cache.exists() and (cache.stat().st_mode & 0o777) == 0o600


async def test_signature_by_a_revoked_key(tmp_path: Path) -> None:
    root_sec, root_pub = keypair(tmp_path, "root")
    sec, pub = keypair(tmp_path, "signing")
    ring = publish_keyring(tmp_path, root_sec, keyring_doc(2, [(pub, "2027-01-01T00:00:00Z")], [key_id(pub)]))
    path = release(tmp_path)
    sign(sec, path)
    with pytest.raises(SignatureError, match="revoked by keyring serial 2"):
        await stage(tmp_path, str(path), trust(tmp_path, [root_pub], str(ring)))
    assert no_staging(tmp_path)


async def test_keyring_signed_by_a_non_root_key(tmp_path: Path) -> None:
    _, root_pub = keypair(tmp_path, "root")
    sec, pub = keypair(tmp_path, "signing")
    ring = publish_keyring(tmp_path, sec, keyring_doc(1, [(pub, "2027-01-01T00:00:00Z")]))
    path = release(tmp_path)
    sign(sec, path)
    with pytest.raises(KeyringError, match="not a root key"):
        await stage(tmp_path, str(path), trust(tmp_path, [root_pub], str(ring)))
    assert no_staging(tmp_path)


async def test_expired_signing_key(tmp_path: Path) -> None:
    root_sec, root_pub = keypair(tmp_path, "root")
    sec, pub = keypair(tmp_path, "signing")
    ring = publish_keyring(tmp_path, root_sec, keyring_doc(1, [(pub, "2026-01-01T00:00:00Z")]))
    path = release(tmp_path)
    sign(sec, path)
    with pytest.raises(SignatureError, match="expired at 2026-01-01"):
        await stage(tmp_path, str(path), trust(tmp_path, [root_pub], str(ring)))
    assert no_staging(tmp_path)


async def test_older_keyring_served_after_a_newer_one(tmp_path: Path) -> None:
    """Rotation: serial 2 revokes the old signing key; a mirror then serves serial 1 again."""
    root_sec, root_pub = keypair(tmp_path, "root")
    old_sec, old_pub = keypair(tmp_path, "old")
    _, new_pub = keypair(tmp_path, "new")
    old_ring = (tmp_path / "v1")
    old_ring.mkdir()
    v1 = publish_keyring(old_ring, root_sec, keyring_doc(1, [(old_pub, "2027-01-01T00:00:00Z")]))
    ring = publish_keyring(tmp_path, root_sec, keyring_doc(
        2, [(new_pub, "2027-01-01T00:00:00Z")], [key_id(old_pub)]))
    path = release(tmp_path)
    sign(old_sec, path)
    t = trust(tmp_path, [root_pub], str(ring))
    with pytest.raises(SignatureError, match="revoked"):
        await stage(tmp_path, str(path), t)
    shutil.copy(v1, ring)
    shutil.copy(str(v1) + ".minisig", str(ring) + ".minisig")
    with pytest.raises(KeyringError, match="serial 1 is older than the cached serial 2"):
        await stage(tmp_path, str(path), t)
    assert no_staging(tmp_path)


async def test_a_legacy_signature_is_refused_unless_allowed(tmp_path: Path) -> None:
    """minisign does not sign its algorithm bytes: ``Ed`` (``minisign -S -l``) is refused by default, before
    the keyring or the archive is read; ``allow_legacy_signatures`` accepts it (the other test above)."""
    sec, pub = keypair(tmp_path, "root")
    path = release(tmp_path)
    sign(sec, path, legacy=True)
    with pytest.raises(SignatureError) as refused:
        await stage(tmp_path, str(path), trust(tmp_path, [pub]))
    assert str(refused.value) == (
        f"{path}.minisig: the legacy Ed algorithm (not pre-hashed) is not accepted for release {path} "
        "([trust] allow_legacy_signatures = false)"
    )
    assert no_staging(tmp_path)


async def test_a_legacy_signed_keyring_is_refused_unless_allowed(tmp_path: Path) -> None:
    root_sec, root_pub = keypair(tmp_path, "root")
    sec, pub = keypair(tmp_path, "signing")
    ring = tmp_path / "keyring.json"
    ring.write_bytes(keyring_doc(1, [(pub, "2027-01-01T00:00:00Z")]))
    sign(root_sec, ring, comment="keyring", legacy=True)
    path = release(tmp_path)
    sign(sec, path)
    legacy = r"legacy Ed algorithm \(not pre-hashed\) is not accepted for the keyring"
    with pytest.raises(KeyringError, match=legacy):
        await stage(tmp_path, str(path), trust(tmp_path, [root_pub], str(ring)))
    assert no_staging(tmp_path)
    assert not (tmp_path / "state" / "trust" / "keyring.json").exists()
    allowed = trust(tmp_path, [root_pub], str(ring), allow_legacy=True)
    staged = await stage(fresh(tmp_path), str(path), allowed)
    assert staged.release is not None and staged.release.key_id == key_id(pub)


def fresh(d: Path) -> Path:
    """Another directory for one more staging attempt (``stage`` writes ``<dir>/stage``)."""
    n = len(list(d.glob("again-*")))
    again = d / f"again-{n}"
    again.mkdir()
    return again


def cached_keyring(d: Path) -> bytes:
    import base64

    doc = json.loads((d / "state" / "trust" / "keyring.json").read_bytes())
    return base64.b64decode(doc["keyring"])


async def test_an_expired_keyring_is_refused_served_or_frozen(tmp_path: Path) -> None:
    """Freeze: a mirror keeps serving the genuine keyring it once had. Past the keyring's own ``expires`` it
    is refused, though it is the cached one too and its signing key is not expired itself."""
    root_sec, root_pub = keypair(tmp_path, "root")
    sec, pub = keypair(tmp_path, "signing")
    ring = publish_keyring(tmp_path, root_sec, keyring_doc(1, [(pub, "2030-01-01T00:00:00Z")]))
    path = release(tmp_path)
    sign(sec, path)
    clock = [NOW]
    t = trust(tmp_path, [root_pub], str(ring), now=lambda: clock[0])
    assert (await stage(tmp_path, str(path), t)).release is not None
    cached = cached_keyring(tmp_path)
    clock[0] = dt.datetime(2026, 7, 1, tzinfo=dt.UTC)
    again = fresh(tmp_path)
    with pytest.raises(KeyringError) as refused:
        await stage(again, str(path), t)
    assert str(refused.value) == f"{ring}: keyring serial 1 expired at 2026-07-01T00:00:00Z"
    assert no_staging(again)
    assert cached_keyring(tmp_path) == cached


async def test_a_keyring_without_expires_is_refused(tmp_path: Path) -> None:
    root_sec, root_pub = keypair(tmp_path, "root")
    sec, pub = keypair(tmp_path, "signing")
    ring = publish_keyring(tmp_path, root_sec, keyring_doc(1, [(pub, "2030-01-01T00:00:00Z")], expires=None))
    path = release(tmp_path)
    sign(sec, path)
    with pytest.raises(KeyringError) as refused:
        await stage(tmp_path, str(path), trust(tmp_path, [root_pub], str(ring)))
    assert str(refused.value) == (
        f"{ring}: keyring serial 1 has no expires (a keyring must carry its own signed expiry; "
        "publish a new serial with expires)"
    )
    assert no_staging(tmp_path)
    assert not (tmp_path / "state" / "trust").exists()


async def test_root_rotation_replaces_a_cache_signed_by_a_root_no_longer_configured(tmp_path: Path) -> None:
    """Root rotation as docs/trust.md describes it: both roots configured during the change (the cache
    still counts: a lower serial by the new root is refused), then only the new one; the cached keyring
    signed by the old root then vouches for nothing and the new root's keyring replaces it, whatever its
    serial."""
    old_sec, old_pub = keypair(tmp_path, "root-old")
    new_sec, new_pub = keypair(tmp_path, "root-new")
    sec, pub = keypair(tmp_path, "signing")
    path = release(tmp_path)
    sign(sec, path)
    ring = publish_keyring(tmp_path, old_sec, keyring_doc(3, [(pub, "2030-01-01T00:00:00Z")]))
    assert (await stage(fresh(tmp_path), str(path), trust(tmp_path, [old_pub], str(ring)))).release
    # the change: both roots; the new root's serial 2 would take the host back
    publish_keyring(tmp_path, new_sec, keyring_doc(2, [(pub, "2030-01-01T00:00:00Z")]))
    with pytest.raises(KeyringError, match="serial 2 is older than the cached serial 3"):
        await stage(fresh(tmp_path), str(path), trust(tmp_path, [old_pub, new_pub], str(ring)))
    # the old root is gone from the configuration: the new root's keyring replaces the cache
    staged = await stage(fresh(tmp_path), str(path), trust(tmp_path, [new_pub], str(ring)))
    assert staged.release is not None and staged.release.key_id == key_id(pub)
    assert cached_keyring(tmp_path) == ring.read_bytes()


# -- the parser -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("mangle", "message"), [
    (lambda ls: ls[:3], "4 lines"),
    (lambda ls: ["comment", *ls[1:]], "untrusted comment"),
    (lambda ls: [ls[0], ls[1][:-4], *ls[2:]], "bytes, expected 74|not valid base64"),
    (lambda ls: [ls[0], "!!" + ls[1][2:], *ls[2:]], "not a base64 line"),
    (lambda ls: [ls[0], ls[1], "trusted: x", ls[3]], "trusted comment"),
    (lambda ls: [*ls[:3], ls[3][:-8]], "global signature"),
])
def test_malformed_signature_files(tmp_path: Path, mangle, message: str) -> None:  # type: ignore[no-untyped-def]
    sec, _ = keypair(tmp_path, "root")
    lines = sign(sec, release(tmp_path)).read_text().splitlines()
    with pytest.raises(SignatureError, match=message):
        parse_signature(("\n".join(mangle(lines)) + "\n").encode(), "x.minisig")


def test_unknown_algorithm_and_oversize(tmp_path: Path) -> None:
    import base64

    sec, _ = keypair(tmp_path, "root")
    lines = sign(sec, release(tmp_path)).read_text().splitlines()
    raw = bytearray(base64.b64decode(lines[1]))
    raw[:2] = b"XX"
    lines[1] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(SignatureError, match="XX is neither ED nor Ed"):
        parse_signature(("\n".join(lines) + "\n").encode())
    with pytest.raises(SignatureError, match="longer than"):
        parse_signature(b"x" * 5000)
    with pytest.raises(SignatureError, match="not UTF-8"):
        parse_signature(b"\xff\n" * 4)


@pytest.mark.parametrize(("comment", "message"), [
    ("version=1.2.0 security_version=3", "no name="),
    ("name=demo-agent security_version=3", "no version="),
    ("name=demo-agent version=1.2.0", "no security_version="),
    ("name=demo-agent version=1.2.0 security_version=-1", "not a non-negative integer"),
    ("name=demo-agent version=banana security_version=1", "not a version"),
    ("name=demo-agent name=x version=1.2.0 security_version=1", "name twice"),
    ("name=Demo version=1.2.0 security_version=1", "not an agent name"),
])
def test_trusted_comment_claims(comment: str, message: str) -> None:
    from agent.release.minisign import parse_release_claims
    from agent.release.verify import normalise_version

    with pytest.raises(SignatureError, match=message):
        parse_release_claims(comment, "x.minisig", normalise_version)


def test_public_key_forms(tmp_path: Path) -> None:
    _, pub = keypair(tmp_path, "root")
    full = (tmp_path / "root.pub").read_text()
    assert parse_public_key(full) == parse_public_key(pub)
    # minisign prints the id without leading zeros; ours is the same number in 16 digits
    assert full.split()[-2].lstrip("0") in parse_public_key(pub).key_id_hex
    with pytest.raises(SignatureError, match="one base64 line"):
        parse_public_key("a\nb\nc")
    assert os.path.exists(tmp_path / "root.key")

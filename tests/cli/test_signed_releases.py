"""Signed releases through the whole CLI (docs/trust.md): each attack ends before the switch.

Releases are signed with Debian's real ``minisign`` (keys from ``minisign -G -W``); the host is installed by
hand (``Rig.install_by_hand``) with ``[trust] root_keys`` naming the publisher's key (and, for the keyring
attacks, ``[trust] keyring`` naming a root-signed keyring file). Expected outcome for
every attack: exit 1, result ``aborted`` with a reason naming the signature problem, one JSON object, no
traceback, and the host exactly as before (both links, both slots' bytes, ``R/bin``, the unit files), with
no staging file left. ``host.systemctl_prefix`` is ``/bin/false``: a run that wrongly reached a restart
would fail loudly and never touch this machine's services.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent.config.boot import machine_arch
from tests.agent_fetch._archives import Entry, compress, tar_bytes

from ._rig import Rig, version_script

ARCH = machine_arch() or "amd64"


@pytest.fixture
def rig(installed_rig: Rig) -> Rig:
    return installed_rig


def keypair(d: Path, name: str) -> tuple[Path, str]:
    """``minisign -G -W``: (secret key file, the public key line ``RW...``)."""
    pub, sec = d / f"{name}.pub", d / f"{name}.key"
    subprocess.run(["minisign", "-G", "-W", "-p", str(pub), "-s", str(sec)], check=True, capture_output=True,
                   timeout=30)
    return sec, pub.read_text().splitlines()[1]


def sign(sec: Path, path: Path, comment: str) -> Path:
    """``minisign -S`` with ``comment`` as the trusted comment; returns ``<path>.minisig``."""
    subprocess.run(["minisign", "-S", "-s", str(sec), "-m", str(path), "-t", comment], check=True,
                   capture_output=True, timeout=30)
    return Path(f"{path}.minisig")


def release(rig: Rig, d: Path, version: str = "2.0.0") -> Path:
    path = d / f"{rig.name}-{version}.tar.gz"
    member = Entry(f"{rig.name}-linux-{ARCH}", data=version_script(version))
    path.write_bytes(compress(tar_bytes([member]), "gzip"))
    return path


def trust_root(rig: Rig, public_key: str) -> None:
    rig.write_config(extra=f'[trust]\nroot_keys = ["{public_key}"]\n')


def assert_refused_before_switch(
    rig: Rig, archive: Path, words: str, *extra: str, operation: str = "signed", exact: bool = False
) -> None:
    """``upgrade``: exit 1, ``aborted``, ``words`` in the reason (the whole reason when ``exact``), the host
    as before and no staging file left."""
    before = rig.host_facts()
    run = rig.cli("upgrade", "--archive", str(archive), "--operation", operation, *extra)
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    assert out["result"] == "aborted", out
    assert words in (out["reason"] or ""), out
    assert not exact or out["reason"] == words, out
    assert rig.host_facts() == before
    assert rig.staging_leftovers() == []


def test_a_tampered_archive_with_the_original_signature_is_refused(rig: Rig, tmp_path: Path) -> None:
    sec, pub = keypair(tmp_path, "publisher")
    trust_root(rig, pub)
    archive = release(rig, tmp_path)
    sign(sec, archive, f"name={rig.name} version=2.0.0 security_version=1")
    # Swap in another valid archive (same name, same version, one more byte in the binary) and keep the
    # original signature: only the signature check can tell.
    member = Entry(f"{rig.name}-linux-{ARCH}", data=version_script("2.0.0") + b"\n")
    archive.write_bytes(compress(tar_bytes([member]), "gzip"))
    assert_refused_before_switch(rig, archive, "signature")


def test_a_valid_signature_by_an_unknown_key_is_refused(rig: Rig, tmp_path: Path) -> None:
    _sec, pub = keypair(tmp_path, "publisher")
    stranger, _ = keypair(tmp_path, "stranger")
    trust_root(rig, pub)
    archive = release(rig, tmp_path)
    sign(stranger, archive, f"name={rig.name} version=2.0.0 security_version=1")
    assert_refused_before_switch(rig, archive, "key")


def test_the_signature_missing_when_required_is_refused(rig: Rig, tmp_path: Path) -> None:
    _sec, pub = keypair(tmp_path, "publisher")
    trust_root(rig, pub)
    assert_refused_before_switch(rig, release(rig, tmp_path), "signature")


@pytest.mark.parametrize(
    "claims",
    ["name=another-agent version=2.0.0 security_version=1", "name={name} version=2.1.0 security_version=1"],
    ids=["another agent", "another version"],
)
def test_a_trusted_comment_naming_another_agent_or_version_is_refused(
    rig: Rig, tmp_path: Path, claims: str
) -> None:
    sec, pub = keypair(tmp_path, "publisher")
    trust_root(rig, pub)
    archive = release(rig, tmp_path)  # its version command prints 2.0.0
    sign(sec, archive, claims.format(name=rig.name))
    word = "another-agent" if "another-agent" in claims else "2.1.0"
    assert_refused_before_switch(rig, archive, word)


def test_a_signature_given_explicitly_is_used(rig: Rig, tmp_path: Path) -> None:
    """``--signature SRC`` names the signature file; one by an unknown key there is refused all the same."""
    _sec, pub = keypair(tmp_path, "publisher")
    stranger, _ = keypair(tmp_path, "stranger")
    trust_root(rig, pub)
    archive = release(rig, tmp_path)
    elsewhere = tmp_path / "sigs"
    elsewhere.mkdir()
    copy = elsewhere / archive.name
    copy.write_bytes(archive.read_bytes())
    signature = sign(stranger, copy, f"name={rig.name} version=2.0.0 security_version=1")
    assert_refused_before_switch(rig, archive, "key", "--signature", str(signature))


# -- the keyring (a local file here; the fetch rules are the archive's) -----------------------------------
def publish_keyring(
    d: Path, root_sec: Path, serial: int, keys: list[tuple[str, str]], revoked: list[str],
    expires: str = "2099-01-01T00:00:00Z",
) -> Path:
    """A keyring document expiring at ``expires``, signed with ``root_sec`` (``minisign -S -t keyring``)."""
    import json

    ring = d / "keyring.json"
    doc = {"serial": serial, "expires": expires, "keys": [{"public_key": k, "expires": e} for k, e in keys],
           "revoked": revoked}
    ring.write_text(json.dumps(doc))
    sign(root_sec, ring, "keyring")
    return ring


def trust_keyring(rig: Rig, root_public_key: str, ring: Path) -> None:
    rig.write_config(extra=f'[trust]\nroot_keys = ["{root_public_key}"]\nkeyring = "{ring}"\n')


def key_id(public_key_file: Path) -> str:
    """The key id minisign prints on the first line of a ``.pub`` file."""
    return public_key_file.read_text().splitlines()[0].split()[-1]


@pytest.mark.parametrize("case", ["revoked key", "expired key", "keyring signed by a non-root key"])
def test_keyring_attacks_are_refused(rig: Rig, tmp_path: Path, case: str) -> None:
    root_sec, root_pub = keypair(tmp_path, "root")
    sec, pub = keypair(tmp_path, "sign1")
    expires = "2020-01-01T00:00:00Z" if case == "expired key" else "2099-01-01T00:00:00Z"
    revoked = [key_id(tmp_path / "sign1.pub")] if case == "revoked key" else []
    ring_signer = sec if case == "keyring signed by a non-root key" else root_sec
    ring = publish_keyring(tmp_path, ring_signer, 1, [(pub, expires)], revoked)
    trust_keyring(rig, root_pub, ring)
    archive = release(rig, tmp_path)
    sign(sec, archive, f"name={rig.name} version=2.0.0 security_version=1")
    word = {"revoked key": "revoked", "expired key": "expired"}.get(case, "root")
    assert_refused_before_switch(rig, archive, word)


def test_a_signature_url_redirecting_off_the_allowed_schemes_is_refused(rig: Rig, tmp_path: Path) -> None:
    """The signature is fetched under the archive's redirect rules: http -> file:// is refused (C08)."""
    from tests.agent_fetch import _servers as servers

    sec, pub = keypair(tmp_path, "publisher")
    trust_root(rig, pub)
    archive = release(rig, tmp_path)
    signature = sign(sec, archive, f"name={rig.name} version=2.0.0 security_version=1")
    with servers.serve() as server:
        server.routes["/a.tar.gz"] = servers.body(archive.read_bytes())
        server.routes["/a.tar.gz.minisig"] = servers.redirect(f"file://{signature}")
        before = rig.host_facts()
        run = rig.cli("upgrade", "--archive", server.url("/a.tar.gz"), "--operation", "redirected")
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    assert out["result"] == "aborted" and "redirect" in (out["reason"] or ""), out
    assert rig.host_facts() == before
    assert rig.staging_leftovers() == []


# -- the algorithm, the keyring's freshness, root rotation ------------------------------------------------
def test_a_legacy_signature_is_refused_by_default(rig: Rig, tmp_path: Path) -> None:
    """``minisign -S -l`` (legacy ``Ed``): the algorithm bytes are not signed, so only ``ED`` counts unless
    ``[trust] allow_legacy_signatures = true``; refused before the archive is fetched."""
    sec, pub = keypair(tmp_path, "publisher")
    trust_root(rig, pub)
    archive = release(rig, tmp_path)
    subprocess.run(["minisign", "-S", "-l", "-s", str(sec), "-m", str(archive), "-t",
                    f"name={rig.name} version=2.0.0 security_version=1"], check=True, capture_output=True,
                   timeout=30)
    line = (
        f"{archive}.minisig: the legacy Ed algorithm (not pre-hashed) is not accepted for release "
        f"{archive} ([trust] allow_legacy_signatures = false)"
    )
    assert_refused_before_switch(rig, archive, line, exact=True)
    human = rig.cli("upgrade", "--archive", str(archive), "--operation", "legacy-again", json_out=False)
    assert human.code == 1 and f"reason: {line}" in human.stdout.splitlines(), human
    # allowed, the same signature gets past every trust check to the version command (stopped there by
    # --expect-version, so that the rig never reaches a switch)
    rig.write_config(extra=f'[trust]\nroot_keys = ["{pub}"]\nallow_legacy_signatures = true\n')
    assert_refused_before_switch(
        rig, archive, "expected 9.9.9", "--expect-version", "9.9.9", operation="allowed"
    )


def test_an_expired_keyring_is_refused(rig: Rig, tmp_path: Path) -> None:
    root_sec, root_pub = keypair(tmp_path, "root")
    sec, pub = keypair(tmp_path, "sign1")
    ring = publish_keyring(tmp_path, root_sec, 1, [(pub, "2099-01-01T00:00:00Z")], [],
                           expires="2026-01-31T00:00:00Z")
    trust_keyring(rig, root_pub, ring)
    archive = release(rig, tmp_path)
    sign(sec, archive, f"name={rig.name} version=2.0.0 security_version=1")
    expired = f"{ring}: keyring serial 1 expired at 2026-01-31T00:00:00Z"
    assert_refused_before_switch(rig, archive, expired, exact=True)
    assert not (rig.state_dir / "trust").exists()  # an expired keyring is never cached


def test_root_rotation_replaces_the_keyring_cached_under_the_old_root(rig: Rig, tmp_path: Path) -> None:
    """The cached keyring (serial 2) was signed by a root the host no longer trusts; the new root's keyring
    replaces it (here with serial 1) instead of every signed upgrade being refused until someone deletes a
    cache file. Each run stops at ``--expect-version`` (after every trust check, before the switch)."""
    old_sec, old_pub = keypair(tmp_path, "root-old")
    new_sec, new_pub = keypair(tmp_path, "root-new")
    sec, pub = keypair(tmp_path, "sign1")
    ring = publish_keyring(tmp_path, old_sec, 2, [(pub, "2099-01-01T00:00:00Z")], [])
    trust_keyring(rig, old_pub, ring)
    archive = release(rig, tmp_path)
    sign(sec, archive, f"name={rig.name} version=2.0.0 security_version=1")
    assert_refused_before_switch(rig, archive, "expected 9.9.9", "--expect-version", "9.9.9")
    cache = rig.state_dir / "trust" / "keyring.json"
    cached = cache.read_bytes()
    publish_keyring(tmp_path, new_sec, 1, [(pub, "2099-01-01T00:00:00Z")], [])
    trust_keyring(rig, new_pub, ring)
    assert_refused_before_switch(
        rig, archive, "expected 9.9.9", "--expect-version", "9.9.9", operation="new-root"
    )
    assert cache.read_bytes() != cached
    # the old root's keyring is refused now
    publish_keyring(tmp_path, old_sec, 3, [(pub, "2099-01-01T00:00:00Z")], [])
    assert_refused_before_switch(rig, archive, "not a root key", operation="old-root")

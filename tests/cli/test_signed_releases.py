"""Signed releases through the whole CLI (issue 12 items 1-2): each attack ends before the switch.

Releases are signed with Debian's real ``minisign`` (keys from ``minisign -G -W``); the host is installed by
hand (``Rig.install_by_hand``) with ``[trust] root_keys`` naming the publisher's key. Expected outcome for
every attack: exit 1, result ``aborted`` with a reason naming the signature problem, one JSON object, no
traceback, and the host exactly as before (both links, both slots' bytes, ``R/bin``, the unit files), with
no staging file left. ``host.systemctl_prefix`` is ``/bin/false``: a run that wrongly reached a restart
would fail loudly and never touch this machine's services.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent.config_fast import machine_arch
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


def assert_refused_before_switch(rig: Rig, archive: Path, words: str, *extra: str) -> None:
    before = rig.host_facts()
    run = rig.cli("upgrade", "--archive", str(archive), "--operation", "signed", *extra)
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    assert out["result"] == "aborted", out
    assert words in (out["reason"] or ""), out
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

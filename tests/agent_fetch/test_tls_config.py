"""``[download]``'s certificate files as :func:`agent.release.tls.download_transport` reads them: each bad
file is one line naming the key and the path, exit 2 for a bad value, exit 4 for a file others own or may
read."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.errors import ConfigError
from agent.release.tls import download_transport
from upgrade_core.errors import HostRefusedError

from ._tls import Authority, Issued

CFG = "/etc/upgrade-agent/demo.toml"


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority.make(tmp_path / "pki")


@pytest.fixture
def client(ca: Authority) -> Issued:
    return ca.issue("client", server=False)


def _not_pem(d: Path) -> Path:
    (d / "ca.pem").write_text("this is not a certificate\n")
    return d / "ca.pem"


@pytest.mark.parametrize(
    ("make", "line"),
    [
        (lambda d: d / "absent.pem", "download.ca_file: {path}: file not found"),
        (_not_pem, "download.ca_file: {path}: not a PEM certificate file (no readable "
                   "'-----BEGIN CERTIFICATE-----' block)"),
        (lambda d: d, "download.ca_file: {path}: not a regular file (a FIFO, device, socket or directory)"),
    ],
    ids=["missing", "not-pem", "directory"],
)
def test_a_bad_ca_file_is_one_line_naming_the_key(
    tmp_path: Path, make: Callable[[Path], Path], line: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(ConfigError) as info:
        download_transport(CFG, ca_file=str(path))
    assert str(info.value) == f"{CFG}: " + line.format(path=path)
    assert info.value.exit_code == 2


def test_a_ca_file_is_read_whole_and_never_waits_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        download_transport(CFG, ca_file=str(fifo))


def test_client_key_without_client_cert_names_both_keys(client: Issued) -> None:
    with pytest.raises(ConfigError) as info:
        download_transport(CFG, client_key=str(client.key))
    assert str(info.value) == (
        f"{CFG}: download.client_key: needs download.client_cert (mutual TLS takes both)")


def test_a_key_that_does_not_match_the_certificate_is_refused(ca: Authority, client: Issued) -> None:
    other = ca.issue("other", server=False)
    with pytest.raises(ConfigError) as info:
        download_transport(CFG, client_cert=str(client.cert), client_key=str(other.key))
    assert str(info.value) == (f"{CFG}: download.client_key: {other.key}: does not match the first "
                               f"certificate of download.client_cert ({client.cert})")


def test_an_encrypted_key_is_refused(client: Issued, tmp_path: Path) -> None:
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkcs8", "-topk8", "-in", str(client.key), "-out", str(encrypted), "-passout",
                    "pass:secret", "-v2", "aes-256-cbc"], check=True, capture_output=True, timeout=30)
    os.chmod(encrypted, 0o600)
    with pytest.raises(ConfigError, match=r"download\.client_key: .*: the key is encrypted"):
        download_transport(CFG, client_cert=str(client.cert), client_key=str(encrypted))


def test_a_certificate_where_the_key_belongs_is_not_a_key(client: Issued, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(client.cert.read_bytes())
    os.chmod(wrong, 0o600)
    with pytest.raises(ConfigError) as info:
        download_transport(CFG, client_cert=str(client.cert), client_key=str(wrong))
    assert str(info.value) == (
        f"{CFG}: download.client_key: {wrong}: not a PEM private key (RSA, EC or Ed25519)")


@pytest.mark.parametrize(("mode", "owner", "what"), [
    (0o640, 0, "mode 0640: a private key must not be readable by group or others (chmod 0600)"),
    (0o604, 0, "mode 0604: a private key must not be readable by group or others (chmod 0600)"),
    (0o600, 65534, "owned by uid 65534 with mode 0600: it must be owned by root (or the user running this) "
                   "and not writable by group or others"),
])
def test_a_private_key_others_may_read_or_own_is_refused_exit_4(
    client: Issued, mode: int, owner: int, what: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the owner rule is root's (as non-root the file would be this user's)")
    os.chmod(client.key, mode)
    os.chown(client.key, owner, -1)
    with pytest.raises(HostRefusedError) as info:
        download_transport(CFG, client_cert=str(client.cert), client_key=str(client.key))
    assert str(info.value) == f"{client.key}: download.client_key: {what}; nothing was changed"
    assert info.value.exit_code == 4


def test_a_ca_file_others_may_write_is_refused_exit_4(ca: Authority) -> None:
    if os.geteuid() != 0:
        pytest.skip("the owner rule is root's (as non-root the file would be this user's)")
    os.chmod(ca.cert, 0o664)
    with pytest.raises(HostRefusedError) as info:
        download_transport(CFG, ca_file=str(ca.cert))
    assert str(info.value) == (f"{ca.cert}: download.ca_file: owned by uid 0 with mode 0664: it must be "
                               "owned by root (or the user running this) and not writable by group or "
                               "others; nothing was changed")
    os.chmod(ca.cert, 0o644)  # a CA bundle is public: readable by all is fine
    assert download_transport(CFG, ca_file=str(ca.cert)).client_certificate is False

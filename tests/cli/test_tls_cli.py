"""TLS through the whole CLI (docs/trust.md, TLS): a release server whose certificate authority is made in the
test, on loopback. A certificate the host does not trust aborts the upgrade with the exact reason; a bad
``[download]`` certificate setting is one line naming the key before anything is locked or journaled; commands
that download nothing never read those files; the keyring and the signature come through the same client as
the archive. The committed upgrade over TLS with ``download.ca_file`` and
``download.proxy`` runs under the private systemd (``tests/systemd/test_tls_upgrade.py``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config.boot import machine_arch
from tests.agent_fetch._archives import Entry, compress, tar_bytes
from tests.agent_fetch._servers import LoopbackServer, body, serve
from tests.agent_fetch._tls import Authority, ConnectProxy

from ._rig import Rig, version_script
from .test_signed_releases import key_id, keypair, publish_keyring, release, sign

ARCH = machine_arch() or "amd64"


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority.make(tmp_path / "pki")


@pytest.fixture
def release_server(ca: Authority, installed_rig: Rig) -> Iterator[LoopbackServer]:
    """An https server of the test CA serving release 2.0.0 at ``/a.tar.gz``."""
    member = Entry(f"{installed_rig.name}-linux-{ARCH}", data=version_script("2.0.0"))
    with serve(ca.server_context()) as server:
        server.routes["/a.tar.gz"] = body(compress(tar_bytes([member]), "gzip"))
        yield server


def test_a_server_the_host_does_not_trust_aborts_with_the_certificate_reason(
    installed_rig: Rig, release_server: LoopbackServer
) -> None:
    rig = installed_rig
    url = release_server.url("/a.tar.gz")
    before = rig.host_facts()
    run = rig.cli("upgrade", "--archive", url.replace("https://", "https://u:SECRET@") + "?sig=TOKEN",
                  "--operation", "untrusted")
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    assert (out["result"], out["reason"]) == (
        "aborted", f"{url}: certificate verify failed: unable to get local issuer certificate")
    assert "SECRET" not in run.stdout + run.stderr and "TOKEN" not in run.stdout + run.stderr
    assert rig.host_facts() == before and rig.staging_leftovers() == []
    human = rig.cli("upgrade", "--archive", url, "--operation", "untrusted-2", json_out=False)
    assert human.code == 1
    assert f"reason: {url}: certificate verify failed: unable to get local issuer certificate" in (
        human.stdout.splitlines())
    assert release_server.requests == []


def test_environment_proxies_are_not_used_by_the_cli(
    installed_rig: Rig, release_server: LoopbackServer, ca: Authority
) -> None:
    """HTTPS_PROXY and friends in the caller's environment change nothing: the download goes straight to
    the server (and is refused for its certificate, exactly as without the variables)."""
    url = release_server.url("/a.tar.gz")
    with ConnectProxy.running() as proxy:
        env = {name: proxy.url for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")}
        run = installed_rig.cli("upgrade", "--archive", url, "--operation", "env-proxy", env=env)
        assert proxy.requests == []
    assert (run.code, run.payload()["reason"]) == (
        1, f"{url}: certificate verify failed: unable to get local issuer certificate")


def _config_error(rig: Rig, argv: tuple[str, ...], code: int) -> str:
    before = rig.host_facts()
    run = rig.cli(*argv, json_out=False)
    assert run.code == code, run
    run.assert_clean_stderr()
    *announced, line = run.error_lines()  # an upgrade first names its operation and source
    assert len(announced) <= 1
    assert rig.host_facts() == before
    assert not rig.state_dir.exists() and not rig.lock_path.exists()  # nothing locked, nothing journaled
    return line.removeprefix("upgrade-agent: ")


@pytest.mark.parametrize("command", ["upgrade", "install"])
def test_a_missing_ca_file_is_exit_2_naming_the_key_before_anything_is_touched(
    installed_rig: Rig, release_server: LoopbackServer, tmp_path: Path, command: str
) -> None:
    rig = installed_rig
    missing = tmp_path / "absent-ca.pem"
    rig.write_config(extra=f'[download]\nca_file = "{missing}"\n')
    line = _config_error(rig, (command, "--archive", release_server.url("/a.tar.gz")), 2)
    assert line == f"{rig.config}: download.ca_file: {missing}: file not found"
    assert release_server.requests == []


def test_a_client_key_others_can_read_is_exit_4_naming_it(
    installed_rig: Rig, release_server: LoopbackServer, ca: Authority
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the owner rule is root's (as non-root the file would be this user's)")
    rig = installed_rig
    client = ca.issue("client", server=False)
    os.chmod(client.key, 0o644)
    rig.write_config(extra=f'[download]\nca_file = "{ca.cert}"\nclient_cert = "{client.cert}"\n'
                           f'client_key = "{client.key}"\n')
    line = _config_error(rig, ("upgrade", "--archive", release_server.url("/a.tar.gz")), 4)
    assert line == (f"{client.key}: download.client_key: mode 0644: a private key must not be readable by "
                    "group or others (chmod 0600); nothing was changed")
    assert release_server.requests == []


def test_client_key_without_client_cert_is_a_configuration_error(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    rig.write_config(extra=f'[download]\nclient_key = "{tmp_path / "k.pem"}"\n')
    line = _config_error(rig, ("status",), 2)
    assert line == f"{rig.config}: download.client_key: needs client_cert (mutual TLS takes both)"


def test_commands_that_download_nothing_never_read_the_certificate_files(
    installed_rig: Rig, tmp_path: Path
) -> None:
    """A broken download setting must not stop status, history or a recovery."""
    rig = installed_rig
    rig.write_config(extra=f'[download]\nca_file = "{tmp_path / "absent-ca.pem"}"\n')
    for argv in (("status",), ("history",), ("recover",)):
        run = rig.cli(*argv)
        assert run.code == 0, run


@pytest.mark.parametrize("with_ca_file", [False, True], ids=["host trust only", "with ca_file"])
def test_the_keyring_and_the_signature_are_fetched_with_the_downloads_trust(
    installed_rig: Rig, ca: Authority, tmp_path: Path, with_ca_file: bool
) -> None:
    """``[trust] keyring`` and ``<archive>.minisig`` come from the same https server as the archive, through
    the same client: refused for its certificate without ``ca_file``; with it, fetched and checked (here the
    keyring revokes the release's signing key, so the upgrade ends on that, before the archive)."""
    rig = installed_rig
    root_sec, root_pub = keypair(tmp_path, "root")
    sec, pub = keypair(tmp_path, "sign1")
    revoked = [key_id(tmp_path / "sign1.pub")]
    ring = publish_keyring(tmp_path, root_sec, 1, [(pub, "2099-01-01T00:00:00Z")], revoked)
    archive = release(rig, tmp_path)
    signature = sign(sec, archive, f"name={rig.name} version=2.0.0 security_version=1")
    with serve(ca.server_context()) as server:
        for path in (ring, Path(f"{ring}.minisig"), archive, signature):
            server.routes[f"/{path.name}"] = body(path.read_bytes())
        download = f'[download]\nca_file = "{ca.cert}"\n' if with_ca_file else ""
        keyring = server.url("/keyring.json")
        rig.write_config(extra=f'[trust]\nroot_keys = ["{root_pub}"]\nkeyring = "{keyring}"\n{download}')
        before = rig.host_facts()
        run = rig.cli("upgrade", "--archive", server.url(f"/{archive.name}"), "--operation", "keyring-tls")
        fetched = sorted(p for p, _ in server.requests)
    assert run.code == 1, run
    reason = run.payload()["reason"]
    if with_ca_file:
        assert "revoked" in reason, reason
        assert fetched == sorted([f"/{signature.name}", "/keyring.json", "/keyring.json.minisig"])
    else:
        assert reason.endswith(": certificate verify failed: unable to get local issuer certificate"), reason
        assert reason.startswith(server.url("/")) and fetched == []
    assert rig.host_facts() == before and rig.staging_leftovers() == []

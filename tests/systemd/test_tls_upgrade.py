"""An upgrade over TLS as fleets run it, committed under the real private systemd (docs/trust.md, TLS).

The release server presents a certificate of a CA made in the test, which the host's store does not hold:
``download.ca_file`` adds it, ``download.proxy`` names a loopback CONNECT proxy that carries the download,
and ``HTTPS_PROXY`` in the CLI's environment names another proxy, which must see nothing. Outcomes are read
from the host: the exit code and result, the running MainPID's slot, the proxies' records, the server's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent_fetch._servers import body, serve
from tests.agent_fetch._tls import Authority, ConnectProxy

from . import agent_env
from .agent_env import AgentEnv

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server


def test_an_upgrade_over_tls_with_ca_file_and_proxy_commits(
    make_env: Callable[..., AgentEnv], tmp_path: Path
) -> None:
    ca = Authority.make(tmp_path / "pki")
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)  # from the plain-http loopback release server, before the proxy is configured
    with ConnectProxy.running() as proxy, ConnectProxy.running() as from_environment:
        env.config.write_text(env.config.read_text()
                              + f'\n[download]\nca_file = "{ca.cert}"\nproxy = "{proxy.url}"\n')
        with serve(ca.server_context()) as server:
            server.routes["/v2.tar.gz"] = body(v2.path.read_bytes())
            url = server.url("/v2.tar.gz")
            up = env.cli("upgrade", "--archive", url, "--sha256", v2.sha256, "--operation", "over-tls",
                         env={"HTTPS_PROXY": from_environment.url, "https_proxy": from_environment.url})
            assert up.code == 0, up.stderr
            assert up.json is not None
            assert (up.json["result"], up.json["to_version"]) == ("committed", "1.1.0")
            assert [path for path, _ in server.requests] == ["/v2.tar.gz"]
        env.assert_running("green", v2)
        assert proxy.tunnels == [f"127.0.0.1:{server.server_address[1]}"]
        assert from_environment.requests == []

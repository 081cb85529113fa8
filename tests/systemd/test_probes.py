
"""Health probes against real things: a loopback HTTP server, real commands, real process groups."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from agent.errors import ConfigError
from agent.host.clock import SystemClock
from agent.systemd.probes import CommandProbe, HttpProbe, NullProbe, make_probe
from agent.testing.sandbox import free_port
from tests._proc import wait_dead
from tests.agent_fetch._servers import body, serve
from tests.agent_fetch._tls import Authority
from upgrade_core.ports import ProbeUnreachable

pytestmark = pytest.mark.anyio


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = {"/ok": 200, "/nocontent": 204, "/moved": 302}.get(self.path.split("?")[0], 500)
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "/ok")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1, port 0; yields its base URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


async def test_http_2xx_is_healthy(server: str) -> None:
    assert await HttpProbe(f"{server}/ok").check() is None
    assert await HttpProbe(f"{server}/nocontent").check() is None


async def test_http_500_is_a_reason(server: str) -> None:
    assert await HttpProbe(f"{server}/fail").check() == (
        f"http probe {server}/fail answered 500 Internal Server Error"
    )


async def test_http_redirect_is_not_followed(server: str) -> None:
    assert await HttpProbe(f"{server}/moved").check() == f"http probe {server}/moved answered 302 Found"


async def test_http_closed_port_is_a_reason() -> None:
    url = f"http://127.0.0.1:{free_port()}/healthz"
    reason = await HttpProbe(url, timeout_s=1.0).check()
    assert reason is not None and reason.startswith(f"http probe {url}: ConnectError")
    assert "\n" not in reason
    assert isinstance(reason, ProbeUnreachable)  # never makes the candidate known-bad (docs/trust.md)


async def test_an_answer_is_never_unreachable(server: str) -> None:
    reason = await HttpProbe(f"{server}/fail").check()
    assert reason is not None and not isinstance(reason, ProbeUnreachable)


async def test_https_probe_reaches_the_connect_stage_with_its_tls_context() -> None:
    url = f"https://127.0.0.1:{free_port()}/healthz"
    reason = await HttpProbe(url, timeout_s=1.0).check()
    assert reason is not None and reason.startswith(f"http probe {url}: ConnectError")


async def test_an_https_probe_trusts_the_operating_systems_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a CA list bundled with a Python package: the system's store, here SSL_CERT_FILE as OpenSSL reads
    it (docs/trust.md, TLS); [download] settings never reach the probe."""
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    ca = Authority.make(tmp_path / "pki")
    with serve(ca.server_context()) as daemon:
        daemon.routes["/healthz"] = body(b"ok")
        url = daemon.url("/healthz")
        refused = await HttpProbe(url, timeout_s=2.0).check()
        monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert))
        assert await HttpProbe(url, timeout_s=2.0).check() is None
    assert refused == (f"http probe {url}: ConnectError: certificate verify failed: unable to get local "
                       "issuer certificate")


async def test_http_reasons_never_carry_secrets(server: str) -> None:
    port = server.rsplit(":", 1)[1]
    reason = await HttpProbe(f"http://user:SECRET@127.0.0.1:{port}/fail?sig=TOKEN#FRAG").check()
    assert reason == f"http probe http://127.0.0.1:{port}/fail answered 500 Internal Server Error"
    closed = f"http://user:SECRET@127.0.0.1:{free_port()}/x?sig=TOKEN"
    reason = await HttpProbe(closed, timeout_s=1.0).check()
    assert reason is not None
    assert "SECRET" not in reason and "TOKEN" not in reason and "user" not in reason


def test_bad_probe_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"health\.http_probe: 'ftp://h/x'"):
        HttpProbe("ftp://h/x")
    with pytest.raises(ConfigError, match=r"health\.http_probe: 'http://:80/'"):
        HttpProbe("http://u:SECRET@:80/")
    with pytest.raises(ConfigError, match=r"health\.command_probe"):
        CommandProbe([])
    with pytest.raises(ConfigError, match="not both"):
        make_probe("http://h/", ["true"])


def test_make_probe_picks_the_configured_kind() -> None:
    assert isinstance(make_probe("", []), NullProbe)
    assert isinstance(make_probe("http://127.0.0.1/", []), HttpProbe)
    assert isinstance(make_probe("", ["true"]), CommandProbe)


async def test_null_probe_is_healthy() -> None:
    assert await NullProbe().check() is None


async def test_command_exit_0_is_healthy() -> None:
    assert await CommandProbe(["true"]).check() is None


async def test_command_failure_reason_quotes_last_stderr_line() -> None:
    probe = CommandProbe(["sh", "-c", "echo first >&2; echo 'db: connection refused' >&2; exit 3"])
    assert await probe.check() == "command probe sh exited 3: db: connection refused"


async def test_command_killed_by_signal() -> None:
    assert await CommandProbe(["sh", "-c", "kill -9 $$"]).check() == "command probe sh killed by signal 9"


async def test_command_missing_program_is_a_reason() -> None:
    reason = await CommandProbe(["/nonexistent/probe"]).check()
    assert reason is not None and reason.startswith("command probe /nonexistent/probe could not run")


async def test_command_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    probe = CommandProbe(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout_s=0.3)
    assert await probe.check() == "command probe sh timed out after 0.3 s (process group killed)"
    assert wait_dead(int(pidfile.read_text())), "a process survived its probe's process group kill"


async def test_command_grandchild_holding_the_pipe_neither_stalls_nor_survives(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    # exits 0 at once, leaving a grandchild that holds stderr open for a minute
    probe = CommandProbe(["sh", "-c", f"sleep 60 >&2 & echo $! > {pidfile}; exit 0"], timeout_s=30.0)
    with anyio.fail_after(20):  # a hang guard: reading must stop once the main process exited
        assert await probe.check() is None
    assert wait_dead(int(pidfile.read_text())), "a process survived its probe's process group kill"


async def test_system_clock() -> None:
    clock = SystemClock()
    before = clock.monotonic()
    await clock.sleep(0.01)
    assert clock.monotonic() >= before + 0.01
    assert abs(clock.wall() - time.time()) < 60

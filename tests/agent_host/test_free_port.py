"""The harness's ``free_port``: every sample agent's port, on the real loopback interface.

A port the kernel may also hand out as the local end of an outbound connection made a healthy daemon fail
to start with EADDRINUSE between two restarts (a CI failure of ``test_rollback_real``): these tests pin
that the ports come from outside the ephemeral range, are distinct across threads, and are free.
"""

from __future__ import annotations

import concurrent.futures
import socket
from pathlib import Path

import pytest

from agent.testing import sandbox
from agent.testing.sandbox import free_port


def _ephemeral() -> tuple[int, int]:
    low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return low, high


def test_ports_are_distinct_free_and_never_ephemeral() -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        ports = list(pool.map(lambda _: free_port(), range(200)))
    assert len(set(ports)) == len(ports)
    low, high = _ephemeral()
    assert not [port for port in ports if low <= port <= high or port < 10000]
    held = []
    try:
        for port in ports:  # every one can be served on at once: none was in use, none was handed out twice
            listener = socket.socket()
            held.append(listener)
            listener.bind(("127.0.0.1", port))
            listener.listen()
    finally:
        for listener in held:
            listener.close()


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = sandbox._port_pool()
    with socket.socket() as other:
        for taken in (port for port in pool if port not in sandbox._PORTS_GIVEN):
            try:
                other.bind(("127.0.0.1", taken))
                break
            except OSError:
                continue
        other.listen()
        # the search starts at the port held above
        monkeypatch.setattr(sandbox.secrets, "randbelow", lambda n: pool.index(taken))
        port = free_port()
    assert port != taken and pool.index(port) > pool.index(taken)

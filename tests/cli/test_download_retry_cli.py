"""``download.retry_deadline_s`` through the whole CLI: a release server that keeps failing is tried until the
deadline, then the upgrade is aborted naming the attempts; the host is unchanged and nothing is remembered
as known-bad (a flaky network says nothing about the release)."""

from __future__ import annotations

import http.server

from tests.agent_fetch import _servers as servers

from ._rig import Rig


def test_a_server_that_keeps_failing_is_tried_until_the_deadline_then_aborted(installed_rig: Rig) -> None:
    rig = installed_rig
    rig.write_config(extra="[download]\nretry_deadline_s = 1\n")

    def unavailable(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(503)
        h.send_header("Content-Length", "0")
        h.end_headers()

    before = rig.host_facts()
    with servers.serve() as server:
        server.routes["/a.tar.gz"] = unavailable
        url = server.url("/a.tar.gz")
        run = rig.cli("upgrade", "--archive", url, "--operation", "flaky")
        attempts = len(server.requests)
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    assert attempts >= 2
    assert (out["result"], out["reason"]) == (
        "aborted", f"{url}: HTTP 503 Service Unavailable; gave up after {attempts} attempts "
                   "(download.retry_deadline_s = 1 s)")
    assert rig.host_facts() == before and rig.staging_leftovers() == []
    status = rig.cli("status")
    assert status.code == 0 and status.payload()["known_bad"] == []


def test_a_404_is_one_request_whatever_the_deadline(installed_rig: Rig) -> None:
    with servers.serve() as server:
        url = server.url("/missing.tar.gz")
        run = installed_rig.cli("upgrade", "--archive", url, "--operation", "missing")
        assert len(server.requests) == 1
    assert (run.code, run.payload()["reason"]) == (1, f"{url}: HTTP 404 Not Found")

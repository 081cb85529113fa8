#!/usr/bin/env python3
"""A daemon that embeds upgrade-core and upgrades itself (the self-upgrade flow, design §4.4).

Shipped like any agent binary: this single file, with ``VERSION`` and ``BEHAVIOUR`` baked in and its
shebang pointed at an interpreter that can import the project (``agent/testing/releases.py`` does both).

    selfupgrade-daemon version                      prints "selfupgrade-daemon <VERSION>"
    selfupgrade-daemon serve --config PATH [--port N]

At start-up ``serve`` starts its HTTP server, then calls the library's resume entry point
(:meth:`agent.session.session.Session.resume_self_upgrade`): if it is the candidate of an open self-upgrade
episode it holds healthy for the stability window and commits; if the episode has no attempts left it
exits 1 without serving, so systemd's ``Restart=`` and start limit end in ``OnFailure=`` ->
``recover-agent-upgrade --trigger on-failure`` -> rollback, with no operator action. When another process
holds the host lock
(a recovery owns the episode) it just serves.

``POST /upgrade?archive=URL[&sha256=HEX][&operation=ID]`` runs steps 1-5 in this process
(:meth:`agent.session.session.Session.self_upgrade`): fetch, verify, switch, then schedule its own restart
through a
transient unit, answering 202 with the operation id (or 200 with a terminal result such as ``aborted``).

``BEHAVIOUR``: ``good`` serves /healthz with 200; ``unhealthy`` answers 503 (a candidate that passes its
version check but never becomes healthy).
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "0.0.0"
BEHAVIOUR = "good"
NAME = "selfupgrade-daemon"


def _config_path(argv: list[str]) -> str:
    if "--config" in argv:
        return argv[argv.index("--config") + 1]
    from agent.config.loader import discover_config_path

    return discover_config_path(None)


def resume(config_path: str) -> int:
    """The start-up call: 0 to serve, 1 to exit without serving (design §4.4)."""
    import anyio

    from agent.session.session import open_session
    from upgrade_core.errors import LockBusyError

    async def run():  # type: ignore[no-untyped-def]
        async with open_session(config_path) as s:
            return await s.resume_self_upgrade()

    try:
        outcome = anyio.run(run)
    except LockBusyError:
        print(f"{NAME} {VERSION}: another process owns the open episode; serving", flush=True)
        return 0
    print(f"{NAME} {VERSION}: resume -> {outcome.status} {outcome.reason or ''}".rstrip(), flush=True)
    return 1 if outcome.status == "failed" else 0


def upgrade(config_path: str, archive: str, sha256: str | None, operation: str | None) -> tuple[int, dict]:
    """Steps 1-5 of the self-upgrade flow in this process; returns (HTTP status, JSON body)."""
    import anyio

    from agent.session.session import open_session
    from upgrade_core import RestartScheduled
    from upgrade_core.errors import UpgradeError

    op = [operation]

    async def run():  # type: ignore[no-untyped-def]
        async with open_session(config_path) as s:
            request = s.request(archive, sha256=sha256, operation=operation)
            op[0] = request.operation  # the episode to recover if anything fails after it opened
            return await s.self_upgrade(request)

    try:
        out = anyio.run(run)
    except UpgradeError as exc:
        return 409, {"operation": op[0], "error": str(exc), "exit_code": exc.exit_code}
    if isinstance(out, RestartScheduled):
        return 202, {"operation": out.operation, "restart_unit": out.unit}
    return 200, {"operation": op[0], "result": out.result, "reason": out.reason}


def serve(config_path: str, port: int) -> int:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = BEHAVIOUR == "good" and self.path == "/healthz"
            self._answer(200 if ok else 503, {"version": VERSION, "healthy": ok})

        def do_POST(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            if url.path != "/upgrade" or "archive" not in query:
                self._answer(404, {"error": "POST /upgrade?archive=URL"})
                return
            status, body = upgrade(config_path, query["archive"], query.get("sha256"), query.get("operation"))
            self._answer(status, body)

        def _answer(self, status: int, body: dict) -> None:
            data = (json.dumps(body) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    if resume(config_path) != 0:
        server.shutdown()
        return 1
    print(f"{NAME} {VERSION} serving on 127.0.0.1:{port}", flush=True)
    threading.Event().wait()
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["version"]:
        print(f"{NAME} {VERSION}")
        return 0
    if argv[:1] == ["serve"]:
        port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 18090
        return serve(_config_path(argv), port)
    print(f"usage: {NAME} version | serve --config PATH [--port N]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

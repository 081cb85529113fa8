#!/usr/bin/env python3
"""demo-agent: the sample host daemon that ``make demo`` and the tests install and upgrade.

It is shipped as a single executable file (this script with its version and behaviour baked in by
``agent/testing/releases.py``), the shape of a real agent binary inside a release archive.

Usage:
    demo-agent version             prints "demo-agent <VERSION>" and exits 0
    demo-agent serve [--port N]    serves GET /healthz (200 "ok <VERSION>") on 127.0.0.1:N until SIGTERM

The serving side keeps the candidate contract's runtime half (docs/candidate.md, "Socket activation"): when
systemd passes a listening socket (``LISTEN_PID`` is this process and ``LISTEN_FDS`` >= 1, sd_listen_fds(3))
it serves on file descriptor 3 and ignores ``--port``; otherwise it binds 127.0.0.1:N itself. On SIGTERM it
stops accepting, finishes every request it has accepted, and exits 0: connections it has not accepted stay
queued in a socket systemd keeps open, for the next process.

Baked-in behaviours (``BEHAVIOUR``): "good" serves forever; "exit-after:S" exits 1 after S seconds of
serving (a candidate that passes its version check and then dies, case C16); "unhealthy" serves /healthz
with 503; "refuse-if-exists:PATH" serves like "good" but exits 1 at start while PATH exists (an older
release that cannot read what a newer one left behind, e.g. a migrated configuration: the reason an
operator's rollback to ``last-good`` fails, docs/recovery.md).
"""

from __future__ import annotations

import http.server
import os
import signal
import socket
import sys
import threading
import time

VERSION = "0.0.0"
BEHAVIOUR = "good"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        healthy = BEHAVIOUR != "unhealthy"
        body = f"{'ok' if healthy else 'unhealthy'} {VERSION}\n".encode()
        self.send_response(200 if healthy and self.path == "/healthz" else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


class _Server(http.server.ThreadingHTTPServer):
    # Handler threads are joined by server_close(): a request accepted before SIGTERM is answered in full.
    daemon_threads = False
    block_on_close = True


SD_LISTEN_FDS_START = 3
"""The first file descriptor systemd passes (sd_listen_fds(3))."""


def _systemd_socket() -> socket.socket | None:
    """The listening socket systemd passed (fd 3), or None: sd_listen_fds(3) with ``unset_environment``.

    Only when ``LISTEN_PID`` names this very process (the variables may have been inherited from a parent
    that got them) and ``LISTEN_FDS`` is at least 1; the variables are removed either way, so no child of
    ours takes them for its own, and fd 3 gets close-on-exec.
    """
    pid, fds = os.environ.pop("LISTEN_PID", ""), os.environ.pop("LISTEN_FDS", "")
    os.environ.pop("LISTEN_FDNAMES", None)
    if pid != str(os.getpid()) or not fds.isdigit() or int(fds) < 1:
        return None
    os.set_inheritable(SD_LISTEN_FDS_START, False)
    return socket.socket(fileno=SD_LISTEN_FDS_START)


def _serve(port: int) -> int:
    if BEHAVIOUR.startswith("refuse-if-exists:"):
        marker = BEHAVIOUR.split(":", 1)[1]
        if os.path.exists(marker):
            print(f"demo-agent {VERSION}: cannot start: {marker} exists", flush=True)
            return 1
    inherited = _systemd_socket()
    if inherited is None:
        server = _Server(("127.0.0.1", port), _Handler)
        where = f"127.0.0.1:{port}"
    else:
        server = _Server(inherited.getsockname(), _Handler, bind_and_activate=False)
        server.socket.close()
        server.socket = inherited
        where = f"fd {SD_LISTEN_FDS_START} from systemd"
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"demo-agent {VERSION} serving on {where} ({BEHAVIOUR})", flush=True)
    if BEHAVIOUR.startswith("exit-after:"):
        delay = float(BEHAVIOUR.split(":", 1)[1])

        def _die() -> None:
            time.sleep(delay)
            print(f"demo-agent {VERSION}: failing on purpose after {delay} s", flush=True)
            sys.stdout.flush()
            os._exit(1)

        threading.Thread(target=_die, daemon=True).start()
    server.serve_forever(poll_interval=0.1)
    server.server_close()  # closes our copy of the listening socket (systemd keeps its own), joins handlers
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["version"]:
        print(f"demo-agent {VERSION}")
        return 0
    if argv[:1] == ["serve"]:
        port = 18080
        if len(argv) >= 3 and argv[1] == "--port":
            port = int(argv[2])
        return _serve(port)
    print("usage: demo-agent version | serve [--port N]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

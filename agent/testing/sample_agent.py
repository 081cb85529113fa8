#!/usr/bin/env python3
"""demo-agent: the sample host daemon that ``make demo`` and the tests install and upgrade.

It is shipped as a single executable file (this script with its version and behaviour baked in by
``agent/testing/releases.py``), the shape of a real agent binary inside a release archive.

Usage:
    demo-agent version             prints "demo-agent <VERSION>" and exits 0
    demo-agent serve [--port N]    serves GET /healthz (200 "ok <VERSION>") on 127.0.0.1:N until SIGTERM

Baked-in behaviours (``BEHAVIOUR``): "good" serves forever; "exit-after:S" exits 1 after S seconds of
serving (a candidate that passes its version check and then dies, case C16); "unhealthy" serves /healthz
with 503; "refuse-if-exists:PATH" serves like "good" but exits 1 at start while PATH exists (an older
release that cannot read what a newer one left behind, e.g. a migrated configuration: the reason an
operator's rollback to ``last-good`` fails, docs/recovery.md).
"""

from __future__ import annotations

import http.server
import signal
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


def _serve(port: int) -> int:
    if BEHAVIOUR.startswith("refuse-if-exists:"):
        import os

        marker = BEHAVIOUR.split(":", 1)[1]
        if os.path.exists(marker):
            print(f"demo-agent {VERSION}: cannot start: {marker} exists", flush=True)
            return 1
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    server.allow_reuse_address = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"demo-agent {VERSION} serving on 127.0.0.1:{port} ({BEHAVIOUR})", flush=True)
    if BEHAVIOUR.startswith("exit-after:"):
        delay = float(BEHAVIOUR.split(":", 1)[1])

        def _die() -> None:
            time.sleep(delay)
            print(f"demo-agent {VERSION}: failing on purpose after {delay} s", flush=True)
            sys.stdout.flush()
            import os

            os._exit(1)

        threading.Thread(target=_die, daemon=True).start()
    server.serve_forever(poll_interval=0.1)
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

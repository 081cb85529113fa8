"""Real loopback HTTP(S) servers for the fetch tests (threaded ``http.server`` on 127.0.0.1, port 0)."""

from __future__ import annotations

import http.server
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


class _RequestHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: LoopbackServer

    def do_GET(self) -> None:
        self.server.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        route = self.server.routes.get(self.path.split("?", 1)[0])
        if route is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        route(self)

    def log_message(self, format: str, *args: object) -> None:
        pass


class LoopbackServer(http.server.ThreadingHTTPServer):
    """Serves ``routes[path](handler)``; records ``(path, lower-cased headers)`` of each request.

    With ``tls`` set, each connection's handshake runs as it is accepted; a refused handshake (no client
    certificate where one is required, one of an unknown CA) ends as a web server ends it: the alert is
    sent, what the client already sent is read and dropped (at most one second), then the socket closes.
    Closing at once with the client's request unread would answer with a reset, which may overtake the
    alert, so the client could not say why it was refused.
    """

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RequestHandler)
        self.routes: dict[str, Handler] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.scheme = "http"
        self.tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, object]:
        raw, address = super().get_request()
        if self.tls is None:
            return raw, address
        conn = self.tls.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        conn.settimeout(5)
        try:
            conn.do_handshake()
        except (ssl.SSLError, OSError):
            with socket.socket(fileno=conn.detach()) as plain:
                plain.settimeout(1)
                try:
                    while plain.recv(65536):
                        pass
                except OSError:
                    pass
            raise
        conn.settimeout(None)
        return conn, address

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}{path}"


@contextmanager
def serve(tls: ssl.SSLContext | None = None) -> Iterator[LoopbackServer]:
    """Run a :class:`LoopbackServer` in a thread for the duration of the block."""
    server = LoopbackServer()
    if tls is not None:
        server.tls = tls
        server.scheme = "https"
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def body(data: bytes, length: bool = True) -> Handler:
    """200 with ``data``; with ``length=False`` the body is close-delimited (no length, no chunking)."""

    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        if length:
            h.send_header("Content-Length", str(len(data)))
        else:
            h.send_header("Connection", "close")
            h.close_connection = True
        h.end_headers()
        h.wfile.write(data)

    return handle


def held_halfway(data: bytes, gate: threading.Event, timeout_s: float = 60.0) -> Handler:
    """200 with ``data`` (its length announced): the first half at once, the rest once ``gate`` is set (or
    after ``timeout_s`` seconds: a server thread never outlives its test by more). A download the test sees
    under way, then lets finish."""

    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[: len(data) // 2])
        h.wfile.flush()
        gate.wait(timeout_s)
        h.wfile.write(data[len(data) // 2:])
        h.wfile.flush()

    return handle


def redirect(location: str, status: int = 302) -> Handler:
    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return handle


def short_body(announced: int, data: bytes) -> Handler:
    """Announce ``Content-Length: announced`` and close after ``data`` (case C06)."""

    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(announced))
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()
        h.close_connection = True

    return handle


def cut_chunked(data: bytes, chunk: int = 65536) -> Handler:
    """Chunked transfer encoding, connection closed before the terminating zero-size chunk (C06)."""

    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for i in range(0, len(data), chunk):
            piece = data[i : i + chunk]
            h.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        h.wfile.flush()
        h.close_connection = True

    return handle


@contextmanager
def stalling(path: str = "/a.tar.gz") -> Iterator[LoopbackServer]:
    """A server whose ``path`` sends the headers (10 MiB announced) and a first 4 KiB of gzip, then stalls
    until the block ends: a download that provably has begun and cannot finish (signal tests)."""
    release = threading.Event()

    def handle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(10 * 1024 * 1024))
        h.end_headers()
        h.wfile.write(b"\x1f\x8b" + bytes(4094))
        h.wfile.flush()
        release.wait(60)  # bounded: a server thread never outlives the test by more than this
        h.close_connection = True

    with serve() as server:
        server.routes[path] = handle
        try:
            yield server
        finally:
            release.set()

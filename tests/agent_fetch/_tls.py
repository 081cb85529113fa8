"""A certificate authority made in the test, its certificates, TLS server contexts and a CONNECT proxy.

Everything is real: the certificates are made with ``cryptography`` (P-256 keys, one day valid), the servers
are ``ssl`` contexts wrapped around the loopback servers of :mod:`tests.agent_fetch._servers`, and the proxy
is a thread that reads a ``CONNECT`` request and relays bytes both ways, as a corporate proxy does.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_LOOPBACK = ipaddress.ip_address("127.0.0.1")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(path, 0o600)
    return path


@attrs.frozen
class Issued:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


@attrs.frozen
class Authority:
    """A test CA: its certificate (``cert``, PEM) and what it issues into ``directory``."""

    directory: Path
    cert: Path
    _key: ec.EllipticCurvePrivateKey
    _subject: x509.Name

    @classmethod
    def make(cls, directory: Path, name: str = "upgrade-core test CA") -> Authority:
        """A self-signed CA certificate (basicConstraints CA:true, keyCertSign) in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256())
        )
        path = directory / f"{name.replace(' ', '-')}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(directory, path, key, cert.subject)

    def issue(self, label: str, *, server: bool) -> Issued:
        """A leaf: a server certificate for 127.0.0.1 (``server``) or a client certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder().subject_name(_name("127.0.0.1" if server else label))
            .issuer_name(self._subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(_LOOPBACK)]),
                                            critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        cert_path = self.directory / f"{label}.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return Issued(cert_path, _write_key(key, self.directory / f"{label}.key"))

    def server_context(self, *, client_ca: Path | None = None) -> ssl.SSLContext:
        """A TLS server context presenting a fresh 127.0.0.1 certificate of this CA; with ``client_ca``
        the server requires a client certificate issued by that CA (mutual TLS)."""
        leaf = self.issue(f"server-{os.urandom(4).hex()}", server=True)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(leaf.cert, leaf.key)
        if client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cafile=str(client_ca))
        return ctx


class ConnectProxy:
    """A loopback HTTP proxy that tunnels ``CONNECT host:port`` requests (RFC 9110 section 9.3.6).

    Attributes:
        url: ``http://127.0.0.1:PORT``.
        requests: the request line and lower-cased headers of every request, in arrival order.
        refuse: when set, every request gets this status line instead (e.g. ``407 Proxy Authentication
            Required``).
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.refuse: str | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                piece = conn.recv(4096)
                if not piece:
                    return
                head += piece
            lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            self.requests.append((lines[0], headers))
            method, target, _ = lines[0].split(" ", 2)
            if self.refuse is not None or method != "CONNECT":
                conn.sendall(f"HTTP/1.1 {self.refuse or '405 Method Not Allowed'}\r\n"
                             "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
                return
            host, _, port = target.rpartition(":")
            with socket.create_connection((host, int(port)), timeout=10) as upstream:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self._relay(conn, upstream)

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        while not self._stop.is_set():
            ready, _, _ = select.select([a, b], [], [], 0.1)
            for s in ready:
                data = s.recv(65536)
                if not data:
                    return
                peers[s].sendall(data)

    @classmethod
    @contextmanager
    def running(cls) -> Iterator[ConnectProxy]:
        """Run a proxy for the duration of the block; its threads end with it (bounded joins)."""
        proxy = cls()
        acceptor = threading.Thread(target=proxy._accept, daemon=True)
        acceptor.start()
        try:
            yield proxy
        finally:
            proxy._stop.set()
            acceptor.join(5)
            for t in proxy._threads:
                t.join(5)
            proxy._listener.close()

    @property
    def tunnels(self) -> list[str]:
        """The ``host:port`` of every ``CONNECT`` request."""
        return [line.split(" ")[1] for line, _ in self.requests if line.startswith("CONNECT ")]

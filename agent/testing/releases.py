"""Build release archives of a sample agent (``sample_agent.py`` here, or any script such as
``examples/selfupgrade_daemon.py``).

``build_release(out_dir, version, behaviour="good", name="demo-agent", arch="amd64") -> Path`` writes
``<name>-<version>.tar.gz`` holding exactly one member, ``<name>-linux-<arch>`` (0755), the sample agent
with ``VERSION`` and ``BEHAVIOUR`` baked in, and returns its path. The archive is built with tarfile and
gzip from the standard library, byte-for-byte reproducible (fixed mtime, uid/gid 0).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import tarfile
from pathlib import Path

# A module of this package, so that it ships in the wheel; it is read as text, never imported.
SAMPLE_AGENT = Path(__file__).with_name("sample_agent.py")


def agent_script(
    version: str, behaviour: str = "good", source: Path = SAMPLE_AGENT, interpreter: str | None = None
) -> bytes:
    """``source`` with ``VERSION`` and ``BEHAVIOUR`` replaced (bytes, UTF-8).

    Args:
        interpreter: absolute path for the shebang (e.g. the project's venv python, so that the
            self-upgrading daemon can import the library); None keeps ``#!/usr/bin/env python3``.
    """
    text = source.read_text()
    if interpreter is not None:
        text = re.sub(r"^#!.*$", f"#!{interpreter}", text, count=1, flags=re.M)
    text = re.sub(r'^VERSION = ".*"$', f'VERSION = "{version}"', text, count=1, flags=re.M)
    text = re.sub(r'^BEHAVIOUR = ".*"$', f'BEHAVIOUR = "{behaviour}"', text, count=1, flags=re.M)
    return text.encode()


def build_release(
    out_dir: Path,
    version: str,
    behaviour: str = "good",
    name: str = "demo-agent",
    arch: str = "amd64",
    source: Path = SAMPLE_AGENT,
    interpreter: str | None = None,
) -> Path:
    """Write ``out_dir/<name>-<version>.tar.gz`` and return its path (see module docstring)."""
    data = agent_script(version, behaviour, source, interpreter)
    member = tarfile.TarInfo(f"{name}-linux-{arch}")
    member.size = len(data)
    member.mode = 0o755
    member.mtime = 1_700_000_000
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(member, io.BytesIO(data))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{version}.tar.gz"
    path.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
    return path


def sha256_file(path: Path) -> str:
    """sha256 of a file, 64 lowercase hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


class ReleaseServer:
    """Serves a directory of release archives over loopback HTTP (``http.server``) from a daemon thread.

    Used by ``make demo``, the benchmarks and the real-systemd tests.

    Args:
        directory: the directory to serve.

    Attributes:
        base: ``http://127.0.0.1:PORT`` (an ephemeral port).
        requests: every request path, in arrival order (tests prove what was, or was not, fetched).
    """

    def __init__(self, directory: Path) -> None:
        import http.server
        import threading
        from typing import Any

        self.directory = directory
        self.requests: list[str] = []
        requests = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(directory), **kwargs)

            def do_GET(self) -> None:
                requests.append(self.path)
                super().do_GET()

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        loop = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05})
        loop.daemon = True
        loop.start()

    @classmethod
    def start(cls, directory: Path) -> ReleaseServer:
        """Start serving ``directory``."""
        return cls(directory)

    def url(self, archive: Path) -> str:
        """The URL of one archive of the served directory."""
        return f"{self.base}/{archive.name}"

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

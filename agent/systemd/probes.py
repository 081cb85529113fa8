"""Application health probes: the ``HealthProbe`` port (design §3 ``[health]``, design §4.3 step 7).

A probe answers None (healthy) or a one-line reason; it never raises for an unhealthy service, because a
failing probe only restarts the stability window. Configuration errors are raised when a probe is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, final
from urllib.parse import urlsplit

import httpx

from agent.errors import ConfigError
from agent.https import Transport, tls_failure
from agent.process import BoundedRunTimeout, run_bounded
from agent.redact import redact_url
from upgrade_core.ports import HealthProbe, ProbeUnreachable

__all__ = ["CommandProbe", "HttpProbe", "NullProbe", "make_probe"]

_REDACTED: Final = "REDACTED"


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


@final
class NullProbe:
    """No application probe configured: always healthy (the unit checks of design §4.3 step 7 still apply)."""

    async def check(self) -> str | None:
        """Always None."""
        return None


@final
class HttpProbe:
    """``health.http_probe``: one GET must answer 2xx within ``timeout_s`` seconds.

    Redirects are not followed (a 3xx is unhealthy) and proxy settings from the environment are ignored: a
    probe of 127.0.0.1 must reach the daemon, not a proxy. An https probe trusts the operating system's
    store (:mod:`agent.https`). Reasons name the URL redacted.

    Args:
        url: ``http://`` or ``https://`` URL.
        timeout_s: seconds for connect, each read, and the whole request.

    Raises:
        ConfigError: not an http(s) URL with a host (``health.http_probe``, shown redacted).
    """

    def __init__(self, url: str, *, timeout_s: float = 2.0) -> None:
        try:
            parts = urlsplit(url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"health.http_probe: {redact_url(url)!r} is not an http(s) URL with a host")
        self._url = url
        self._shown = redact_url(url)
        self._secrets = [s for s in (parts.username, parts.password, parts.query, parts.fragment) if s]
        self._timeout_s = timeout_s
        # One transport for the probe's life (the agent's one client construction, agent.https): the
        # operating system's trust store, no proxy, nothing from the environment. Not [download]'s
        # ca_file, client certificate or proxy: the probe talks to the daemon on this host, and a broken
        # download setting must never stop a recovery's health check.
        self._transport = Transport()

    def _scrub(self, text: str) -> str:
        text = text.replace(self._url, self._shown)
        for secret in self._secrets:
            text = text.replace(secret, _REDACTED)
        return text

    async def check(self) -> str | None:
        """GET the URL once. Returns None on 2xx, else ``"http probe URL: ..."`` (status or error); a
        connection that could not be made is a :class:`~upgrade_core.ports.ProbeUnreachable` (a candidate
        failing only that way is not made known-bad, docs/trust.md)."""
        try:
            async with self._transport.client(self._timeout_s) as client:
                response = await client.get(self._url)
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
            tls = tls_failure(exc)  # what OpenSSL said, also where httpx's text is empty
            detail = tls if tls is not None else self._scrub(str(exc)) or "no detail"
            reason = _one_line(f"http probe {self._shown}: {type(exc).__name__}: {detail}")
            if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
                # never reached the service (network not up, DNS, refused): not the release's fault alone
                return ProbeUnreachable(reason)
            return reason
        if 200 <= response.status_code < 300:
            return None
        return _one_line(f"http probe {self._shown} answered {response.status_code} {response.reason_phrase}")


@final
class CommandProbe:
    """``health.command_probe``: the command must exit 0 within ``timeout_s`` seconds.

    The command runs in its own session; on exit or timeout its whole process group is killed, so a probe
    that leaves a child behind neither stalls nor survives. stdout is discarded; the last stderr line (at
    most 4 KiB read) is quoted in the reason.

    Args:
        argv: the command and its arguments (``argv[0]`` looked up on PATH).
        timeout_s: seconds.

    Raises:
        ConfigError: ``argv`` is empty (``health.command_probe``).
    """

    def __init__(self, argv: Sequence[str], *, timeout_s: float = 5.0) -> None:
        if not argv or not argv[0]:
            raise ConfigError("health.command_probe: the command is empty")
        self._argv = tuple(argv)
        self._timeout_s = timeout_s

    async def check(self) -> str | None:
        """Run the command once. Returns None on exit 0, else ``"command probe ...: ..."``."""
        name = self._argv[0]
        try:
            done = await run_bounded(self._argv, timeout_s=self._timeout_s, max_output_bytes=4096,
                                     capture_stdout=False)
        except BoundedRunTimeout:
            return f"command probe {name} timed out after {self._timeout_s:g} s (process group killed)"
        except OSError as exc:
            return _one_line(f"command probe {name} could not run: {exc}")
        if done.returncode == 0:
            return None
        how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exited {done.returncode}"
        lines = [ln for ln in done.stderr.decode(errors="replace").splitlines() if ln.strip()]
        return _one_line(f"command probe {name} {how}" + (f": {lines[-1]}" if lines else ""))


def make_probe(http_probe: str, command_probe: Sequence[str], *, timeout_s: float = 5.0) -> HealthProbe:
    """The probe for a ``[health]`` section: HTTP if ``http_probe`` is set, else the command, else none.

    Raises:
        ConfigError: both are set (ambiguous), or the one set is malformed.
    """
    if http_probe and command_probe:
        raise ConfigError("health: set http_probe or command_probe, not both")
    if http_probe:
        return HttpProbe(http_probe, timeout_s=timeout_s)
    if command_probe:
        return CommandProbe(command_probe, timeout_s=timeout_s)
    return NullProbe()


def _are_health_probes(null: NullProbe, http: HttpProbe, command: CommandProbe) -> tuple[HealthProbe, ...]:
    """Static proof (mypy) that each probe satisfies ``upgrade_core.ports.HealthProbe``."""
    return null, http, command

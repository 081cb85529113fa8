"""``upgrade-agent ignition`` (design §10, docs/ignition.md): an Ignition config that provisions this
configuration on a new host whose ``/usr`` is read-only and which has no Python (Flatcar-family images).

The config (Ignition spec :data:`SPEC_VERSION`, the newest stable 3.x that Debian's Ignition 2.14 accepts)
holds, all outside ``/usr``:

- ``storage.files``, each mode 0600 (:data:`_SECRET_MODE`): the agent's TOML file, byte for byte, at
  ``/etc/upgrade-agent/NAME.toml``
  (:data:`CONFIG_DIR`; the one file there, so the agent finds it without ``--config`` too); the runtime
  tar.gz and the release archive as remote files (``contents.source`` the http(s) URL,
  ``contents.verification.hash`` ``sha256-HEX``) under ``R/bootstrap/``; with ``[trust]`` keys also the
  release's ``<archive URL>.minisig`` (checked by the agent, not by Ignition);
- ``storage.directories``: ``R/runtime``, where the bootstrap unit unpacks the runtime;
- ``systemd.units``: what :meth:`agent.session.session.Session.units` renders for this configuration, with the
  executables in ``R/runtime`` and ``--config`` the path above, each ``enabled: false`` (``install`` enables
  them, as on any host), and ``NAME-bootstrap.service`` (:func:`agent.systemd.units.render_bootstrap_unit`),
  ``enabled: true``.

Nothing here reads the network or writes anything: the command only renders. Every refusal is one
:class:`~agent.errors.UsageError` or :class:`~agent.errors.ConfigError` line (exit 2).
"""

from __future__ import annotations

import base64
import os
import posixpath
import urllib.parse
from typing import TYPE_CHECKING, Any, Final

from agent.errors import ConfigError, UsageError
from agent.redact import redact_url

if TYPE_CHECKING:
    from agent.config.loader import AgentConfig
    from agent.session.session import Session

__all__ = ["CONFIG_DIR", "SPEC_VERSION", "IgnitionPaths", "all_paths", "render_ignition"]

SPEC_VERSION: Final = "3.3.0"
"""Ignition config spec version written: the newest that Ignition 2.14 (Debian's package) accepts as
stable (3.4.0 is experimental there)."""

CONFIG_DIR: Final = "/etc/upgrade-agent"
"""Where the configuration lands on the new host: ``CONFIG_DIR/NAME.toml``."""

UNIT_DIR: Final = "/etc/systemd/system"
"""The only unit directory Ignition writes (``systemd.units``); ``host.unit_dir`` must be it."""

_SECRET_MODE: Final = 0o600
"""Every file the config writes: root's only. The configuration may carry credentials (a probe or keyring
URL with a password or token in it), and Ignition would otherwise write it 0644, readable by every user of
the new host; the archives and the signature are root's business alone."""
_DIR_MODE: Final = 0o755


class IgnitionPaths:
    """Where the rendered config puts things on the new host, from ``host.root`` R and ``agent.name``.

    Attributes:
        config: ``/etc/upgrade-agent/NAME.toml``.
        bootstrap_dir: ``R/bootstrap``: the downloaded archives and the marker.
        runtime_archive: ``R/bootstrap/runtime.tar.gz``.
        release_archive: ``R/bootstrap/release.archive`` (the agent reads its format from its bytes).
        signature: ``R/bootstrap/release.archive.minisig``.
        marker: ``R/bootstrap/done``, written by the bootstrap unit once ``install`` succeeded.
        runtime_dir: ``R/runtime``: the unpacked runtime; its top level holds ``upgrade-agent`` and
            ``recover-agent-upgrade``.
    """

    def __init__(self, root: str, name: str) -> None:
        self.config = posixpath.join(CONFIG_DIR, f"{name}.toml")
        self.bootstrap_dir = posixpath.join(root, "bootstrap")
        self.runtime_archive = posixpath.join(self.bootstrap_dir, "runtime.tar.gz")
        self.release_archive = posixpath.join(self.bootstrap_dir, "release.archive")
        self.signature = self.release_archive + ".minisig"
        self.marker = posixpath.join(self.bootstrap_dir, "done")
        self.runtime_dir = posixpath.join(root, "runtime")


def _under_usr(path: str) -> bool:
    norm = posixpath.normpath(path)
    return norm == "/usr" or norm.startswith("/usr/")


def _check_not_usr(path: str, key: str) -> None:
    if path and _under_usr(path):
        raise ConfigError(f"{key}: {path} is under /usr, which is read-only on the hosts Ignition provisions")


def _remote(source: str, option: str, allow_http: Any) -> str:
    """Check a source Ignition fetches on the new host: an http(s) URL, no credentials, plain http only as
    ``download.allow_http`` allows. Returns the source unchanged."""
    from agent.release.sources import check_http_allowed, parse_source
    from upgrade_core.errors import FetchError

    shown = redact_url(source)
    try:
        target = parse_source(source)
    except (FetchError, UsageError) as exc:
        raise UsageError(
            f"{option} {exc}; Ignition fetches it on the new host: give an http(s) URL"
        ) from None
    if target.local_path is not None or target.scheme not in ("http", "https"):
        raise UsageError(f"{option} {shown}: Ignition fetches it on the new host; give an http(s) URL")
    parts = urllib.parse.urlsplit(source)
    if parts.username is not None or parts.password is not None:
        raise UsageError(f"{option} {shown}: credentials in the URL would be stored in the Ignition config")
    try:
        check_http_allowed(source, allow_http)
    except FetchError as exc:
        raise UsageError(f"{option} {exc}") from None
    return source


def _digest(value: str, option: str) -> str:
    from agent.release.sources import parse_sha256

    try:
        digest = parse_sha256(value)
    except UsageError:
        raise UsageError(
            f"{option}: expected 64 hex digits (optionally 'sha256:' first), got {value!r}"
        ) from None
    if digest is None:
        raise UsageError(f"{option}: a digest is required (Ignition verifies the download with it)")
    return digest


def _config_as_loaded(path: str, cfg: AgentConfig) -> bytes:
    """The configuration file's bytes, read once more to embed them exactly (comments, key order), and
    proved to be the configuration the checks above judged: parsed again, it must equal ``cfg``.

    Raises:
        ConfigError: it cannot be read, is no longer a regular file, or changed since it was loaded.
    """
    import tomllib

    from agent.config.boot import decode_config
    from agent.config.loader import parse_config
    from agent.fs.regular import read_regular_file

    try:
        data = read_regular_file(path, trusted=True)
        again = parse_config(tomllib.loads(decode_config(path, data)), path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration again to embed it: "
                          f"{exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError:
        raise ConfigError(f"{path}: changed while upgrade-agent ignition ran; run it again") from None
    if again != cfg:
        raise ConfigError(f"{path}: changed while upgrade-agent ignition ran; run it again")
    return data


def _file(path: str, mode: int, source: str, sha256: str | None = None) -> dict[str, Any]:
    contents: dict[str, Any] = {"source": source}
    if sha256 is not None:
        contents["verification"] = {"hash": f"sha256-{sha256}"}
    return {"path": path, "mode": mode, "contents": contents}


def render_ignition(
    session: Session, *, archive: str, sha256: str, runtime: str | None, runtime_sha256: str | None
) -> dict[str, Any]:
    """The Ignition config (a JSON-ready dict, spec :data:`SPEC_VERSION`) that provisions ``session``'s
    configuration on a new read-only-``/usr`` host; see the module docstring for what it holds.

    Args:
        session: the loaded configuration (nothing of it is locked, created or written).
        archive: the release archive's http(s) URL (``--archive``).
        sha256: its digest, 64 hex digits, optionally ``sha256:`` first (``--sha256``).
        runtime: the self-contained runtime tar.gz's http(s) URL (``--runtime``); required: the new host
            has no Python.
        runtime_sha256: its digest (``--runtime-sha256``); required with ``--runtime``.

    Returns:
        The config: ``ignition``, ``storage`` (``files``, ``directories``) and ``systemd`` (``units``).

    Raises:
        UsageError: a missing runtime or digest, a malformed digest, a source that is not an http(s) URL
            (or plain http the configuration refuses, or one with credentials) (exit 2).
        ConfigError: a configured path under ``/usr``, or ``host.unit_dir`` other than
            ``/etc/systemd/system`` (exit 2).
    """
    from agent.systemd.units import bootstrap_unit_name, render_bootstrap_unit

    cfg = session.config
    if runtime is None:
        raise UsageError(
            "--runtime is required: the new host has no Python; give the runtime tar.gz's URL "
            "(--runtime URL --runtime-sha256 HEX)"
        )
    if runtime_sha256 is None:
        raise UsageError("--runtime-sha256 is required with --runtime (Ignition verifies the download)")
    allow_http = cfg.download.allow_http
    archive = _remote(archive, "--archive", allow_http)
    runtime = _remote(runtime, "--runtime", allow_http)
    digest = _digest(sha256, "--sha256")
    runtime_digest = _digest(runtime_sha256, "--runtime-sha256")
    host = cfg.host
    for key, path in (("host.root", host.root), ("host.state_dir", host.state_dir),
                      ("host.lock_path", host.lock_path), ("host.unit_dir", host.unit_dir),
                      ("host.legacy_root", host.legacy_root),
                      ("operations.spool_dir", cfg.operations.spool_dir),
                      ("operations.kubeconfig", cfg.operations.kubeconfig)):
        _check_not_usr(path, key)
    for i, mirror in enumerate(cfg.mirrors):
        _check_not_usr(mirror.path, f"mirrors[{i}].path")
    if posixpath.normpath(host.unit_dir) != UNIT_DIR:
        raise ConfigError(f"host.unit_dir: {host.unit_dir}: Ignition writes units only to {UNIT_DIR}")
    name = cfg.agent.name
    paths = IgnitionPaths(host.root, name)
    config_bytes = _config_as_loaded(session.config_path, cfg)
    files = [
        _file(paths.config, _SECRET_MODE, "data:;base64," + base64.b64encode(config_bytes).decode("ascii")),
        _file(paths.runtime_archive, _SECRET_MODE, runtime, runtime_digest),
        _file(paths.release_archive, _SECRET_MODE, archive, digest),
    ]
    signature = None
    if cfg.trust.root_keys:
        parts = urllib.parse.urlsplit(archive)
        files.append(_file(paths.signature, _SECRET_MODE, urllib.parse.urlunsplit(
            parts._replace(path=parts.path + ".minisig"))))
        signature = paths.signature
    units: list[dict[str, Any]] = [
        {"name": fname, "enabled": False, "contents": text}
        for fname, text in session.units(bin_dir=paths.runtime_dir, config_path=paths.config).items()
    ]
    units.append({
        "name": bootstrap_unit_name(name),
        "enabled": True,
        "contents": render_bootstrap_unit(
            name=name, runtime_archive=paths.runtime_archive, runtime_dir=paths.runtime_dir,
            upgrade_exe=posixpath.join(paths.runtime_dir, "upgrade-agent"), config_path=paths.config,
            release_archive=paths.release_archive, sha256=digest, signature=signature, marker=paths.marker,
        ),
    })
    for entry in files:
        _check_not_usr(entry["path"], "an Ignition file path")
    return {
        "ignition": {"version": SPEC_VERSION},
        "storage": {
            "directories": [{"path": paths.runtime_dir, "mode": _DIR_MODE}],
            "files": files,
        },
        "systemd": {"units": units},
    }


def all_paths(config: dict[str, Any]) -> list[str]:
    """Every path an Ignition config writes: files, directories, links and units (in ``/etc/systemd/system``).

    For the tests' and callers' check that nothing lands under ``/usr``.
    """
    storage = config.get("storage", {})
    out = [e["path"] for kind in ("files", "directories", "links") for e in storage.get(kind, [])]
    out += [os.path.join(UNIT_DIR, u["name"]) for u in config.get("systemd", {}).get("units", [])]
    return out

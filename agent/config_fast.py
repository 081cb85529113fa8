"""Configuration discovery and the lean path reader of the no-op recovery (SPEC 3, SPEC 9 ``recover.noop``).

This module imports only the standard library (``os``, ``re``, ``tomllib``): ``recover-agent-upgrade`` at
boot with nothing to do must finish within 3x ``python -c pass``, so it reads just the three values it needs
here and imports ``attrs``/``cattrs`` (through :mod:`agent.config`) only when there is work or an error to
report. The defaults below are the single source for both readers.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CONFIG_DIR",
    "CONFIG_ENV",
    "DEFAULT_LOCK_PATH",
    "DEFAULT_STATE_DIR",
    "NAME_RE",
    "discover_config_path",
    "machine_arch",
    "read_paths_fast",
    "substitute",
]

CONFIG_ENV = "UPGRADE_AGENT_CONFIG"
CONFIG_DIR = "/etc/upgrade-agent"
DEFAULT_STATE_DIR = "/var/lib/upgrade-agent/{name}"
DEFAULT_LOCK_PATH = "/run/upgrade-agent/{name}.lock"
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")

# platform.machine() spellings -> the release-archive spelling of SPEC 3 ``{arch}``.
_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def machine_arch(machine: str | None = None) -> str | None:
    """The ``{arch}`` value for a machine name: ``amd64``, ``arm64``, or None when unsupported.

    Args:
        machine: a ``platform.machine()`` value; None reads ``os.uname().machine`` (the same string,
            without importing :mod:`platform`).
    """
    return _ARCHES.get(machine if machine is not None else os.uname().machine)


def substitute(value: str, name: str, arch: str | None, machine: str | None = None) -> str:
    """Replace ``{name}`` and ``{arch}`` in ``value``; other braces are kept verbatim.

    Args:
        value: the configured string.
        name: ``agent.name``.
        arch: from :func:`machine_arch`; None on an unsupported machine.
        machine: the machine name for the message (None: this machine's).

    Raises:
        ValueError: ``value`` uses ``{arch}`` and ``arch`` is None (an unsupported machine).
    """
    out = value.replace("{name}", name)
    if "{arch}" in out:
        if arch is None:
            m = machine if machine is not None else os.uname().machine
            raise ValueError(f"uses {{arch}}, but machine {m!r} is neither x86_64 nor aarch64")
        out = out.replace("{arch}", arch)
    return out


def _config_error(message: str) -> Exception:
    # Imported lazily: upgrade_core pulls in attrs and cattrs, which the fast path must not pay for.
    from upgrade_core.errors import ConfigError

    return ConfigError(message)


def discover_config_path(
    cli_path: str | None,
    env: Mapping[str, str] | None = None,
    config_dir: str = CONFIG_DIR,
) -> str:
    """Find the configuration file (SPEC 3): ``--config``, else ``$UPGRADE_AGENT_CONFIG``, else the only
    ``*.toml`` in ``config_dir``.

    Args:
        cli_path: the ``--config`` value, or None.
        env: the environment (None: ``os.environ``).
        config_dir: where to look last (tests pass a temporary directory).

    Returns:
        The path to load, as given (not checked for existence when explicitly named: the loader reports it).

    Raises:
        upgrade_core.errors.ConfigError: none or several ``*.toml`` in ``config_dir`` (exit 2).
    """
    if cli_path:
        return cli_path
    environ = os.environ if env is None else env
    from_env = environ.get(CONFIG_ENV, "")
    if from_env:
        return from_env
    try:
        names = sorted(
            n for n in os.listdir(config_dir) if n.endswith(".toml") and not n.startswith(".")
        )
    except FileNotFoundError:
        names = []
    except OSError as e:
        raise _config_error(f"{config_dir}: cannot list configuration files: {e.strerror}") from None
    found = [os.path.join(config_dir, n) for n in names if os.path.isfile(os.path.join(config_dir, n))]
    if not found:
        raise _config_error(
            f"{config_dir}: no *.toml configuration found; pass --config PATH or set ${CONFIG_ENV}"
        )
    if len(found) > 1:
        raise _config_error(
            f"{config_dir}: several configurations ({', '.join(os.path.basename(p) for p in found)}); "
            f"pass --config PATH or set ${CONFIG_ENV}"
        )
    return found[0]


def read_paths_fast(path: str) -> tuple[str, str, str]:
    """Read ``(agent.name, host.state_dir, host.lock_path)`` with ``tomllib`` only, substituted.

    Checks only these three keys. Anything unexpected about them (unreadable file, bad TOML, missing or
    bad name, non-string or relative path, unsupported ``{arch}``) falls back to the full loader
    :func:`agent.config.load_config`, so the error a user sees is the same one the full loader gives, and
    the happy path agrees with it by construction. The caller must still run the full loader before doing
    any work (this reader does not reject unknown keys elsewhere in the file).

    Args:
        path: the configuration file.

    Returns:
        ``(name, state_dir, lock_path)``, paths absolute and normalised as the full loader gives them.

    Raises:
        upgrade_core.errors.ConfigError: from the full loader, when the quick read found a problem.
    """
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        name, state_dir, lock_path = _fast_values(doc)
        return name, state_dir, lock_path
    except (OSError, ValueError, TypeError, KeyError):
        pass
    from agent.config import load_config

    cfg = load_config(path)
    return cfg.agent.name, cfg.host.state_dir, cfg.host.lock_path


def _fast_values(doc: dict[str, Any]) -> tuple[str, str, str]:
    agent = doc["agent"]
    host = doc.get("host", {})
    if not isinstance(agent, dict) or not isinstance(host, dict):
        raise TypeError("not a table")
    name = agent["name"]
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValueError("bad name")
    arch = machine_arch()
    out = []
    for key, default in (("state_dir", DEFAULT_STATE_DIR), ("lock_path", DEFAULT_LOCK_PATH)):
        raw = host.get(key, default)
        if not isinstance(raw, str):
            raise TypeError(key)
        value = substitute(raw, name, arch)
        if not os.path.isabs(value):
            raise ValueError(key)
        out.append(os.path.normpath(value))
    return name, out[0], out[1]

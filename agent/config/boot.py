"""Configuration discovery and the lean path reader of the no-op recovery (design §3, design §9
``recover.noop``).

This module imports only ``os``, ``stat`` and ``binascii`` of the standard library, not even ``re``,
``typing`` or ``tomllib`` (together about 11 ms in the installed venv, where the whole boot-time no-op may
cost about 6 ms more than ``python -c pass``, design §9 ``recover.noop``): it reads just the three values it
needs with :mod:`agent.config.quicktoml` and checks the file with predicates written out by hand, and
imports ``attrs``/``cattrs`` (through :mod:`agent.config.loader`) only when there is work or an error to
report. The defaults below are the single source for both readers; the full loader holds the regular
expressions (``NAME_RE``, ``DNS_SUBDOMAIN_RE``) whose hand-written twins are here.
"""

from __future__ import annotations

import os

from agent.config.quicktoml import loads_plain
from agent.fs.regular import list_names, read_regular_file
from agent.systemd.listen import listen_stream_problem

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: the boot path does not load typing (mypy reads True)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

__all__ = [
    "CONFIG_DIR",
    "CONFIG_ENV",
    "DEFAULT_LOCK_PATH",
    "DEFAULT_STATE_DIR",
    "decode_config",
    "discover_config_path",
    "machine_arch",
    "quick_paths",
    "substitute",
]

CONFIG_ENV = "UPGRADE_AGENT_CONFIG"
CONFIG_DIR = "/etc/upgrade-agent"
DEFAULT_STATE_DIR = "/var/lib/upgrade-agent/{name}"
DEFAULT_LOCK_PATH = "/run/upgrade-agent/{name}.lock"
STATE_SUBDIRS = ("journal", "results", "trust")
"""The directories the agent keeps in ``state_dir`` (design §10): each is checked like ``state_dir`` by every
writer (:func:`agent.host.ownership.check_state`) and by the boot-time no-op answer."""
DEFAULT_ROOT = "/opt/upgrade-agent"
DEFAULT_UNIT_DIR = "/etc/systemd/system"
MIN_POLL_S = 0.1
"""The shortest ``[operations] poll_s`` (seconds): a shorter poll keeps a core busy for nothing."""
_LOWER_DIGITS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_DIGITS = frozenset("0123456789")


def plain_name(v: object) -> bool:
    """``agent.name``: ``[a-z0-9][a-z0-9._-]{0,62}`` (the full loader's ``NAME_RE``, without ``re``)."""
    return (isinstance(v, str) and 0 < len(v) <= 63 and v[0] in _LOWER_DIGITS
            and _LOWER_DIGITS.union("._-").issuperset(v))


def dns_subdomain(v: object) -> bool:
    """``[operations] node_name`` / ``namespace``: a DNS subdomain (RFC 1123, at most 253 characters), as a
    Kubernetes node name: ``[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?`` (the full loader's
    ``DNS_SUBDOMAIN_RE``)."""
    return (isinstance(v, str) and 0 < len(v) <= 253 and v[0] in _LOWER_DIGITS and v[-1] in _LOWER_DIGITS
            and _LOWER_DIGITS.union("-.").issuperset(v))

# platform.machine() spellings -> the release-archive spelling of design §3 ``{arch}``.
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
    # Imported lazily: the fast path imports the standard library only until it knows there is work.
    from agent.errors import ConfigError

    return ConfigError(message)


def discover_config_path(
    cli_path: str | None,
    env: Mapping[str, str] | None = None,
    config_dir: str = CONFIG_DIR,
) -> str:
    """Find the configuration file (design §3): ``--config``, else ``$UPGRADE_AGENT_CONFIG``, else the only
    ``*.toml`` in ``config_dir``.

    Args:
        cli_path: the ``--config`` value, or None.
        env: the environment (None: ``os.environ``).
        config_dir: where to look last (tests pass a temporary directory).

    Returns:
        The path to load, as given (not checked for existence when explicitly named: the loader reports it).

    Raises:
        agent.errors.ConfigError: none or several ``*.toml`` in ``config_dir`` (exit 2).
    """
    if cli_path:
        return cli_path
    environ = os.environ if env is None else env
    from_env = environ.get(CONFIG_ENV, "")
    if from_env:
        return from_env
    try:
        names = [n for n in list_names(config_dir) if n.endswith(".toml") and not n.startswith(".")]
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


_BOMS = (
    (b"\xef\xbb\xbf", "starts with a UTF-8 byte order mark (BOM); save it as UTF-8 without a BOM"),
    (b"\xff\xfe", "is UTF-16 (little-endian BOM); save it as UTF-8"),
    (b"\xfe\xff", "is UTF-16 (big-endian BOM); save it as UTF-8"),
)


def decode_config(path: str, data: bytes) -> str:
    """The text of a configuration file: UTF-8 without a byte order mark, no NUL byte (TOML 1.0).

    Both readers (this module's quick path and :func:`agent.config.loader.load_config`) decode through here,
    so a
    file in UTF-16, Latin-1 or with a BOM is the same one line everywhere, the boot-time recovery included.

    Args:
        path: the file, for the message.
        data: its bytes.

    Returns:
        The decoded text.

    Raises:
        agent.errors.ConfigError: naming the file, what is wrong and where (exit 2).
    """
    for bom, what in _BOMS:
        if data.startswith(bom):
            raise _config_error(f"{path}: not a valid configuration: the file {what}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise _config_error(
            f"{path}: not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} (line {line}); "
            "TOML configuration files must be UTF-8"
        ) from None
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise _config_error(
            f"{path}: not UTF-8 text: a NUL byte at offset {nul} (line {line}; UTF-16 without a BOM?); "
            "TOML configuration files must be UTF-8"
        )
    return text


def quick_paths(path: str) -> tuple[str, str, str, str] | None:
    """Read ``(agent.name, host.state_dir, host.lock_path, host.root)`` with
    :func:`agent.config.quicktoml.loads_plain` only, substituted; None when unsure.

    The whole file must pass the stdlib pre-check :func:`plausibly_valid`, and the three keys must be usable;
    anything unexpected (unreadable file, bad TOML, an unknown key, a bad value, an unsupported ``{arch}``)
    returns None, and the caller asks the full loader (:func:`agent.config.loader.read_paths`), so the error a
    user sees is the one the full loader gives. Never raises for a bad file.

    Args:
        path: the configuration file.

    Returns:
        ``(name, state_dir, lock_path, root)``, paths absolute and normalised as the full loader gives them,
        or None.
    """
    try:
        data = read_regular_file(path, trusted=True)
        if data.startswith(b"\xef\xbb\xbf") or b"\0" in data:
            return None  # the full loader words the error (decode_config)
        doc = loads_plain(data.decode("utf-8"))  # UnicodeDecodeError is a ValueError: same answer
        if doc is None:  # outside the plain subset: the full loader reads it
            return None
        return _fast_values(doc, os.path.dirname(os.path.abspath(path)))
    except (OSError, ValueError, TypeError, KeyError):
        return None


# -- a conservative, stdlib-only pre-check of the whole file (the no-op recovery path) ----------------
# Why a second description of the schema: the full loader (attrs + cattrs, agent/config/loader.py) costs about
# three times the whole design §9 ``recover.noop`` budget to import, yet a boot-time recovery with nothing to
# do must still refuse a configuration the full loader would refuse (design §7: exit 2 naming the key). This
# table only has to be at least as strict as the full loader: anything it does not recognise sends the run
# to the full loader, which produces the one precise error line. ``tests/agent_host`` pins its keys to the
# attrs classes, and the generated-config agreement test checks "fast accepts => full accepts".
def _text(v: object) -> bool:
    return isinstance(v, str) and "\0" not in v


def _abs(v: object) -> bool:
    return _text(v) and os.path.isabs(v)  # type: ignore[arg-type]


def _argv(v: object) -> bool:
    return isinstance(v, list) and all(_text(x) for x in v)


def _pos_int(v: object) -> bool:
    return type(v) is int and v > 0


def _pos_num(v: object) -> bool:
    return type(v) in (int, float) and 0 < v < float("inf")  # type: ignore[operator]


_SERVICE_CHARS = _LOWER_DIGITS.union("_.-")
_BASE64_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


def _plain_service(v: object) -> bool:
    """A plain lowercase service name, ``[a-z0-9_][a-z0-9_.-]{0,240}\\.service``; any other (still valid)
    unit name is the full loader's to judge."""
    if not isinstance(v, str) or not v.endswith(".service"):
        return False
    stem = v[: -len(".service")]
    return (0 < len(stem) <= 241 and (stem[0] in _LOWER_DIGITS or stem[0] == "_")
            and _SERVICE_CHARS.issuperset(stem))


def _after_http_scheme(v: object) -> str | None:
    """What follows ``http://`` or ``https://`` in ``v``, None when ``v`` is not a string starting so."""
    if isinstance(v, str):
        for scheme in ("http://", "https://"):
            if v.startswith(scheme):
                return v[len(scheme):]
    return None


def _http_url(v: object) -> bool:
    """``https?://`` then a non-empty authority without ``@`` or blanks, then optionally a path, query or
    fragment without blanks (``str.isspace``, the ``\\s`` of :mod:`re`)."""
    rest = _after_http_scheme(v)
    if rest is None:
        return False
    end = len(rest)
    for mark in "/?#":
        at = rest.find(mark)
        if 0 <= at < end:
            end = at
    authority = rest[:end]
    return bool(authority) and "@" not in authority and not any(c.isspace() for c in rest)


_HOST_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")


def _proxy(v: object) -> bool:
    """``[download] proxy``: empty, or a proxy without credentials: ``https?://`` then a host name or IPv4
    literal (``[A-Za-z0-9.-]+``), an optional ``:port`` (1 to 5 digits, at most 65535) and an optional
    ``/``; anything else is the full loader's to judge."""
    if v == "":
        return True
    rest = _after_http_scheme(v)
    if rest is None:
        return False
    rest = rest[:-1] if rest.endswith("/") else rest
    host, colon, port = rest.partition(":")
    if not host or not _HOST_CHARS.issuperset(host):
        return False
    return not colon or (0 < len(port) <= 5 and _DIGITS.issuperset(port) and int(port) <= 65535)


def _root_keys(v: object) -> bool:
    """``[trust] root_keys``: each a minisign public key as one bare line, base64 of 42 bytes (56 characters,
    no padding) whose first two bytes are "Ed" (so its text starts "RW"); anything else, such as a key after
    its untrusted comment, is the full loader's (agent.release.minisign.parse_public_key) to accept or
    name."""
    if not isinstance(v, list):
        return False
    import binascii

    return all(isinstance(k, str) and len(k) == 56 and k.startswith("RW") and _BASE64_CHARS.issuperset(k)
               and binascii.a2b_base64(k)[:2] == b"Ed" for k in v)


FAST_SCHEMA: dict[str, dict[str, Callable[[Any], bool]]] = {
    "agent": {
        "name": plain_name,
        # a plain .service that is not one of the agent's own; anything else: the full loader decides
        "unit": lambda v: _plain_service(v) and "-recover" not in v,
        "exec_args": _argv,
        "version_args": _argv,
        "host_root_args": _argv,
        "member": lambda v: _text(v) and v != "",
        "member_policy": lambda v: v in ("exact", "select", "none"),
        # no "{" here: a substituted path's length is the full loader's to check; only an "[IPv6]:PORT"
        # value loads a module more (ipaddress, to read the address)
        "socket": lambda v: isinstance(v, str) and "{" not in v and listen_stream_problem(v) is None,
    },
    "host": {
        "root": _abs,
        "legacy_root": lambda v: v == "" or _abs(v),
        "state_dir": _abs,
        "unit_dir": _abs,
        "lock_path": _abs,
        "systemctl_prefix": _argv,
    },
    "download": {
        "allow_http": lambda v: v in ("never", "loopback", "always"),
        "max_redirects": lambda v: type(v) is int and v >= 0,
        "timeout_s": _pos_num,
        "ca_file": lambda v: v == "" or (_abs(v) and "{" not in v),
        "client_cert": lambda v: v == "" or (_abs(v) and "{" not in v),
        "client_key": lambda v: v == "" or (_abs(v) and "{" not in v),
        "proxy": _proxy,
        "retry_deadline_s": lambda v: type(v) in (int, float) and 0 <= v < float("inf"),
    },
    "limits": {
        key: _pos_int
        for key in ("max_archive_bytes", "max_member_bytes", "max_total_bytes", "max_entries",
                    "max_zstd_window_bytes")
    },
    "verify": {"timeout_s": _pos_num, "max_output_bytes": _pos_int, "version_regex": lambda v: v == ""},
    "health": {
        "stability_s": _pos_num,
        "timeout_s": _pos_num,
        "max_attempts": _pos_int,
        "http_probe": lambda v: v == "" or _http_url(v),
        "command_probe": lambda v: _argv(v) and (not v or v[0] != ""),
    },
    "journal": {"keep_episodes": _pos_int},
    # a window expression is checked by systemd-analyze: the full loader's business
    "schedule": {
        "window": lambda v: v == "",
        "window_s": lambda v: type(v) in (int, float) and 0 <= v < float("inf"),
        "jitter_s": lambda v: type(v) in (int, float) and 0 <= v < float("inf"),
    },
    # the boot-time no-op reads no signature; a signed host's configuration must not cost it the full loader
    "trust": {
        "root_keys": _root_keys,
        "keyring": lambda v: isinstance(v, str) and "\x00" not in v,
        "require_signatures": lambda v: type(v) is bool,
        "allow_legacy_signatures": lambda v: type(v) is bool,
    },
    # no "{" in the paths here: a substituted spool path is the full loader's to check against host.root
    "operations": {
        "source": lambda v: v in ("", "spool", "kubernetes"),
        "spool_dir": lambda v: v == "" or (_abs(v) and "{" not in v),
        "node_name": lambda v: v == "" or dns_subdomain(v),
        "namespace": lambda v: v == "" or dns_subdomain(v),
        "kubeconfig": lambda v: v == "" or (_abs(v) and "{" not in v),
        "poll_s": lambda v: _pos_num(v) and v >= MIN_POLL_S,
        "allow_local_sources": lambda v: type(v) is bool,
    },
}
"""Section -> key -> a predicate the value must meet for the quick path to trust the file."""


def plausibly_valid(doc: dict[str, Any]) -> bool:
    """True when every section, key and value of ``doc`` passes :data:`FAST_SCHEMA` (stdlib only).

    False means "let the full loader decide" (it then reports the precise error); True is only ever
    returned for files the full loader accepts too.
    """
    for section, table in doc.items():
        if section == "mirrors":
            if not isinstance(table, list) or not all(
                isinstance(m, dict) and set(m) == {"path"} and _abs(m["path"]) for m in table
            ):
                return False
            continue
        schema = FAST_SCHEMA.get(section)
        if schema is None or not isinstance(table, dict):
            return False
        for key, value in table.items():
            check = schema.get(key)
            if check is None or not check(value):
                return False
    health = doc.get("health", {})
    trust = doc.get("trust", {})
    download = doc.get("download", {})
    if bool(download.get("client_cert")) != bool(download.get("client_key")):
        return False  # DownloadSection's cross-key rule: the full loader names the key
    if (trust.get("keyring") or trust.get("require_signatures")) and not trust.get("root_keys"):
        return False  # TrustSection's cross-key rules: the full loader names the key
    return not (health.get("http_probe") and health.get("command_probe"))


def _fast_values(doc: dict[str, Any], config_dir: str) -> tuple[str, str, str, str]:
    if not plausibly_valid(doc):
        raise ValueError("let the full loader check this file")
    agent = doc["agent"]
    host = doc.get("host", {})
    if not isinstance(agent, dict) or not isinstance(host, dict):
        raise TypeError("not a table")
    name = agent["name"]
    if not plain_name(name):
        raise ValueError("bad name")
    arch = machine_arch()
    out = []
    for key, default in (("state_dir", DEFAULT_STATE_DIR), ("lock_path", DEFAULT_LOCK_PATH),
                         ("root", DEFAULT_ROOT)):
        raw = host.get(key, default)
        if not isinstance(raw, str):
            raise TypeError(key)
        value = substitute(raw, name, arch)
        if not os.path.isabs(value):
            raise ValueError(key)
        out.append(os.path.normpath(value))
    from agent.config.pathrules import (  # design §10: never accept what the full loader refuses
        path_problem,
        spool_problem,
    )

    if path_problem(out[2], out[0], out[1]) is not None:
        raise ValueError("let the full loader name the key")
    operations = doc.get("operations", {})
    spool = operations.get("spool_dir", "")
    if operations.get("source") == "spool" and not spool:
        raise ValueError("let the full loader name the key")
    unit_dir = host.get("unit_dir", DEFAULT_UNIT_DIR)
    if not isinstance(unit_dir, str) or "{" in unit_dir:
        raise ValueError("let the full loader name the key")
    if spool and spool_problem(os.path.normpath(spool), out[2], out[0], unit_dir=os.path.normpath(unit_dir),
                               lock_path=out[1], config_dir=config_dir) is not None:
        raise ValueError("let the full loader name the key")
    return name, out[0], out[1], out[2]

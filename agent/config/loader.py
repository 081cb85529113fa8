"""The agent's configuration: one TOML file -> frozen attrs classes, via ``tomllib`` and ``cattrs`` (design
§3).

Every key but ``agent.name`` has the default design §3 gives. Unknown keys and bad values are refused with one
:class:`~agent.errors.ConfigError` line naming the file and the dotted key, e.g.::

    /etc/upgrade-agent/demo.toml: agent.member_policy: must be "exact", "select" or "none"

``cattrs`` structures and rejects unknown keys; its default scalar hooks are lenient (``int("5")``,
``tuple("abc")``), so strict hooks are registered below: TOML already types its values, and a string where a
number belongs is a mistake to report, not to coerce. Value rules live in attrs validators next to each
field. ``{name}`` and ``{arch}`` are substituted in every string after structuring.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)

from agent.config.boot import (
    DEFAULT_LOCK_PATH,
    DEFAULT_STATE_DIR,
    DEFAULT_UNIT_DIR,
    MIN_POLL_S,
    discover_config_path,
    machine_arch,
    quick_paths,
    substitute,
)
from agent.config.pathrules import path_problem, spool_problem
from agent.errors import ConfigError
from agent.systemd.listen import listen_stream_problem
from agent.systemd.units import check_agent_unit

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
"""``agent.name`` (the boot reader's :func:`agent.config.boot.plain_name` is its twin without ``re``)."""
DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""``[operations] node_name`` / ``namespace``: a DNS subdomain (RFC 1123, at most 253 characters), as a
Kubernetes node name (twin: :func:`agent.config.boot.dns_subdomain`)."""

__all__ = [
    "AgentConfig",
    "AgentSection",
    "DownloadSection",
    "HealthSection",
    "HostSection",
    "JournalSection",
    "LimitsSection",
    "MirrorEntry",
    "TrustSection",
    "VerifySection",
    "discover_config_path",
    "load_config",
    "parse_config",
    "read_paths",
]

T = TypeVar("T")
MemberPolicy = Literal["exact", "select", "none"]
AllowHttp = Literal["never", "loopback", "always"]
OperationsSource = Literal["", "spool", "kubernetes"]


class _BadValue(ValueError):
    """A validator's complaint about one attribute; the loader adds the section path."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


# -- validators ------------------------------------------------------------------------------------
def _positive(_inst: object, a: attrs.Attribute[Any], v: float) -> None:
    if not (math.isfinite(v) and v > 0):
        raise _BadValue(a.name, f"must be a positive number, got {v!r}")


def _poll_interval(_inst: object, a: attrs.Attribute[Any], v: float) -> None:
    _positive(_inst, a, v)
    if v < MIN_POLL_S:
        raise _BadValue(a.name, f"must be at least {MIN_POLL_S} seconds (a shorter poll keeps a core busy), "
                                f"got {v!r}")


def _non_negative_seconds(_inst: object, a: attrs.Attribute[Any], v: float) -> None:
    if not (math.isfinite(v) and v >= 0):
        raise _BadValue(a.name, f"must be 0 or a positive number of seconds, got {v!r}")


def _non_negative(_inst: object, a: attrs.Attribute[Any], v: int) -> None:
    if v < 0:
        raise _BadValue(a.name, f"must be 0 or more, got {v!r}")


def _absolute(_inst: object, a: attrs.Attribute[Any], v: str) -> None:
    if not os.path.isabs(v) or "\0" in v:
        raise _BadValue(a.name, f"must be an absolute path, got {v!r}")


def _absolute_or_empty(inst: object, a: attrs.Attribute[Any], v: str) -> None:
    if v != "":
        _absolute(inst, a, v)


def _agent_name(_inst: object, a: attrs.Attribute[Any], v: str) -> None:
    if not NAME_RE.fullmatch(v):
        raise _BadValue(a.name, f"must match [a-z0-9][a-z0-9._-]{{0,62}}, got {v!r}")


def _non_empty(_inst: object, a: attrs.Attribute[Any], v: str) -> None:
    if not v:
        raise _BadValue(a.name, "must not be empty")


def _argv(_inst: object, a: attrs.Attribute[Any], v: tuple[str, ...]) -> None:
    if any("\0" in s for s in v):
        raise _BadValue(a.name, "must not contain NUL characters")


def _command_probe(inst: object, a: attrs.Attribute[Any], v: tuple[str, ...]) -> None:
    _argv(inst, a, v)
    if v and not v[0]:
        raise _BadValue(a.name, "the program (first element) must not be empty")


def _listen_stream(_inst: object, a: attrs.Attribute[Any], v: str) -> None:
    problem = listen_stream_problem(v)
    if problem is not None:
        raise _BadValue(a.name, problem)


def _http_probe(_inst: object, a: attrs.Attribute[Any], v: str) -> None:
    if v == "":
        return
    parts = urllib.parse.urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        from agent.redact import redact_url

        shown = redact_url(v)
        raise _BadValue(a.name, f'must be "" or an http:// or https:// URL with a host, got {shown!r}')


def _proxy(_inst: object, a: attrs.Attribute[Any], v: str) -> None:
    if v == "":
        return
    try:
        parts = urllib.parse.urlsplit(v)
        ok = (parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path in ("", "/")
              and not parts.query and not parts.fragment and not any(c.isspace() for c in v))
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        ok = False
    if not ok:
        from agent.redact import redact_url

        raise _BadValue(a.name, f'must be "" or a proxy URL http://HOST:PORT or https://HOST:PORT '
                                f"(credentials allowed, no path), got {redact_url(v)!r}")


# -- the sections ----------------------------------------------------------------------------------
@attrs.frozen
class AgentSection:
    """``[agent]``: what the managed daemon is and how to recognise its binary.

    Attributes:
        name: NAME, ``[a-z0-9][a-z0-9._-]{0,62}``; required.
        unit: the agent's systemd unit name.
        exec_args: arguments after the current link in ``ExecStart``.
        version_args: arguments of the candidate's version command (design §4.3 step 4).
        member: the archive member path; ``{arch}`` is ``amd64`` or ``arm64``.
        member_policy: ``exact`` (the archive holds only the member), ``select`` (design §6) or ``none``
            (no archive: the downloaded file itself is the candidate; ``member`` is not used).
        socket: "" (the agent binds its own socket) or a ``ListenStream=`` value (a port, ``IPv4:PORT``,
            ``[IPv6]:PORT``, a unix socket path or ``@name``; :mod:`agent.systemd.listen`): ``install``
            renders ``NAME.socket`` and the agent unit takes its listening socket from systemd (design §11).
        host_root_args: () or the arguments that make a candidate print the host root it works on (the
            self-contained runtime managing itself: ``["--config", CFG, "host-root"]``); a candidate whose
            answer differs from this host's root is refused (docs/candidate.md, "A runtime that checks its
            host root").
    """

    name: str = attrs.field(validator=_agent_name)
    unit: str = attrs.field(default="{name}.service", validator=_non_empty)
    exec_args: tuple[str, ...] = attrs.field(default=(), validator=_argv)
    version_args: tuple[str, ...] = attrs.field(default=("version",), validator=_argv)
    member: str = attrs.field(default="{name}-linux-{arch}", validator=_non_empty)
    member_policy: MemberPolicy = "exact"
    socket: str = attrs.field(default="", validator=_listen_stream)
    host_root_args: tuple[str, ...] = attrs.field(default=(), validator=_argv)


@attrs.frozen
class HostSection:
    """``[host]``: where things live on the host (design §3 layout table).

    Attributes:
        root: the host root R.
        legacy_root: LEGACY for adoption (e.g. ``/usr/local``), or "" for none.
        state_dir: journal and results (0700).
        unit_dir: where unit files are written.
        lock_path: the host lock file (0600).
        systemctl_prefix: argv prefix for systemctl/systemd-run and /proc reads (e.g. ``nsenter ...``).
    """

    root: str = attrs.field(default="/opt/upgrade-agent", validator=_absolute)
    legacy_root: str = attrs.field(default="", validator=_absolute_or_empty)
    state_dir: str = attrs.field(default=DEFAULT_STATE_DIR, validator=_absolute)
    unit_dir: str = attrs.field(default=DEFAULT_UNIT_DIR, validator=_absolute)
    lock_path: str = attrs.field(default=DEFAULT_LOCK_PATH, validator=_absolute)
    systemctl_prefix: tuple[str, ...] = attrs.field(default=(), validator=_argv)


@attrs.frozen
class DownloadSection:
    """``[download]`` (design §6; TLS and proxy: docs/trust.md).

    Attributes:
        allow_http: ``never``, ``loopback`` (127.0.0.0/8, ::1, localhost) or ``always``.
        max_redirects: redirects followed at most (0: none).
        timeout_s: seconds for the whole transfer.
        ca_file: "" or the absolute path of a PEM bundle trusted beside the operating system's store.
        client_cert: "" or the absolute path of a PEM client certificate for mutual TLS (with
            ``client_key``).
        client_key: "" or the absolute path of its unencrypted PEM private key (with ``client_cert``).
        proxy: "" or an ``http://``/``https://`` proxy URL; proxies from the environment are never used.
        retry_deadline_s: seconds during which transient download failures are tried again, resuming by
            ``Range`` (see :mod:`agent.release.fetch`); 0 is one attempt.

    The files are read and checked when a download is about to start
    (:func:`agent.release.tls.download_transport`), not here: commands that download nothing never read them.
    """

    allow_http: AllowHttp = "loopback"
    max_redirects: int = attrs.field(default=5, validator=_non_negative)
    timeout_s: float = attrs.field(default=600.0, validator=_positive)
    ca_file: str = attrs.field(default="", validator=_absolute_or_empty)
    client_cert: str = attrs.field(default="", validator=_absolute_or_empty)
    client_key: str = attrs.field(default="", validator=_absolute_or_empty)
    proxy: str = attrs.field(default="", validator=_proxy)
    retry_deadline_s: float = attrs.field(default=300.0, validator=_non_negative_seconds)

    def __attrs_post_init__(self) -> None:
        if self.client_cert and not self.client_key:
            raise _BadValue("client_cert", "needs client_key (mutual TLS takes both)")
        if self.client_key and not self.client_cert:
            raise _BadValue("client_key", "needs client_cert (mutual TLS takes both)")


@attrs.frozen
class LimitsSection:
    """``[limits]``: bounds on archives (case C04). All in bytes except ``max_entries``."""

    max_archive_bytes: int = attrs.field(default=268435456, validator=_positive)
    max_member_bytes: int = attrs.field(default=268435456, validator=_positive)
    max_total_bytes: int = attrs.field(default=536870912, validator=_positive)
    max_entries: int = attrs.field(default=10000, validator=_positive)
    max_zstd_window_bytes: int = attrs.field(default=33554432, validator=_positive)


def _version_regex(_inst: object, a: attrs.Attribute[Any], v: str) -> None:
    from agent.release.verify import compile_version_regex

    if v:
        try:
            compile_version_regex(v)
        except ValueError as e:
            raise _BadValue(a.name, str(e)) from None


@attrs.frozen
class VerifySection:
    """``[verify]``: the version command's bounds (case C10) and how its version is read (C29).

    Attributes:
        timeout_s: seconds for the whole version command.
        max_output_bytes: bytes read at most from each of stdout and stderr.
        version_regex: "" for the default version token, else a regular expression with exactly one
            capture group: the version (see :mod:`agent.release.verify`).
    """

    timeout_s: float = attrs.field(default=30.0, validator=_positive)
    max_output_bytes: int = attrs.field(default=65536, validator=_positive)
    version_regex: str = attrs.field(default="", validator=_version_regex)


@attrs.frozen
class HealthSection:
    """``[health]`` (design §4.3 step 7).

    Attributes:
        stability_s: monotonic seconds the new process must hold.
        timeout_s: seconds per attempt.
        max_attempts: attempts before rollback.
        http_probe: "" or an http(s) URL that must answer 2xx.
        command_probe: () or an argv that must exit 0.
    """

    stability_s: float = attrs.field(default=3.0, validator=_positive)
    timeout_s: float = attrs.field(default=60.0, validator=_positive)
    max_attempts: int = attrs.field(default=3, validator=_positive)
    http_probe: str = attrs.field(default="", validator=_http_probe)
    command_probe: tuple[str, ...] = attrs.field(default=(), validator=_command_probe)


@attrs.frozen
class JournalSection:
    """``[journal]``: ``keep_episodes`` closed episodes are retained by compaction."""

    keep_episodes: int = attrs.field(default=50, validator=_positive)


def _root_keys(_inst: object, a: attrs.Attribute[Any], v: tuple[str, ...]) -> None:
    if not v:
        return  # no keys: nothing to parse, and cryptography stays unimported
    from agent.release.minisign import parse_public_key
    from upgrade_core.errors import SignatureError

    for i, key in enumerate(v):
        try:
            parse_public_key(key, "key")
        except SignatureError as e:
            raise _BadValue(f"{a.name}[{i}]", str(e).removeprefix("key: ")) from None


def _keyring_source(_inst: object, a: attrs.Attribute[Any], v: str) -> None:
    if v and "\x00" in v:
        raise _BadValue(a.name, "must not contain a NUL byte")


@attrs.frozen
class TrustSection:
    """``[trust]`` (design §10, docs/trust.md): who may sign releases.

    Attributes:
        root_keys: minisign public keys (the ``RW...`` line of a ``.pub`` file).
        keyring: "" or a source (file or URL) of a root-signed keyring of signing keys (see
            :mod:`agent.release.trust`); its signature is ``<keyring>.minisig``.
        require_signatures: None (the default) means true whenever a key is configured.
        allow_legacy_signatures: also accept minisign's legacy ``Ed`` signatures (over the whole file, not
            pre-hashed); false by default because minisign does not sign the algorithm bytes.
    """

    root_keys: tuple[str, ...] = attrs.field(default=(), validator=_root_keys)
    keyring: str = attrs.field(default="", validator=_keyring_source)
    require_signatures: bool | None = None
    allow_legacy_signatures: bool = False

    def __attrs_post_init__(self) -> None:
        if self.keyring and not self.root_keys:
            raise _BadValue("keyring", "needs root_keys: a keyring is trusted only when a root key signed it")
        if self.require_signatures and not self.root_keys:
            raise _BadValue("require_signatures", "is true but no root_keys are configured")

    @property
    def required(self) -> bool:
        """Signatures are required: as configured, else whenever a key is configured."""
        return bool(self.root_keys) if self.require_signatures is None else self.require_signatures


def _node_name(_inst: object, a: attrs.Attribute[Any], v: str) -> None:
    # a Kubernetes node name is a DNS subdomain (RFC 1123, at most 253 characters)
    if v and not DNS_SUBDOMAIN_RE.fullmatch(v):
        raise _BadValue(a.name, "must be a DNS subdomain name (lowercase letters, digits, '-' and '.')")


@attrs.frozen
class OperationsSection:
    """``[operations]`` (design §10, docs/managed.md): where ``upgrade-agent operator`` takes operations from.

    Attributes:
        source: "" (no operator), "spool" or "kubernetes".
        spool_dir: spool: the absolute directory holding ``<id>.json`` (in) and ``<id>.status.json`` (out);
            owned by root (the effective user), not group- or world-writable.
        node_name: this host's node name; "" means the host name (``socket.gethostname()``).
        namespace: kubernetes: the namespace watched; "" means the service account's namespace in a pod,
            else ``default``.
        kubeconfig: kubernetes: "" for the in-cluster service account, else an absolute kubeconfig path.
        poll_s: spool: seconds between two scans of the directory (the operator's idle cost); at least
            ``MIN_POLL_S`` (0.1 s).
        allow_local_sources: an operation may name a local path or ``file://`` URL as its archive or
            signature; off by default, since whoever may write an operation (a spool file, a Kubernetes
            object) would otherwise make root read any file (docs/managed.md, "A control plane is not root").
    """

    source: OperationsSource = ""
    spool_dir: str = attrs.field(default="", validator=_absolute_or_empty)
    node_name: str = attrs.field(default="", validator=_node_name)
    namespace: str = attrs.field(default="", validator=_node_name)
    kubeconfig: str = attrs.field(default="", validator=_absolute_or_empty)
    poll_s: float = attrs.field(default=2.0, validator=_poll_interval)
    allow_local_sources: bool = False

    def __attrs_post_init__(self) -> None:
        if self.source == "spool" and not self.spool_dir:
            raise _BadValue("spool_dir", 'is required when source = "spool"')

    @property
    def node(self) -> str:
        """``node_name``, or this host's name."""
        import socket

        return self.node_name or socket.gethostname()


@attrs.frozen
class ScheduleSection:
    """``[schedule]`` (docs/configuration.md): the maintenance window in which a switch may happen.

    Attributes:
        window: "" (a switch may happen any time) or a systemd calendar expression (systemd.time(7), what
            ``OnCalendar=`` takes) naming when a window starts; checked by the real ``systemd-analyze
            calendar`` when the configuration is loaded (:func:`parse_config`).
        window_s: the window's length, seconds; > 0 when ``window`` is set.
        jitter_s: the most a host waits into each window before it switches, seconds, ``< window_s``; each
            host's own delay derives from its machine id (:func:`upgrade_core._window.host_delay_s`).
    """

    window: str = ""
    window_s: float = attrs.field(default=0.0, validator=_non_negative_seconds)
    jitter_s: float = attrs.field(default=0.0, validator=_non_negative_seconds)

    def __attrs_post_init__(self) -> None:
        if self.window and self.window_s <= 0:
            raise _BadValue("window_s", "must be more than 0 when window is set")
        if self.window and self.jitter_s >= self.window_s:
            raise _BadValue("jitter_s", f"must be less than window_s ({self.window_s:g})")


@attrs.frozen
class MirrorEntry:
    """One ``[[mirrors]]`` entry: a path that receives a verified copy of the current slot
    (docs/configuration.md ``[[mirrors]]``).

    Attributes:
        path: the mirror file: absolute; with ``active_from``, relative to the active machine's root (no
            ``..``).
        root: the mirror tree it lies in ("" = ``path``'s directory); the tree may belong to another uid
            (a container's root), so the copy is confined beneath it: no component below ``root`` is
            followed if it is a symlink (design §10). Must be "" with ``active_from`` (the machine's root is
            the tree).
        active_from: "" or the absolute path of a JSON file the host keeps that names the active machine
            (the seeds' kube1/kube2 nspawn machines); read at every copy (SPEC §12).
        active_key: with ``active_from``, the JSON pointer (RFC 6901) of the active machine's root in it (an
            absolute path string).
    """

    path: str = attrs.field()
    root: str = attrs.field(default="", validator=_absolute_or_empty)
    active_from: str = attrs.field(default="", validator=_absolute_or_empty)
    active_key: str = attrs.field(default="")

    @path.validator
    def _path_form(self, _attribute: object, value: str) -> None:
        if not self.active_from:
            if not os.path.isabs(value):
                raise _BadValue("path", f"must be an absolute path (or relative with active_from), "
                                        f"got {value!r}")
            return
        parts = value.split("/")
        if not value or os.path.isabs(value) or ".." in parts:
            raise _BadValue("path", f"must be relative to the active machine's root (no leading / and no ..) "
                                    f"with active_from, got {value!r}")

    @root.validator
    def _root_holds_path(self, _attribute: object, value: str) -> None:
        if value and self.active_from:
            raise _BadValue("root", "must be empty with active_from: the active machine's root is the tree")
        if value and not os.path.normpath(self.path).startswith(os.path.normpath(value).rstrip("/") + "/"):
            raise _BadValue("root", f"{value} does not hold path {self.path}")

    @active_key.validator
    def _pointer(self, _attribute: object, value: str) -> None:
        if bool(value) != bool(self.active_from):
            raise _BadValue("active_key", "active_from and active_key go together")
        if value and not value.startswith("/"):
            raise _BadValue("active_key", f"must be a JSON pointer (RFC 6901) starting with /, got {value!r}")


@attrs.frozen
class AgentConfig:
    """The whole configuration, substituted and validated.

    Attributes:
        source: the file it was loaded from (for messages).
        agent, host, download, limits, verify, health, journal: the sections of design §3.
        trust, operations: the sections of design §10.
        schedule: the maintenance window (docs/configuration.md).
        mirrors: the ``[[mirrors]]`` entries, in file order.
    """

    agent: AgentSection
    host: HostSection = attrs.Factory(HostSection)
    download: DownloadSection = attrs.Factory(DownloadSection)
    limits: LimitsSection = attrs.Factory(LimitsSection)
    verify: VerifySection = attrs.Factory(VerifySection)
    health: HealthSection = attrs.Factory(HealthSection)
    journal: JournalSection = attrs.Factory(JournalSection)
    trust: TrustSection = attrs.Factory(TrustSection)
    operations: OperationsSection = attrs.Factory(OperationsSection)
    schedule: ScheduleSection = attrs.Factory(ScheduleSection)
    mirrors: tuple[MirrorEntry, ...] = ()
    source: str = ""


# -- strict structuring ----------------------------------------------------------------------------
def _describe(v: object) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "a table"}.get(type(v), type(v).__name__)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)

    def s_str(v: object, _t: object) -> str:
        if not isinstance(v, str):
            raise TypeError(f"must be a string, got {_describe(v)}")
        return v

    def s_int(v: object, _t: object) -> int:
        if type(v) is not int:
            raise TypeError(f"must be an integer, got {_describe(v)}")
        return v

    def s_bool(v: object, _t: object) -> bool:
        if type(v) is not bool:
            raise TypeError(f"must be a boolean (true or false), got {_describe(v)}")
        return v

    def s_float(v: object, _t: object) -> float:
        if type(v) not in (int, float):
            raise TypeError(f"must be a number, got {_describe(v)}")
        return float(v)  # type: ignore[arg-type]

    def is_literal(t: Any) -> bool:
        return get_origin(t) is Literal

    def s_literal(v: object, t: Any) -> object:
        options = get_args(t)
        if v not in options or type(v) is not str:
            quoted = [f'"{o}"' for o in options]
            choice = ", ".join(quoted[:-1]) + f" or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
            shown = f'"{v}"' if type(v) is str else _describe(v)  # TOML's quoting, never a Python repr
            raise ValueError(f"must be {choice}, got {shown}")
        return v

    def is_var_tuple(t: Any) -> bool:
        args = get_args(t)
        return get_origin(t) is tuple and len(args) == 2 and args[1] is Ellipsis

    def var_tuple_factory(t: Any) -> Callable[[object, object], tuple[Any, ...]]:
        (item_type, _) = get_args(t)
        inner = conv.get_structure_hook(item_type)

        def s_tuple(v: object, _t: object) -> tuple[Any, ...]:
            if not isinstance(v, list):
                raise TypeError(f"must be an array, got {_describe(v)}")
            out, errors = [], []
            for i, item in enumerate(v):
                try:
                    out.append(inner(item, item_type))
                except Exception as e:
                    e.__notes__ = [*getattr(e, "__notes__", []), IterableValidationNote(
                        f"index {i}", i, item_type)]
                    errors.append(e)
            if errors:
                raise IterableValidationError(f"while structuring {t}", errors, t)
            return tuple(out)

        return s_tuple

    conv.register_structure_hook(str, s_str)
    conv.register_structure_hook(int, s_int)
    conv.register_structure_hook(float, s_float)
    conv.register_structure_hook(bool, s_bool)
    conv.register_structure_hook_func(is_literal, s_literal)
    conv.register_structure_hook_factory(is_var_tuple, var_tuple_factory)
    return conv


_CONVERTER = _make_converter()


def _errors(exc: BaseException, path: str) -> list[tuple[str, str]]:
    """Flatten cattrs' exception groups into ``(dotted key, message)`` pairs, in file order."""
    if isinstance(exc, _BadValue):
        return [(_join(path, exc.key), str(exc))]
    if isinstance(exc, ForbiddenExtraKeysError):
        return [(_join(path, k), "unknown key") for k in sorted(exc.extra_fields)]
    if isinstance(exc, ClassValidationError | IterableValidationError):
        out: list[tuple[str, str]] = []
        for sub in exc.exceptions:
            sub_path = path
            for note in getattr(sub, "__notes__", []):
                if isinstance(note, AttributeValidationNote):
                    sub_path = _join(path, note.name)
                elif isinstance(note, IterableValidationNote):
                    sub_path = f"{path}[{note.index}]"
            out.extend(_errors(sub, sub_path))
        return out
    if isinstance(exc, KeyError):
        if path == "agent":  # no [agent] table at all: name the key that is actually required
            return [("agent.name", "required key is missing (no [agent] table)")]
        return [(path, "required key is missing")]
    if isinstance(exc, TypeError | ValueError) and str(exc).startswith("must"):
        return [(path, str(exc))]
    if isinstance(exc, TypeError | AttributeError):
        return [(path or "(top level)", "must be a table")]
    return [(path or "(top level)", str(exc))]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _substituted(cfg: AgentConfig, machine: str | None) -> AgentConfig:
    arch = machine_arch(machine)
    name = cfg.agent.name

    def sub(section: Any, prefix: str) -> Any:
        changes: dict[str, Any] = {}
        for a in attrs.fields(type(section)):
            v = getattr(section, a.name)
            try:
                if isinstance(v, str):
                    changes[a.name] = substitute(v, name, arch, machine)
                elif isinstance(v, tuple) and all(isinstance(x, str) for x in v):
                    changes[a.name] = tuple(substitute(x, name, arch, machine) for x in v)
            except ValueError as e:
                raise _BadValue(f"{prefix}.{a.name}", str(e)) from None
        for k, v in changes.items():
            if k in ("root", "legacy_root", "state_dir", "unit_dir", "lock_path", "path", "spool_dir",
                     "kubeconfig", "ca_file", "client_cert", "client_key", "active_from") and v:
                changes[k] = os.path.normpath(v)
        try:
            return attrs.evolve(section, **changes)
        except _BadValue as e:
            raise _BadValue(f"{prefix}.{e.key}", str(e)) from None

    return attrs.evolve(
        cfg,
        agent=sub(cfg.agent, "agent"),
        host=sub(cfg.host, "host"),
        download=sub(cfg.download, "download"),
        health=sub(cfg.health, "health"),
        operations=sub(cfg.operations, "operations"),
        mirrors=tuple(sub(m, f"mirrors[{i}]") for i, m in enumerate(cfg.mirrors)),
    )


def _check_paths(host: HostSection, operations: OperationsSection, config_dir: str | None) -> None:
    """design §10 rules across keys (:func:`agent.config.pathrules.path_problem`), after substitution and
    normalisation: no system directory itself, no ``host.root``/``host.state_dir`` overlap, no lock file
    inside ``host.root``.

    Raises:
        _BadValue: naming the key.
    """
    problem = path_problem(host.root, host.state_dir, host.lock_path)
    if problem is None and operations.spool_dir:
        problem = spool_problem(operations.spool_dir, host.root, host.state_dir, unit_dir=host.unit_dir,
                                lock_path=host.lock_path, config_dir=config_dir)
    if problem is not None:
        raise _BadValue(*problem)


def parse_config(doc: Mapping[str, Any], source: str, machine: str | None = None) -> AgentConfig:
    """Structure, validate and substitute an already parsed TOML document.

    Args:
        doc: the ``tomllib`` result.
        source: the file name used in messages.
        machine: a ``platform.machine()`` value for ``{arch}``; None reads this machine's.

    Returns:
        The configuration, with ``{name}`` and ``{arch}`` substituted and paths normalised.

    Raises:
        ConfigError: ``source: dotted.key: message`` for the first problem in file order (unknown key,
            missing ``agent.name``, wrong type, bad value, ``{arch}`` on an unsupported machine), then the
            cross-key path rules of design §10 (a system directory, ``host.root``/``host.state_dir`` overlap,
            a lock inside ``host.root``), then ``schedule.window`` as ``systemd-analyze calendar`` judges it.
    """
    if "source" in doc:
        raise ConfigError(f"{source}: source: unknown key")
    try:
        cfg = _CONVERTER.structure(doc, AgentConfig)
        cfg = attrs.evolve(_substituted(cfg, machine), source=source)
        config_dir = os.path.dirname(os.path.abspath(source)) if os.path.isabs(source) else None
        _check_paths(cfg.host, cfg.operations, config_dir)
    except (ClassValidationError, _BadValue) as e:
        problems = _errors(e, "")
        key, message = problems[0] if problems else ("(top level)", str(e))
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"{source}: {key}: {message}{more}") from None
    try:
        check_agent_unit(cfg.agent.name, cfg.agent.unit)
        if cfg.schedule.window:
            from agent.systemd.calendar import check_calendar

            check_calendar(cfg.schedule.window)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return cfg


def load_config(path: str, machine: str | None = None) -> AgentConfig:
    """Load one configuration file (design §3).

    Args:
        path: the TOML file (see :func:`discover_config_path`).
        machine: override of ``platform.machine()`` for ``{arch}`` (tests).

    Raises:
        ConfigError: the file cannot be read, is not a regular file (a FIFO or device is never opened
            for reading), is owned by another user than root or the effective user or is group- or
            world-writable (:func:`~agent.fs.regular.read_regular_file` with ``trusted``), is not valid TOML,
            or has an unknown key or a bad value; the message names the file and the dotted key (exit 2).
    """
    from agent.config.boot import decode_config
    from agent.fs.regular import read_regular_file

    try:
        doc = tomllib.loads(decode_config(path, read_regular_file(path, trusted=True)))
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read configuration: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    return parse_config(doc, path, machine)



def read_paths(path: str) -> tuple[str, str, str]:
    """``(agent.name, host.state_dir, host.lock_path)`` of one configuration file: the boot reader's quick
    answer (:func:`agent.config.boot.quick_paths`) when it has one, else the full loader's.

    Raises:
        agent.errors.ConfigError: the full loader's one line, when the file is bad.
    """
    quick = quick_paths(path)
    if quick is not None:
        return quick[:3]
    cfg = load_config(path)
    return cfg.agent.name, cfg.host.state_dir, cfg.host.lock_path

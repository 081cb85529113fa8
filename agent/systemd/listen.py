"""The ``[agent] socket`` rule: which ``ListenStream=`` values the agent renders into ``NAME.socket``
(systemd.socket(5)), standard library only.

Shared by the full loader (:mod:`agent.config.loader`), the boot path's quick reader
(:mod:`agent.config.boot`, which must never accept what the full loader refuses) and the unit renderer
(:mod:`agent.systemd.units`). The accepted forms are the stream addresses systemd.socket(5) lists, minus
those that would need quoting in a unit file or name more than one address:

- a port, ``8080`` (1 to 65535): every address of the host, IPv4 and IPv6;
- ``IPv4:PORT``, ``127.0.0.1:8080`` (four decimal numbers 0 to 255, no leading zeros);
- ``[IPv6]:PORT``, ``[::1]:8080`` (no ``%`` scope: ``%`` starts a specifier in a unit file);
- an absolute unix socket path, ``/run/demo-agent.sock``, at most 107 bytes (``sun_path`` holds 108 with
  its NUL, unix(7)), normalised (no ``//``, ``.`` or ``..`` component, no trailing ``/``);
- an abstract unix socket, ``@demo-agent``, at most 107 bytes after the ``@``.

No whitespace, control character, ``%`` (a specifier, systemd.unit(5)) or ``\\`` (an escape) anywhere. Host
names are refused: systemd binds addresses, it does not resolve names. ``""`` means no socket.
"""

from __future__ import annotations

__all__ = ["MAX_UNIX_PATH_BYTES", "listen_is_ip", "listen_stream_problem"]

MAX_UNIX_PATH_BYTES = 107
"""The longest unix socket path or abstract name, in bytes: ``sun_path`` is 108 bytes with the NUL
(unix(7))."""

_DIGITS = frozenset("0123456789")
_FORMS = ('a port ("8080"), "IPv4:PORT" ("127.0.0.1:8080"), "[IPv6]:PORT" ("[::1]:8080"), an absolute '
          'unix socket path or "@name" (systemd.socket(5) ListenStream=)')


def _char(c: str) -> str:
    """A character as a person reads it in a message: ``'%'``, ``a space``, ``U+0009``."""
    if c == " ":
        return "a space"
    return f"'{c}'" if c.isprintable() else f"U+{ord(c):04X}"


def _port_problem(text: str) -> str | None:
    if not text or not _DIGITS.issuperset(text) or len(text) > 5 or (len(text) > 1 and text[0] == "0"):
        if not text:
            return "has no port after the last ':'"
        return f'port "{text}" is not a decimal number from 1 to 65535'
    if not 1 <= int(text) <= 65535:
        return f"port {text} is out of range (1 to 65535)"
    return None


def _ipv4(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 4 and all(
        p and len(p) <= 3 and _DIGITS.issuperset(p) and (p == "0" or p[0] != "0") and int(p) <= 255
        for p in parts
    )


def _ipv6(text: str) -> bool:
    import ipaddress  # only for the bracketed form: the boot path of other configurations never loads it

    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def listen_stream_problem(value: str) -> str | None:
    """What is wrong with ``value`` as ``[agent] socket``, or None when it is ``""`` or one of the accepted
    forms (see the module doc).

    Args:
        value: the configured string, after ``{name}`` substitution.

    Returns:
        None, or one phrase saying what is wrong and what is accepted (the caller prefixes the key), e.g.
        ``"localhost:80" is not a ListenStream= stream address: use a port ("8080"), ...``.
    """
    if value == "":
        return None
    bad = [c for c in value if c.isspace() or not c.isprintable() or c in "%\\"]
    if bad:
        return (f"holds {_char(bad[0])}: no whitespace, control character, '%' or '\\' (systemd would "
                "read them as separators, specifiers or escapes)")
    if value[0] in "/@":
        return _unix_problem(value)
    if _DIGITS.issuperset(value):
        return _port_problem(value)
    host, colon, port = value.rpartition(":")
    if colon:
        if host.startswith("[") and host.endswith("]") and _ipv6(host[1:-1]):
            return _port_problem(port)
        if _ipv4(host):
            return _port_problem(port)
    return f'"{value}" is not a ListenStream= stream address: use {_FORMS}'


def _unix_problem(value: str) -> str | None:
    size = len(value.encode("utf-8", errors="surrogateescape")) - (1 if value[0] == "@" else 0)
    if size > MAX_UNIX_PATH_BYTES or (value[0] == "@" and size == 0):
        return (f'"{value}": a unix socket path or abstract name must be 1 to {MAX_UNIX_PATH_BYTES} bytes '
                f"(unix(7) sun_path), got {size}")
    if value[0] == "/":
        parts = value.split("/")[1:]
        if value == "/" or any(p in ("", ".", "..") for p in parts):
            return f"\"{value}\": a unix socket path must be normalised (no '//', '.', '..' or trailing '/')"
    return None


def listen_is_ip(value: str) -> bool:
    """True when an accepted ``value`` (see :func:`listen_stream_problem`) is a TCP address (a port or
    ``ADDRESS:PORT``), False for a unix socket path or abstract name."""
    return value[:1] not in ("/", "@")

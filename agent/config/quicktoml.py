"""A reader for the plain subset of TOML 1.0 that configuration files are written in, for the boot-time no-op
recovery only (design §9 ``recover.noop``); standard library only, and not even :mod:`re`.

Why not :mod:`tomllib`: importing it loads ``re``, ``typing`` and ``datetime``, about 11 ms on the benchmark
VM, where the whole no-op recovery may cost about 6 ms more than ``python -c pass`` in the installed venv.
This reader answers only when it is sure and gives up otherwise: :func:`loads_plain` returns the same
document as ``tomllib.loads`` for every text it accepts, and None for everything else (the caller then
reads the file with the full loader, which uses ``tomllib`` and words any error). It accepts, one item per
line:

- blank lines and ``#`` comments (TOML's comment rules: no control character but tab);
- table headers ``[name]`` and array-of-tables headers ``[[name]]`` with a bare name (``A-Za-z0-9_-``),
  each table defined once, never both ways;
- ``key = value`` with a bare key, once per table, and an optional comment after the value, where a value
  is a basic string without escapes (``"..."``, no backslash), a literal string (``'...'``), ``true`` or
  ``false``, a decimal integer (no sign on a leading zero, no ``_``), a decimal float of the form
  ``1.5`` (no exponent, no ``_``, no ``inf``/``nan``), or a one-line array of strings and integers.

Anything else (dotted or quoted keys, multi-line strings or arrays, escapes, inline tables, dates, hex
integers, a bare carriage return, an unterminated anything) is None. ``tests/agent_host/test_quicktoml.py``
checks the agreement with ``tomllib`` on generated documents.
"""

from __future__ import annotations

__all__ = ["loads_plain"]

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_DIGITS = frozenset("0123456789")
_WS = " \t"


class _Unsure(Exception):
    """The text is outside the subset (or not TOML at all): the full loader decides."""


def _no_control(text: str) -> None:
    """TOML 1.0 forbids U+0000-U+0008, U+000A-U+001F and U+007F in comments and strings (tab is allowed)."""
    for ch in text:
        if (ch < " " and ch != "\t") or ch == "\x7f":
            raise _Unsure


def _bare(name: str) -> str:
    if not name or not _BARE.issuperset(name):
        raise _Unsure
    return name


def _string(line: str, at: int) -> tuple[str, int]:
    """The string starting at ``line[at]`` (``"`` or ``'``), and the index after its closing quote."""
    quote = line[at]
    end = line.find(quote, at + 1)
    if end < 0:
        raise _Unsure
    value = line[at + 1:end]
    if quote == '"' and "\\" in value:
        raise _Unsure  # escapes: the full parser's
    if value == "" and line[end + 1:end + 2] == quote:
        raise _Unsure  # a multi-line string's opening
    _no_control(value)
    return value, end + 1


def _number(token: str) -> int | float:
    sign = token[:1] in ("+", "-")
    body = token[1:] if sign else token
    whole, dot, fraction = body.partition(".")
    if not whole or not _DIGITS.issuperset(whole) or (len(whole) > 1 and whole[0] == "0"):
        raise _Unsure
    if dot:
        if not fraction or not _DIGITS.issuperset(fraction):
            raise _Unsure
        return float(token)
    return int(token)


def _scalar(line: str, at: int) -> tuple[object, int]:
    """A string, boolean or number starting at ``line[at]``; the value and the index after it."""
    if line[at] in "\"'":
        return _string(line, at)
    end = at
    while end < len(line) and line[end] not in " \t,]#":
        end += 1
    token = line[at:end]
    if token == "true":
        return True, end
    if token == "false":
        return False, end
    return _number(token), end


def _skip_ws(line: str, at: int) -> int:
    while at < len(line) and line[at] in _WS:
        at += 1
    return at


def _array(line: str, at: int) -> tuple[list[object], int]:
    """A one-line array of strings and integers starting at ``line[at] == "["``."""
    items: list[object] = []
    at = _skip_ws(line, at + 1)
    while True:
        if at >= len(line):
            raise _Unsure  # multi-line: the full parser's
        if line[at] == "]":
            return items, at + 1
        if line[at] in "[{#,":
            raise _Unsure
        value, at = _scalar(line, at)
        if type(value) not in (str, int):
            raise _Unsure  # booleans and floats in arrays: not needed here
        items.append(value)
        at = _skip_ws(line, at)
        if at < len(line) and line[at] == ",":
            at = _skip_ws(line, at + 1)
        elif at >= len(line) or line[at] != "]":
            raise _Unsure


def _tail(line: str, at: int) -> None:
    """After a value or a header: only blanks and an optional comment."""
    at = _skip_ws(line, at)
    if at < len(line):
        if line[at] != "#":
            raise _Unsure
        _no_control(line[at + 1:])


def _parse(text: str) -> dict[str, object]:
    doc: dict[str, object] = {}
    table: dict[str, object] = doc
    headers: set[str] = set()
    text = text.replace("\r\n", "\n")
    if "\r" in text:
        raise _Unsure  # a carriage return that does not end a line
    for line in text.split("\n"):
        line = line.strip(_WS)
        if not line:
            continue
        if line[0] == "#":
            _no_control(line[1:])
            continue
        if line.startswith("[["):
            end = line.find("]]")
            if end < 0:
                raise _Unsure
            name = _bare(line[2:end])
            _tail(line, end + 2)
            tables = doc.setdefault(name, [])
            if name in headers or not isinstance(tables, list):
                raise _Unsure
            table = {}
            tables.append(table)
            continue
        if line[0] == "[":
            end = line.find("]")
            if end < 0:
                raise _Unsure
            name = _bare(line[1:end])
            _tail(line, end + 1)
            if name in headers or name in doc:
                raise _Unsure  # defined twice, or an array of tables already
            headers.add(name)
            table = {}
            doc[name] = table
            continue
        key, eq, rest = line.partition("=")
        key = _bare(key.rstrip(_WS))
        if not eq or key in table:
            raise _Unsure
        at = _skip_ws(line, len(line) - len(rest))
        if at >= len(line):
            raise _Unsure
        value, at = _array(line, at) if line[at] == "[" else _scalar(line, at)
        _tail(line, at)
        table[key] = value
    return doc


def loads_plain(text: str) -> dict[str, object] | None:
    """``tomllib.loads(text)`` when ``text`` is in the plain subset described above; None otherwise.

    Args:
        text: the decoded file (the caller refuses a BOM and NUL bytes first).

    Returns:
        The document (tables as dicts, arrays of tables as lists of dicts), or None: outside the subset, or
        not valid TOML. Never raises.
    """
    try:
        return _parse(text)
    except (_Unsure, ValueError):
        return None

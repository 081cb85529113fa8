"""Text that came from elsewhere (a control plane's spec, an API server's answer, a journal record), made
safe to put in a log line, a status document or human output: one line, nothing a terminal interprets,
bounded in length.

Why: the operator's stderr goes to journald line by line, so a newline in a string a cluster user wrote
would forge a second log line; an ANSI escape (``ESC [``) is interpreted by the terminal that shows
``journalctl`` or ``journal dump``; bidirectional overrides reorder what a reader sees (CVE-2021-42574,
"Trojan Source"); a lone surrogate (JSON allows ``"\\ud800"``) cannot even be encoded to UTF-8 and would end
the write with an exception; and a 60 KB string would become a 60 KB log line and a status the Kubernetes
API refuses (the CRD bounds ``status.message`` to 32768 characters) or the spool's own reader refuses
(64 KiB per file).

Standard library only, and not even :mod:`re`: :mod:`agent.logline` uses it, and the boot-time no-op
``recover`` stays import-light (design §9).
"""

from __future__ import annotations

__all__ = ["MAX_LOG_LINE_CHARS", "MAX_VALUE_CHARS", "clean_text"]

MAX_LOG_LINE_CHARS = 4096
"""Longest line :func:`agent.logline.log` writes (characters, after escaping): journald keeps lines up to
48 KiB (``LineMax=``) and a person reads far less."""

MAX_VALUE_CHARS = 256
"""Longest rendering of one foreign value quoted inside a message (a node or agent name, a key)."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_table: dict[int, str] | None = None


def _escapes() -> dict[int, str]:
    """``str.translate`` table: every character :func:`clean_text` escapes, to its escape.

    Escaped: the C0 controls (ESC among them, so no ANSI sequence survives), DEL, the C1 controls (U+0080 to
    U+009F: a terminal reads U+009B as CSI), the line and paragraph separators U+2028/U+2029, the
    bidirectional marks, embeddings, overrides and isolates (U+061C, U+200E, U+200F, U+202A to U+202E,
    U+2066 to U+2069), the zero-width characters (U+200B to U+200D, U+2060, U+FEFF), the interlinear
    annotation characters (U+FFF9 to U+FFFB) and the surrogates (U+D800 to U+DFFF). Everything else, other
    scripts included, passes unchanged.
    """
    global _table
    if _table is None:
        codes = [*range(0x00, 0x20), *range(0x7F, 0xA0), 0x061C, *range(0x200B, 0x2010),
                 *range(0x2028, 0x202F), 0x2060, *range(0x2066, 0x206A), 0xFEFF, *range(0xFFF9, 0xFFFC),
                 *range(0xD800, 0xE000)]
        table = {}
        for code in codes:
            char = chr(code)
            table[code] = _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        _table = table
    return _table


def clean_text(text: object, limit: int = MAX_VALUE_CHARS) -> str:
    """``text`` (``str()`` of it) on one line, with nothing a terminal or log reader interprets, at most
    ``limit`` characters long.

    Each character listed in :func:`_escapes` becomes a visible escape: ``\\n``, ``\\r``, ``\\t``,
    ``\\xHH`` below U+0100, ``\\uHHHH`` above. A backslash already in the text is kept as is, so cleaning
    twice changes nothing (the result is for reading, not for decoding back). When the escaped text is
    longer than ``limit``, its beginning is kept (never half an escape) and `` ...[N more characters]``
    says how many characters of ``text`` were left out.

    Args:
        text: any value; ``str()`` of it is cleaned.
        limit: the longest result, in characters; at least 32.

    Returns:
        The cleaned text, ``len() <= limit``.

    Raises:
        ValueError: ``limit`` is below 32 (no room for the marker).
    """
    if limit < 32:
        raise ValueError(f"limit {limit}: at least 32 characters")
    s = text if isinstance(text, str) else str(text)
    table = _escapes()
    escaped = s.translate(table)
    if len(escaped) <= limit:
        return escaped
    marker = f" ...[{len(s)} more characters]"  # the longest count this marker can need
    budget = limit - len(marker)
    kept: list[str] = []
    used = 0
    for i, char in enumerate(s):
        piece = table.get(ord(char), char)
        if used + len(piece) > budget:
            return "".join(kept) + f" ...[{len(s) - i} more characters]"
        kept.append(piece)
        used += len(piece)
    return "".join(kept)  # not reached: the escaped text was longer than the budget

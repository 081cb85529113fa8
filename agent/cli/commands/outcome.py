"""What a command prints and returns (:class:`Outcome`), and the result payloads design §7 pins."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from agent.sanitize import MAX_LOG_LINE_CHARS, clean_text
from upgrade_core import UpgradeResult

RESULT_EXIT = {
    "committed": 0, "noop": 0, "staged": 0, "switched_stopped": 0, "rolled_back": 1, "aborted": 1,
    "needs_attention": 3,
}


@attrs.frozen
class Outcome:
    """What a command prints and returns.

    Attributes:
        payload: the one JSON object printed with ``--json``.
        human: the summary printed to stdout without ``--json``.
        exit_code: the process exit status (design §7).
        stderr: an extra line for stderr (e.g. the reason of a rollback), or None.
    """

    payload: dict[str, Any]
    human: str | None
    exit_code: int = 0
    stderr: str | None = None


def result_payload(result: UpgradeResult) -> dict[str, Any]:
    return {
        "operation": result.operation,
        "result": result.result,
        "from_version": result.from_version,
        "to_version": result.to_version,
        "slot": result.slot,
        "reason": result.reason,
    }


def result_outcome(result: UpgradeResult) -> Outcome:
    words: list[str] = [result.result]
    if result.from_version or result.to_version:
        words.append(f"{result.from_version or '?'} -> {result.to_version or '?'}")
    if result.slot:
        words.append(f"(current: {result.slot})")
    human = f"{result.operation or '-'}: {' '.join(words)}"
    if result.reason:
        human += f"\nreason: {clean_text(result.reason, MAX_LOG_LINE_CHARS)}"  # one line, whatever it quotes
    return Outcome(result_payload(result), human, RESULT_EXIT[result.result])


def plain_fields(fields: Mapping[str, Any]) -> str:
    """``key=value`` pairs for a person (``journal dump``, the ``-v`` trace): strings and numbers as they
    are, booleans ``true``/``false``, tables and lists as JSON (``{"slot": "blue"}``, ``["a", "b"]``), and
    fields that are None or empty left out, so that no Python repr (``None``, ``True``, ``{'``, ``()``) is
    ever shown (design §7)."""
    words = []
    for key, value in fields.items():
        if value is None or (isinstance(value, list | tuple | dict) and not value):
            continue
        words.append(f"{key}={_plain(value)}")
    return " ".join(words)


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    if attrs.has(type(value)):
        value = attrs.asdict(value)
    return json.dumps(value, default=str, separators=(", ", ": "))

"""What a command prints and returns (:class:`Outcome`), and the result payloads design §7 pins."""

from __future__ import annotations

from typing import Any

import attrs

from agent.sanitize import MAX_LOG_LINE_CHARS, clean_text
from upgrade_core import UpgradeResult

RESULT_EXIT = {"committed": 0, "noop": 0, "staged": 0, "rolled_back": 1, "aborted": 1, "needs_attention": 3}


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

"""``journal verify|dump|compact|quarantine``: verify and dump read only (the session runs the ownership
checks of design §10 first, which create nothing); compact and quarantine take the host lock."""

from __future__ import annotations

import argparse
from typing import Any

import anyio

from agent.cli.commands.common import rfc3339
from agent.cli.commands.outcome import Outcome
from agent.sanitize import MAX_LOG_LINE_CHARS, clean_text
from agent.session.quarantine import HINT, CarriedOver
from agent.session.session import Session
from upgrade_core.codec import to_dict
from upgrade_core.errors import JournalUnreadableError


def carried_lines(carried: CarriedOver) -> list[str]:
    """What ``journal quarantine`` says it kept of the old journal (docs/recovery.md)."""
    watermark = "none" if carried.watermark is None else str(carried.watermark)
    bad = ", ".join(sha[:12] for sha in carried.known_bad) or "none"
    lines = [f"carried over: watermark {watermark}; known-bad releases: {bad}"]
    if carried.source is not None:
        why = carried.problem or "it is empty"
        lines.append(
            f"nothing of the old journal could be used ({why}); carried over from the earlier quarantined "
            f"journal {carried.source} (through record {carried.read_through})"
        )
    elif carried.problem is not None:
        lines.append(
            f"the old journal was read through record {carried.read_through} only ({carried.problem}); "
            "nothing after it was carried over"
        )
    return lines


def cmd_journal(args: argparse.Namespace) -> Outcome:
    """``journal verify|dump|compact|quarantine``."""
    session = Session.load(args.config)
    if args.action == "quarantine":
        done = anyio.run(session.quarantine)
        lines = [f"journal moved to {done.quarantine_path}; a new journal records what the host shows:"]
        for label, slot in (("current", done.current), ("last-good", done.last_good)):
            lines.append(f"{label}: {slot.slot} {slot.version} {slot.sha256}")
        lines.extend(carried_lines(done.carried))
        return Outcome(done.to_json(), "\n".join(lines))
    if args.action == "compact":
        count = anyio.run(session.compact)
        return Outcome({"compacted": True, "records": count}, f"compacted; {count} records remain")
    if args.action == "verify":
        check = session.verify_journal()
        if check.corrupt is not None:
            file, offset = check.corrupt
            payload: dict[str, Any] = {
                "ok": False, "records": None, "torn_tail": None, "corrupt": {"file": file, "offset": offset}}
            return Outcome(payload, f"corrupt: {check.error}", JournalUnreadableError.exit_code,
                           stderr=f"upgrade-agent: {check.error}; {HINT}")
        torn = None if check.torn_tail is None else {"file": check.torn_tail[0], "offset": check.torn_tail[1]}
        payload = {"ok": True, "records": check.records, "torn_tail": torn, "corrupt": None}
        human = f"ok: {check.records} records" + (
            f"; torn tail at {torn['file']}:{torn['offset']} (repaired by the next writer)" if torn else ""
        )
        return Outcome(payload, human)
    records: list[dict[str, Any]] = [
        {
            "seq": r.seq,
            "episode": r.episode_id,
            "time": rfc3339(r.wall_time),
            "event": to_dict(r.event),
        }
        for r in session.journal_records()
    ]
    # one line per record whatever a value holds: a source or reason may quote what a control plane or a
    # server sent (agent.sanitize); --json escapes by itself
    human = "\n".join(
        f"{r['seq']:>6} {r['time']} {r['episode'][:12]:<12} {r['event']['_type']} "
        + " ".join(f"{k}={clean_text(v, MAX_LOG_LINE_CHARS)}" for k, v in r["event"].items() if k != "_type")
        for r in records
    )
    return Outcome({"records": records}, human or "empty journal")

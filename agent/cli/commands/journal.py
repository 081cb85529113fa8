"""``journal verify|dump|compact|quarantine``: verify and dump read only (after the ownership checks of
design §10, which create nothing); compact and quarantine take the host lock."""

from __future__ import annotations

import argparse
from typing import Any

import anyio

from agent.cli.commands.common import rfc3339
from agent.cli.commands.outcome import Outcome
from agent.session.session import Session
from upgrade_core import EVENT_CODEC


def cmd_journal(args: argparse.Namespace) -> Outcome:
    """``journal verify|dump|compact|quarantine``."""
    from agent.session.quarantine import HINT
    from agent.session.wiring import journal_dir
    from journal import JournalCorruptError, replay

    session = Session.load(args.config)
    directory = journal_dir(session.config)
    if args.action == "quarantine":
        done = anyio.run(session.quarantine)
        lines = [f"journal moved to {done.quarantine_path}; a new journal records what the host shows:"]
        for label, slot in (("current", done.current), ("last-good", done.last_good)):
            lines.append(f"{label}: {slot.slot} {slot.version} {slot.sha256}")
        return Outcome(done.to_json(), "\n".join(lines))
    if args.action == "compact":
        count = anyio.run(session.compact)
        return Outcome({"compacted": True, "records": count}, f"compacted; {count} records remain")
    from agent.host.ownership import check_state

    check_state(session.config)  # design §10: the writer's checks (exit 4, or 2 for a foreign journal)
    if args.action == "verify":
        try:
            rep = replay(directory, EVENT_CODEC)
        except JournalCorruptError as exc:
            payload: dict[str, Any] = {
                "ok": False,
                "records": None,
                "torn_tail": None,
                "corrupt": {"file": exc.path, "offset": exc.offset},
            }
            return Outcome(payload, f"corrupt: {exc}", 3, stderr=f"upgrade-agent: {exc}; {HINT}")
        torn = None if rep.torn_tail is None else {"file": rep.torn_tail.file, "offset": rep.torn_tail.offset}
        payload = {"ok": True, "records": len(rep.records), "torn_tail": torn, "corrupt": None}
        human = f"ok: {len(rep.records)} records" + (
            f"; torn tail at {torn['file']}:{torn['offset']} (repaired by the next writer)" if torn else ""
        )
        return Outcome(payload, human)
    rep = replay(directory, EVENT_CODEC)
    from upgrade_core.codec import to_dict

    records: list[dict[str, Any]] = [
        {
            "seq": r.seq,
            "episode": r.episode_id,
            "time": rfc3339(r.wall_time),
            "event": to_dict(r.event),
        }
        for r in rep.records
    ]
    human = "\n".join(
        f"{r['seq']:>6} {r['time']} {r['episode'][:12]:<12} {r['event']['_type']} "
        + " ".join(f"{k}={v}" for k, v in r["event"].items() if k != "_type")
        for r in records
    )
    return Outcome({"records": records}, human or "empty journal")

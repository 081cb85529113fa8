"""The readers: ``status``, ``history``, ``units``, ``host-root``. They never write and never create
``state_dir`` or the lock (design §7)."""

from __future__ import annotations

import argparse
from typing import Any

import anyio

from agent.cli.commands.common import rfc3339
from agent.cli.commands.outcome import Outcome
from agent.logline import log
from agent.session.session import Session


def cmd_units(args: argparse.Namespace) -> Outcome:
    """``units``: the rendered unit files."""
    units = Session.load(args.config).units()
    human = "\n".join(f"# {name}\n{text}" for name, text in units.items())
    return Outcome({"units": units}, human)


def cmd_host_root(args: argparse.Namespace) -> Outcome:
    """``host-root``: the resolved host root; changes nothing."""
    root = Session.load(args.config).host_root()
    return Outcome({"host_root": root}, root)


def cmd_status(args: argparse.Namespace) -> Outcome:
    """``status``: from the journal and the links; never runs binaries, never writes (design §7)."""
    status = anyio.run(Session.load(args.config).status)
    if status.service_error is not None:
        log(f"service state unavailable: {status.service_error}")
    lines = [f"agent: {status.agent}"]
    for key, info in (("current", status.current), ("last_good", status.last_good)):
        described = (
            "none" if info is None else f"{info.slot} {info.version or '?'} {info.sha256 or 'missing'}"
        )
        lines.append(f"{key}: {described}")
    if status.staged is not None:
        st = status.staged
        who = "the recovery timer switches in the window" if st.switch_in_window else "activate switches"
        lines.append(f"staged: {st.slot} {st.version} {st.sha256} (operation {st.operation}; {who})")
    svc = status.service
    state = "unknown" if svc.active_state is None else f"{svc.active_state}/{svc.sub_state}"
    lines.append(f"service: {state}" + (f" pid {svc.main_pid}" if svc.main_pid else ""))
    ep = status.episode
    if ep is None:
        lines.append("episode: none")
    else:
        who = "abandoned (no upgrader holds the lock)" if ep.abandoned else (
            f"upgrader pid {ep.upgrader_pid}" if ep.upgrader_pid else "upgrader running")
        lines.append(f"episode: {ep.operation} ({ep.state}, {who})")
    if status.missing_units:
        lines.append("missing units: " + ", ".join(status.missing_units))
    if status.drifted_units:
        lines.append("drifted units: " + ", ".join(status.drifted_units))
    watermark = status.security_watermark
    lines.append(f"security watermark: {watermark}" if watermark is not None
                 else "security watermark: none (no signed release committed)")
    if status.known_bad:
        lines.append(f"known bad ({len(status.known_bad)}, refused unless --retry-known-bad):")
        lines.extend(f"  {bad.sha256} (condemned by {bad.operation})" for bad in status.known_bad)
    else:
        lines.append("known bad: none")
    lines.append("next: " + (status.next or "nothing to do"))
    return Outcome(status.to_json(), "\n".join(lines))


def cmd_history(args: argparse.Namespace) -> Outcome:
    """``history``: episodes newest first, RFC 3339 UTC times, each with its ``kind`` (``install``,
    ``upgrade``, ``rollback``, ``self_upgrade``, ``quarantine``; None for an episode a snapshot written
    before kinds were kept summarises) and ``reason`` (the published result's; None for committed and
    noop)."""
    view = Session.load(args.config).view()
    rows: list[dict[str, Any]] = []
    for summary in view.history:
        r = summary.result
        rows.append(
            {
                "operation": summary.operation,
                "kind": summary.kind,
                "result": r.result,
                "from_version": r.from_version,
                "to_version": r.to_version,
                "opened_at": rfc3339(summary.opened_at),
                "closed_at": rfc3339(summary.closed_at),
                "reason": r.reason,
            }
        )
    for ep in view.episodes.values():
        res = ep.published or ep.terminal_result
        rows.append(
            {
                "operation": ep.episode_id,
                "kind": ep.kind,
                "result": res.result if res else None,
                "from_version": res.from_version if res else ep.from_version,
                "to_version": res.to_version if res else ep.candidate_version,
                "opened_at": rfc3339(ep.opened_at),
                "closed_at": rfc3339(ep.closed_at),
                "reason": res.reason if res else None,
            }
        )
    rows.reverse()
    return Outcome({"episodes": rows}, "\n".join(_history_line(r) for r in rows) or "no episodes")


def _history_line(row: dict[str, Any]) -> str:
    """One episode for a person: ``TIME  OPERATION  KIND  RESULT  FROM -> TO`` and ``: REASON`` if any."""
    versions = f"{row['from_version'] or '?'} -> {row['to_version'] or '?'}"
    if row["kind"] == "quarantine":
        versions = ""
    line = (f"{row['opened_at']}  {row['operation']:<32}  {row['kind'] or '?':<12} "
            f"{row['result'] or 'open':<15} {versions}").rstrip()
    return f"{line}: {row['reason']}" if row["reason"] else line

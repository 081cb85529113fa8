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
        lines.append(
            f"staged: {st.slot} {st.version} {st.sha256} (operation {st.operation}; activate switches)"
        )
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
    lines.append("next: " + (status.next or "nothing to do"))
    return Outcome(status.to_json(), "\n".join(lines))


def cmd_history(args: argparse.Namespace) -> Outcome:
    """``history``: episodes newest first, RFC 3339 UTC times."""
    view = Session.load(args.config).view()
    rows: list[dict[str, Any]] = []
    for summary in view.history:
        r = summary.result
        rows.append(
            {
                "operation": summary.operation,
                "result": r.result,
                "from_version": r.from_version,
                "to_version": r.to_version,
                "opened_at": rfc3339(summary.opened_at),
                "closed_at": rfc3339(summary.closed_at),
            }
        )
    for ep in view.episodes.values():
        res = ep.published or ep.terminal_result
        rows.append(
            {
                "operation": ep.episode_id,
                "result": res.result if res else None,
                "from_version": res.from_version if res else ep.from_version,
                "to_version": res.to_version if res else ep.candidate_version,
                "opened_at": rfc3339(ep.opened_at),
                "closed_at": rfc3339(ep.closed_at),
            }
        )
    rows.reverse()
    human = "\n".join(
        f"{r['opened_at']}  {r['operation']:<32}  {r['result'] or 'open':<15} "
        f"{r['from_version'] or '?'} -> {r['to_version'] or '?'}"
        for r in rows
    )
    return Outcome({"episodes": rows}, human or "no episodes")

"""The readers: ``status``, ``history``, ``units``, ``host-root``. They never write and never create
``state_dir`` or the lock (SPEC 7)."""

from __future__ import annotations

import argparse
from typing import Any

import anyio

from agent.commands.common import load_args, log, rfc3339
from agent.commands.outcome import Outcome
from agent.config import AgentConfig
from agent.host import AgentHost
from agent.provision import Provisioner
from upgrade_core import EVENT_CODEC, Slot
from upgrade_core.errors import UpgradeError
from upgrade_core.ports import UnitSnapshot


def agent_units(cfg: AgentConfig, config_path: str, host: AgentHost) -> dict[str, str]:
    from agent.units import render_units
    from agent.wiring import recover_executable

    return render_units(
        name=cfg.agent.name,
        unit=cfg.agent.unit,
        current_link=host.current_link_path(),
        exec_args=cfg.agent.exec_args,
        max_attempts=cfg.health.max_attempts,
        recover_exe=recover_executable(),
        config_path=config_path,
    )


def cmd_units(args: argparse.Namespace) -> Outcome:
    """``units``: the three rendered unit files."""
    cfg, config_path = load_args(args)
    units = agent_units(cfg, config_path, AgentHost.from_config(cfg))
    human = "\n".join(f"# {name}\n{text}" for name, text in units.items())
    return Outcome({"units": units}, human)


def cmd_host_root(args: argparse.Namespace) -> Outcome:
    """``host-root``: the resolved host root; changes nothing."""
    cfg, _ = load_args(args)
    root = Provisioner(AgentHost.from_config(cfg)).host_root()
    return Outcome({"host_root": root}, root)


def _read_view(cfg: AgentConfig) -> Any:
    from agent.wiring import journal_dir
    from journal import replay
    from upgrade_core import fold

    return fold(replay(journal_dir(cfg), EVENT_CODEC).records)


def cmd_status(args: argparse.Namespace) -> Outcome:
    """``status``: from the journal and the links; never runs binaries (SPEC 7)."""
    cfg, config_path = load_args(args)
    host = AgentHost.from_config(cfg)
    view = _read_view(cfg)
    links = host.links()

    async def gather() -> tuple[dict[Slot, str | None], UnitSnapshot | None]:
        """Each slot hashed once (current and last-good often name the same one), then the unit."""
        from agent.wiring import service_manager

        digests = {slot: await host.slot_sha256(slot) for slot in {links.current, links.last_good} if slot}
        try:
            return digests, await service_manager(cfg, config_path).snapshot()
        except UpgradeError as exc:
            log(f"service state unavailable: {exc}")
            return digests, None

    digests, snap = anyio.run(gather)

    def slot_info(slot: Any) -> dict[str, Any] | None:
        if slot is None:
            return None
        return {
            "slot": slot,
            "path": host.slot_path(slot),
            "sha256": digests[slot],
            "version": view.slot_versions.get(slot),
        }

    service: dict[str, Any] = {"active_state": None, "sub_state": None, "main_pid": None, "exe": None}
    if snap is not None:
        service = {
            "active_state": snap.active_state,
            "sub_state": snap.sub_state,
            "main_pid": snap.main_pid or None,
            "exe": snap.exe,
        }
    ep = view.open_episode
    payload: dict[str, Any] = {
        "agent": cfg.agent.name,
        "current": slot_info(links.current),
        "last_good": slot_info(links.last_good),
        "service": service,
        "episode": None if ep is None else {"operation": ep.episode_id, "state": ep.state.value},
    }
    lines = [f"agent: {cfg.agent.name}"]
    for key in ("current", "last_good"):
        info: dict[str, Any] | None = payload[key]
        described = "none" if info is None else f"{info['slot']} {info['version'] or '?'} {info['sha256']}"
        lines.append(f"{key}: {described}")
    lines.append(f"service: {service['active_state']}/{service['sub_state']} pid {service['main_pid']}")
    lines.append("episode: " + ("none" if ep is None else f"{ep.episode_id} ({ep.state.value})"))
    return Outcome(payload, "\n".join(lines))


def cmd_history(args: argparse.Namespace) -> Outcome:
    """``history``: episodes newest first, RFC 3339 UTC times."""
    cfg, _ = load_args(args)
    view = _read_view(cfg)
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
        r = ep.published or ep.terminal_result
        rows.append(
            {
                "operation": ep.episode_id,
                "result": r.result if r else None,
                "from_version": r.from_version if r else ep.from_version,
                "to_version": r.to_version if r else ep.candidate_version,
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

"""``reset`` (the three units) and ``uninstall`` (units, layout, ``state_dir``, lock; never the legacy
root or the configuration)."""

from __future__ import annotations

import argparse
import os

import anyio

from agent.commands.common import load_args, log
from agent.commands.outcome import Outcome
from agent.commands.readers import agent_units
from agent.config import AgentConfig
from agent.host import AgentHost
from agent.provision import Provisioner
from upgrade_core.errors import UpgradeError


async def reset_units(cfg: AgentConfig, config_path: str, host: AgentHost) -> list[str]:
    from agent.wiring import service_manager

    service = service_manager(cfg, config_path)
    names = list(agent_units(cfg, config_path, host))
    for unit in names:
        try:
            await service.stop(unit)
        except UpgradeError as exc:
            log(f"stop {unit}: {exc}")
    try:
        await service.disable(*names)
    except UpgradeError as exc:
        log(f"disable: {exc}")
    removed: list[str] = await service.remove_units(names)
    await service.daemon_reload()
    return removed


def cmd_reset(args: argparse.Namespace) -> Outcome:
    """``reset``: stop, disable and remove the three units, daemon-reload."""
    from agent.lock import HostLock

    cfg, config_path = load_args(args)
    host = AgentHost.from_config(cfg)
    with HostLock(cfg.host.lock_path):
        removed = anyio.run(reset_units, cfg, config_path, host)
    return Outcome({"removed": removed}, "\n".join(f"removed {p}" for p in removed) or "nothing to remove")


def _refuse_read_only(*paths: str) -> None:
    """Refuse, before stopping anything, to uninstall from a read-only mount (C14 rescue views).

    Raises:
        HostError: the nearest existing ancestor of one of ``paths`` is on a read-only mount (exit 1).
    """
    from upgrade_core.errors import HostError

    for path in paths:
        probe = path
        while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        if os.statvfs(probe).f_flag & os.ST_RDONLY:
            raise HostError(f"{path}: on a read-only mount; nothing was stopped or removed")


def cmd_uninstall(args: argparse.Namespace) -> Outcome:
    """``uninstall``: reset, then the layout, ``state_dir`` and the lock; never the legacy root or config."""
    import shutil

    from agent import durable
    from agent.lock import HostLock

    cfg, config_path = load_args(args)
    host = AgentHost.from_config(cfg)
    _refuse_read_only(host.layout.agent_dir, cfg.host.state_dir)
    lock = HostLock(cfg.host.lock_path)
    with lock:
        removed = anyio.run(reset_units, cfg, config_path, host)
        removed += Provisioner(host).remove_layout()
        if os.path.lexists(cfg.host.state_dir):
            shutil.rmtree(cfg.host.state_dir)
            removed.append(cfg.host.state_dir)
    if durable.remove_if_present(cfg.host.lock_path):
        removed.append(cfg.host.lock_path)
    return Outcome({"removed": removed}, "\n".join(f"removed {p}" for p in removed) or "nothing to remove")

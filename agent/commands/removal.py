"""``reset`` (the three units) and ``uninstall`` (units, layout, ``state_dir``, lock; never the legacy
root or the configuration)."""

from __future__ import annotations

import argparse
import os

import anyio

from agent.commands.outcome import Outcome
from agent.provision import Provisioner
from agent.session import Session


def cmd_reset(args: argparse.Namespace) -> Outcome:
    """``reset``: stop, disable and remove the three units, daemon-reload."""
    removed = anyio.run(Session.load(args.config).reset)
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

    session = Session.load(args.config)
    cfg, host = session.config, session.host
    _refuse_read_only(host.layout.agent_dir, cfg.host.state_dir)
    with HostLock(cfg.host.lock_path):
        removed = anyio.run(session.remove_units)
        removed += Provisioner(host).remove_layout()
        if os.path.lexists(cfg.host.state_dir):
            shutil.rmtree(cfg.host.state_dir)
            removed.append(cfg.host.state_dir)
    if durable.remove_if_present(cfg.host.lock_path):
        removed.append(cfg.host.lock_path)
    return Outcome({"removed": removed}, "\n".join(f"removed {p}" for p in removed) or "nothing to remove")

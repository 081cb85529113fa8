"""``install``: a bare host to blue, links, units, start, health; adoption of a plain binary or a legacy
layout; and the undo of a failed install (SPEC 7)."""

from __future__ import annotations

import argparse
import functools
import os
import uuid
from typing import Any

import anyio

from agent.commands.common import load_args
from agent.commands.episode import run_episode
from agent.commands.outcome import Outcome, result_outcome
from agent.commands.readers import agent_units
from agent.commands.removal import reset_units
from agent.config import AgentConfig
from agent.host import AgentHost
from agent.provision import Provisioner
from upgrade_core import UpgradeResult, other_slot
from upgrade_core.errors import AlreadyInstalledError, UsageError


def cmd_install(args: argparse.Namespace) -> Outcome:
    """``install`` (SPEC 7): bare host -> blue, links, units, start, health; adoption without --archive.

    A failed install (any result but committed/noop, or an error) removes the units and layout it made;
    the journal keeps the episode.

    Raises:
        ConfigError, UsageError: bad configuration or arguments; nothing to adopt (exit 2).
        AlreadyInstalledError: installed with a different binary (exit 2).
        LockBusyError: the host lock is held (exit 75).
    """
    from agent.fetch import parse_sha256
    from agent.lock import HostLock
    from agent.redact import redact_url
    from upgrade_core import UpgradeRequest

    cfg, config_path = load_args(args)
    host = AgentHost.from_config(cfg)
    provision = Provisioner(host)
    sha = parse_sha256(args.sha256)
    op = uuid.uuid4().hex
    if args.archive is None:
        found = provision.find_adoptable()
        if found is None:
            if host.is_installed():
                return result_outcome(UpgradeResult(None, "noop", slot=host.links().current))
            raise UsageError(
                f"nothing to adopt at {host.layout.bin_link} or under host.legacy_root; pass --archive"
            )
        source, source_override = found.source, _PlainFileSource()
    else:
        found, source, source_override = None, args.archive, None
    request = UpgradeRequest(op, source, redact_url(source), sha, args.expect_version)
    if not host.is_installed() and not (found is not None and found.kind == "legacy_layout"):
        provision.check_bare()  # before the lock file too: a refusal leaves the host untouched
    with HostLock(cfg.host.lock_path) as lock:
        if found is not None and found.kind == "legacy_layout":
            provision.adopt()
            return anyio.run(_install_units_only, cfg, config_path, host)
        if host.is_installed():
            return anyio.run(_install_again, cfg, config_path, host, request)
        provision.check_bare()
        provision.create_layout_dirs()
        done = False
        try:
            result = anyio.run(
                functools.partial(
                    run_episode,
                    cfg,
                    config_path,
                    args.json,
                    lambda w: _install_flow(w, cfg, config_path, request),
                    lock,
                    source_override=source_override,
                )
            )
            done = result.result in ("committed", "noop")
        finally:
            if not done:  # SPEC 7: a failed install removes what it created (the journal keeps the episode)
                anyio.run(_undo_install, cfg, config_path, host)
    return result_outcome(result)


async def _install_units(service: Any, cfg: AgentConfig, config_path: str, host: AgentHost) -> None:
    """Write the three units, daemon-reload, enable the agent and the boot-time recovery unit."""
    from agent.units import recover_boot_unit_name

    await service.write_units(agent_units(cfg, config_path, host))
    await service.daemon_reload()
    await service.enable(cfg.agent.unit, recover_boot_unit_name(cfg.agent.name))


async def _install_flow(wired: Any, cfg: AgentConfig, config_path: str, request: Any) -> UpgradeResult:
    from upgrade_core import run_install

    await _install_units(wired.ports.service, cfg, config_path, wired.host)
    result: UpgradeResult = await run_install(wired.ports, wired.policy, request)
    if result.result == "committed":
        Provisioner(wired.host).ensure_compat_link()
    return result


async def _install_again(cfg: AgentConfig, config_path: str, host: AgentHost, request: Any) -> Outcome:
    """Already installed: same member digest as ``current`` -> noop; else exit 2 (SPEC 7)."""
    from agent.wiring import wire

    wired = await wire(cfg, config_path)
    try:
        current = host.links().current
        assert current is not None
        inactive = other_slot(current)
        path = await host.prepare_staging(inactive)
        try:
            staged = await wired.ports.source.stage(request.source, request.expected_sha256, path, inactive)
        finally:
            await host.discard_staging(path)
        if staged.sha256 == await host.slot_sha256(current):
            return result_outcome(UpgradeResult(None, "noop", slot=current))
    finally:
        await wired.journal.writer.aclose()
    raise AlreadyInstalledError(f"{host.current_link_path()}: already installed; use upgrade")


async def _install_units_only(cfg: AgentConfig, config_path: str, host: AgentHost) -> Outcome:
    from agent.wiring import service_manager

    service = service_manager(cfg, config_path)
    await _install_units(service, cfg, config_path, host)
    await service.start()
    current = host.links().current
    return result_outcome(UpgradeResult(None, "noop", slot=current, reason="adopted legacy layout"))


async def _undo_install(cfg: AgentConfig, config_path: str, host: AgentHost) -> None:
    """A failed install removes what it created: units, slots, links; the journal keeps the episode."""
    await reset_units(cfg, config_path, host)
    Provisioner(host).remove_layout()


class _PlainFileSource:
    """An :class:`~upgrade_core.ports.ArchiveSource` for adoption: the "archive" is a plain executable."""

    async def stage(self, source: str, expected_sha256: str | None, staging_path: str, slot: Any) -> Any:
        """Copy ``source`` into ``staging_path`` durably (its digest checked during the copy)."""
        from agent import durable
        from upgrade_core.ports import StagedCandidate

        def copy() -> tuple[str, int]:
            durable.copy_file_durable(source, staging_path, 0o755)
            return durable.file_sha256(staging_path), os.stat(staging_path).st_size

        sha, size = await anyio.to_thread.run_sync(copy)
        return StagedCandidate(slot, staging_path, sha, size, sha, size)

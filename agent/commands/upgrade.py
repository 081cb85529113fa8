"""``upgrade`` (and ``upgrade --preflight``) and ``recover``: the commands that run an episode's flow."""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import attrs

from agent.commands.common import load_args, log
from agent.commands.episode import operation_id, run_episode
from agent.commands.outcome import Outcome, result_outcome, result_payload
from agent.config import AgentConfig
from agent.host import AgentHost
from upgrade_core import EVENT_CODEC, UpgradeResult, other_slot
from upgrade_core.errors import NotInstalledError


def cmd_upgrade(args: argparse.Namespace) -> Outcome:
    """``upgrade`` (SPEC 4.3) and ``upgrade --preflight``.

    Raises:
        ConfigError, UsageError: bad configuration, ``--sha256`` or ``--operation`` (exit 2).
        NotInstalledError: no ``current`` link (exit 2).
        LockBusyError: another process holds the host lock (exit 75).
        EpisodeLeftOpenError: a failure after ``switch intended`` (exit 3; ``recover`` finishes it).
        JournalDurabilityError, journal.JournalError: the journal cannot be trusted or written (exit 3).
    """
    from agent.fetch import parse_sha256
    from agent.lock import HostLock
    from agent.redact import redact_url
    from upgrade_core import UpgradeRequest, run_upgrade

    cfg, config_path = load_args(args)
    host = AgentHost.from_config(cfg)
    sha = parse_sha256(args.sha256)
    request = UpgradeRequest(
        operation=operation_id(args.operation),
        source=args.archive,
        source_redacted=redact_url(args.archive),
        expected_sha256=sha,
        expected_version=args.expect_version,
    )
    if args.preflight:
        return _preflight(cfg, host, request)
    host.links()  # LayoutConflictError (exit 2) for a real file or directory where a link must be
    if not host.is_installed():
        raise NotInstalledError(f"{host.current_link_path()}: not installed; run `upgrade-agent install`")
    with HostLock(cfg.host.lock_path) as lock:
        log(f"upgrade {request.operation}: {request.source_redacted}")
        result = anyio.run(
            run_episode, cfg, config_path, args.json, lambda w: run_upgrade(w.ports, w.policy, request), lock
        )
    return result_outcome(result)


def _preflight(cfg: AgentConfig, host: AgentHost, request: Any) -> Outcome:
    """No fetch, no directories, no lock file created; prints the plan (SPEC 7)."""
    from agent.lock import probe_lock
    from agent.wiring import journal_dir
    from journal import replay
    from upgrade_core import fold

    if not host.is_installed():
        raise NotInstalledError(f"{host.current_link_path()}: not installed; run `upgrade-agent install`")
    links = host.links()
    assert links.current is not None
    inactive = other_slot(links.current)
    lock = probe_lock(cfg.host.lock_path)
    view = fold(replay(journal_dir(cfg), EVENT_CODEC).records)
    open_ep = view.open_episode.episode_id if view.open_episode else None
    plan = []
    if open_ep is not None:
        plan.append(f"recover the open episode {open_ep} first")
    prior = view.result_of(request.operation)
    if prior is not None:
        plan.append(f"operation {request.operation} already closed as {prior.result}: print it, do nothing")
    else:
        plan += [
            f"fetch {request.source_redacted}" + (" and check its sha256" if request.expected_sha256 else ""),
            f"extract {cfg.agent.member} into a staging file for the inactive slot {inactive}",
            "run its version command"
            + (f", expect {request.expected_version}" if request.expected_version else ""),
            f"switch current from {links.current} to {inactive} (last-good stays {links.current})",
            f"restart {cfg.agent.unit} through a transient unit and health-check it "
            f"({cfg.health.max_attempts} attempts, {cfg.health.stability_s} s stable)",
            "commit, or roll back to last-good",
        ]
    payload = {
        "preflight": True,
        "plan": plan,
        "inactive_slot": inactive,
        "lock": lock,
        "open_episode": open_ep,
    }
    code = 75 if lock == "busy" else 0
    return Outcome(payload, "\n".join(f"- {p}" for p in plan) + f"\nlock: {lock}", code)


def cmd_recover(args: argparse.Namespace) -> Outcome:
    """``recover`` (SPEC 4.5): exit 0 whenever it leaves no open episode.

    Raises:
        LockBusyError: the holder owns the episode (exit 75, at once).
        HistoryError, journal.JournalError: the journal is corrupt in the middle; links untouched (exit 3).
    """
    from agent.lock import HostLock
    from upgrade_core import recover

    cfg, config_path = load_args(args)
    with HostLock(cfg.host.lock_path) as lock:
        result = anyio.run(
            run_episode, cfg, config_path, args.json, lambda w: _recover(w, recover, args.trigger), lock
        )
    if result.operation is not None and result.reason == _HANDED_OFF:
        payload = {**result_payload(result), "handed_off": True}
        return Outcome(payload, f"{result.operation}: health check handed to a transient unit", 0)
    # SPEC 7: recover exits 0 whenever it leaves no open episode, whatever the result it published.
    return attrs.evolve(result_outcome(result), exit_code=0)


_HANDED_OFF = "boot recovery handed the health check to a transient unit, which owns the episode now"


async def _recover(wired: Any, recover: Any, trigger: str) -> UpgradeResult:
    result = await recover(wired.ports, wired.policy, trigger)
    if result is None:  # boot: the health check was handed to a transient unit that owns the episode now
        from upgrade_core import fold

        ep = fold(wired.journal.records()).open_episode
        return UpgradeResult(ep.episode_id if ep else None, "noop", reason=_HANDED_OFF)
    assert isinstance(result, UpgradeResult)
    return result

"""``upgrade`` (and ``upgrade --preflight``, ``upgrade --stage``), ``activate``, ``rollback`` (and
``--preflight``) and ``recover``: the commands that run an episode's flow."""

from __future__ import annotations

import argparse

import attrs

from agent.cli.commands.common import cli_session, run_writing
from agent.cli.commands.outcome import Outcome, result_outcome, result_payload
from agent.errors import UsageError
from agent.logline import log
from agent.session.request import make_delta_request
from agent.session.session import BUSY_REASON, Preflight
from agent.session.window import closed_window_text, refuse_outside_window, window_now
from upgrade_core import HandedOff, UpgradeResult
from upgrade_core.errors import LockBusyError


def cmd_upgrade(args: argparse.Namespace) -> Outcome:
    """``upgrade`` (design §4.3), ``upgrade --preflight`` and ``upgrade --stage`` (docs/cli.md: fetch, verify
    and install into the inactive slot, switch nothing; result ``staged``, exit 0). Outside the
    ``[schedule]`` maintenance window a switch is refused unless ``--now``; ``--in-window`` stages the
    candidate the same way instead and leaves the switch to the recovery timer, which activates it once the
    window is open (docs/configuration.md ``[schedule]``).

    Raises:
        ConfigError, UsageError: bad configuration, source, ``--sha256``, ``--operation`` or
            ``--expect-version``, neither ``--archive`` nor ``--delta``, a ``--delta`` without its two
            digests, or outside the maintenance window without ``--now`` or ``--in-window``
            (:class:`~agent.session.window.OutsideWindowError`) (exit 2): nothing locked, created or
            journaled.
        NotInstalledError: no ``current`` link (exit 2).
        LockBusyError: another process holds the host lock (exit 75).
        EpisodeLeftOpenError: a failure after ``switch intended`` (exit 3; ``recover`` finishes it).
        JournalError: the journal cannot be trusted or written (exit 3).
    """
    session = cli_session(args)
    delta = None
    if args.delta is not None:
        request, delta = make_delta_request(
            args.delta, allow_http=session.config.download.allow_http, delta_sha256=args.delta_sha256,
            member_sha256=args.member_sha256,
            archive=args.archive, sha256=args.sha256, operation=args.operation,
            expect_version=args.expect_version, signature=args.signature,
            retry_known_bad=args.retry_known_bad, stage=args.stage,
        )
    elif args.archive is None:
        raise UsageError("upgrade needs --archive SRC or --delta SRC")
    elif args.delta_sha256 or args.member_sha256:
        raise UsageError("--delta-sha256 and --member-sha256 go with --delta")
    else:
        request = session.request(
            args.archive, sha256=args.sha256, operation=args.operation, expect_version=args.expect_version,
            signature=args.signature, retry_known_bad=args.retry_known_bad, stage=args.stage,
        )
    if args.preflight:
        return _preflight_outcome(session.preflight(request))
    if args.in_window:
        verdict = window_now(session.config)
        if not verdict.open:
            # the switch waits for the window; the fetch and the checks need not (the recovery timer switches)
            log(f"upgrade: {closed_window_text(session.config, verdict)}: staging now; the recovery timer "
                "switches to the candidate once the window is open")
            request = attrs.evolve(request, stage=True, switch_in_window=True)
    elif not args.stage and not args.now:
        refuse_outside_window(session.config, "upgrade")
    return result_outcome(run_writing(session, args, lambda: session.upgrade(request, delta)))


def cmd_rollback(args: argparse.Namespace) -> Outcome:
    """``rollback`` (docs/recovery.md, design §10): ``current`` to ``last-good`` as its own episode, and
    ``rollback --preflight``. Exit 0 committed, 1 rolled_back/aborted (the previous current runs; aborted
    too when last-good is below the anti-rollback watermark without ``--below-watermark``), 3
    needs_attention, as ``upgrade``.

    Raises:
        ConfigError, UsageError: bad configuration or ``--operation`` (exit 2): nothing locked or journaled.
        NotInstalledError, NothingToRollBackError: no ``current``; ``last-good`` missing or naming current's
            slot (exit 2), before any episode opens.
        LockBusyError, EpisodeLeftOpenError, JournalError: as ``upgrade``.
    """
    session = cli_session(args)
    operation = session.rollback_operation(args.operation)
    below = args.below_watermark
    if args.preflight:
        return _preflight_outcome(session.rollback_preflight(operation, below_watermark=below))
    return result_outcome(
        run_writing(session, args, lambda: session.rollback(operation, below_watermark=below))
    )


def cmd_activate(args: argparse.Namespace) -> Outcome:
    """``activate`` (docs/cli.md): switch to the candidate ``upgrade --stage`` installed, after hashing its
    bytes again; restart and health-check as ``upgrade``. Exit 0 committed, 1 rolled_back or aborted (the
    staged bytes changed: nothing switched), 3 needs_attention. Outside the ``[schedule]`` maintenance
    window it is refused (exit 2) unless ``--now``.

    Raises:
        ConfigError, UsageError: bad configuration or ``--operation`` (exit 2): nothing locked or journaled.
        NotInstalledError, NothingStagedError: no ``current``; nothing staged (exit 2), before any episode
            opens.
        LockBusyError, EpisodeLeftOpenError, JournalError: as ``upgrade``.
    """
    session = cli_session(args)
    operation = session.activate_operation(args.operation)
    if not args.now:
        refuse_outside_window(session.config, "activate")
    return result_outcome(run_writing(session, args, lambda: session.activate(operation)))


def _preflight_outcome(pre: Preflight) -> Outcome:
    human = "\n".join(f"- {p}" for p in pre.plan) + f"\nlock: {pre.lock}"
    if pre.missing_units:
        human += "\nmissing units: " + ", ".join(pre.missing_units)
    if pre.next:
        human += f"\nnext: {pre.next}"
    return Outcome(pre.to_json(), human, LockBusyError.exit_code if pre.lock == "busy" else 0)


def cmd_recover(args: argparse.Namespace) -> Outcome:
    """``recover`` (design §4.5): exit 0 whenever it leaves no open episode.

    Raises:
        LockBusyError: the holder owns the episode (exit 75, at once).
        JournalError, HistoryError: the journal is corrupt in the middle; links untouched (exit 3).
    """
    session = cli_session(args)
    outcome = run_writing(session, args, lambda: session.recover(args.trigger))
    if isinstance(outcome, HandedOff):
        reason = f"the health check was handed to {outcome.unit}, which owns the episode now"
        payload = result_payload(UpgradeResult(outcome.operation, "noop", reason=reason))
        payload["handed_off"] = True
        return Outcome(payload, f"{outcome.operation}: health check handed to {outcome.unit}", 0)
    busy = outcome.operation is None and (outcome.reason or "").startswith(BUSY_REASON)
    if args.trigger == "timer" and busy:
        # The timer never waits and never fails its unit: a live upgrade owns the episode (exit 0, one line).
        payload = result_payload(outcome)
        payload["busy"] = True
        return Outcome(payload, outcome.reason, 0)
    # design §7: recover exits 0 whenever it leaves no open episode, whatever the result it published.
    done = attrs.evolve(result_outcome(outcome), exit_code=0)
    if outcome.operation is None:  # nothing was open: the quick path's words, and why, when there is a why
        return attrs.evolve(done, human="nothing to recover: " + (outcome.reason or "no open episode"))
    return done


"""``operator``: the long-running managed-operations process (docs/managed.md;
:mod:`agent.operations.operator`)."""

from __future__ import annotations

import argparse
import os
import signal

import anyio
import anyio.abc

from agent.cli.commands.outcome import Outcome
from agent.logline import log

# SIGHUP is handled as SIGTERM is (an operator's ssh session dropping, case C26).
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def cmd_operator(args: argparse.Namespace) -> Outcome:
    """``upgrade-agent operator [--once]``: serve ``[operations] source`` until SIGTERM (exit 0), or with
    ``--once`` until no operation is left to do.

    A first SIGINT/SIGTERM/SIGHUP stops it after the running operation (aborted before the switch, finished
    after it) and its status are done; a second one exits 130 at once, leaving any open episode to
    ``recover`` (and to the operator's next start-up gate).

    Raises:
        ConfigError: no ``[operations] source``, or the source's configuration is invalid (exit 2).
        JournalError, HistoryError: the journal cannot be trusted (exit 3).
        HostRefusedError: a state path is not ours (exit 4).
    """
    from agent.cli.commands.progress import PhaseLines, verbosity
    from agent.operations.operator import Operator, open_source
    from agent.session.session import Session

    session = Session.load(args.config, on_event=PhaseLines(verbosity(args)))

    async def serve() -> None:
        source = await open_source(session)
        operator = Operator(session, source)

        async def watch(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            count = 0
            with anyio.open_signal_receiver(*_SIGNALS) as signals:
                task_status.started()  # the handlers are in place before the first operation is taken
                async for signum in signals:
                    count += 1
                    name = signal.Signals(signum).name
                    if count >= 2:
                        log(f"{name} again: stopping now; the next start (or recover) finishes the episode")
                        os._exit(130)
                    operator.request_stop(name)

        try:
            async with anyio.create_task_group() as tg:
                await tg.start(watch)
                await operator.run(once=args.once)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await source.aclose()

    anyio.run(serve)
    return Outcome({"stopped": True}, None, 0)

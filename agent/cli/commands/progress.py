"""What a person sees on stderr while a command works (design §7: progress and logs go to stderr only).

Three levels, chosen by the output options: ``-q/--quiet`` prints nothing here (only the result on stdout),
the default prints one line per phase of an episode (:class:`PhaseLines`), ``-v/--verbose`` adds the event
trace (every journal record). The download display (:class:`Progress`) is a rich bar on a terminal and a
line every 5 s otherwise; quiet turns it off.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import attrs

from agent.cli.commands.outcome import plain_fields
from agent.logline import ERR, INFO, WARNING, log

QUIET, NORMAL, VERBOSE = 0, 1, 2
"""Output levels: ``-q``, the default, ``-v``."""

_DURING_ATTEMPT = frozenset({"RestartRequested", "RestartObserved"})
"""Records written inside a health attempt: the wait the ticker speaks for goes on."""

HEALTH_TICK_S = 5.0
"""Seconds between two ``health attempt i/n: waiting, S s left`` lines while an attempt waits."""


def verbosity(args: Any) -> int:
    """The output level the parsed options ask for (:data:`QUIET`, :data:`NORMAL` or :data:`VERBOSE`)."""
    if getattr(args, "quiet", False):
        return QUIET
    return VERBOSE if getattr(args, "verbose", False) else NORMAL


def trace_line(record: Any) -> str:
    """The ``-v`` line of one journal record: ``[episode8] Tag key=value ...`` (Nones, empties left out)."""
    event = record.event
    fields = attrs.asdict(event, recurse=False) if attrs.has(type(event)) else {}
    detail = plain_fields({k: v for k, v in fields.items() if k != "result"})
    return f"[{record.episode_id[:8]}] {type(event).TAG} {detail}".rstrip()


@attrs.define
class HealthPolicy:
    """The attempts and seconds a health check spends: from the episode's ``EpisodeOpened`` when this run
    saw it, otherwise from the configuration (a ``recover`` of an episode opened by an earlier process).

    Attributes:
        max_attempts: attempts before a rollback.
        timeout_s: seconds one attempt may last.
    """

    max_attempts: int | None = None
    timeout_s: float | None = None


class _HealthTicker:
    """A daemon thread that says how long the running health attempt may still wait, every
    :data:`HEALTH_TICK_S` seconds, until :meth:`stop` (bounded by the attempt's own timeout)."""

    def __init__(self, label: str, timeout_s: float) -> None:
        self._label = label
        self._deadline = time.monotonic() + timeout_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-ticker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(HEALTH_TICK_S):
            left = self._deadline - time.monotonic()
            if left <= 0:
                return
            log(f"{self._label}: waiting, {left:.0f} s left")

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=1.0)


class PhaseLines:
    """The journal-append callback of a CLI session: one line per phase of an episode on stderr.

    Lines (``upgrade-agent: `` prefixed): ``upgrade OP from SRC``, ``fetched N bytes, digest ok``,
    ``signature ok: key K, security version N``, ``staged into SLOT``, ``verified version V``,
    ``the service is stopped (ActiveState=inactive): it stays stopped``, ``switched: current -> SLOT``,
    ``left stopped: current -> SLOT, not health-checked``, ``health attempt i/n: up to T s``,
    ``restarting the service (transient unit UNIT)``, then every 5 s ``health attempt i/n: waiting, S s
    left``, ``health attempt i/n: healthy`` or ``... failed: WHY`` (warning), ``committed: SLOT runs V``,
    ``rolling back to SLOT: WHY`` (err),
    ``rolled back: current -> SLOT`` (warning), ``aborted: WHY`` (err), ``needs attention: WHY`` (err).
    Under ``-v`` every record's :func:`trace_line` too; under ``-q`` nothing.

    Args:
        level: :data:`QUIET`, :data:`NORMAL` or :data:`VERBOSE`.
        policy: the configured health policy, used until an ``EpisodeOpened`` names the episode's own.
    """

    def __init__(self, level: int, policy: HealthPolicy | None = None) -> None:
        self.level = level
        self.policy = policy or HealthPolicy()
        self._expected_digest = False
        self._ticker: _HealthTicker | None = None

    def __call__(self, record: Any) -> None:
        if self.level == QUIET:
            return
        if self._ticker is not None and _tag(record.event) not in _DURING_ATTEMPT:
            self._ticker.stop()  # the attempt has its verdict (or the flow moved on)
            self._ticker = None
        if self.level == VERBOSE:
            log(trace_line(record))
        said = self.phase(record.event)
        if said is not None:
            log(*said)
        if _tag(record.event) == "HealthAttemptStarted" and self.policy.timeout_s:
            self._ticker = _HealthTicker(self._attempt(record.event), self.policy.timeout_s)

    def close(self) -> None:
        """Stop the health ticker, if one runs (the command is over)."""
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None

    def _attempt(self, e: Any) -> str:
        of = f"/{self.policy.max_attempts}" if self.policy.max_attempts else ""
        whose = "" if e.target == "candidate" else " (last-good)"
        return f"health attempt {e.attempt}{of}{whose}"

    def phase(self, e: Any) -> tuple[str, int] | None:
        """The phase line of event ``e`` and its syslog priority, or None for a record with no phase of
        its own (the ``-v`` trace shows it)."""
        tag = _tag(e)
        if tag == "EpisodeOpened":
            self.policy = HealthPolicy(e.max_health_attempts, e.health_timeout_s)
            self._expected_digest = e.expected_sha256 is not None
            return f"{e.kind} {e.operation} from {e.source}", INFO
        if tag == "ArchiveFetched":
            digest = "digest ok" if self._expected_digest else f"sha256 {e.sha256} (no --sha256 to compare)"
            return f"fetched {e.size} bytes, {digest}", INFO
        if tag == "ReleaseTrusted":
            return f"signature ok: key {e.key_id}, security version {e.security_version}", INFO
        if tag == "CandidateStaged":
            return f"staged into {e.slot}", INFO
        if tag == "CandidateVerified":
            return f"verified version {e.version}", INFO
        if tag == "CandidateUnchanged":
            return f"{e.slot} already holds this release ({e.version or 'version unknown'})", INFO
        if tag == "UnitFoundStopped":
            return f"the service is stopped (ActiveState={e.active_state}): it stays stopped", INFO
        if tag == "SwitchCommitted":
            return f"switched: current -> {e.slot}", INFO
        if tag == "LeftStopped":
            return f"left stopped: current -> {e.slot}, not health-checked", WARNING
        if tag == "RestartRequested":
            return f"restarting the service (transient unit {e.unit})", INFO
        if tag == "HealthAttemptStarted":
            wait = f"up to {self.policy.timeout_s:g} s" if self.policy.timeout_s else "started"
            return f"{self._attempt(e)}: {wait}", INFO
        if tag == "HealthPassed":
            return f"{self._attempt(e)}: healthy", INFO
        if tag == "HealthFailed":
            return f"{self._attempt(e)}: failed: {e.reason}", WARNING
        if tag == "UpgradeCommitted":
            return f"committed: {e.slot} runs {e.version or 'version unknown'}", INFO
        if tag == "RollbackStarted":
            return f"rolling back to {e.to_slot}: {e.reason}", ERR
        if tag == "RolledBack":
            return f"rolled back: current -> {e.slot}", WARNING
        if tag == "Aborted":
            return f"aborted: {e.reason}", ERR
        if tag == "AttentionNeeded":
            return f"needs attention: {e.reason}", ERR
        if tag == "RecoveryStarted":
            return f"recovering ({e.trigger})", INFO
        return None


class Progress:
    """A rich progress bar on a terminal, otherwise a line every 5 s while a download lasts (its end is the
    ``fetched N bytes`` phase line) (design §7); all on stderr; nothing under ``-q``. As a context (the
    writing run, :func:`agent.cli.commands.common.run_writing`) it also ends ``phases``' health ticker."""

    def __init__(self, label: str, level: int = NORMAL, phases: PhaseLines | None = None) -> None:
        self.label = label
        self.level = level
        self.phases = phases  # its health ticker ends with the display (the writing run is over)
        self._bar: Any = None
        self._task: Any = None
        self._started: float | None = None
        self._last_log = 0.0
        self._tty = sys.stderr.isatty()

    def __enter__(self) -> Progress:
        if self._tty and self.level != QUIET:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.phases is not None:
            self.phases.close()
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def __call__(self, done: int, total: int | None) -> None:
        if self.level == QUIET:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)
            return
        now = time.monotonic()
        if self._started is None:  # the first line after 5 s: a quick download says only "fetched N bytes"
            self._started = self._last_log = now
        if now - self._last_log >= 5.0 and (total is None or done < total):
            self._last_log = now
            of = f" of {total}" if total else ""
            log(f"{self.label}: {done}{of} bytes")


def _tag(event: Any) -> str:
    """A journal event's stable name (its class's ``TAG``, the name the journal stores)."""
    return str(type(event).TAG)

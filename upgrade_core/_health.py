"""Judging one health attempt from unit samples (design §4.3 step 7, cases C16, C19). Pure, no I/O.

The orchestrator polls ``ServiceManager.snapshot()`` and the probe at most ``poll_interval_s`` (0.25 s)
apart (sooner while it waits for a first healthy sample, and exactly when a window ends:
:meth:`HealthJudge.next_sample_in`) on the :class:`~upgrade_core.ports.Clock` port's monotonic clock, and
feeds each sample to :meth:`HealthJudge.observe`. The judge answers :class:`Pending`, :class:`Passed` or
:class:`Failed`.

Passes when every condition holds continuously for ``stability_s`` within ``timeout_s``:

- a MainPID and InvocationID different from the baseline taken before the restart (or, without a
  baseline, a main process started after the restart was requested);
- ``ActiveState=active`` and ``SubState=running``;
- ``/proc/<MainPID>/exe`` is the expected slot path; or, for an interpreted agent whose exe is its
  interpreter, the main process started after the restart request (``ExecMainStartTimestampMonotonic``)
  and its command line names the current link or the slot path;
- ``NRestarts`` not above its first value after the restart;
- the probe (if any) healthy.

Fails at once on: a change of MainPID or InvocationID after the first new one was seen, ``failed``,
``inactive`` (unless no new process was seen and none started since the restart request: the
``--no-block`` restart job has not run yet, so the attempt waits, bounded by its timeout),
``Result=start-limit-hit``, ``NRestarts`` rising, an exe that is neither the slot nor an
interpreter naming it. A failing probe, or a unit still ``activating``, only restarts the window. Time is
monotonic only, so wall-clock jumps (C19) cannot shorten or stretch the window.
"""

from __future__ import annotations

import signal

import attrs

from .ports import ProbeUnreachable, UnitSnapshot

FIRST_GAP_S = 0.02
"""Seconds before the second sample of a wait (for a restart job, or for a first healthy sample)."""
GAP_GROWTH = 1.25
"""Each gap of a wait is this many times the one before, so a gap is about a quarter of the time already
waited (``g * r**n`` against ``g * (r**n - 1) / (r - 1)``): what a wait looks for (a restart job over, a
first healthy sample) is seen at most about 25 % late, where doubling could see it up to 100 % late. The
price: 12 samples in the first 1.08 s of a wait instead of 7, and none more after it (the gaps have
reached the 0.25 s poll interval). Design §9, ``upgrade.end_to_end``."""


def backoff_gap(waited: int) -> float:
    """The gap, in seconds, after ``waited`` (>= 0) samples of one wait: 0.02, 0.025, 0.031, 0.039, ...,
    growing by :data:`GAP_GROWTH` up to 0.02 * 1.25**16 (about 0.71 s). The caller caps it at its poll
    interval (0.25 s by default, reached after 12 samples, about 1 s into the wait)."""
    return FIRST_GAP_S * GAP_GROWTH ** min(waited, 16)


_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3  # waitid(2) si_code values systemd shows as ExecMainCode


def how_it_ended(snap: UnitSnapshot) -> str | None:
    """What systemd saw of the unit's last main process, from its own ``ExecMainCode``/``ExecMainStatus``
    (systemd.exec(5)): ``exited with status N``, ``killed by signal SIGX`` or ``dumped core on signal
    SIGX``; None when no main process has ended (code 0) or the code is one systemd does not document."""
    if snap.exec_main_code == _CLD_EXITED:
        return f"exited with status {snap.exec_main_status}"
    if snap.exec_main_code in (_CLD_KILLED, _CLD_DUMPED):
        try:
            name = signal.Signals(snap.exec_main_status).name
        except ValueError:
            name = f"signal {snap.exec_main_status}"
        how = "killed by" if snap.exec_main_code == _CLD_KILLED else "dumped core on"
        return f"{how} {name}"
    return None


def _ended(snap: UnitSnapshot) -> str:
    """``: the service exited with status 1`` (see :func:`how_it_ended`), or "" when systemd saw no end."""
    how = how_it_ended(snap)
    return f": the service {how}" if how else ""


@attrs.frozen
class Pending:
    """No verdict yet. ``why`` says which condition does not hold (for logs), or "" inside the window."""

    why: str = ""


@attrs.frozen
class Passed:
    """Every condition held for the whole stability window."""


@attrs.frozen
class Failed:
    """The attempt failed; ``reason`` is one line for ``HealthFailed``. ``environment``: the failure says
    nothing about the binary (its cause is journaled as ``"environment"``: never known-bad, docs/trust.md)."""

    reason: str
    environment: bool = False


Verdict = Pending | Passed | Failed


@attrs.frozen
class Expectation:
    """What the new main process must look like.

    Attributes:
        slot_path: absolute path of the slot that must run (candidate, or last-good during a rollback).
        current_link_path: absolute path of ``NAME-current`` (ExecStart runs it).
        restart_requested_monotonic: CLOCK_MONOTONIC seconds just before the restart was requested.
        baseline_pid / baseline_invocation: MainPID and InvocationID before the restart; None when
            unknown (a recovery or a resume that did not restart the unit itself).
        stability_s: seconds every condition must hold.
        timeout_s: seconds the attempt may last.
    """

    slot_path: str
    current_link_path: str
    restart_requested_monotonic: float
    baseline_pid: int | None
    baseline_invocation: str | None
    stability_s: float
    timeout_s: float


class HealthJudge:
    """Judges one attempt, sample by sample. Create one per attempt.

    Args:
        expect: what the new process must look like.
        started_monotonic: CLOCK_MONOTONIC seconds when the attempt began (its timeout counts from here).
    """

    def __init__(self, expect: Expectation, started_monotonic: float) -> None:
        self.expect = expect
        self.started = started_monotonic
        self.first_pid: int | None = None
        self.first_invocation: str | None = None
        self.first_n_restarts: int | None = None
        self.window_start: float | None = None
        self.verdict: Verdict = Pending("no sample yet")
        self._waiting = 0  # samples since the last window ended (or since the start) without a window

    @property
    def observed(self) -> tuple[int, str] | None:
        """The new (MainPID, InvocationID) once seen, else None."""
        if self.first_pid is None or self.first_invocation is None:
            return None
        return (self.first_pid, self.first_invocation)

    def observe(self, snap: UnitSnapshot, probe_failure: str | None, now: float) -> Verdict:
        """Judge one sample taken at monotonic time ``now`` (seconds).

        Args:
            snap: the unit and its main process.
            probe_failure: None when the probe passed (or there is none), else its one-line reason.
            now: CLOCK_MONOTONIC seconds of the sample.

        Returns:
            The verdict; once :class:`Passed` or :class:`Failed`, later calls return the same value.
        """
        if isinstance(self.verdict, Passed | Failed):
            return self.verdict
        self.verdict = self._judge(snap, probe_failure, now)
        self._waiting = self._waiting + 1 if self.window_start is None else 0
        return self.verdict

    def next_sample_in(self, now: float, poll_interval_s: float) -> float:
        """Seconds to wait before the next sample; never more than ``poll_interval_s``.

        Before the window (the new process not seen yet, or not healthy yet) the gaps grow from
        :data:`FIRST_GAP_S` by :data:`GAP_GROWTH`, so a process that is up within a few hundred milliseconds
        is seen then rather than up to a poll interval later, and one that never comes up costs no more
        samples than the fixed polling after the first second. Inside the window the sample that completes it
        is taken when it ends, not up to a poll interval (plus each sample's own duration) after it. The
        window is never shorter: :meth:`observe` passes only once ``stability_s`` elapsed between the window's
        first sample and the current one.

        Args:
            now: CLOCK_MONOTONIC seconds.
            poll_interval_s: the longest gap between samples (design §4.3 step 7: 0.25 s).

        Returns:
            Seconds, at least 0.01 (a clock that does not advance by tiny sleeps still reaches the end).
        """
        if self.window_start is None:
            return min(poll_interval_s, backoff_gap(self._waiting))
        left = self.window_start + self.expect.stability_s - now
        return max(0.01, min(poll_interval_s, left))

    def _judge(self, snap: UnitSnapshot, probe_failure: str | None, now: float) -> Verdict:
        e = self.expect
        if snap.result == "start-limit-hit":
            return Failed("start-limit-hit")
        if snap.active_state in ("failed", "inactive"):
            if self._restart_not_begun(snap):
                # The restart runs from a --no-block transient unit: until its job starts, a unit that was
                # not running (an install) still shows inactive/dead from before our request. The
                # orchestrator now samples only once that job is over (ServiceManager.restart_done); this
                # stays for a judge fed without that wait (an embedder's own loop).
                return self._timeout(now, "restart not begun yet")
            return Failed(f"unit {snap.active_state} ({snap.sub_state}, result {snap.result}){_ended(snap)}")
        why = self._identity(snap)
        if isinstance(why, Failed):
            return why
        if why is None:
            why = self._exe(snap)
            if isinstance(why, Failed):
                return why
        if why is None and (snap.active_state, snap.sub_state) != ("active", "running"):
            why = f"unit {snap.active_state}/{snap.sub_state}"
        unreachable = False
        if why is None and probe_failure is not None:
            why = f"probe: {probe_failure}"
            unreachable = isinstance(probe_failure, ProbeUnreachable)
        if why is not None:
            self.window_start = None
            return self._timeout(now, why, environment=unreachable)
        if self.window_start is None:
            self.window_start = now
        if now - self.window_start >= e.stability_s:
            return Passed()
        return self._timeout(now, "")

    def _timeout(self, now: float, why: str, *, environment: bool = False) -> Verdict:
        if now - self.started >= self.expect.timeout_s:
            detail = f": {why}" if why else ""
            return Failed(f"not healthy for {self.expect.stability_s:g} s within {self.expect.timeout_s:g} s"
                          f"{detail}", environment)
        return Pending(why)

    def _restart_not_begun(self, snap: UnitSnapshot) -> bool:
        """Inactive, no new process seen, and none started since the request: the restart job has not run."""
        return (
            self.first_pid is None
            and snap.active_state == "inactive"
            and snap.main_start_monotonic_s < self.expect.restart_requested_monotonic
        )

    def _identity(self, snap: UnitSnapshot) -> str | Failed | None:
        """MainPID / InvocationID / NRestarts rules; a string is a reason to wait."""
        e = self.expect
        if self.first_pid is not None:
            if snap.main_pid != self.first_pid:
                return Failed(f"MainPID changed from {self.first_pid} to {snap.main_pid}{_ended(snap)}")
            if snap.invocation_id != self.first_invocation:
                return Failed("InvocationID changed")
            assert self.first_n_restarts is not None
            if snap.n_restarts > self.first_n_restarts:
                return Failed(
                    f"NRestarts rose from {self.first_n_restarts} to {snap.n_restarts}{_ended(snap)}")
            return None
        if snap.main_pid <= 0 or not snap.invocation_id:
            return "no main process yet"
        if e.baseline_pid is not None and (
            snap.main_pid == e.baseline_pid or snap.invocation_id == e.baseline_invocation
        ):
            return "restart not observed yet"
        if not e.baseline_pid and snap.main_start_monotonic_s < e.restart_requested_monotonic:
            # No baseline, or the unit had no main process (MainPID 0) before the request: a process is
            # ours only if it started after the request (a previous attempt's late restart is not).
            return "main process predates the restart"
        self.first_pid = snap.main_pid
        self.first_invocation = snap.invocation_id
        self.first_n_restarts = snap.n_restarts
        return None

    def _exe(self, snap: UnitSnapshot) -> str | Failed | None:
        e = self.expect
        if snap.exe is None:
            return "exe unreadable"
        if snap.exe == e.slot_path:
            return None
        if not snap.cmdline:
            # A process that has begun to exit has an empty command line (proc(5): "unless the process is a
            # zombie"), and the exe and the command line are read one after the other: a main process that
            # exits between the two reads looks like an interpreter running something else. Wait for the
            # next sample, which shows the exit (MainPID changed, the unit failed); a process that hides its
            # command line never opens the window, so the attempt ends at its timeout.
            return "main process command line unreadable (exiting)"
        # An interpreted agent: exe is the interpreter; its command line must name the link or the slot,
        # and the process must have started after our restart request.
        names_us = any(arg in (e.current_link_path, e.slot_path) for arg in snap.cmdline)
        if names_us and snap.main_start_monotonic_s >= e.restart_requested_monotonic:
            return None
        # What the unit runs, not the interpreter: the ExecStart path (a drop-in may pin it elsewhere).
        runs = snap.exec_start if snap.exec_start and snap.exec_start != snap.exe else snap.exe
        started = f" (its ExecStart runs {runs})" if runs != snap.exe else ""
        return Failed(f"exe mismatch: main process runs {snap.exe}{started}, expected {e.slot_path}")

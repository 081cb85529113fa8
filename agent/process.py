"""Run a child process with a deadline, bounded output, and its whole process group killed at the end.

Used by the systemd binding (``systemctl``/``systemd-run``, possibly behind an ``nsenter`` prefix) and by
the command health probe. anyio's ``run_process`` has neither a timeout nor process-group handling: a
child that forks (``nsenter -p`` forks, a probe script may background a grandchild) would otherwise
survive a timeout and keep our pipes open. So each child starts its own session (``setsid``); when the main
process exits, times out or the caller is cancelled, the group is sent SIGKILL (killpg(2)) and reading stops.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

import anyio
import attrs
from anyio.abc import ByteReceiveStream

__all__ = ["BoundedRunTimeout", "Finished", "kill_group", "run_bounded"]


@attrs.frozen
class Finished:
    """A child that exited on its own.

    Attributes:
        argv: the command as run.
        returncode: exit status; negative when killed by a signal (``-signum``).
        stdout: at most ``max_output_bytes`` of standard output.
        stderr: at most ``max_output_bytes`` of standard error.
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes


class BoundedRunTimeout(TimeoutError):
    """The child ran past its deadline; its process group was killed.

    Attributes:
        argv: the command as run.
        timeout_s: the deadline in seconds.
    """

    def __init__(self, argv: Sequence[str], timeout_s: float) -> None:
        super().__init__(f"{' '.join(argv)} timed out after {timeout_s:g} s")
        self.argv = tuple(argv)
        self.timeout_s = timeout_s


def kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid``; a group that is gone already is not an error.

    ``pgid`` is the leader's PID. Linux keeps a PID reserved while it names a live process group, so while
    any member survives this reaches exactly that group; with none left it is ESRCH. (Only a new process
    given the same PID *and* making itself a group leader in between could be hit: negligible.) Used by
    :func:`run_bounded` and by the candidate verifier (:mod:`agent.release.verify`).
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _drain(stream: ByteReceiveStream | None, sink: bytearray, limit: int) -> None:
    if stream is None:
        return
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        while True:
            chunk = await stream.receive()
            room = limit - len(sink)
            if room > 0:
                sink += chunk[:room]


async def run_bounded(
    argv: Sequence[str],
    *,
    timeout_s: float,
    max_output_bytes: int = 1 << 20,
    env: Mapping[str, str] | None = None,
    capture_stdout: bool = True,
) -> Finished:
    """Run ``argv`` to completion within ``timeout_s`` seconds.

    Output beyond ``max_output_bytes`` per stream is read and discarded (so a chatty child never blocks).
    When the main process exits, its process group is killed and reading stops: a grandchild holding a
    pipe neither stalls the caller nor survives.

    Args:
        argv: the command; ``argv[0]`` is looked up on PATH.
        timeout_s: seconds from start to the end of the main process.
        max_output_bytes: bound per stream, in bytes.
        env: the child's environment (default: ours).
        capture_stdout: False sends stdout to /dev/null.

    Returns:
        The exit status and bounded output.

    Raises:
        BoundedRunTimeout: the deadline passed; the group was killed and the child reaped.
        OSError: the program could not be started (missing, not executable).

    Cancellation: the process group is killed and the child reaped (shielded); no other effect.
    """
    proc = await anyio.open_process(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture_stdout else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )
    out, err = bytearray(), bytearray()
    exited = False
    try:
        with anyio.move_on_after(timeout_s):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_drain, proc.stdout, out, max_output_bytes)
                tg.start_soon(_drain, proc.stderr, err, max_output_bytes)
                await proc.wait()
                exited = True
                kill_group(proc.pid)
                # The pipes reach EOF once the killed group is gone; a descendant that left the group
                # (its own setsid) may still hold them: stop reading after a short grace.
                tg.cancel_scope.deadline = anyio.current_time() + 0.5
    finally:
        kill_group(proc.pid)
        with anyio.CancelScope(shield=True):
            await proc.wait()
            await proc.aclose()
    if not exited:
        raise BoundedRunTimeout(argv, timeout_s)
    assert proc.returncode is not None  # reaped above
    return Finished(tuple(argv), proc.returncode, bytes(out), bytes(err))

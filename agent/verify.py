"""``VerifierImpl``: run a candidate's version command, bounded (SPEC 4.3 step 4, case C10).

The command ``[path, *version_args]`` runs in its own session (so it leads a new process group), with
stdin on ``/dev/null`` and stderr merged into stdout (version commands print to either). Bounds:

- time: ``verify.timeout_s``; on expiry the whole process group gets SIGKILL (``killpg``), so children
  it forked die too;
- output: at most ``verify.max_output_bytes`` are read; more is a failure and kills the group;
- lifetime: as soon as the main process exits, its process group is killed and reading stops after a
  short drain, so a grandchild that keeps the pipe open neither stalls the verify nor survives it;
- ``ETXTBSY`` on exec (the file was just written, and another thread's fork may still hold a write
  descriptor for a moment, a known race of fork+exec) is retried a few times, milliseconds apart.

Acceptance: exit status 0 and a non-empty line; the version is the first whitespace-separated token that
matches ``v?\\d+(\\.\\d+)+\\S*``; an expected version is compared after stripping one leading ``v``.
Uses ``anyio.open_process`` so it runs on asyncio and trio alike.
"""

from __future__ import annotations

import errno
import re
import subprocess
from collections.abc import Sequence

import anyio
import attrs
from anyio.abc import Process

from agent._bounded_run import kill_group
from upgrade_core.errors import VerifyError, VerifyTimeoutError, VersionMismatchError

__all__ = ["VerifierImpl", "parse_version"]

_VERSION_RE = re.compile(r"v?\d+(\.\d+)+\S*")
_DRAIN_S = 0.5  # after the main process exited: bounded wait for the pipe's last bytes
_SHOWN_CHARS = 200


def parse_version(output: str) -> str | None:
    """First whitespace-separated token of ``output`` matching ``v?\\d+(\\.\\d+)+\\S*`` (SPEC 4.3).

    Returns None when no token matches.
    """
    for token in output.split():
        if _VERSION_RE.fullmatch(token):
            return token
    return None


def _strip_v(version: str) -> str:
    return version[1:] if version[:1] in ("v", "V") else version


@attrs.define
class VerifierImpl:
    """The real :class:`upgrade_core.ports.Verifier`.

    Attributes:
        version_args: ``agent.version_args``, e.g. ``("version",)``.
        timeout_s: ``verify.timeout_s``, seconds, for the whole run.
        max_output_bytes: ``verify.max_output_bytes``.
        etxtbsy_attempts: exec attempts while the kernel answers ETXTBSY.
        etxtbsy_delay_s: pause between those attempts, seconds (grows linearly).
    """

    version_args: Sequence[str] = ("version",)
    timeout_s: float = 30.0
    max_output_bytes: int = 65536
    etxtbsy_attempts: int = 5
    etxtbsy_delay_s: float = 0.01

    async def verify(self, path: str, expected_version: str | None) -> str:
        """Run ``path`` with ``version_args`` and return the version it reports.

        Args:
            path: the candidate (usually its staging file), executable.
            expected_version: ``--expect-version``, with or without a leading ``v``; None to accept any.

        Returns:
            The reported version token as printed (e.g. ``v1.4.2`` or ``1.4.2+build.7``).

        Raises:
            VerifyTimeoutError: it ran past ``timeout_s``; its process group was killed.
            VersionMismatchError: the reported version differs from ``expected_version``.
            VerifyError: it could not be executed, exited non-zero or by a signal, printed nothing, printed
                more than ``max_output_bytes``, or printed no version token.

        Cancellation: the process group is killed and the process reaped; no other effect.
        """
        argv = [path, *self.version_args]
        proc = await self._spawn(argv)
        pgid = proc.pid  # start_new_session: the child leads its own process group
        output = bytearray()
        overflow = False
        timed_out = False
        try:
            with anyio.move_on_after(self.timeout_s) as deadline:
                reader_done = anyio.Event()
                async with anyio.create_task_group() as tg:

                    async def read_output() -> None:
                        nonlocal overflow
                        assert proc.stdout is not None
                        try:
                            async for chunk in proc.stdout:
                                output.extend(chunk)
                                if len(output) > self.max_output_bytes:
                                    overflow = True
                                    del output[self.max_output_bytes :]
                                    kill_group(pgid)
                                    break
                        finally:
                            reader_done.set()

                    async def reap() -> None:
                        await proc.wait()
                        kill_group(pgid)  # C10: no grandchild outlives the main process
                        with anyio.move_on_after(_DRAIN_S):  # bounded drain of what is in the pipe
                            await reader_done.wait()
                        tg.cancel_scope.cancel()  # stop reading: a setsid'd grandchild may hold the pipe

                    tg.start_soon(read_output)
                    tg.start_soon(reap)
            timed_out = deadline.cancelled_caught
        finally:
            with anyio.CancelScope(shield=True):
                kill_group(pgid)
                await proc.wait()
                await proc.aclose()
        if timed_out:
            raise VerifyTimeoutError(
                f"{path}: version command {' '.join(self.version_args)!r} did not finish within "
                f"verify.timeout_s = {self.timeout_s:g} s; its process group was killed"
            )
        if overflow:
            raise VerifyError(
                f"{path}: version command printed more than verify.max_output_bytes = {self.max_output_bytes}"
            )
        return self._judge(path, proc.returncode, output.decode("utf-8", "replace"), expected_version)

    async def _spawn(self, argv: list[str]) -> Process:
        for attempt in range(1, self.etxtbsy_attempts + 1):
            try:
                return await anyio.open_process(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                if exc.errno == errno.ETXTBSY and attempt < self.etxtbsy_attempts:
                    await anyio.sleep(self.etxtbsy_delay_s * attempt)
                    continue
                raise VerifyError(
                    f"{argv[0]}: cannot run the version command: {exc.strerror or exc}"
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _judge(self, path: str, returncode: int | None, text: str, expected: str | None) -> str:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        shown = first[:_SHOWN_CHARS]
        if returncode != 0:
            how = f"was killed by signal {-returncode}" if returncode and returncode < 0 else (
                f"exited with status {returncode}"
            )
            raise VerifyError(f"{path}: version command {how}" + (f": {shown!r}" if shown else ""))
        if not first:
            raise VerifyError(f"{path}: version command printed nothing")
        version = parse_version(text)
        if version is None:
            raise VerifyError(f"{path}: version command printed no version token: {shown!r}")
        if expected is not None and _strip_v(version) != _strip_v(expected):
            raise VersionMismatchError(f"{path}: reports version {version}, expected {expected}")
        return version

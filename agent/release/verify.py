"""``VerifierImpl``: run a candidate's version command, bounded (design §4.3 step 4, cases C10, C29).

The command ``[path, *version_args]`` runs in its own session (so it leads a new process group), with
stdin on ``/dev/null``; stdout and stderr are two separate pipes, each read and bounded on its own.
Bounds:

- time: ``verify.timeout_s``; on expiry the whole process group gets SIGKILL (``killpg``), so children
  it forked die too;
- output: at most ``verify.max_output_bytes`` are read from each of stdout and stderr; more on either is a
  failure and kills the group;
- lifetime: as soon as the main process exits, its process group is killed and reading stops after a
  short drain, so a grandchild that keeps a pipe open neither stalls the verify nor survives it;
- environment: only ``PATH``, systemd's default for system services (:data:`VERSION_COMMAND_ENV`): the
  candidate is checked as the unit will run it, not with what the operator's shell happens to export
  (an ``LD_LIBRARY_PATH`` that makes it start here but not under systemd, credentials it has no business
  reading, a ``PATH`` through interpreter shims);
- ``ETXTBSY`` on exec (the file was just written, and another thread's fork may still hold a write
  descriptor for a moment, a known race of fork+exec) is retried a few times, milliseconds apart.

Reading the version (case C29, the candidate contract in docs/candidate.md):

- stdout is read first; stderr only when stdout holds no version (tools print ``--version`` to either);
- output must be UTF-8 text: invalid UTF-8, a NUL or another control character (anything below U+0020
  but tab, LF, VT, FF and CR, and DEL) is refused;
- the version is taken from the *first line that holds a version token*; every token on that line must
  normalise to the same value (``tool 1.2.3 (libtool 1.2.3)`` is fine, ``curl 7.88 zlib/1.2.13`` is
  ambiguous and refused: configure ``[verify] version_regex`` for such tools);
- default token (:data:`VERSION_TOKEN`): an optional ``v``, two or more dot-separated numbers, an optional
  semver pre-release (``-rc.1``) and build metadata (``+abc``), delimited by the line's start or end,
  whitespace or punctuation that is not part of a version: ``1.4.0,`` reads ``1.4.0``, ``jq-1.6`` reads
  ``1.6``, ``Version: 1.2.3`` reads ``1.2.3``; letters glued to the number (``go1.22``) do not delimit;
- ``[verify] version_regex`` replaces the default: its one capture group is the token, searched line by
  line in the same way;
- the recorded version is the normalised token: without its leading ``v``. ``--expect-version`` is
  normalised the same way and compared for equality.

Uses ``anyio.open_process`` so it runs on asyncio and trio alike.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
from collections.abc import Sequence

import anyio
import attrs
from anyio.abc import ByteReceiveStream, Process

from agent.process import kill_group
from upgrade_core.errors import (
    HostRootMismatchError,
    VerifyCannotRunError,
    VerifyError,
    VerifyTimeoutError,
    VersionMismatchError,
)

__all__ = [
    "VERSION_COMMAND_ENV",
    "VERSION_TOKEN",
    "VerifierImpl",
    "compile_version_regex",
    "normalise_version",
    "parse_version",
]

_CORE = r"[vV]?(\d+(?:\.\d+)+(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?)"
VERSION_TOKEN = re.compile(r"(?<![0-9A-Za-z.+_])" + _CORE + r"(?![0-9A-Za-z_]|[.+-][0-9A-Za-z])")
"""The default version token; group 1 is the normalised version (no leading ``v``)."""

VERSION_COMMAND_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
"""The version command's whole environment: the ``PATH`` systemd gives system services when the unit sets
none (``DefaultEnvironment=`` unset; systemd.exec(5), "Environment variables in spawned processes")."""
_FULL_TOKEN = re.compile(_CORE)
_BINARY = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_DRAIN_S = 0.5  # after the main process exited: bounded wait for the pipes' last bytes
_SHOWN_CHARS = 200


def normalise_version(token: str) -> str | None:
    """The normalised form of one version token (``v1.2.3-rc.1+abc`` -> ``1.2.3-rc.1+abc``).

    Returns:
        The token without its leading ``v``, or None when ``token`` as a whole is not a version token of
        the default grammar (:data:`VERSION_TOKEN`).
    """
    m = _FULL_TOKEN.fullmatch(token)
    return m.group(1) if m else None


def compile_version_regex(pattern: str) -> re.Pattern[str]:
    """Compile ``[verify] version_regex``: a valid regular expression with exactly one capture group.

    Raises:
        ValueError: the pattern does not compile or has another number of groups (the message says
            which; the configuration loader turns it into a ConfigError naming the key).
    """
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"must be a valid regular expression: {exc}") from None
    if compiled.groups != 1:
        raise ValueError(f"must have exactly one capture group, found {compiled.groups}")
    return compiled


class _Ambiguous(Exception):
    def __init__(self, line: str, tokens: list[str]) -> None:
        super().__init__(line)
        self.line = line
        self.tokens = tokens


def _line_tokens(line: str, pattern: re.Pattern[str] | None) -> list[str]:
    if pattern is None:
        return [m.group(1) for m in VERSION_TOKEN.finditer(line)]
    out = []
    for m in pattern.finditer(line):
        token = (m.group(1) or "").strip()
        if token:
            out.append(token[1:] if token[:1] in ("v", "V") and token[1:2].isdigit() else token)
    return out


def parse_version(output: str, pattern: re.Pattern[str] | None = None) -> str | None:
    """The normalised version printed in ``output`` (design §4.3 step 4, case C29).

    Args:
        output: the decoded text of one stream.
        pattern: ``[verify] version_regex`` compiled (one capture group), or None for
            :data:`VERSION_TOKEN`.

    Returns:
        The version from the first line holding a token, without a leading ``v``; None when no line
        holds one.

    Raises:
        VerifyError: that line holds two tokens that normalise differently (ambiguous).
    """
    for line in output.splitlines():
        tokens = _line_tokens(line, pattern)
        if not tokens:
            continue
        distinct = sorted(set(tokens))
        if len(distinct) > 1:
            raise VerifyError(
                f"version output is ambiguous: {' and '.join(distinct[:3])} on the line "
                f"\"{_shown(line)}\" (set [verify] version_regex for this tool)"
            )
        return tokens[0]
    return None


def _shown(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _SHOWN_CHARS else line[:_SHOWN_CHARS] + "..."


def _as_text(data: bytes, path: str, stream: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VerifyError(
            f"{path}: version command printed bytes that are not UTF-8 text on {stream} "
            f"(at byte {exc.start})"
        ) from None
    bad = _BINARY.search(text)
    if bad is not None:
        raise VerifyError(
            f"{path}: version command printed binary output on {stream} "
            f"(control character U+{ord(bad.group()):04X} at character {bad.start()})"
        )
    return text


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


@attrs.define
class VerifierImpl:
    """The real :class:`upgrade_core.ports.Verifier`.

    Attributes:
        version_args: ``agent.version_args``, e.g. ``("version",)``.
        timeout_s: ``verify.timeout_s``, seconds, for the whole run.
        max_output_bytes: ``verify.max_output_bytes``, per stream (stdout, stderr).
        version_regex: ``[verify] version_regex`` ("" for the default token, :data:`VERSION_TOKEN`);
            checked here too (exactly one capture group).
        host_root_args: ``agent.host_root_args``: () for no host-root check, else the arguments after the
            candidate that make it print its host root (run by the same rules as the version command).
        host_root: this host's root, resolved (``upgrade-agent host-root``), which the answer must equal.
        etxtbsy_attempts: exec attempts while the kernel answers ETXTBSY.
        etxtbsy_delay_s: pause between those attempts, seconds (grows linearly).

    Raises:
        ValueError: at construction, a ``version_regex`` that does not compile or has not exactly one
            capture group (the configuration loader reports it earlier, as a ConfigError).
    """

    version_args: Sequence[str] = ("version",)
    timeout_s: float = 30.0
    max_output_bytes: int = 65536
    version_regex: str = ""
    host_root_args: Sequence[str] = ()
    host_root: str = ""
    etxtbsy_attempts: int = 5
    etxtbsy_delay_s: float = 0.01
    _pattern: re.Pattern[str] | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._pattern = compile_version_regex(self.version_regex) if self.version_regex else None

    async def verify(self, path: str, expected_version: str | None) -> str:
        """Run ``path`` with ``version_args`` and return the version it reports; with ``host_root_args``, then
        run ``path`` with those and refuse an answer other than ``host_root``.

        Args:
            path: the candidate (usually its staging file), executable.
            expected_version: ``--expect-version``, with or without a leading ``v``; None to accept any.

        Returns:
            The reported version, normalised (``v1.4.2`` is returned as ``1.4.2``).

        Raises:
            VerifyTimeoutError: it ran past ``timeout_s``; its process group was killed.
            VersionMismatchError: the reported version differs from ``expected_version`` (both normalised).
            HostRootMismatchError: it answers ``host_root_args`` with another host root than ``host_root``.
            VerifyError: it could not be executed, exited non-zero or by a signal, printed nothing, printed
                more than ``max_output_bytes`` on a stream, printed non-UTF-8 or binary output, printed no
                version token, or two different ones on the first line holding one; or its host-root
                command failed in one of those ways or printed no absolute path.

        Cancellation: the process group is killed and the process reaped; no other effect.
        """
        code, out, err = await self._run(path, self.version_args, "version command")
        version = self._judge(path, code, out, err, expected_version)
        if self.host_root_args:
            await self._check_host_root(path)
        return version

    async def _check_host_root(self, path: str) -> None:
        """The seeds' ``<candidate> host-root`` check (docs/candidate.md): the candidate's answer, the first
        line of its stdout (a path, or ``upgrade-agent --json``'s ``{"host_root": ...}``), must be this host's
        root."""
        what = "host-root command"
        code, out, _err = await self._run(path, self.host_root_args, what)
        if code != 0:
            raise VerifyError(f"{path}: {what} {' '.join(self.host_root_args)} exited with status {code}")
        line = _first_line(_as_text(out, path, "stdout"))
        answer: object = line
        if line.startswith("{"):
            try:
                answer = json.loads(line).get("host_root")
            except (ValueError, AttributeError):
                answer = None
        if not isinstance(answer, str) or not os.path.isabs(answer):
            raise VerifyError(f"{path}: {what} printed no host root: \"{_shown(line)}\"")
        if os.path.normpath(answer) != os.path.normpath(self.host_root):
            raise HostRootMismatchError(
                f"{path}: answers host root {_shown(answer)}; this host's root is {self.host_root}"
            )

    async def _run(self, path: str, args: Sequence[str], what: str) -> tuple[int | None, bytes, bytes]:
        """Run ``[path, *args]`` by the rules of the module doc; its exit status, stdout and stderr."""
        argv = [path, *args]
        proc = await self._spawn(argv, what)
        pgid = proc.pid  # start_new_session: the child leads its own process group
        outputs = {"stdout": bytearray(), "stderr": bytearray()}
        overflow: list[str] = []
        timed_out = False
        try:
            with anyio.move_on_after(self.timeout_s) as deadline:
                async with anyio.create_task_group() as tg:
                    readers_done = [anyio.Event(), anyio.Event()]

                    async def read(stream: ByteReceiveStream | None, name: str, done: anyio.Event) -> None:
                        sink = outputs[name]
                        try:
                            if stream is None:
                                return
                            async for chunk in stream:
                                sink.extend(chunk)
                                if len(sink) > self.max_output_bytes:
                                    overflow.append(name)
                                    del sink[self.max_output_bytes :]
                                    kill_group(pgid)
                                    break
                        finally:
                            done.set()

                    async def reap() -> None:
                        await proc.wait()
                        kill_group(pgid)  # C10: no grandchild outlives the main process
                        with anyio.move_on_after(_DRAIN_S):  # bounded drain of what is in the pipes
                            for done in readers_done:
                                await done.wait()
                        tg.cancel_scope.cancel()  # stop reading: a setsid'd grandchild may hold a pipe

                    tg.start_soon(read, proc.stdout, "stdout", readers_done[0])
                    tg.start_soon(read, proc.stderr, "stderr", readers_done[1])
                    tg.start_soon(reap)
            timed_out = deadline.cancelled_caught
        finally:
            with anyio.CancelScope(shield=True):
                kill_group(pgid)
                await proc.wait()
                await proc.aclose()
        if timed_out:
            raise VerifyTimeoutError(
                f"{path}: {what} {' '.join(args)} did not finish within "
                f"verify.timeout_s = {self.timeout_s:g} s; its process group was killed"
            )
        if overflow:
            raise VerifyError(
                f"{path}: {what} printed more than verify.max_output_bytes = "
                f"{self.max_output_bytes} on {overflow[0]}"
            )
        return proc.returncode, bytes(outputs["stdout"]), bytes(outputs["stderr"])

    async def _spawn(self, argv: list[str], what: str) -> Process:
        for attempt in range(1, self.etxtbsy_attempts + 1):
            try:
                return await anyio.open_process(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    env=VERSION_COMMAND_ENV,
                )
            except OSError as exc:
                if exc.errno == errno.ETXTBSY and attempt < self.etxtbsy_attempts:
                    await anyio.sleep(self.etxtbsy_delay_s * attempt)
                    continue
                raise VerifyCannotRunError(
                    f"{argv[0]}: cannot run the {what}: {exc.strerror or exc}"
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _judge(
        self, path: str, returncode: int | None, stdout: bytes, stderr: bytes, expected: str | None
    ) -> str:
        if returncode != 0:
            first = _first_line(stdout.decode("utf-8", "replace")) or _first_line(
                stderr.decode("utf-8", "replace")
            )
            shown = _BINARY.sub("?", _shown(first))
            how = f"was killed by signal {-returncode}" if returncode and returncode < 0 else (
                f"exited with status {returncode}"
            )
            raise VerifyError(f"{path}: version command {how}" + (f": \"{shown}\"" if shown else ""))
        out_text = _as_text(stdout, path, "stdout")
        version = self._parse(out_text, path)
        if version is None:
            err_text = _as_text(stderr, path, "stderr")
            version = self._parse(err_text, path)
            if version is None:
                first = _first_line(out_text) or _first_line(err_text)
                if not first:
                    raise VerifyError(f"{path}: version command printed nothing")
                raise VerifyError(f"{path}: version command printed no version token: \"{_shown(first)}\"")
        if expected is not None:
            want = normalise_version(expected)
            if want is None or version != want:
                raise VersionMismatchError(f"{path}: reports version {version}, expected {expected}")
        return version

    def _parse(self, text: str, path: str) -> str | None:
        try:
            return parse_version(text, self._pattern)
        except VerifyError as exc:
            raise VerifyError(f"{path}: {exc}") from None

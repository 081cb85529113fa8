"""agent.release.verify against real processes (case C10, design §4.3 step 4), on asyncio and trio."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import anyio
import pytest

from agent.release.verify import VerifierImpl, compile_version_regex, normalise_version, parse_version
from tests._proc import wait_dead
from upgrade_core.errors import VerifyError, VerifyTimeoutError, VersionMismatchError

pytestmark = pytest.mark.anyio

HANG_GUARD_S = 20.0  # a verify that outlives its own timeout by this much is hung, not slow


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def _read_pid(path: Path) -> int:
    return int(path.read_text().split()[0])


# The default token (C29): expected normalised versions written down; None = no token on any line.
PARSE_CASES = [
    ("demo-agent version v1.2.3 (abc)\n", "1.2.3"),
    ("v1.2.3\n", "1.2.3"),
    ("agent 1.4.0, build x\n", "1.4.0"),
    ("agent 1.4.0, build 3f2a9c1\n", "1.4.0"),
    ("jq-1.6\n", "1.6"),
    ("jq-1.7.1\n", "1.7.1"),
    ("Version: 1.2.3\n", "1.2.3"),
    ("1.2.3-rc.1+abc\n", "1.2.3-rc.1+abc"),
    ("1.2.3+build.7\n", "1.2.3+build.7"),
    ("tool (1.2.3).\n", "1.2.3"),
    ("esbuild 0.20.2\n", "0.20.2"),
    ("OpenSSL 3.0.11 19 Sep 2023 (Library: OpenSSL 3.0.11 19 Sep 2023)\n", "3.0.11"),  # same token twice
    ("usage: tool [opts]\ntool version 2.0.1\n", "2.0.1"),  # the first line that has one
    ("v2 release\n", None),  # one number is not a version
    ("go version go1.22.1 linux/amd64\n", None),  # letters glued to the number do not delimit it
    ("1.2.3.x\n", None),
    ("", None),
]


@pytest.mark.parametrize(("output", "want"), PARSE_CASES)
def test_parse_version(output: str, want: str | None) -> None:
    assert parse_version(output) == want


@pytest.mark.parametrize(
    "output", ["agent 10.0-rc1 2.3.4\n", "agent 10 build-2.3 2.3.4\n", "curl 7.88.1 zlib/1.2.13\n"]
)
def test_two_different_tokens_on_the_first_line_are_ambiguous(output: str) -> None:
    with pytest.raises(VerifyError, match="ambiguous"):
        parse_version(output)


@pytest.mark.parametrize(
    ("token", "want"),
    [("v1.2.3", "1.2.3"), ("1.2.3-rc.1+abc", "1.2.3-rc.1+abc"), ("V0.1", "0.1"), ("1.4.0,", None),
     ("latest", None), ("1", None), ("v1.2.3 ", None)],
)
def test_normalise_version(token: str, want: str | None) -> None:
    assert normalise_version(token) == want


def test_custom_version_regex() -> None:
    pattern = compile_version_regex(r"go(\d+\.\d+(?:\.\d+)?)")
    assert parse_version("go version go1.22.1 linux/amd64\n", pattern) == "1.22.1"
    for bad, why in [(r"\d+", "exactly one capture group, found 0"), (r"(a)(b)", "found 2"), ("(", "valid")]:
        with pytest.raises(ValueError, match=why):
            compile_version_regex(bad)


async def test_reports_normalised_version_and_compares_normalised(tmp_path: Path) -> None:
    path = _script(tmp_path, "ok", 'test "$1" = version || exit 9\necho "demo-agent version v1.2.3 (abc)"\n')
    assert await VerifierImpl().verify(path, "1.2.3") == "1.2.3"
    assert await VerifierImpl().verify(path, "v1.2.3") == "1.2.3"
    assert await VerifierImpl().verify(path, None) == "1.2.3"


# C29: what real tools print, through a real process; (script body, version recorded, --expect-version).
TOOL_OUTPUTS = [
    ('echo v1.2.3', "1.2.3", "1.2.3"),
    ('echo "agent 1.4.0, build x"', "1.4.0", "1.4.0"),
    ('echo jq-1.6', "1.6", "v1.6"),
    ('echo "Version: 1.2.3" >&2', "1.2.3", "1.2.3"),  # stderr only
    ('echo 1.2.3-rc.1+abc', "1.2.3-rc.1+abc", "v1.2.3-rc.1+abc"),
    ('echo "starting..."; echo "tool 9.9.9" >&2', "9.9.9", "9.9.9"),  # stdout has no token: stderr
    ('echo "tool 2.0.0"; echo "warning: 1.0.0 is deprecated" >&2', "2.0.0", "2.0.0"),  # stdout first
]


@pytest.mark.parametrize(("body", "want", "expect"), TOOL_OUTPUTS)
async def test_c29_version_outputs_as_tools_print_them(
    tmp_path: Path, body: str, want: str, expect: str
) -> None:
    path = _script(tmp_path, "tool", body + "\n")
    assert await VerifierImpl().verify(path, None) == want
    assert await VerifierImpl().verify(path, expect) == want
    mismatch = f"reports version {re.escape(want)}, expected 0.0.1"
    with pytest.raises(VersionMismatchError, match=mismatch):
        await VerifierImpl().verify(path, "0.0.1")


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("printf 'tool \\377\\376 1.2.3\\n'", "not UTF-8 text on stdout"),
        ("printf 'tool\\0001.2.3\\n'", "binary output on stdout"),
        ("printf 'x' >&2; printf '\\177ELF 1.2.3' >&2", "binary output on stderr"),
        ("echo 'agent 1.2.3 (core 1.2.4)'", "ambiguous: 1.2.3 and 1.2.4"),
        ("echo 'hello'; echo 'world' >&2", 'no version token: "hello"'),
    ],
    ids=["non-utf8", "nul", "binary-stderr", "two-tokens", "no-token"],
)
async def test_c29_unreadable_version_output_is_one_line(tmp_path: Path, body: str, match: str) -> None:
    path = _script(tmp_path, "tool", body + "\n")
    with pytest.raises(VerifyError, match=match) as info:
        await VerifierImpl().verify(path, None)
    message = str(info.value)
    assert "\n" not in message and message.startswith(path) and "b'" not in message


async def test_version_regex_in_the_verifier(tmp_path: Path) -> None:
    path = _script(tmp_path, "go", "echo 'go version go1.22.1 linux/amd64'\n")
    assert await VerifierImpl(version_regex=r"\bgo(\d+(?:\.\d+)+)").verify(path, "1.22.1") == "1.22.1"
    with pytest.raises(VerifyError, match="no version token"):
        await VerifierImpl().verify(path, None)


async def test_stderr_is_bounded_too(tmp_path: Path) -> None:
    path = _script(tmp_path, "chatty", "yes 1.2.3 >&2\n")
    with anyio.fail_after(HANG_GUARD_S), pytest.raises(VerifyError, match="4096 on stderr"):
        await VerifierImpl(max_output_bytes=4096).verify(path, None)


async def test_custom_version_args_and_stderr(tmp_path: Path) -> None:
    path = _script(tmp_path, "ok", 'test "$1" = --version || exit 9\necho "tool 3.1.4" >&2\n')
    assert await VerifierImpl(version_args=("--version",)).verify(path, None) == "3.1.4"


async def test_the_environment_is_systemds_path_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidate sees what the unit will give it, not the operator's shell: a secret, a library path
    and the operator's PATH stay out."""
    seen = tmp_path / "env"
    monkeypatch.setenv("UPGRADE_TEST_SECRET", "s3cret")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    path = _script(tmp_path, "env", f'printf "%s|%s|%s" "$PATH" "${{UPGRADE_TEST_SECRET-unset}}" '
                                    f'"${{LD_LIBRARY_PATH-unset}}" > {seen}\necho 1.0.0\n')
    assert await VerifierImpl().verify(path, None) == "1.0.0"
    assert seen.read_text() == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|unset|unset"


async def test_stdin_is_dev_null(tmp_path: Path) -> None:
    path = _script(tmp_path, "reads", "cat >/dev/null\necho 1.0.0\n")
    with anyio.fail_after(HANG_GUARD_S):
        assert await VerifierImpl(timeout_s=5).verify(path, None) == "1.0.0"


async def test_c10_sleeps_forever_is_killed_with_its_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    path = _script(tmp_path, "hang", f"sleep 1000 &\necho $! > {pids}\nsleep 1000\n")
    started = time.monotonic()
    with anyio.fail_after(0.5 + HANG_GUARD_S), pytest.raises(VerifyTimeoutError) as info:
        await VerifierImpl(timeout_s=0.5).verify(path, None)
    assert time.monotonic() - started >= 0.5  # it did wait for the timeout
    assert "verify.timeout_s" in str(info.value) and path in str(info.value)
    assert wait_dead(_read_pid(pids))


async def test_c10_wrong_version(tmp_path: Path) -> None:
    path = _script(tmp_path, "wrong", "echo 1.0.0\n")
    with pytest.raises(VersionMismatchError, match=r"reports version 1\.0\.0, expected v2\.0\.0"):
        await VerifierImpl().verify(path, "v2.0.0")


@pytest.mark.parametrize("body", ["exit 0\n", "echo\necho '   '\n"], ids=["silent", "blank-lines"])
async def test_c10_prints_nothing(tmp_path: Path, body: str) -> None:
    with pytest.raises(VerifyError, match="printed nothing"):
        await VerifierImpl().verify(_script(tmp_path, "quiet", body), None)


async def test_no_version_token(tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="no version token"):
        await VerifierImpl().verify(_script(tmp_path, "words", "echo hello world\n"), None)


async def test_non_zero_exit(tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="exited with status 3"):
        await VerifierImpl().verify(_script(tmp_path, "fails", "echo 1.2.3\nexit 3\n"), None)


async def test_killed_by_signal(tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="killed by signal 9"):
        await VerifierImpl().verify(_script(tmp_path, "dies", "echo 1.2.3\nkill -9 $$\n"), None)


async def test_c10_grandchild_holding_the_pipe_neither_stalls_nor_survives(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    wait = f"while [ ! -s {pids} ]; do sleep 0.01; done\n"  # the grandchild is running before we exit
    path = _script(tmp_path, "gc", f"sh -c 'echo $$ > {pids}; exec sleep 1000' &\n{wait}echo 4.5.6\n")
    with anyio.fail_after(HANG_GUARD_S):  # the verify timeout (60 s) must not be what ends it
        assert await VerifierImpl(timeout_s=60).verify(path, "4.5.6") == "4.5.6"
    assert wait_dead(_read_pid(pids))


async def test_c10_grandchild_in_its_own_session_does_not_stall(tmp_path: Path) -> None:
    # setsid escapes the process group; reading still stops once the main process has exited.
    pids = tmp_path / "pids"
    wait = f"while [ ! -s {pids} ]; do sleep 0.01; done\n"
    path = _script(tmp_path, "gc2", f"setsid sh -c 'echo $$ > {pids}; exec sleep 1000' &\n{wait}echo 4.5.6\n")
    try:
        with anyio.fail_after(HANG_GUARD_S):
            assert await VerifierImpl(timeout_s=60).verify(path, None) == "4.5.6"
    finally:
        deadline = time.monotonic() + 10
        while not pids.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        if pids.exists():
            os.kill(_read_pid(pids), 9)


async def test_output_bound(tmp_path: Path) -> None:
    path = _script(tmp_path, "chatty", "yes 1.2.3\n")
    with anyio.fail_after(HANG_GUARD_S), pytest.raises(VerifyError, match="max_output_bytes = 4096"):
        await VerifierImpl(max_output_bytes=4096).verify(path, None)


async def test_not_executable(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    path.write_text("1.2.3")
    with pytest.raises(VerifyError, match="cannot run"):
        await VerifierImpl().verify(str(path), None)


async def test_etxtbsy_is_retried(tmp_path: Path) -> None:
    """A writer still holds the file open when the first exec is attempted; it closes soon after."""
    path = tmp_path / "busy"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o755)
    os.write(fd, b"#!/bin/sh\necho 7.8.9\n")

    async def close_soon() -> None:
        await anyio.sleep(0.03)
        os.close(fd)

    async with anyio.create_task_group() as tg:
        tg.start_soon(close_soon)
        version = await VerifierImpl(etxtbsy_attempts=50, etxtbsy_delay_s=0.005).verify(str(path), None)
    assert version == "7.8.9"


async def test_etxtbsy_gives_up(tmp_path: Path) -> None:
    path = tmp_path / "busy"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o755)
    try:
        os.write(fd, b"#!/bin/sh\necho 7.8.9\n")
        with pytest.raises(VerifyError, match="cannot run"):
            await VerifierImpl(etxtbsy_attempts=3, etxtbsy_delay_s=0.001).verify(str(path), None)
    finally:
        os.close(fd)


async def test_cancellation_kills_the_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    path = _script(tmp_path, "hang", f"echo $$ > {pids}\nsleep 1000\n")
    with anyio.move_on_after(HANG_GUARD_S):
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                await VerifierImpl(timeout_s=60).verify(path, None)

            tg.start_soon(run)
            while not pids.exists() or not pids.read_text().strip():
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert wait_dead(_read_pid(pids))

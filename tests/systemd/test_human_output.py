"""What a person sees: the human lines of ``upgrade-agent`` (no ``--json``) under the real private systemd.

Each run's stderr is compared line by line with what a person reads (design §7: one line per phase on
stderr; ``-q`` only the result; ``-v`` the event trace too); the values a run chooses itself (pids, the
transient unit's random suffix, the release server's port) are put in from what the host shows.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

from . import agent_env
from .agent_env import CLI_TIMEOUT_S, WORKTREE, AgentEnv, Release

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server

MakeEnv = Callable[..., AgentEnv]
DEMO_TIMEOUT_S = 600.0  # a safety net: the demo takes about a minute
_TRANSIENT = re.compile(r"\(transient unit \S+-restart-[^ )]+\)")


def human(env: AgentEnv, *args: str) -> subprocess.CompletedProcess[str]:
    """``upgrade-agent --config CFG ARGS`` without ``--json``: what a person at a console runs."""
    argv = [arg for arg in env.argv(*args) if arg != "--json"]
    return subprocess.run(argv, capture_output=True, text=True, env=env.env(), cwd=WORKTREE,
                          timeout=CLI_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)


def lines(text: str) -> list[str]:
    """stderr as a list of lines, the transient restart unit's name (random per run) as ``UNIT``."""
    return [_TRANSIENT.sub("(transient unit UNIT)", line) for line in text.splitlines()]


def fetched(rel: Release) -> str:
    return f"upgrade-agent: fetched {rel.path.stat().st_size} bytes, digest ok"


def test_an_upgrade_says_each_phase_once_and_the_result_on_stdout(make_env: MakeEnv) -> None:
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    done = human(env, "upgrade", "--archive", v2.url, "--sha256", v2.sha256, "--operation", "to-1.1.0")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "to-1.1.0: committed 1.0.0 -> 1.1.0 (current: green)\n"
    assert lines(done.stderr) == [
        f"upgrade-agent: upgrade to-1.1.0 from {v2.url}",
        fetched(v2),
        "upgrade-agent: staged into green",
        "upgrade-agent: verified version 1.1.0",
        "upgrade-agent: switched: current -> green",
        "upgrade-agent: health attempt 1/2: up to 10 s",
        "upgrade-agent: restarting the service (transient unit UNIT)",
        "upgrade-agent: health attempt 1/2: healthy",
        "upgrade-agent: committed: green runs 1.1.0",
    ]


def test_quiet_prints_only_the_result_and_verbose_adds_the_trace(make_env: MakeEnv) -> None:
    env = make_env()
    v1, v2, v3 = env.release("1.0.0"), env.release("1.1.0"), env.release("1.2.0")
    env.install(v1)
    quiet = human(env, "-q", "upgrade", "--archive", v2.url, "--sha256", v2.sha256, "--operation", "q")
    result = "q: committed 1.0.0 -> 1.1.0 (current: green)\n"
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, result, "")
    verbose = human(env, "upgrade", "-v", "--archive", v3.url, "--sha256", v3.sha256, "--operation", "v")
    assert verbose.returncode == 0, verbose.stderr
    traced = [line for line in verbose.stderr.splitlines() if line.startswith("upgrade-agent: [v] ")]
    assert [line.split()[2] for line in traced] == env.events("v")  # every record, in order
    phases = [line for line in lines(verbose.stderr) if not line.startswith("upgrade-agent: [v] ")]
    assert phases[-1] == "upgrade-agent: committed: blue runs 1.2.0"


def test_a_candidate_that_exits_is_rolled_back_with_what_systemd_saw_and_where_to_read(
    make_env: MakeEnv,
) -> None:
    env = make_env()
    v1, bad = env.release("1.0.0"), env.release("2.0.0", "exit-after:0.3")
    env.install(v1)
    done = human(env, "upgrade", "--archive", bad.url, "--operation", "to-2")
    assert done.returncode == 1, done.stderr
    unit = f"{env.name}.service"
    failures = [r["event"]["reason"] for r in env.journal() if r["event"]["_type"] == "HealthFailed"]
    assert len(failures) == 2
    for reason in failures:  # the pids differ by attempt; the rest is fixed
        assert re.fullmatch(r"MainPID changed from \d+ to 0: the service exited with status 1; "
                            rf"see journalctl -u {re.escape(unit)} -n 50", reason), reason
    why = f"candidate unhealthy after 2 attempt(s): {failures[-1]}"
    assert done.stdout == f"to-2: rolled_back 1.0.0 -> 2.0.0 (current: blue)\nreason: {why}\n"
    assert lines(done.stderr) == [
        f"upgrade-agent: upgrade to-2 from {bad.url}",
        f"upgrade-agent: fetched {bad.path.stat().st_size} bytes, sha256 {bad.sha256} "
        "(no --sha256 to compare)",
        "upgrade-agent: staged into green",
        "upgrade-agent: verified version 2.0.0",
        "upgrade-agent: switched: current -> green",
        "upgrade-agent: health attempt 1/2: up to 10 s",
        "upgrade-agent: restarting the service (transient unit UNIT)",
        f"upgrade-agent: health attempt 1/2: failed: {failures[0]}",
        "upgrade-agent: health attempt 2/2: up to 10 s",
        "upgrade-agent: restarting the service (transient unit UNIT)",
        f"upgrade-agent: health attempt 2/2: failed: {failures[1]}",
        f"upgrade-agent: rolling back to blue: {why}",
        "upgrade-agent: health attempt 1/2 (last-good): up to 10 s",
        "upgrade-agent: restarting the service (transient unit UNIT)",
        "upgrade-agent: health attempt 1/2 (last-good): healthy",
        "upgrade-agent: rolled back: current -> blue",
    ]


def test_a_long_health_wait_says_how_long_it_may_still_take(make_env: MakeEnv) -> None:
    """An attempt that waits (a probe answering 503) says every 5 s how many seconds it has left."""
    env = make_env(timeout_s=7.0, max_attempts=1)
    v1, sick = env.release("1.0.0"), env.release("2.0.0", "unhealthy")
    env.install(v1)
    done = human(env, "upgrade", "--archive", sick.url, "--sha256", sick.sha256, "--operation", "sick")
    assert done.returncode == 1, done.stderr
    said = lines(done.stderr)
    start = said.index("upgrade-agent: health attempt 1/1: up to 7 s")
    assert said[start + 1] == "upgrade-agent: restarting the service (transient unit UNIT)"
    assert re.fullmatch(r"upgrade-agent: health attempt 1/1: waiting, [12] s left", said[start + 2]), said
    assert said[start + 3].startswith(
        "upgrade-agent: health attempt 1/1: failed: not healthy for 0.5 s within 7 s")


def test_a_failed_install_names_no_slot_its_clean_up_removed(make_env: MakeEnv) -> None:
    """The summary is what the host shows after the clean-up: no ``current`` link, so no slot."""
    env = make_env()
    bad = env.release("1.0.0", "exit-after:0.3")
    done = human(env, "install", "--archive", bad.url, "--sha256", bad.sha256)
    assert done.returncode == 1, done.stderr
    assert not (env.root / "lib" / env.name).exists()  # the clean-up removed what install made
    operation, _, rest = done.stdout.partition(": ")
    failures = [r["event"]["reason"] for r in env.journal() if r["event"]["_type"] == "HealthFailed"]
    assert rest == f"aborted ? -> 1.0.0\nreason: candidate unhealthy after 2 attempt(s): {failures[-1]}\n"
    assert lines(done.stderr)[-1] == (
        f"upgrade-agent: aborted: candidate unhealthy after 2 attempt(s): {failures[-1]}")
    assert env.cli("history").json["episodes"][0]["operation"] == operation


def test_journalctl_p_err_finds_the_recovery_that_rolled_back(make_env: MakeEnv) -> None:
    """Under systemd (``JOURNAL_STREAM``) each line carries its syslog priority: the ``OnFailure=``
    recovery of a crash-looping candidate (its upgrader SIGKILLed after the restart) is found by
    ``journalctl -p err``, its failed attempts by ``-p warning``, and the info lines by neither."""
    env = make_env(inside=True)
    v1, bad = env.release("1.0.0"), env.release("2.0.0", "exit-after:0.3")
    env.install(v1)
    op = "loop-found-by-p-err"
    killed = env.upgrade(bad, op, env={"UPGRADE_AGENT_TEST_KILL_AFTER": "RestartObserved"})
    assert killed.code in (-9, 137), killed.stderr
    agent_env.poll(lambda: env.result_file(op) is not None, 60.0, "the OnFailure= recovery to publish")
    result = env.result_file(op)
    assert result is not None and result["result"] == "rolled_back", result

    def journal(priority: str) -> list[str]:
        done = env.sandbox.run("journalctl", "--no-pager", "-o", "cat", "-p", priority, "-u", f"{env.name}*")
        return [line for line in done.stdout.splitlines() if line.startswith("upgrade-agent: ")]

    errors = journal("err")
    assert errors == [f"upgrade-agent: rolling back to blue: {result['reason']}"], errors
    warnings = journal("warning")
    assert any(line.startswith("upgrade-agent: health attempt 2/2: failed: ") for line in warnings), warnings
    assert "upgrade-agent: rolled back: current -> blue" in warnings
    healthy = "upgrade-agent: health attempt 1/2 (last-good): healthy"
    assert healthy in journal("info") and healthy not in warnings


def test_json_demo_prints_exactly_one_object_on_stdout() -> None:
    """``upgrade-agent --json demo``: the walk-through (and every CLI run inside it) goes to stderr."""
    if os.geteuid() != 0:
        pytest.skip("the demo boots a private systemd (root)")
    done = subprocess.run([sys.executable, "-m", "agent.cli.main", "--json", "demo"], capture_output=True,
                          text=True, cwd=WORKTREE, timeout=DEMO_TIMEOUT_S, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == '{"demo": true}\n'
    assert "==> Installing 1.0.0 into the blue slot" in done.stderr
    assert "upgrade-agent: rolling back to green: candidate unhealthy after 2 attempt(s)" in done.stderr
    assert "nothing left behind" in done.stderr.splitlines()

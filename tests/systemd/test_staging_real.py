"""``upgrade --stage`` then ``activate`` under the private systemd (docs/cli.md), through the CLI.

Staging leaves the running process alone (same MainPID, same slot, same served version); ``activate``
switches to the staged bytes, restarts and health-checks as ``upgrade`` does: a good candidate commits (the
unit's MainPID runs the current link, which resolves to the staged slot, and serves the staged version), a
candidate that dies after start is rolled back to what ran before. A SIGKILL right after each record of the
activation (``UPGRADE_AGENT_TEST_KILL_AFTER``), then ``recover``, ends committed on the staged slot once the
switch was durable, and on the old slot with the candidate still staged before it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from . import agent_env
from ._cli_agent import KILL_ENV
from .agent_env import AgentEnv, Release

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server

MakeEnv = Callable[..., AgentEnv]


def _stage(env: AgentEnv, rel: Release, op: str) -> None:
    out = env.cli("upgrade", "--stage", "--archive", rel.url, "--sha256", rel.sha256, "--operation", op)
    assert out.code == 0, out.stderr
    assert out.json is not None and (out.json["result"], out.json["to_version"]) == ("staged", rel.version)


def test_stage_then_activate_commits_the_staged_candidate(make_env: MakeEnv) -> None:
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    pid = env.assert_running("blue", v1)
    _stage(env, v2, "st1")
    assert env.assert_running("blue", v1) == pid  # nothing restarted
    assert env.link("last-good") == f"{env.name}-blue"
    assert env.slot_sha256("green") == v2.member_sha256
    status = env.cli("status").json
    assert status is not None and status["staged"]["sha256"] == v2.member_sha256

    out = env.cli("activate", "--operation", "ac1")
    assert out.code == 0, out.stderr
    assert out.json == {"operation": "ac1", "result": "committed", "from_version": "1.0.0",
                        "to_version": "1.1.0", "slot": "green", "reason": None}
    assert env.assert_running("green", v2) != pid
    assert env.link("last-good") == f"{env.name}-blue"
    assert env.events("ac1")[:3] == ["EpisodeOpened", "StagedCandidateChecked", "SwitchIntended"]
    after = env.cli("status").json
    assert after is not None and after["staged"] is None


def test_activate_of_a_candidate_that_dies_rolls_back(make_env: MakeEnv) -> None:
    env = make_env()
    v1, bad = env.release("1.0.0"), env.release("2.0.0", "exit-after:0.3")
    env.install(v1)
    _stage(env, bad, "st1")
    out = env.cli("activate", "--operation", "ac1")
    assert out.code == 1, out.stderr
    assert out.json is not None and (out.json["result"], out.json["slot"]) == ("rolled_back", "blue")
    env.assert_running("blue", v1)
    assert env.link("last-good") == f"{env.name}-blue"


def test_sigkill_after_each_activation_record_then_recover(make_env: MakeEnv) -> None:
    for point in ("EpisodeOpened#1", "StagedCandidateChecked#1", "SwitchIntended#1", "SwitchCommitted#1",
                  "HealthAttemptStarted#1"):
        env = make_env()
        v1, v2 = env.release("1.0.0"), env.release("1.1.0")
        env.install(v1)
        _stage(env, v2, "st1")
        killed = env.cli("activate", "--operation", "ac1", env={KILL_ENV: point})
        assert killed.code != 0, (point, killed.stderr)
        rec = env.cli("recover")
        assert rec.code == 0, (point, rec.stderr)
        result = env.result_file("ac1")
        assert result is not None, point
        if point in ("EpisodeOpened#1", "StagedCandidateChecked#1", "SwitchIntended#1"):
            assert result["result"] == "aborted", (point, result)
            env.assert_running("blue", v1)
            status = env.cli("status").json
            assert status is not None and status["staged"] is not None, point
            again = env.cli("activate", "--operation", "ac2")
            assert again.code == 0 and again.json is not None, (point, again.stderr)
            assert again.json["result"] == "committed", point
        else:
            assert result["result"] == "committed", (point, result)
        env.assert_running("green", v2)
        env.teardown()


# -- design §4.7: activate on a host whose agent unit was stopped on purpose -----------------------------
STOPPED_ACTIVATE = [
    "EpisodeOpened", "StagedCandidateChecked", "UnitFoundStopped", "SwitchIntended", "SwitchCommitted",
    "LeftStopped", "ResultPublished", "EpisodeClosed",
]


def _stop(env: AgentEnv) -> None:
    env.sandbox.run("systemctl", "stop", env.unit)
    assert env.show()["ActiveState"] == "inactive"


def _assert_left_stopped(env: AgentEnv, candidate: Release) -> None:
    """current names green (the candidate's bytes), last-good blue, and systemd shows the unit stopped."""
    state = env.show()
    assert (state["ActiveState"], state["SubState"], state["MainPID"]) == ("inactive", "dead", "0"), state
    assert env.link("current") == f"{env.name}-green"
    assert env.link("last-good") == f"{env.name}-blue"
    assert env.slot_sha256("green") == candidate.member_sha256


def _activate_stopped(env: AgentEnv, v1: Release, candidate: Release) -> None:
    env.install(v1)
    _stage(env, candidate, "st1")
    _stop(env)
    out = env.cli("activate", "--operation", "ac1")
    assert out.code == 0, out.stderr
    assert out.json == {
        "operation": "ac1", "result": "switched_stopped", "from_version": v1.version,
        "to_version": candidate.version, "slot": "green",
        "reason": f"current -> green ({candidate.version}) with the unit stopped, as found; not "
                  "health-checked: recover-agent-upgrade checks it once the unit runs",
    }
    assert "upgrade-agent: the service is stopped (ActiveState=inactive): it stays stopped" in out.stderr
    assert "upgrade-agent: left stopped: current -> green, not health-checked" in out.stderr
    _assert_left_stopped(env, candidate)
    assert env.events("ac1") == STOPPED_ACTIVATE
    status = env.cli("status").json
    assert status is not None and status["staged"] is None
    assert status["left_stopped"] == {"operation": "ac1", "slot": "green", "sha256": candidate.member_sha256,
                                      "version": candidate.version}


def _check_of(env: AgentEnv) -> str | None:
    """The id of the check recovery opened for the candidate ``ac1`` left stopped, once it published."""
    ops = [r["episode"] for r in env.journal()
           if r["episode"].startswith("ac1-check-") and r["event"]["_type"] == "ResultPublished"]
    return ops[-1] if ops else None


def test_activate_leaves_a_stopped_unit_stopped_and_a_failing_start_is_rolled_back(make_env: MakeEnv) -> None:
    """The unit stopped on purpose stays stopped: ``current`` switched, ``last-good`` unmoved, nothing
    checked; recovery (timer, manual) leaves it so; once an operator starts it and the candidate crash-loops
    into its start limit, ``OnFailure=`` recovery checks it, and it is rolled back to last-good. The CLI
    runs inside the sandbox, so that the recovery units systemd starts read a valid configuration."""
    env = make_env(inside=True)
    v1, bad = env.release("1.0.0"), env.release("2.0.0", "exit-after:0.3")
    _activate_stopped(env, v1, bad)

    for trigger in ("timer", "manual"):
        rec = env.cli("recover", "--trigger", trigger)
        assert rec.code == 0, rec.stderr
        assert rec.json is not None, rec.stderr
        assert (rec.json["operation"], rec.json["result"]) == (None, "noop"), rec.json
        assert rec.json["reason"] == ("current names green (2.0.0), switched to with the unit stopped by "
                                      "activate ac1; it is checked once the unit runs")
        _assert_left_stopped(env, bad)
    refused = env.upgrade(v1, "up2")
    assert refused.code == 2 and refused.json is not None, refused.stderr
    assert refused.json["error"].startswith("current names green (2.0.0), switched to with the unit stopped")
    assert env.events("up2") == []

    env.sandbox.run("systemctl", "start", "--no-block", env.unit)
    agent_env.poll(lambda: _check_of(env) is not None, 90.0, "the OnFailure= recovery to check the candidate")
    check = _check_of(env)
    assert check is not None
    result = env.result_file(check)
    assert result is not None and (result["result"], result["slot"]) == ("rolled_back", "blue"), result
    records = [r for r in env.journal() if r["episode"] == check]
    triggers = [r["event"].get("trigger") for r in records if r["event"]["_type"] == "RecoveryStarted"]
    assert "on-failure" in triggers, triggers
    agent_env.poll(lambda: env.events(check)[-1:] == ["EpisodeClosed"], 10.0, "the check to close")
    assert env.link("current") == env.link("last-good") == f"{env.name}-blue"
    env.assert_running("blue", v1)
    status = env.cli("status").json
    assert status is not None and bad.member_sha256 in [k["sha256"] for k in status["known_bad"]]


def test_a_started_healthy_candidate_is_checked_and_committed_by_the_timer(make_env: MakeEnv) -> None:
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    _activate_stopped(env, v1, v2)
    env.sandbox.run("systemctl", "start", env.unit)
    agent_env.poll(lambda: env.show()["ActiveState"] == "active", 10.0, "the operator's start")
    rec = env.cli("recover", "--trigger", "timer")
    assert rec.code == 0, rec.stderr
    check = _check_of(env)
    assert check is not None and rec.json is not None
    assert (rec.json["operation"], rec.json["result"], rec.json["slot"]) == (check, "committed", "green")
    assert env.events(check)[:5] == ["EpisodeOpened", "RecoveryStarted", "StagedCandidateChecked",
                                     "SwitchIntended", "SwitchCommitted"]
    env.assert_running("green", v2)
    assert env.link("last-good") == f"{env.name}-blue"
    status = env.cli("status").json
    assert status is not None and status["left_stopped"] is None
    again = env.cli("recover", "--trigger", "timer")
    assert again.json is not None and (again.json["result"], again.json["reason"]) == ("noop", None)


def test_journal_quarantine_keeps_a_candidate_left_stopped_unverified(make_env: MakeEnv) -> None:
    """``journal quarantine`` while a candidate left stopped waits for its check: the fresh journal still
    knows ``current`` is unverified (the carried snapshot's ``left_stopped``), so once the unit is started the
    timer's recovery checks it and commits it, instead of taking an unchecked binary for a verified one."""
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    _activate_stopped(env, v1, v2)
    moved = env.cli("journal", "quarantine")
    assert moved.code == 0, moved.stderr
    status = env.cli("status").json
    assert status is not None and status["left_stopped"] is not None, status
    assert (status["left_stopped"]["slot"], status["left_stopped"]["sha256"]) == ("green", v2.member_sha256)
    _assert_left_stopped(env, v2)
    refused = env.cli("upgrade", "--archive", v2.url, "--sha256", v2.sha256)
    assert refused.code == 2, refused  # staging would overwrite last-good, the only verified slot
    env.sandbox.run("systemctl", "start", env.unit)
    agent_env.poll(lambda: env.show()["ActiveState"] == "active", 10.0, "the operator's start")
    rec = env.cli("recover", "--trigger", "timer")
    assert rec.code == 0 and rec.json is not None and rec.json["result"] == "committed", rec
    env.assert_running("green", v2)
    status = env.cli("status").json
    assert status is not None and status["left_stopped"] is None, status


def test_sigkill_after_each_stopped_activation_record_then_recover(make_env: MakeEnv) -> None:
    """A kill right after each record an activation of a stopped unit writes, then ``recover``: before the
    switch landed it is aborted (the candidate still staged); after it, ``switched_stopped``; the unit stays
    stopped either way."""
    for point in ("UnitFoundStopped#1", "SwitchIntended#1", "SwitchCommitted#1", "LeftStopped#1"):
        env = make_env()
        v1, v2 = env.release("1.0.0"), env.release("1.1.0")
        env.install(v1)
        _stage(env, v2, "st1")
        _stop(env)
        killed = env.cli("activate", "--operation", "ac1", env={KILL_ENV: point})
        assert killed.code != 0, (point, killed.stderr)
        assert env.events("ac1")[-1] == point.split("#")[0], point
        rec = env.cli("recover")
        assert rec.code == 0, (point, rec.stderr)
        result = env.result_file("ac1")
        assert result is not None, point
        assert env.show()["ActiveState"] == "inactive", point
        if point in ("UnitFoundStopped#1", "SwitchIntended#1"):
            assert (result["result"], env.link("current")) == ("aborted", f"{env.name}-blue"), (point, result)
            status = env.cli("status").json
            assert status is not None and status["staged"] is not None, point
        else:
            assert result["result"] == "switched_stopped", (point, result)
            _assert_left_stopped(env, v2)
        env.teardown()


def test_sigkill_inside_the_check_of_a_started_candidate_then_recover(make_env: MakeEnv) -> None:
    """The check recovery runs once the unit was started, killed right after each of its first records; the
    next timer recovery finishes it (or, cut before its switch, aborts it and checks again): committed."""
    for point in ("EpisodeOpened#1", "StagedCandidateChecked#1", "SwitchIntended#1", "SwitchCommitted#1",
                  "HealthAttemptStarted#1"):
        env = make_env()
        v1, v2 = env.release("1.0.0"), env.release("1.1.0")
        _activate_stopped(env, v1, v2)
        env.sandbox.run("systemctl", "start", env.unit)
        killed = env.cli("recover", "--trigger", "timer", env={KILL_ENV: point})
        assert killed.code != 0, (point, killed.stderr)
        for _ in range(2):  # the open check, then (when it was aborted before its switch) a fresh one
            rec = env.cli("recover", "--trigger", "timer")
            assert rec.code == 0 and rec.json is not None, (point, rec.stderr)
            if rec.json["result"] == "committed":
                break
        assert rec.json["result"] == "committed", (point, rec.json)
        env.assert_running("green", v2)
        assert env.link("last-good") == f"{env.name}-blue"
        env.teardown()


def _human(env: AgentEnv, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a person runs it (no ``--json``)."""
    argv = [word for word in env.argv(*args) if word != "--json"]
    return subprocess.run(argv, capture_output=True, text=True, env=env.env(), cwd=agent_env.WORKTREE,
                          timeout=agent_env.CLI_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)


def test_what_a_person_reads_when_activate_leaves_the_unit_stopped(make_env: MakeEnv) -> None:
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    _stage(env, v2, "st1")
    _stop(env)
    done = _human(env, "activate", "--operation", "ac1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "ac1: switched_stopped 1.0.0 -> 1.1.0 (current: green)\n"
        "reason: current -> green (1.1.0) with the unit stopped, as found; not health-checked: "
        "recover-agent-upgrade checks it once the unit runs\n"
    )
    _assert_left_stopped(env, v2)
    refused = _human(env, "upgrade", "--archive", v1.url, "--sha256", v1.sha256)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines()[-1] == (
        "upgrade-agent: current names green (1.1.0), switched to with the unit stopped by activate ac1 and "
        "not checked yet: start the unit and run recover-agent-upgrade, or run upgrade-agent rollback")
    compact = _human(env, "journal", "compact")
    assert compact.returncode == 2, compact.stderr
    assert "not compacted while current names green (1.1.0), left stopped by activate ac1" in compact.stderr

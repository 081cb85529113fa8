"""``upgrade --stage`` then ``activate`` under the private systemd (docs/cli.md), through the CLI.

Staging leaves the running process alone (same MainPID, same slot, same served version); ``activate``
switches to the staged bytes, restarts and health-checks as ``upgrade`` does: a good candidate commits (the
unit's MainPID runs the current link, which resolves to the staged slot, and serves the staged version), a
candidate that dies after start is rolled back to what ran before. A SIGKILL right after each record of the
activation (``UPGRADE_AGENT_TEST_KILL_AFTER``), then ``recover``, ends committed on the staged slot once the
switch was durable, and on the old slot with the candidate still staged before it.
"""

from __future__ import annotations

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

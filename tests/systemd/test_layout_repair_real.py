"""The recovery timer's converge step repairs a damaged layout as ``install`` would (docs/recovery.md, "A
damaged layout"; the seeds' ``EnsureDaemonBinaryLinks``), under the private systemd through the CLI: a host
whose ``current`` link is gone (removed by hand after install) is adopted again from its slots, blue first, or
from a legacy single binary, as a journaled ``install`` episode (verified, started, health-checked); a slot
holding a verified binary is never overwritten. What is asserted is read from the host: the links, the slots'
bytes, the unit and what it serves, the journal.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable

import pytest

from agent.testing.releases import agent_script

from . import agent_env
from .agent_env import AgentEnv

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server


def _timer(env: AgentEnv) -> dict[str, object]:
    out = env.cli("recover", "--trigger", "timer")
    assert out.code == 0 and out.json is not None, out
    assert "Traceback" not in out.stderr
    return out.json


@pytest.mark.parametrize("damage", ["links-removed", "blue-emptied"])
def test_a_layout_without_its_links_is_adopted_again_from_its_slots(
    make_env: Callable[..., AgentEnv], damage: str
) -> None:
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    assert env.upgrade(v2, "up2").code == 0  # green 1.1.0 current, blue 1.0.0 last-good
    for link in (f"{env.name}-current", f"{env.name}-last-good"):
        (env.lib / link).unlink()
    (env.root / "bin" / env.name).unlink()
    want = v1
    if damage == "blue-emptied":  # a crash's zero-length leftover (C12): blue holds nothing verified
        (env.lib / f"{env.name}-blue").write_bytes(b"")
        want = v2
    green_before = (env.lib / f"{env.name}-green").read_bytes()

    out = _timer(env)
    assert out["result"] == "committed" and out["slot"] == "blue", out
    env.assert_running("blue", want)
    assert env.link("current") == env.link("last-good") == f"{env.name}-blue"
    assert os.readlink(env.root / "bin" / env.name) == f"../lib/{env.name}/{env.name}-current"
    assert (env.lib / f"{env.name}-green").read_bytes() == green_before  # the verified green untouched
    assert env.events(str(out["operation"]))[:4] == ["EpisodeOpened", "ArchiveFetched", "CandidateStaged",
                                                     "CandidateVerified"]
    again = _timer(env)
    assert (again["operation"], again["result"]) == (None, "noop"), again  # converged: nothing more to do


def test_a_layout_reset_by_hand_is_adopted_from_the_legacy_binary(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env()
    legacy = env.work / "legacy"
    (legacy / "bin").mkdir(parents=True)
    text = env.config.read_text().replace("[host]\n", f'[host]\nlegacy_root = "{legacy}"\n', 1)
    env.config.write_text(text)
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    (legacy / "bin" / env.name).write_bytes(agent_script("1.1.0", "good"))
    os.chmod(legacy / "bin" / env.name, 0o755)
    shutil.rmtree(env.lib)  # the layout reset by hand: no slot, no link

    out = _timer(env)
    assert out["result"] == "committed" and out["to_version"] == "1.1.0", out
    env.assert_running("blue", v2)
    assert hashlib.sha256((legacy / "bin" / env.name).read_bytes()).hexdigest() == v2.member_sha256

"""``upgrade-agent host move`` under the private systemd, through the CLI (docs/host.md, "Moving a linked
host into a real root"; the seeds' ``hostroot_move.go``).

A host whose layout lives under a legacy root is adopted by ``install`` (the host root becomes a link to it);
the move is refused while a slot ``current`` or ``last-good`` names predates the host root, and goes ahead
once two upgrades have replaced both. The agent unit runs throughout: its MainPID stays the same, the file its
command line names (the ``current`` link under the host root) resolves before, during and after the move,
and it keeps serving. A SIGKILL after each record of the move and at the two steps between them
(``UPGRADE_AGENT_TEST_KILL_AFTER``), then ``recover``, ends moved (the exchange had landed) or undone (it had
not), and a second ``host move`` then completes. What is asserted is read from the host: the root's file type,
the links, the slots' bytes, the legacy files, the unit and what it serves.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.testing.releases import agent_script

from . import agent_env
from ._cli_agent import KILL_ENV
from .agent_env import AgentEnv, Release

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server

MakeEnv = Callable[..., AgentEnv]


def _legacy_host(make_env: MakeEnv) -> tuple[AgentEnv, Path, Release, Release, Release]:
    """A legacy layout (blue 1.0.0 current, green 1.0.0 last-good) adopted by ``install`` through the
    compatibility link, the agent running from it; and the releases 1.1.0 and 1.2.0."""
    env = make_env()
    legacy = env.work / "legacy"
    text = env.config.read_text().replace("[host]\n", f'[host]\nlegacy_root = "{legacy}"\n', 1)
    env.config.write_text(text)
    v1, v2, v3 = env.release("1.0.0"), env.release("1.1.0"), env.release("1.2.0")
    lib = legacy / "lib" / env.name
    lib.mkdir(parents=True)
    for slot in ("blue", "green"):
        (lib / f"{env.name}-{slot}").write_bytes(agent_script("1.0.0", "good"))
        os.chmod(lib / f"{env.name}-{slot}", 0o755)
    os.symlink(f"{env.name}-blue", lib / f"{env.name}-current")
    os.symlink(f"{env.name}-green", lib / f"{env.name}-last-good")
    out = env.cli("install")
    assert out.code == 0 and out.json is not None and out.json["reason"] == "adopted legacy layout", out
    assert os.path.islink(env.root) and os.path.realpath(env.root) == str(legacy)
    agent_env.poll(lambda: _answers(env), 20, "the adopted agent answering")
    return env, legacy, v1, v2, v3


def _refused(env: AgentEnv, words: str) -> None:
    out = env.cli("host", "move")
    assert out.code == 2, out
    assert out.json is not None and words in out.json["error"], out
    assert "Traceback" not in out.stderr
    assert os.path.islink(env.root)  # nothing moved


def _serving(env: AgentEnv, rel: Release, pid: int | None = None) -> int:
    """The unit runs (the same MainPID when ``pid`` is given), the file its command line names resolves to
    an existing slot holding ``rel``'s bytes, and ``/healthz`` answers ``rel``'s version."""
    state = env.show()
    assert (state["ActiveState"], state["SubState"]) == ("active", "running"), state
    main, exe, argv = env.main_process()
    assert pid is None or main == pid, (main, pid)
    assert os.path.exists(exe) or not exe.endswith("(deleted)"), exe
    assert argv[1] == str(env.lib / f"{env.name}-current"), argv
    ran = Path(os.path.realpath(argv[1]))
    assert ran.is_file() and hashlib.sha256(ran.read_bytes()).hexdigest() == rel.member_sha256
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{env.port}/healthz", timeout=5) as resp:
        assert resp.read().decode().split() == ["ok", rel.version]
    return main


def _answers(env: AgentEnv) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{env.port}/healthz", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _moved(env: AgentEnv, legacy: Path, v2: Release, v3: Release) -> None:
    """The host root is a real directory holding the layout; the legacy files are as they were."""
    st = os.lstat(env.root)
    assert stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode)
    assert env.link("current") == f"{env.name}-blue" and env.link("last-good") == f"{env.name}-green"
    assert env.slot_sha256("blue") == v3.member_sha256 and env.slot_sha256("green") == v2.member_sha256
    assert os.readlink(env.root / "bin" / env.name) == f"../lib/{env.name}/{env.name}-current"
    assert not [n for n in os.listdir(env.root.parent) if ".move-" in n]  # no copy or old link left
    legacy_lib = legacy / "lib" / env.name
    assert hashlib.sha256((legacy_lib / f"{env.name}-blue").read_bytes()).hexdigest() == v3.member_sha256


def test_a_linked_host_moves_once_no_slot_predates_it(make_env: MakeEnv) -> None:
    env, legacy, v1, v2, v3 = _legacy_host(make_env)
    _serving(env, v1)  # adopted as it was, running from the legacy root
    _refused(env, "predates the host root")
    assert env.upgrade(v2, "up2").code == 0
    _refused(env, "slot blue (last-good) predates the host root")
    assert env.upgrade(v3, "up3").code == 0
    pid = _serving(env, v3)

    out = env.cli("host", "move")
    assert out.code == 0, out
    assert out.json is not None and out.json["result"] == "committed" and out.json["slot"] == "blue", out
    assert out.json["operation"].startswith("host-move-")
    _moved(env, legacy, v2, v3)
    assert _serving(env, v3, pid) == pid  # not restarted, still running what it ran
    assert env.events(out.json["operation"]) == ["EpisodeOpened", "HostMoveIntended", "HostMoved",
                                                 "ResultPublished", "EpisodeClosed"]

    again = env.cli("host", "move")
    assert again.code == 0 and again.json is not None and again.json["result"] == "noop", again

    env.sandbox.run("systemctl", "restart", env.unit)  # from now on the agent runs from the moved root
    agent_env.poll(lambda: _answers(env), 20, "the restarted agent answering")
    assert _serving(env, v3) != pid
    assert os.path.realpath(env.lib / f"{env.name}-current").startswith(str(env.root) + "/")
    v4 = env.release("1.3.0")
    up = env.upgrade(v4, "up4")  # upgrades go on in the real root
    assert up.code == 0, up
    assert env.slot_sha256("green") == v4.member_sha256
    assert hashlib.sha256((legacy / "lib" / env.name / f"{env.name}-green").read_bytes()).hexdigest() \
        == v2.member_sha256  # the legacy layout is left alone


@pytest.mark.parametrize(("point", "landed"), [
    ("EpisodeOpened#1", False),
    ("HostMoveIntended#1", False),
    ("host-move-copied", False),
    ("host-move-exchanged", True),
    ("HostMoved#1", True),
    ("ResultPublished#1", True),
])
def test_sigkill_at_every_step_of_the_move_then_recover(make_env: MakeEnv, point: str, landed: bool) -> None:
    env, legacy, _v1, v2, v3 = _legacy_host(make_env)
    assert env.upgrade(v2, "up2").code == 0
    assert env.upgrade(v3, "up3").code == 0
    pid = _serving(env, v3)

    killed = env.cli("host", "move", env={KILL_ENV: point})
    assert killed.code != 0, (point, killed)
    assert _serving(env, v3, pid) == pid  # during: the unit never noticed
    assert stat.S_ISLNK(os.lstat(env.root).st_mode) != landed, point

    rec = env.cli("recover")
    assert rec.code == 0, (point, rec)
    assert rec.json is not None
    if point == "EpisodeOpened#1" or not landed:
        assert rec.json["result"] == "aborted", (point, rec.json)
        assert os.path.islink(env.root) and os.path.realpath(env.root) == str(legacy)
        assert not [n for n in os.listdir(env.root.parent) if ".move-" in n], point  # the copy removed
        out = env.cli("host", "move")
        assert out.code == 0 and out.json is not None and out.json["result"] == "committed", (point, out)
    else:
        assert rec.json["result"] == "committed", (point, rec.json)
    _moved(env, legacy, v2, v3)
    assert _serving(env, v3, pid) == pid  # after: the same process, serving
    idle = env.cli("recover").json
    assert idle is not None and (idle["operation"], idle["result"]) == (None, "noop"), idle

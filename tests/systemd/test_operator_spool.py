"""``upgrade-agent operator`` with the spool source, for real under the private systemd (docs/managed.md).

Every outcome is read from the host (links, ``MainPID``'s executable, the served version, the journal) and
from the status file the operator wrote, never from the operator's own output alone:

- a good operation commits; its status file says ``Succeeded`` with the journal sequence number of its
  ``ResultPublished`` record, the boot id and both versions; a second operator run rewrites nothing;
- a bad candidate rolls back: ``RolledBack``, the host serves the previous version;
- invalid operations (another node, another agent, a bad digest, not JSON, a FIFO or a symlink where the
  operation goes) are ``Failed`` with the reason, the journal byte-identical and the links unchanged;
- the operator as the installed ``NAME-operator.service``: it takes an operation dropped into the spool and
  stops on SIGTERM (``systemctl stop``) with exit 0;
- exactly once: the operator is SIGKILLed after every durable event of an operation (the kill points
  recorded from a real run, plus right after each status it publishes), then started again; every run ends
  with one terminal status, written once, and an operation that committed never runs again.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.agent_fetch import _servers as servers

from . import agent_env
from .agent_env import AgentEnv, Cli, Release
from .conftest import wait_for

pytestmark = pytest.mark.systemd
release_server = agent_env.release_server
make_env = agent_env.make_env

NODE = "node-1"


def spool_env(make_env: Any, *, unit: bool = False, **options: Any) -> tuple[AgentEnv, Release]:
    """An agent with 1.0.0 installed whose configuration has ``[operations] source = "spool"`` (the spool
    under the test's directory), and that release. Without ``unit`` the section is added after ``install``,
    so no ``NAME-operator.service`` runs beside the operator the test starts itself; with it, the section
    comes first (the CLI then runs inside the sandbox, as the unit does) and ``install`` starts the unit.
    ``options`` go to ``make_env`` (e.g. ``stability_s``)."""
    env: AgentEnv = make_env(inside=unit, **options)
    v1 = env.release("1.0.0")
    if not unit:
        env.install(v1)
    spool = env.work / f"spool-{env.name}"
    with env.config.open("a") as f:
        f.write(f'\n[operations]\nsource = "spool"\nspool_dir = "{spool}"\nnode_name = "{NODE}"\n'
                'poll_s = 0.2\n')
    if unit:
        env.install(v1)
    return env, v1


def spool_dir(env: AgentEnv) -> Path:
    return env.work / f"spool-{env.name}"


def spec(env: AgentEnv, rel: Release, **override: Any) -> dict[str, Any]:
    """The spec of an operation that upgrades ``env`` to ``rel``."""
    doc: dict[str, Any] = {
        "nodeName": NODE, "agent": env.name,
        "archive": {"url": rel.url, "sha256": rel.sha256}, "expectVersion": rel.version,
    }
    doc.update(override)
    return doc


def put(env: AgentEnv, op: str, doc: Any) -> None:
    """Place ``<op>.json`` atomically (write a temp file, rename), as a control plane does."""
    d = spool_dir(env)
    d.mkdir(mode=0o700, exist_ok=True)
    tmp = d / f".{op}.tmp"
    tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    tmp.chmod(0o600)
    os.rename(tmp, d / f"{op}.json")


def status(env: AgentEnv, op: str) -> dict[str, Any] | None:
    path = spool_dir(env) / f"{op}.status.json"
    return json.loads(path.read_text()) if path.exists() else None


def operator_once(env: AgentEnv, extra: dict[str, str] | None = None) -> Cli:
    """``upgrade-agent operator --once`` to its end (or its SIGKILL)."""
    return env.cli("operator", "--once", env=extra)


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_good_operation_commits_and_is_reported_once(make_env: Any) -> None:
    env, _v1 = spool_env(make_env)
    v2 = env.release("1.1.0")
    put(env, "op-good", spec(env, v2))
    out = operator_once(env)
    assert out.code == 0, out.stderr
    env.assert_running("green", v2)
    st = status(env, "op-good")
    assert st is not None
    assert (st["phase"], st["result"], st["from_version"], st["to_version"]) == (
        "Succeeded", "committed", "1.0.0", "1.1.0")
    assert st["journal_seq"] == env.published_seq("op-good")
    assert st["boot_id"] == boot_id()
    assert st["started_at"] and st["finished_at"] and st["started_at"] <= st["finished_at"]
    assert st["conditions"][0]["type"] == "Complete" and st["conditions"][0]["status"] == "True"
    path = spool_dir(env) / "op-good.status.json"
    before = (path.stat().st_ino, path.read_bytes())
    again = operator_once(env)
    assert again.code == 0, again.stderr
    assert (path.stat().st_ino, path.read_bytes()) == before  # acknowledged: never written again
    path.unlink()  # the acknowledgement lost: the recorded result is republished, the operation not re-run
    assert operator_once(env).code == 0
    assert path.read_bytes() == before[1]
    assert env.events("op-good").count("EpisodeOpened") == 1


STEP_ORDER = ["Waiting", "Fetching", "Verifying", "Staged", "Switching", "Restarting", "HealthChecking"]


def test_a_running_operation_publishes_its_steps_from_the_journal(make_env: Any) -> None:
    # The archive comes from a loopback server that sends half of it, then holds the rest until the test has
    # read "Fetching" in the status file; the candidate's health check lasts 4 s (stability_s), longer than
    # two of the operator's progress periods, so "HealthChecking" is published while it runs.
    env, _v1 = spool_env(make_env, stability_s=4.0)
    v2 = env.release("1.1.0")
    data = v2.path.read_bytes()
    gate = threading.Event()
    with servers.serve() as server:
        server.routes["/v2.tar.gz"] = servers.held_halfway(data, gate)
        put(env, "op-steps", spec(env, v2, archive={"url": server.url("/v2.tar.gz"), "sha256": v2.sha256}))
        proc = subprocess.Popen(env.argv("operator", "--once"), env=env.env(), cwd=agent_env.WORKTREE,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        seen: list[dict[str, Any]] = []  # every distinct status document read, in order
        deadline = time.monotonic() + 90
        try:
            while time.monotonic() < deadline:
                st = status(env, "op-steps")  # replaced by rename: never read half-written
                if st is not None and (not seen or st != seen[-1]):
                    seen.append(st)
                    if st["step"] == "Fetching":
                        gate.set()
                if st is not None and st["phase"] != "InProgress":
                    break
                time.sleep(0.05)
            else:
                pytest.fail(f"no terminal status within 90 s: {seen}")
        finally:
            gate.set()
            _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    env.assert_running("green", v2)

    steps = [st["step"] for st in seen]
    assert steps[-1] is None and seen[-1]["phase"] == "Succeeded", seen
    running = steps[:-1]
    assert running[:2] == ["Waiting", "Fetching"], steps
    assert "HealthChecking" in running, steps
    assert running == sorted(running, key=STEP_ORDER.index), steps  # never backwards
    fetching = next(st for st in seen if st["step"] == "Fetching")
    assert (fetching["bytes_fetched"], fetching["attempt"]) == (None, None), fetching
    assert fetching["started_at"] is not None and fetching["journal_seq"] is None
    checking = next(st for st in seen if st["step"] == "HealthChecking")
    assert (checking["bytes_fetched"], checking["attempt"]) == (len(data), 1), checking
    # terminal: the document a republication after compaction gives again, without the running fields
    assert (seen[-1]["bytes_fetched"], seen[-1]["attempt"]) == (None, None), seen[-1]
    # every step came from the journal: the episode's records in that order
    events = env.events("op-steps")
    assert events.index("ArchiveFetched") < events.index("RestartObserved")
    assert "operator: " in err and "InProgress (Fetching)" in err, err


def test_bad_candidate_is_rolled_back(make_env: Any) -> None:
    env, v1 = spool_env(make_env)
    bad = env.release("1.2.0", "exit-after:0.3")
    put(env, "op-bad", spec(env, bad))
    out = operator_once(env)
    assert out.code == 0, out.stderr
    env.assert_running("blue", v1)
    st = status(env, "op-bad")
    assert st is not None and (st["phase"], st["result"]) == ("RolledBack", "rolled_back"), st
    assert st["journal_seq"] == env.published_seq("op-bad")
    assert st["message"]


def test_invalid_operations_fail_without_touching_the_host(make_env: Any) -> None:
    env, v1 = spool_env(make_env)
    v2 = env.release("1.1.0")
    journal_before = {p.name: p.read_bytes() for p in (env.state_dir / "journal").iterdir() if p.is_file()}
    links = (env.link("current"), env.link("last-good"))
    cases = {
        "other-node": (spec(env, v2, nodeName="node-2"), "addressed to node node-2"),
        "other-agent": (spec(env, v2, agent="someone-else"), "addressed to agent someone-else"),
        "bad-digest": (spec(env, v2, archive={"url": v2.url, "sha256": "abc"}), "sha256"),
        "no-archive": ({"nodeName": NODE, "agent": env.name}, "spec.archive"),
        "unknown-key": (spec(env, v2, sha="x"), "unknown key sha"),
        "not-json": ("{not json", "not a JSON document"),
    }
    for op, (doc, _) in cases.items():
        put(env, op, doc)
    d = spool_dir(env)
    os.mkfifo(d / "a-fifo.json", 0o600)
    (env.work / "elsewhere.json").write_text(json.dumps(spec(env, v2)))
    os.symlink(env.work / "elsewhere.json", d / "a-link.json")
    out = operator_once(env)
    assert out.code == 0, out.stderr
    for op, (_, reason) in cases.items():
        st = status(env, op)
        assert st is not None and st["phase"] == "Failed" and st["result"] is None, (op, st)
        assert reason in st["message"], (op, st["message"])
        assert st["journal_seq"] is None
    for op, what in (("a-fifo", "FIFO"), ("a-link", "symlink")):
        st = status(env, op)
        assert st is not None and st["phase"] == "Failed" and what in st["message"], (op, st)
    journal_after = {p.name: p.read_bytes() for p in (env.state_dir / "journal").iterdir() if p.is_file()}
    assert journal_after == journal_before
    assert (env.link("current"), env.link("last-good")) == links
    env.assert_running("blue", v1)
    assert json.loads((env.work / "elsewhere.json").read_text())["agent"] == env.name  # target untouched


def test_installed_operator_unit_serves_and_stops_on_sigterm(make_env: Any) -> None:
    env, _v1 = spool_env(make_env, unit=True)
    v2 = env.release("1.1.0")
    unit = f"{env.name}-operator.service"
    assert unit in env.units_present()
    wait_for(lambda: env.show(unit)["ActiveState"] == "active", 15, f"{unit} active")
    put(env, "op-unit", spec(env, v2))
    wait_for(lambda: (status(env, "op-unit") or {}).get("phase") == "Succeeded", 60, "op-unit Succeeded")
    env.assert_running("green", v2)
    env.sandbox.run("systemctl", "stop", unit)
    shown = env.show(unit, "ActiveState", "Result", "ExecMainStatus")
    assert (shown["ActiveState"], shown["Result"], shown["ExecMainStatus"]) == ("inactive", "success", "0"), (
        shown)


def test_sigkill_at_every_kill_point_publishes_exactly_once(make_env: Any) -> None:
    env, v1 = spool_env(make_env)
    releases = [v1, env.release("1.1.0")]
    put(env, "record", spec(env, releases[1]))
    assert operator_once(env).code == 0
    points = env.kill_points("record")
    assert "UpgradeCommitted#1" in points and "EpisodeClosed#1" in points, points
    current = 1
    rows = []
    terminal = ("Succeeded", "Failed", "RolledBack", "NeedsAttention")
    for i, point in enumerate(points):
        target = releases[1 - current]
        op = f"kill-{i}-{secrets.token_hex(2)}"
        put(env, op, spec(env, target))
        killed = operator_once(env, {"UPGRADE_AGENT_TEST_KILL_AFTER": point})
        again = operator_once(env)
        st = status(env, op) or {}
        phase = st.get("phase")
        writes = sum(out.stderr.count(f"{op}.json: {p}") for out in (killed, again) for p in terminal)
        path = spool_dir(env) / f"{op}.status.json"
        ino = path.stat().st_ino if path.exists() else None
        third = operator_once(env)
        rows.append({
            "point": point, "killed": killed.code, "again": again.code, "phase": phase, "writes": writes,
            "rewritten": (path.stat().st_ino if path.exists() else None) != ino,
            "opened": env.events(op).count("EpisodeOpened"), "third": third.code,
            "seq_matches": st.get("journal_seq") == env.published_seq(op),
        })
        if phase == "Succeeded":  # committed: the host serves the target; anything else: the previous one
            current = 1 - current
        env.assert_running("green" if current == 1 else "blue", releases[current])
    want = (-9, 0, True, 1, False, 1, 0, True)
    bad = [r for r in rows if (r["killed"], r["again"], r["phase"] in terminal, r["writes"], r["rewritten"],
                               r["opened"], r["third"], r["seq_matches"]) != want]
    committed_late = [r for r in rows if r["point"] in ("UpgradeCommitted#1", "ResultPublished#1",
                                                        "EpisodeClosed#1", "operator-terminal")]
    assert all(r["phase"] == "Succeeded" for r in committed_late), committed_late
    assert not bad, "\n".join(json.dumps(r) for r in bad)


def test_outside_its_window_an_operation_is_staged_then_switched_when_the_window_opens(make_env: Any) -> None:
    """``[schedule]`` (docs/configuration.md): outside the window the operation is fetched, verified and
    staged under its own id, reported ``InProgress``/``Waiting`` with the unit untouched; once the window is
    open the operator activates the staging: ``Succeeded``, the host serves the new version, and the status
    names the activation's ``ResultPublished`` record."""
    env, v1 = spool_env(make_env)
    v2 = env.release("1.1.0")
    base = env.config.read_text()
    later = datetime.now(UTC) + timedelta(hours=3)
    env.config.write_text(base + f'\n[schedule]\nwindow = "*-*-* {later:%H:%M}:00 UTC"\nwindow_s = 60\n')
    pid = env.assert_running("blue", v1)
    put(env, "op-window", spec(env, v2))
    out = operator_once(env)
    assert out.code == 0, out.stderr
    st = status(env, "op-window")
    assert st is not None and (st["phase"], st["step"], st["result"]) == ("InProgress", "Waiting", None), st
    assert st["message"].startswith("waiting for the maintenance window: the next opens at "), st
    assert env.assert_running("blue", v1) == pid  # nothing switched or restarted
    assert env.slot_sha256("green") == v2.member_sha256
    assert env.events("op-window")[-3:] == ["StagedForActivation", "ResultPublished", "EpisodeClosed"]

    env.config.write_text(base + '\n[schedule]\nwindow = "*-*-* *:*:00"\nwindow_s = 120\n')  # open now
    out = operator_once(env)
    assert out.code == 0, out.stderr
    st = status(env, "op-window")
    assert st is not None and (st["phase"], st["result"], st["step"]) == ("Succeeded", "committed", None), st
    env.assert_running("green", v2)
    activations = [r for r in env.journal() if r["event"]["_type"] == "StagedCandidateChecked"]
    assert [r["event"]["staged_by"] for r in activations] == ["op-window"]
    assert st["journal_seq"] == env.published_seq(activations[0]["episode"])

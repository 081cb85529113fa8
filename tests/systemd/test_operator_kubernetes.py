"""``upgrade-agent operator`` with the Kubernetes source against a real ``kube-apiserver`` and etcd
(:mod:`tests.kube.realserver`, on loopback, started once per session), upgrading a real agent under the
private systemd (docs/managed.md). The operator authenticates with a bound token of the ServiceAccount of
``deploy/kubernetes/rbac.yaml``, whose Role the API server's RBAC authorizer enforces: every request it made
must have been allowed.

Outcomes are read from the host (links, ``MainPID``'s executable, the served version, the journal) and from
the status documents the API server accepted, as its audit log records them (:class:`RealBackend`), never
from the operator's output alone:

- a good ``UpgradeOperation`` commits: status ``Succeeded`` with ``journalSeq`` = the ``ResultPublished``
  record, ``observedGeneration``, ``bootID``, both versions; one terminal status write;
- a bad candidate: ``RolledBack``, the host serves the previous version; an object for another agent:
  ``Failed``, the journal untouched; an object for another node is never seen (field selector) nor written;
- exactly once: the operator is SIGKILLed after every durable event of an operation and right after each
  status write, then started again: one terminal status write per object, matching the journal, and no
  operation opens a second episode.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kube.apiserver import service_account
from tests.kube.backends import RealBackend

from . import agent_env
from .agent_env import AgentEnv, Cli, Release

pytestmark = pytest.mark.systemd
release_server = agent_env.release_server
make_env = agent_env.make_env

NODE = "node-1"
NS, AGENT_USER = service_account()  # the ServiceAccount of deploy/kubernetes/rbac.yaml, its Role enforced
TERMINAL = ("Succeeded", "Failed", "RolledBack", "NeedsAttention")


@pytest.fixture
def kube(real_kube: RealBackend) -> Iterator[RealBackend]:
    """The session's real API server, its audit log read from this test's start. Objects are named after the
    test's agent (``cli-<hex>``), so the tests sharing the server never meet each other's objects."""
    yield real_kube.scoped()


def kube_env(make_env: Any, kube: RealBackend, tmp_path: Path, **options: Any) -> tuple[AgentEnv, Release]:
    """An agent with 1.0.0 installed, then ``[operations] source = "kubernetes"`` pointed at the API server
    with a bound token of ``rbac.yaml``'s ServiceAccount; ``options`` go to ``make_env`` (e.g.
    ``stability_s``)."""
    env: AgentEnv = make_env(**options)
    v1 = env.release("1.0.0")
    env.install(v1)
    token = kube.issue_token(f"token-{env.name}", AGENT_USER)
    config = kube.kubeconfig(str(tmp_path / f"kubeconfig-{env.name}"), namespace=NS, token=token)
    with env.config.open("a") as f:
        f.write(f'\n[operations]\nsource = "kubernetes"\nnamespace = "{NS}"\nnode_name = "{NODE}"\n'
                f'kubeconfig = "{config}"\n')
    return env, v1


def create(kube: RealBackend, env: AgentEnv, name: str, rel: Release, **override: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": NODE, "agent": env.name, "expectVersion": rel.version,
                            "archive": {"url": rel.url, "sha256": rel.sha256}}
    spec.update(override)
    body = {"apiVersion": "upgrades.upgrade-core.io/v1alpha1", "kind": "UpgradeOperation",
            "metadata": {"name": f"{env.name}-{name}"}, "spec": spec}
    return kube.put_object(NS, body)


def history(kube: RealBackend, env: AgentEnv, name: str) -> list[dict[str, Any]]:
    return kube.status_history(NS, f"{env.name}-{name}")


def terminal_writes(kube: RealBackend, env: AgentEnv, name: str) -> list[dict[str, Any]]:
    return [s for s in history(kube, env, name) if s.get("phase") in TERMINAL]


def operator_once(env: AgentEnv, extra: dict[str, str] | None = None) -> Cli:
    return env.cli("operator", "--once", env=extra)


def test_the_status_subresource_shows_the_running_steps(
    make_env: Any, kube: RealBackend, tmp_path: Path
) -> None:
    # The candidate's health check lasts 4 s (stability_s): longer than the operator's progress period, so
    # the API server sees the step while it runs, each write derived from the journal.
    env, _v1 = kube_env(make_env, kube, tmp_path, stability_s=4.0)
    v2 = env.release("1.1.0")
    create(kube, env, "upgrade-steps", v2)
    out = operator_once(env)
    assert out.code == 0, out.stderr
    env.assert_running("green", v2)
    written = history(kube, env, "upgrade-steps")
    steps = [s.get("step") for s in written]
    assert steps[0] == "Waiting" and steps[-1] is None, written
    assert written[-1]["phase"] == "Succeeded"
    checking = [s for s in written if s.get("step") == "HealthChecking"]
    assert checking, steps
    assert (checking[0]["phase"], checking[0]["attempt"], checking[0]["bytesFetched"]) == (
        "InProgress", 1, v2.path.stat().st_size), checking[0]
    assert "journalSeq" not in checking[0]  # the result is not published yet
    order = ["Waiting", "Fetching", "Verifying", "Staged", "Switching", "Restarting", "HealthChecking"]
    assert steps[:-1] == sorted(steps[:-1], key=order.index), steps
    # each write says something new
    assert len(written) == len({json.dumps(s, sort_keys=True) for s in written})


def test_good_bad_foreign_and_other_node_operations(make_env: Any, kube: RealBackend, tmp_path: Path) -> None:
    env, _v1 = kube_env(make_env, kube, tmp_path)
    v2, bad = env.release("1.1.0"), env.release("1.2.0", "exit-after:0.3")
    good = create(kube, env, "upgrade-good", v2)
    out = operator_once(env)
    assert out.code == 0, out.stderr
    env.assert_running("green", v2)
    uid = good["metadata"]["uid"]
    (st,) = terminal_writes(kube, env, "upgrade-good")
    assert (st["phase"], st["operation"], st["fromVersion"], st["toVersion"], st["observedGeneration"]) == (
        "Succeeded", uid, "1.0.0", "1.1.0", 1)
    assert st["journalSeq"] == env.published_seq(uid)
    assert st["bootID"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    written = history(kube, env, "upgrade-good")
    assert [s["phase"] for s in written][-1] == "Succeeded", written
    assert {s["phase"] for s in written[:-1]} == {"InProgress"}, written
    assert written[0]["step"] == "Waiting"
    assert not {"step", "attempt", "bytesFetched"} & set(st), st  # running fields only

    journal_before = {p.name: p.read_bytes() for p in (env.state_dir / "journal").iterdir() if p.is_file()}
    create(kube, env, "for-another-agent", v2, agent="someone-else")
    create(kube, env, "for-another-node", v2, nodeName="node-2")
    assert operator_once(env).code == 0
    assert history(kube, env, "for-another-agent") == []  # another agent's operator runs and reports it
    assert history(kube, env, "for-another-node") == []  # never listed: the field selector
    journal_after = {p.name: p.read_bytes() for p in (env.state_dir / "journal").iterdir() if p.is_file()}
    assert journal_after == journal_before
    env.assert_running("green", v2)

    broken = create(kube, env, "upgrade-bad", bad)
    assert operator_once(env).code == 0
    (rolled,) = terminal_writes(kube, env, "upgrade-bad")
    assert rolled["phase"] == "RolledBack" and rolled["message"]
    assert rolled["journalSeq"] == env.published_seq(broken["metadata"]["uid"])
    env.assert_running("green", v2)
    assert len(terminal_writes(kube, env, "upgrade-good")) == 1  # nothing was republished on the later runs
    used = kube.access_log(AGENT_USER)
    assert used and all(allowed for _, _, allowed in used), used


def test_sigkill_at_every_kill_point_writes_one_terminal_status(
    make_env: Any, kube: RealBackend, tmp_path: Path
) -> None:
    env, v1 = kube_env(make_env, kube, tmp_path)
    releases = [v1, env.release("1.1.0")]
    recorded = create(kube, env, "record", releases[1])
    assert operator_once(env).code == 0
    points = env.kill_points(recorded["metadata"]["uid"])
    assert "UpgradeCommitted#1" in points, points
    current, rows = 1, []
    for i, point in enumerate(points):
        name = f"kill-{i}-{secrets.token_hex(2)}"
        uid = create(kube, env, name, releases[1 - current])["metadata"]["uid"]
        killed = operator_once(env, {"UPGRADE_AGENT_TEST_KILL_AFTER": point})
        again = operator_once(env)
        third = operator_once(env)
        done = terminal_writes(kube, env, name)
        phase = done[0]["phase"] if done else None
        rows.append({
            "point": point, "killed": killed.code, "again": again.code, "third": third.code,
            "terminal_writes": len(done), "phase": phase,
            "opened": env.events(uid).count("EpisodeOpened"),
            "seq_matches": bool(done) and done[0].get("journalSeq") == env.published_seq(uid),
        })
        if phase == "Succeeded":
            current = 1 - current
        env.assert_running("green" if current == 1 else "blue", releases[current])
    want = {"killed": -9, "again": 0, "third": 0, "terminal_writes": 1, "opened": 1, "seq_matches": True}
    bad = [r for r in rows if any(r[k] != v for k, v in want.items()) or r["phase"] not in TERMINAL]
    late = [r for r in rows if r["point"] in ("UpgradeCommitted#1", "ResultPublished#1", "EpisodeClosed#1",
                                               "operator-terminal")]
    assert all(r["phase"] == "Succeeded" for r in late), late
    assert not bad, "\n".join(json.dumps(r) for r in bad)

"""The ``upgrade_core.fleet`` collection (docs/managed.md) rolls releases across six real hosts in waves.

Six private systemds are booted once for the module (:mod:`tests.systemd.ansible_fleet`); each host gets
the sample agent 1.0.0 installed through the real CLI inside it, with ``[trust] root_keys`` naming a key
made by the real ``minisign`` (every release below is signed; the agent fetches ``<archive>.minisig``).
Every scenario runs the real ``ansible-playbook upgrade_core.fleet.rollout`` and then asserts what each host
shows: its links, its unit's ``MainPID`` (the executable and argv read from ``/proc`` inside the host, and
when it started), and the version its agent serves on ``/healthz``; the summary and the play recap are
checked against those facts, never instead of them.

The scenarios share the fleet, in order: check mode (changes nothing), the good 2.0.0 rollout (a module
fixture, so the later scenarios can rely on it whichever runs first), its re-run (``changed=0``), a bad
3.0.0 (the canary rolls back, the play halts, the other five hosts are untouched), a 3.1.0 that passes its
health check and dies during the soak (the canary is rolled back by an operator rollback, nothing else is
touched), and 4.0.0 in waves of 1, 3 and 2 with one host of the second wave handed a failing build (that
wave halts the play, its two hosts that had committed are rolled back to 2.0.0; the third wave is never
touched), and 6.0.0 the same way with a failure budget of 50 % (the wave goes on, nothing is rolled back).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent.testing.releases import ReleaseServer
from agent.testing.sandbox import PrivateSystemd
from tests.cli.test_signed_releases import keypair, sign

from . import agent_env
from .agent_env import AgentEnv, Release, tree
from .ansible_fleet import (
    AGENT_EXE,
    BIN,
    Fleet,
    Play,
    ansible_env,
    build_collection,
    host_vars,
    run_bounded,
    start_ticks,
)

pytestmark = pytest.mark.systemd
release_server = agent_env.release_server

N_HOSTS = 6
# serial [1, "10%", "50%", "100%"] over six hosts: 10% rounds down to 0 and Ansible makes it 1; 50% is 3;
# 100% takes the one left.
EXPECTED_WAVES = [["host0"], ["host1"], ["host2", "host3", "host4"], ["host5"]]
GOOD_OP = "rollout-2.0.0"
BAD_OP = "rollout-3.0.0"
HALT_KEYS = ("halted", "halted_wave", "failed_hosts", "rolled_back_hosts", "rollback_failed_hosts",
             "untouched_hosts", "waves")
SPEC_KEYS = ("operation", "result", "from_version", "to_version", "slot", "reason")


class FleetReleases:
    """The fleet under test and its three signed releases (1.0.0 installed, 2.0.0 good, 3.0.0 bad)."""

    def __init__(self, fleet: Fleet, server: ReleaseServer, secret_key: Path,
                 v1: Release, v2: Release, v3: Release) -> None:
        self.fleet = fleet
        self.server = server
        self.secret_key = secret_key
        self.v1, self.v2, self.v3 = v1, v2, v3

    def sign(self, rel: Release) -> None:
        """Sign ``rel`` with the publisher key every host trusts (security version 1)."""
        name = self.fleet.hosts["host0"].name
        sign(self.secret_key, rel.path, f"name={name} version={rel.version} security_version=1")

    def vars(self, rel: Release, operation: str) -> dict[str, Any]:
        """The rollout's extra vars for ``rel``."""
        return {"rollout_archive": rel.url, "rollout_sha256": rel.sha256,
                "rollout_expect_version": rel.version, "rollout_operation": operation}


def snapshot(env: AgentEnv) -> dict[str, Any]:
    """What a host shows: its host root's tree (links and slot digests), ``state_dir``'s tree, and its
    unit's MainPID with that process's start time."""
    pid, _, _ = env.main_process()
    return {"root": tree(env.root), "state": tree(env.state_dir), "pid": pid,
            "started": start_ticks(env, pid)}


def assert_untouched(fleet: FleetReleases, before: dict[str, dict[str, Any]], names: list[str],
                     operation: str) -> None:
    """The hosts ``names`` show exactly ``before``'s links and slots and the same main process (same pid,
    same start), and hold no result of ``operation``: the rollout never reached them."""
    for name in names:
        env = fleet.fleet.hosts[name]
        now = snapshot(env)
        assert now["root"] == before[name]["root"], name
        assert (now["pid"], now["started"]) == (before[name]["pid"], before[name]["started"]), name
        assert env.result_file(operation) is None, name


@pytest.fixture(scope="module")
def ansible_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collection, built with ``ansible-galaxy collection build`` and installed into a private path."""
    home = tmp_path_factory.mktemp("ansible")
    build_collection(home)
    return home


@pytest.fixture(scope="module")
def fleet(
    ansible_home: Path, release_server: ReleaseServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FleetReleases]:
    """Six hosts, each its own private systemd, running the signed sample agent 1.0.0."""
    if os.geteuid() != 0:
        pytest.skip("the private systemd harness needs root (unshare, mount, cgroup2)")
    work = tmp_path_factory.mktemp("fleet")
    sec, pub = keypair(work, "publisher")
    name = f"fleet-{os.urandom(3).hex()}"
    sandboxes: list[PrivateSystemd] = []
    try:
        hosts: dict[str, AgentEnv] = {}
        for i in range(N_HOSTS):
            sandboxes.append(PrivateSystemd.start(work / f"sd{i}"))
            (work / f"host{i}").mkdir()
            hosts[f"host{i}"] = AgentEnv.create(
                sandboxes[-1], release_server, work / f"host{i}", inside=True, name=name,
                extra_config=f'[trust]\nroot_keys = ["{pub}"]\n',
            )
        assert len({env.port for env in hosts.values()}) == N_HOSTS
        first = hosts["host0"]
        releases = [first.release("1.0.0"), first.release("2.0.0"), first.release("3.0.0", "exit-after:0.3")]
        fleet = FleetReleases(Fleet.create(hosts, ansible_home), release_server, sec, *releases)
        for rel in releases:
            fleet.sign(rel)
        with ThreadPoolExecutor(N_HOSTS) as pool:
            list(pool.map(lambda env: env.install(releases[0]), hosts.values()))
        for env in hosts.values():
            env.assert_running("blue", releases[0])
        yield fleet
    finally:
        problems = []
        for sd in sandboxes:
            try:
                sd.stop()
            except Exception as exc:  # stop every sandbox, then report
                problems.append(str(exc))
        assert not problems, problems


@pytest.fixture(scope="module")
def good_rollout(fleet: FleetReleases) -> tuple[Play, dict[str, dict[str, Any]]]:
    """The good signed 2.0.0 rolled out once with the default waves; (the play, each host's snapshot from
    before it)."""
    before = {name: snapshot(env) for name, env in fleet.fleet.hosts.items()}
    play = fleet.fleet.playbook(fleet.vars(fleet.v2, GOOD_OP), "--diff")
    return play, before


def test_ansible_doc_renders_the_modules(ansible_home: Path) -> None:
    env = ansible_env(ansible_home)
    for kind, plugin, words in (
        ("module", "upgrade_core.fleet.upgrade", ("archive", "sha256", "expect_version", "operation",
                                                  "signature", "config", "EXAMPLES", "RETURN VALUES",
                                                  "--preflight", "rolled_back",
                                                  "looked up on the module's PATH")),
        # config and executable come from the collection's doc fragment (upgrade_core.fleet.agent)
        ("module", "upgrade_core.fleet.status", ("upgrade_core_status", "EXAMPLES", "config",
                                                 "looked up on the module's PATH", "default: upgrade-agent")),
        ("module", "upgrade_core.fleet.rollback", ("operation", "below_watermark", "last-good", "EXAMPLES",
                                                   "RETURN VALUES", "--preflight")),
        ("connection", "upgrade_core.fleet.nsenter", ("nsenter_pid", "ansible_nsenter_pid")),
    ):
        done = run_bounded([str(BIN / "ansible-doc"), "-t", kind, plugin], env, 60.0)
        assert done.returncode == 0, done.stderr
        assert "WARNING" not in done.stderr, done.stderr
        for word in words:
            assert word in done.stdout, (plugin, word, done.stdout)


def test_bad_module_input_fails_with_one_clear_line(fleet: FleetReleases) -> None:
    env = fleet.fleet.hosts["host1"]
    before = snapshot(env)
    good = {"config": str(env.config), "executable": str(AGENT_EXE)}
    v2 = {"archive": fleet.v2.url, "sha256": fleet.v2.sha256}
    cases = [
        ("upgrade", {**good, **v2, "sha256": "not-a-digest"}, "sha256"),
        ("upgrade", {**good, **v2, "archive": str(env.work / "missing.tar.gz")}, "missing.tar.gz"),
        ("upgrade", {**good, **v2, "executable": "/nonexistent/upgrade-agent"}, "/nonexistent/upgrade-agent"),
        ("upgrade", {**good, **v2, "timeout": "0"}, "timeout must be a positive number"),
        ("status", {**good, "config": str(env.work / "missing.toml")}, "missing.toml"),
    ]
    for module, args, words in cases:
        code, state, result = fleet.fleet.adhoc("host1", f"upgrade_core.fleet.{module}", args)
        assert (code, state) == (2, "FAILED!"), (args, state, result)
        msg = result["msg"]
        assert "\n" not in msg and words in msg and "Traceback" not in msg, (args, msg)
    assert snapshot(env) == before


def test_an_unreachable_canary_halts_the_rollout_and_is_reported(fleet: FleetReleases) -> None:
    # "ghost" names host0's live PID 1 with another pid namespace: what a PID reused after a host stopped
    # looks like. The connection must refuse it; the rollout must halt there with host0 untouched.
    host0 = fleet.fleet.hosts["host0"]
    before = snapshot(host0)
    inventory = fleet.fleet.home / "ghost-inventory.json"
    ghost = {**host_vars(host0), "ansible_nsenter_namespace": "pid:[1]"}
    inventory.write_text(json.dumps({"all": {"hosts": {"ghost": ghost, "host0": host_vars(host0)}}}))
    play = fleet.fleet.playbook(fleet.vars(fleet.v2, "ghost-2.0.0"), inventory=inventory)
    assert play.code != 0, play.stdout[-4000:]
    entries = play.summary_by_host()
    assert entries["ghost"]["result"] == "unreachable", entries
    assert f"is in {host0.sandbox.pidns}, not pid:[1]" in entries["ghost"]["reason"], entries
    assert entries["host0"]["result"] == "not_run", entries
    assert snapshot(host0) == before
    assert host0.result_file("ghost-2.0.0") is None


def test_check_mode_changes_nothing_on_any_host(fleet: FleetReleases) -> None:
    hosts = fleet.fleet.hosts
    before = {name: snapshot(env) for name, env in hosts.items()}
    fetched = len(fleet.server.requests)
    play = fleet.fleet.playbook(fleet.vars(fleet.v2, "check-2.0.0"), "--check", "--diff")
    assert play.code == 0, play.stdout[-4000:]
    assert {name: snapshot(env) for name, env in hosts.items()} == before
    assert fleet.server.requests[fetched:] == []  # not even the signature was fetched
    for env in hosts.values():
        assert env.result_file("check-2.0.0") is None
    assert all(counts["failed"] == 0 for counts in play.recap.values()), play.recap
    summary = play.summary_by_host()
    assert sorted(summary) == sorted(hosts)
    for entry in summary.values():
        assert entry["result"] == "preflight", entry
        assert any("switch current" in step for step in entry["plan"]), entry
    assert play.summary is not None and play.summary["check_mode"] is True
    # --diff: each host's version before and the one the task expects after (nothing fetched, so no digest)
    assert play.stdout.count("-version - 1.0.0\n+version - 2.0.0") == len(hosts), play.stdout[-4000:]
    assert play.stdout.count("--- before: current (blue)\n+++ after: current (green)") == len(hosts)


def test_good_signed_release_rolls_out_to_every_host_in_waves(
    fleet: FleetReleases, good_rollout: tuple[Play, dict[str, dict[str, Any]]]
) -> None:
    play, before = good_rollout
    assert play.code == 0, play.stdout[-4000:]
    hosts = fleet.fleet.hosts
    started: dict[str, int] = {}
    for name, env in hosts.items():
        pid = env.assert_running("green", fleet.v2)  # MainPID runs the current link -> green = 2.0.0's bytes
        assert pid != before[name]["pid"]
        started[name] = start_ticks(env, pid)
        assert env.link("last-good") == f"{env.name}-blue"  # 1.0.0 stays the way back
        published = env.result_file(GOOD_OP) or {}
        assert {k: published.get(k) for k in SPEC_KEYS} == {
            "operation": GOOD_OP, "result": "committed", "from_version": "1.0.0", "to_version": "2.0.0",
            "slot": "green", "reason": None}, published
        assert "ReleaseTrusted" in env.events(GOOD_OP)  # the signature was checked on this host
    # The waves, from the hosts: every host of a wave restarted after every host of the wave before.
    for earlier, later in itertools.pairwise(EXPECTED_WAVES):
        assert max(started[h] for h in earlier) < min(started[h] for h in later), started
    assert play.summary is not None
    assert {k: play.summary[k] for k in HALT_KEYS} == {
        "halted": False, "halted_wave": None, "failed_hosts": [], "rolled_back_hosts": [],
        "rollback_failed_hosts": [], "untouched_hosts": [], "waves": EXPECTED_WAVES}
    assert play.summary["fleet_versions"] == {"ungrouped": {name: "2.0.0" for name in hosts}}
    for entry in play.summary_by_host().values():
        assert (entry["from"], entry["to"], entry["result"], entry["reason"], entry["changed"]) == (
            "1.0.0", "2.0.0", "committed", None, True), entry
        assert (entry["soak"], entry["rollback"]) == ({"healthy": True, "reason": None}, None), entry
    assert {name: (c["changed"], c["failed"]) for name, c in play.recap.items()} == {
        name: (1, 0) for name in hosts}
    assert "host5: committed 1.0.0 -> 2.0.0" in play.stdout
    # --diff: the version current ran before and runs now, the slots in the headers, once per host
    assert play.stdout.count("--- before: current (blue)\n+++ after: current (green)") == len(hosts)
    assert play.stdout.count("-version - 1.0.0\n+version - 2.0.0") == len(hosts), play.stdout[-4000:]


def test_rerunning_the_good_rollout_changes_nothing(
    fleet: FleetReleases, good_rollout: tuple[Play, dict[str, dict[str, Any]]]
) -> None:
    hosts = fleet.fleet.hosts
    before = {name: snapshot(env) for name, env in hosts.items()}
    play = fleet.fleet.playbook(fleet.vars(fleet.v2, GOOD_OP))
    assert play.code == 0, play.stdout[-4000:]
    assert {name: c["changed"] for name, c in play.recap.items()} == {name: 0 for name in hosts}, play.recap
    for name, env in hosts.items():
        assert env.assert_running("green", fleet.v2) == before[name]["pid"]  # not even restarted
        assert snapshot(env)["root"] == before[name]["root"]
    for entry in play.summary_by_host().values():
        assert entry["changed"] is False and entry["to"] == "2.0.0", entry


def test_bad_release_canary_rolls_back_and_the_rollout_halts(
    fleet: FleetReleases, good_rollout: tuple[Play, dict[str, dict[str, Any]]]
) -> None:
    hosts = fleet.fleet.hosts
    before = {name: snapshot(env) for name, env in hosts.items()}
    bad_path = fleet.v3.url.split("/", 3)[3]
    play = fleet.fleet.playbook(fleet.vars(fleet.v3, BAD_OP))
    assert play.code != 0, play.stdout[-4000:]
    canary = hosts["host0"]
    # The canary tried 3.0.0 (blue), saw it die, and is back on 2.0.0 in green.
    canary_result = canary.result_file(BAD_OP)
    assert canary_result is not None and canary_result["result"] == "rolled_back", canary_result
    assert canary_result["reason"]
    canary.assert_running("green", fleet.v2)
    assert canary.link("current") == f"{canary.name}-green"
    # Every other host never started: same links and slots, same process, still serving 2.0.0.
    assert_untouched(fleet, before, [name for name in hosts if name != "host0"], BAD_OP)
    for name, env in hosts.items():
        if name != "host0":
            assert env.assert_running("green", fleet.v2) == before[name]["pid"]
    assert fleet.server.requests.count(f"/{bad_path}") == 1  # only the canary fetched the bad archive
    assert play.recap["host0"]["failed"] == 1, play.recap
    assert set(play.recap) == {"host0"} | ({"localhost"} & set(play.recap)), play.recap
    assert play.summary is not None
    assert {k: play.summary[k] for k in HALT_KEYS} == {
        "halted": True, "halted_wave": 1, "failed_hosts": ["host0"], "rolled_back_hosts": [],
        "rollback_failed_hosts": [],  # the canary's agent rolled itself back: it never committed
        "untouched_hosts": [name for name in hosts if name != "host0"], "waves": [["host0"]]}
    entries = play.summary_by_host()
    assert (entries["host0"]["result"], entries["host0"]["reason"]) == (
        "rolled_back", canary_result["reason"])
    assert (entries["host0"]["from"], entries["host0"]["to"]) == ("2.0.0", "3.0.0")
    for name in hosts:
        if name != "host0":
            assert entries[name]["result"] == "not_run", entries[name]
    assert canary_result["reason"] in play.stdout


def test_a_canary_that_dies_during_the_soak_is_rolled_back_and_the_rollout_halts(
    fleet: FleetReleases, good_rollout: tuple[Play, dict[str, dict[str, Any]]]
) -> None:
    # 3.1.0 serves for 8 s, then exits 1: it passes the agent's health check (0.5 s of stability), commits,
    # and dies during the 10 s soak; systemd restarts it (Restart=on-failure), so only its replaced main
    # process tells. The inventory groups the hosts (canary, rest) for the fleet report.
    hosts = fleet.fleet.hosts
    flaky = hosts["host0"].release("3.1.0", "exit-after:8")
    fleet.sign(flaky)
    before = {name: snapshot(env) for name, env in hosts.items()}
    inventory = fleet.fleet.home / "grouped-inventory.json"
    inventory.write_text(json.dumps({"all": {"children": {
        "canary": {"hosts": {"host0": host_vars(hosts["host0"])}},
        "rest": {"hosts": {name: host_vars(env) for name, env in hosts.items() if name != "host0"}}}}}))
    operation = "rollout-3.1.0"
    fetched = len(fleet.server.requests)
    play = fleet.fleet.playbook({**fleet.vars(flaky, operation), "rollout_soak_s": 10}, inventory=inventory)
    assert play.code != 0, play.stdout[-4000:]

    canary = hosts["host0"]
    assert (canary.result_file(operation) or {}).get("result") == "committed"  # it passed the health check
    # The operator rollback, journaled on the canary as its own episode, put 2.0.0 (green) back.
    rollback = canary.result_file(f"{operation}-rollback")
    assert rollback is not None, canary.journal()[-5:]
    assert (rollback["result"], rollback["from_version"], rollback["to_version"], rollback["slot"]) == (
        "committed", "3.1.0", "2.0.0", "green"), rollback
    assert "UpgradeCommitted" in canary.events(f"{operation}-rollback")
    canary.assert_running("green", fleet.v2)
    assert canary.link("last-good") == f"{canary.name}-green"
    assert_untouched(fleet, before, [name for name in hosts if name != "host0"], operation)
    flaky_path = f"/{flaky.url.split('/', 3)[3]}"
    assert fleet.server.requests[fetched:].count(flaky_path) == 1

    assert play.summary is not None
    assert {k: play.summary[k] for k in HALT_KEYS} == {
        "halted": True, "halted_wave": 1, "failed_hosts": ["host0"], "rolled_back_hosts": ["host0"],
        "rollback_failed_hosts": [], "untouched_hosts": [name for name in hosts if name != "host0"],
        "waves": [["host0"]]}
    assert play.summary["fleet_versions"] == {
        "canary": {"host0": "2.0.0"}, "rest": {name: "2.0.0" for name in hosts if name != "host0"}}
    entry = play.summary_by_host()["host0"]
    assert (entry["result"], entry["from"], entry["to"]) == ("committed", "2.0.0", "3.1.0"), entry
    assert entry["soak"]["healthy"] is False, entry
    assert "main process changed" in entry["soak"]["reason"], entry
    assert entry["rollback"] == {"operation": f"{operation}-rollback", "result": "committed", "from": "3.1.0",
                                 "to": "2.0.0", "reason": None}, entry
    assert "host0: committed 2.0.0 -> 3.1.0 (unhealthy after the soak" in play.stdout
    assert "; rolled back to 2.0.0" in play.stdout
    assert play.recap["host0"]["failed"] == 1, play.recap


def signed_pair(fleet: FleetReleases, version: str) -> tuple[Release, Release]:
    """``version`` built twice and signed: the good sample agent, and one that exits 0.3 s after it starts
    (it fails its health check and its agent rolls it back)."""
    first = fleet.fleet.hosts["host0"]
    good, bad = first.release(version), first.release(version, "exit-after:0.3")
    for rel in (good, bad):
        fleet.sign(rel)
    return good, bad


def one_bad_host_inventory(fleet: FleetReleases, name: str, good: Release, bad: Release) -> Path:
    """An inventory of the fleet handing ``bad`` to host2 and ``good`` to every other host."""
    inventory = fleet.fleet.home / name
    per_host = {host: host_vars(env) for host, env in fleet.fleet.hosts.items()}
    per_host["host2"] |= {"rollout_archive": bad.url, "rollout_sha256": bad.sha256}
    inventory.write_text(json.dumps({"all": {
        "vars": {"rollout_archive": good.url, "rollout_sha256": good.sha256},
        "hosts": per_host}}))
    return inventory


def test_a_failed_host_in_a_multi_host_wave_rolls_that_wave_back_and_halts_the_rollout(
    fleet: FleetReleases, good_rollout: tuple[Play, dict[str, dict[str, Any]]]
) -> None:
    # Waves of 1, 3 and 2 hosts; host2 (the middle of the second wave) is handed a build of 4.0.0 that exits
    # 0.3 s after it starts, every other host the good 4.0.0. The second wave breaks its failure budget:
    # the whole wave must end on 2.0.0 (host1 and host3 rolled back), the third never start.
    hosts = fleet.fleet.hosts
    good, bad = signed_pair(fleet, "4.0.0")
    before = {name: snapshot(env) for name, env in hosts.items()}
    inventory = one_bad_host_inventory(fleet, "mixed-wave-inventory.json", good, bad)
    operation = "rollout-4.0.0"
    fetched = len(fleet.server.requests)
    play = fleet.fleet.playbook(
        {"rollout_serial": [1, 3, 2], "rollout_expect_version": "4.0.0", "rollout_operation": operation,
         "rollout_soak_s": 1},
        inventory=inventory)
    assert play.code != 0, play.stdout[-4000:]

    # The first wave committed 4.0.0 (blue: it ran 2.0.0 in green) and passed its soak.
    hosts["host0"].assert_running("blue", good)
    assert (hosts["host0"].result_file(operation) or {}).get("result") == "committed"
    assert hosts["host0"].result_file(f"{operation}-rollback") is None
    # The two good hosts of the second wave committed 4.0.0, then were rolled back with it: an operator
    # rollback journaled on each, MainPID running green's bytes again and serving 2.0.0.
    for name in ("host1", "host3"):
        env = hosts[name]
        assert (env.result_file(operation) or {}).get("result") == "committed", name
        rollback = env.result_file(f"{operation}-rollback") or {}
        assert (rollback.get("result"), rollback.get("from_version"), rollback.get("to_version")) == (
            "committed", "4.0.0", "2.0.0"), (name, rollback)
        assert "UpgradeCommitted" in env.events(f"{operation}-rollback")
        env.assert_running("green", fleet.v2)
    # host2 tried its build, saw it die, and is back on 2.0.0 in green (its own agent rolled it back).
    failed = hosts["host2"]
    failed_result = failed.result_file(operation)
    assert failed_result is not None and failed_result["result"] == "rolled_back", failed_result
    assert failed.result_file(f"{operation}-rollback") is None
    failed.assert_running("green", fleet.v2)
    # The third wave was never touched: same links and slots, same process, no result, nothing fetched.
    assert_untouched(fleet, before, ["host4", "host5"], operation)
    good_path, bad_path = (f"/{rel.url.split('/', 3)[3]}" for rel in (good, bad))
    assert sorted(fleet.server.requests[fetched:]).count(good_path) == 3, fleet.server.requests[fetched:]
    assert fleet.server.requests[fetched:].count(bad_path) == 1
    assert set(play.recap) - {"localhost"} == {"host0", "host1", "host2", "host3"}, play.recap
    assert play.recap["host2"]["failed"] == 1, play.recap

    assert play.summary is not None
    assert {k: play.summary[k] for k in HALT_KEYS} == {
        "halted": True, "halted_wave": 2, "failed_hosts": ["host2"], "rolled_back_hosts": ["host1", "host3"],
        "rollback_failed_hosts": [], "untouched_hosts": ["host4", "host5"],
        "waves": [["host0"], ["host1", "host2", "host3"]]}
    assert play.summary["fleet_versions"] == {"ungrouped": {
        "host0": "4.0.0", "host1": "2.0.0", "host2": "2.0.0", "host3": "2.0.0", "host4": "2.0.0",
        "host5": "2.0.0"}}
    entries = play.summary_by_host()
    assert {name: entries[name]["result"] for name in hosts} == {
        "host0": "committed", "host1": "committed", "host2": "rolled_back", "host3": "committed",
        "host4": "not_run", "host5": "not_run"}
    assert {name: (entries[name]["rollback"] or {}).get("result") for name in hosts} == {
        "host0": None, "host1": "committed", "host2": None, "host3": "committed", "host4": None,
        "host5": None}
    assert entries["host0"]["soak"] == {"healthy": True, "reason": None}
    assert entries["host2"]["reason"] == failed_result["reason"]
    assert "host1: committed 2.0.0 -> 4.0.0; rolled back to 2.0.0" in play.stdout
    # the printed fleet report: each host of the group with its version
    assert ('"ungrouped: host0 4.0.0, host1 2.0.0, host2 2.0.0, host3 2.0.0, host4 2.0.0, host5 2.0.0"'
            in play.stdout), play.stdout[-3000:]


def test_a_wave_within_its_failure_budget_goes_on_and_nothing_is_rolled_back(
    fleet: FleetReleases, good_rollout: tuple[Play, dict[str, dict[str, Any]]]
) -> None:
    # Waves of 1, 3 and 2 with rollout_max_fail_percentage 50: host2's failing build is one host of three in
    # its wave (33 %), within the budget, so the wave is not undone and the third wave runs.
    hosts = fleet.fleet.hosts
    good, bad = signed_pair(fleet, "6.0.0")
    slots = {name: env.link("current").rsplit("-", 1)[1] for name, env in hosts.items()}
    inventory = one_bad_host_inventory(fleet, "tolerant-inventory.json", good, bad)
    operation = "rollout-6.0.0"
    play = fleet.fleet.playbook(
        {"rollout_serial": [1, 3, 2], "rollout_expect_version": "6.0.0", "rollout_operation": operation,
         "rollout_max_fail_percentage": 50}, inventory=inventory)
    assert play.code != 0, play.stdout[-4000:]  # host2 failed, and Ansible says so
    for name, env in hosts.items():
        if name == "host2":
            continue
        other = "blue" if slots[name] == "green" else "green"
        env.assert_running(other, good)
        assert env.result_file(f"{operation}-rollback") is None, name
    assert (hosts["host2"].result_file(operation) or {}).get("result") == "rolled_back"
    assert hosts["host2"].link("current") == f"{hosts['host2'].name}-{slots['host2']}"
    assert play.recap["host2"]["failed"] == 1, play.recap
    assert play.summary is not None
    assert {k: play.summary[k] for k in HALT_KEYS} == {
        "halted": False, "halted_wave": None, "failed_hosts": [], "rolled_back_hosts": [],
        "rollback_failed_hosts": [], "untouched_hosts": [],
        "waves": [["host0"], ["host1", "host2", "host3"], ["host4", "host5"]]}
    versions = play.summary["fleet_versions"]["ungrouped"]
    assert {name: v for name, v in versions.items() if name != "host2"} == {
        name: "6.0.0" for name in hosts if name != "host2"}
    assert versions["host2"] != "6.0.0"


def test_a_soak_that_is_not_a_number_of_seconds_stops_before_any_host(fleet: FleetReleases) -> None:
    hosts = fleet.fleet.hosts
    before = {name: snapshot(env) for name, env in hosts.items()}
    fetched = len(fleet.server.requests)
    play = fleet.fleet.playbook({**fleet.vars(fleet.v2, "soak-typo"), "rollout_soak_s": "10m"})
    assert play.code != 0, play.stdout[-4000:]
    line = "rollout_soak_s: 10m is not a whole number of seconds (0 or more)"
    assert line in play.stdout, play.stdout[-3000:]
    assert {name: snapshot(env) for name, env in hosts.items()} == before
    assert fleet.server.requests[fetched:] == []
    for env in hosts.values():
        assert env.result_file("soak-typo") is None

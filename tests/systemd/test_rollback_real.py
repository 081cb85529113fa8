"""Operator rollback under the private systemd (docs/recovery.md): ``upgrade-agent rollback`` through the CLI.

Every agent here installs a 1.0.x release into blue and upgrades to a good 1.1.0 on green (committed), so
``current`` names green and ``last-good`` blue. Then:

1. ``rollback --preflight`` prints the plan and changes nothing; ``rollback`` commits to blue: both links
   name blue, the unit's MainPID runs the ``current`` link (which resolves to blue) and serves 1.0.0; a
   second ``rollback`` has nothing to roll back to (exit 2, journal unchanged).
2. A failing last-good, honestly: the 1.0.5 release in blue refuses to start while a marker file exists
   (an older release that cannot read what the newer one left behind, e.g. a migrated configuration;
   ``refuse-if-exists:`` in ``agent/testing/sample_agent.py``). It ran healthy when installed; the marker is
   created after the upgrade to 1.1.0. ``rollback`` switches to blue, its health attempts fail, current
   goes back to green (health-checked) and the command exits 1 naming both slots and versions.
3. Kill points, as ``test_crash_real.py`` does for upgrades: both rollbacks above are recorded once; the
   rollback episode's events, as ``(TAG, N)``, are the kill points. For each, a fresh agent is prepared,
   ``rollback`` runs with ``UPGRADE_AGENT_TEST_KILL_AFTER=TAG#N`` (SIGKILL right after that record is
   durable), then ``recover-agent-upgrade --trigger manual``; the host must be consistent (one table row
   per kill point, the same shape as the upgrade's).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from agent.config.boot import machine_arch
from agent.testing.releases import build_release, sha256_file
from agent.testing.sandbox import PrivateSystemd

from ._cli_agent import KILL_ENV, CliAgent, tags_with_occurrence
from .test_crash_real import HEADER, Row

pytestmark = pytest.mark.systemd

ARCH = machine_arch() or "amd64"
NAME = "rb-agent"
MEMBER = f"{NAME}-linux-{ARCH}"
OLD, FRAGILE, GOOD = "1.0.0", "1.0.5", "1.1.0"
OPERATION = "rb-op"
WORKERS = 5

KillPoint = tuple[str, int]


@attrs.frozen
class Prepared:
    """An agent on green 1.1.0 with last-good on blue (``old``), ready for ``rollback``."""

    agent: CliAgent
    old: str
    marker: Path | None


def _args(archive: Path) -> list[str]:
    return ["--archive", str(archive), "--sha256", sha256_file(archive)]


def prepare(sandbox: PrivateSystemd, base: Path, path: str) -> Prepared:
    """install 1.0.x (``path`` "failing": the fragile 1.0.5), upgrade to 1.1.0; for "failing" then create
    the marker 1.0.5 refuses to start with. Raises on a setup step that fails."""
    base.mkdir(parents=True, exist_ok=True)
    marker = base / "migrated-by-1.1.0" if path == "failing" else None
    old = FRAGILE if marker is not None else OLD
    behaviour = f"refuse-if-exists:{marker}" if marker is not None else "good"
    releases = base / "releases"
    releases.mkdir(exist_ok=True)
    old_archive = build_release(releases, old, behaviour, name=NAME, arch=ARCH)
    new_archive = build_release(releases, GOOD, "good", name=NAME, arch=ARCH)
    # 10 s an attempt: a healthy slot's restart must never miss its window on a loaded CI machine (the
    # kill-point test runs five agents at once; at 4 s one good return to the previous current timed out
    # under the full suite). A failing last-good still fails at once: it exits on start.
    agent = CliAgent.create(sandbox, base / "agent", prefix="rb", member=MEMBER, stability_s=0.3,
                            timeout_s=10.0, max_attempts=2)
    try:
        done = agent.cli("install", *_args(old_archive), "--expect-version", old)
        assert done.returncode == 0, f"install of {old}: exit {done.returncode}: {done.stderr[-600:]}"
        done = agent.cli("upgrade", *_args(new_archive), "--operation", "up-op")
        assert done.returncode == 0, f"upgrade to {GOOD}: exit {done.returncode}: {done.stderr[-600:]}"
        assert (_slot(agent, "current"), _slot(agent, "last-good")) == ("green", "blue")
        if marker is not None:
            marker.write_text("configuration format 2\n")
    except BaseException:
        agent.teardown()
        raise
    return Prepared(agent, old, marker)


def _slot(agent: CliAgent, link: str) -> str | None:
    target = agent.link(link)
    return target.rsplit("-", 1)[-1] if target else None


def serving(agent: CliAgent, slot: str, version: str, timeout_s: float = 10.0) -> str | None:
    """None when the unit is active/running, its MainPID runs the current link (or ``slot``'s file) and
    answers ``version``; else what was seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        svc = agent.service()
        pid = svc.get("MainPID", "0")
        cmd = agent.main_cmdline(pid) if pid != "0" else []
        served = agent.served_version()
        names = {str(agent.lib / f"{agent.name}-current"), str(agent.lib / f"{agent.name}-{slot}")}
        running = (svc.get("ActiveState"), svc.get("SubState")) == ("active", "running")
        if running and names & set(cmd) and served == version:
            return None
        if time.monotonic() > deadline:
            return (f"unit {svc.get('ActiveState')}/{svc.get('SubState')} pid {pid} cmd {cmd[1:2]} "
                    f"serving {served}, expected {version} from {slot}")
        time.sleep(0.1)


def test_rollback_commits_to_last_good(sandbox: PrivateSystemd, tmp_path: Path) -> None:
    prep = prepare(sandbox, tmp_path, "success")
    agent = prep.agent
    try:
        records = len(agent.records())
        pre = agent.cli("rollback", "--preflight", "--operation", OPERATION)
        assert pre.returncode == 0, pre.stderr
        plan = json.loads(pre.stdout)
        assert plan["preflight"] is True and plan["inactive_slot"] == "blue" and plan["lock"] == "free"
        assert any("switch current from green" in step for step in plan["plan"]), plan
        assert len(agent.records()) == records and _slot(agent, "current") == "green"
        assert agent.result_file(OPERATION) is None

        done = agent.cli("rollback", "--operation", OPERATION)
        assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-800:]}"
        out = json.loads(done.stdout)
        assert (out["result"], out["slot"], out["from_version"], out["to_version"]) == (
            "committed", "blue", GOOD, OLD), out
        assert (_slot(agent, "current"), _slot(agent, "last-good")) == ("blue", "blue")
        assert agent.link("current") == f"{agent.name}-blue"
        assert serving(agent, "blue", OLD) is None
        assert agent.result_file(OPERATION) == out
        episode = agent.episode(OPERATION)
        assert getattr(episode[0].event, "kind", None) == "rollback"
        assert [t for t, _ in tags_with_occurrence(episode)][-3:] == [
            "UpgradeCommitted", "ResultPublished", "EpisodeClosed"]

        # Nothing left to roll back to: refused before any episode opens, the journal unchanged.
        records = len(agent.records())
        again = agent.cli("rollback")
        assert again.returncode == 2, again.stdout
        assert "nothing to roll back to" in json.loads(again.stdout)["error"]
        assert len(agent.records()) == records
        # The same operation id prints its recorded result and does nothing.
        same = agent.cli("rollback", "--operation", OPERATION)
        assert same.returncode == 0 and json.loads(same.stdout) == out
    finally:
        agent.teardown()


def test_failing_last_good_returns_to_the_previous_current(sandbox: PrivateSystemd, tmp_path: Path) -> None:
    prep = prepare(sandbox, tmp_path, "failing")
    agent = prep.agent
    try:
        done = agent.cli("rollback", "--operation", OPERATION, timeout_s=120)
        assert done.returncode == 1, f"exit {done.returncode}: {done.stdout} {done.stderr[-800:]}"
        out = json.loads(done.stdout)
        assert (out["result"], out["slot"], out["from_version"], out["to_version"]) == (
            "rolled_back", "green", GOOD, FRAGILE), out
        assert f"last-good blue ({FRAGILE}) unhealthy after 2 attempt(s)" in out["reason"], out
        assert f"back to green ({GOOD})" in out["reason"], out
        # Both links as before the rollback; the previous current serves again.
        assert (_slot(agent, "current"), _slot(agent, "last-good")) == ("green", "blue")
        assert serving(agent, "green", GOOD) is None
        tags = [t for t, _ in tags_with_occurrence(agent.episode(OPERATION))]
        assert tags.count("HealthFailed") == 2 and "RollbackStarted" in tags and "RolledBack" in tags
    finally:
        agent.teardown()


# -- kill points -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recorded(sandbox: PrivateSystemd, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[KillPoint]]:
    """One recorded rollback per path; its episode's ``(TAG, N)`` list is that path's kill points."""
    runs: dict[str, list[KillPoint]] = {}
    for path, expect in (("success", 0), ("failing", 1)):
        prep = prepare(sandbox, tmp_path_factory.mktemp(f"recorded-{path}"), path)
        try:
            done = prep.agent.cli("rollback", "--operation", OPERATION, timeout_s=120)
            assert done.returncode == expect, f"recorded {path}: exit {done.returncode}: {done.stderr}"
            runs[path] = list(tags_with_occurrence(prep.agent.episode(OPERATION)))
        finally:
            prep.agent.teardown()
    return runs


def _expected(points: Sequence[KillPoint], index: int, path: str) -> set[str]:
    """What recovery may end with after a kill right after ``points[index]`` was durable."""
    if index <= points.index(("SwitchIntended", 1)):
        return {"aborted"}  # the link was not flipped (or recovery sees it was not): never move it
    if path == "failing":
        return {"rolled_back"}  # last-good is active and unhealthy: back to the previous current
    if ("UpgradeCommitted", 1) in points and index >= points.index(("UpgradeCommitted", 1)):
        return {"committed"}  # one-way door
    return {"committed", "rolled_back"}  # active, uncommitted: its remaining attempts decide


def check_rollback_host(prep: Prepared, row: Row, expected: set[str]) -> None:
    """After recovery: one closed episode with one published result (file = journal), links consistent with
    it, last-good still blue, the unit serving what current names, a second recover a noop."""
    agent, p = prep.agent, row.problems
    if agent.open_episodes():
        p.append(f"open episodes {agent.open_episodes()}")
    episode = agent.episode(OPERATION)
    tags = [type(r.event).TAG for r in episode]
    published = [r.event for r in episode if type(r.event).TAG == "ResultPublished"]
    if len(published) != 1 or tags.count("EpisodeClosed") != 1 or tags[-1:] != ["EpisodeClosed"]:
        p.append(f"not published and closed exactly once: {tags[-3:]}")
    if published:
        journal_result = attrs.asdict(published[0].result)  # type: ignore[attr-defined]
        row.result = journal_result["result"]
        file = agent.result_file(OPERATION)
        if file is None or {k: file.get(k) for k in journal_result} != journal_result:
            p.append(f"result file {file} != journal {journal_result}")
        if row.result not in expected:
            p.append(f"result {row.result}, expected {sorted(expected)}")
    row.current, row.last_good = _slot(agent, "current"), _slot(agent, "last-good")
    if row.last_good != "blue":
        p.append(f"last-good moved to {row.last_good}")
    want_slot, want_version = ("blue", prep.old) if row.result == "committed" else ("green", GOOD)
    if row.current != want_slot:
        p.append(f"{row.result} but current is {row.current}")
    problem = serving(agent, want_slot, want_version)
    row.serving = agent.served_version()
    if problem:
        p.append(problem)
    again = agent.recover()
    if again.returncode != 0 or json.loads(again.stdout or "{}").get("result") != "noop":
        p.append(f"second recover: exit {again.returncode} {again.stdout.strip()}")


def run_kill_point(sandbox: PrivateSystemd, base: Path, path: str, points: Sequence[KillPoint],
                   index: int) -> Row:
    """Fresh agent, rollback killed after ``points[index]``, recover, check; never raises on a finding."""
    tag, nth = points[index]
    row = Row(path, f"{tag}#{nth}")
    prep = None
    try:
        prep = prepare(sandbox, base, path)
        done = prep.agent.cli("rollback", "--operation", OPERATION, env={KILL_ENV: f"{tag}#{nth}"},
                              timeout_s=120)
        row.killed = "SIGKILL" if done.returncode == -9 else f"exit {done.returncode}"
        if done.returncode != -9 and (tag, nth) in list(tags_with_occurrence(prep.agent.episode(OPERATION))):
            row.problems.append(f"{tag}#{nth} was journaled but the rollback was not killed")
        rec = prep.agent.recover()
        row.recover_exit = rec.returncode
        if rec.returncode != 0:
            row.problems.append(f"recover exit {rec.returncode}: {rec.stderr.strip()[-300:]}")
        check_rollback_host(prep, row, _expected(points, index, path))
    except Exception as exc:  # a broken harness step is a finding of this row, reported with the rest
        row.problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        if prep is not None:
            prep.agent.teardown()
    return row


@pytest.mark.parametrize("path", ["success", "failing"])
def test_kill_every_event_of_a_rollback(sandbox: PrivateSystemd, recorded: dict[str, list[KillPoint]],
                                        tmp_path: Path, path: str) -> None:
    """SIGKILL after each durable event of a recorded rollback, then recover: consistent at every point."""
    points = recorded[path]
    assert points[0] == ("EpisodeOpened", 1) and points[-2:] == [("ResultPublished", 1), ("EpisodeClosed", 1)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = [pool.submit(run_kill_point, sandbox, tmp_path / f"k{i:02d}", path, points, i)
                   for i in range(len(points))]
        rows = [f.result() for f in futures]
    print(f"\nrollback {path} path: {len(rows)} kill points from the recorded run\n{HEADER}")
    for row in rows:
        print(row.line())
    bad = [row.line() for row in rows if row.problems]
    assert not bad, f"{len(bad)} of {len(rows)} kill points broke an invariant:\n" + "\n".join(bad)

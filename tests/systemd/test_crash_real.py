"""Crash injection, real (design §8): SIGKILL the upgrader after every event of a recorded run, then recover.

1. Two full runs are recorded through the real CLI against the private systemd: install 1.0.0 then
   upgrade to a good 1.1.0 (committed), and install 1.0.0 then upgrade to a bad 1.2.0 that passes its
   version check and dies 0.1 s after start (rolled back). The upgrade episode's events are read back
   from each journal as ``(TAG, N)`` (N-th occurrence of that tag): these lists are the kill points, so
   they follow the product, not a hand-written list.
2. For every kill point of each list: a fresh agent (unique NAME, fresh host root) installs 1.0.0, runs
   the upgrade with ``UPGRADE_AGENT_TEST_KILL_AFTER=TAG#N`` (documented in agent/crashhook.py: SIGKILL
   right after that record's append returned, i.e. after its fdatasync), then ``recover --trigger manual``;
   the design §4.6 invariants are checked on the real layout, journal, result file and unit.
3. The same over delta upgrades (docs/delta.md): 1.0.0 to 1.1.0 rebuilt from the current slot and a
   ``zstd --patch-from`` delta (path ``delta``), and a delta made against another base that falls back to
   the archive in the same episode (path ``delta-fallback``, its ``ArchiveFetched`` carrying the reason).
4. A crash inside the recovery itself: the recover process is killed by the same hook after one of its
   own events, and a second recover must reach the same end.

Kill points run five at a time (the work is mostly waiting on systemd and stability windows); each
outcome is a row of a table printed at the end of the test, and the test fails listing every bad row.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import secrets
import tarfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import pytest

from agent.config.boot import machine_arch
from agent.testing.releases import ReleaseServer, build_release, sha256_file
from agent.testing.sandbox import PrivateSystemd
from tests.agent_fetch._archives import zstd_patch

from ._cli_agent import KILL_ENV, CliAgent, tags_with_occurrence

pytestmark = pytest.mark.systemd

ARCH = machine_arch() or "amd64"
MEMBER = f"crash-agent-linux-{ARCH}"
OLD, GOOD, BAD = "1.0.0", "1.1.0", "1.2.0"
OPERATION = "crash-op"
WORKERS = 5

KillPoint = tuple[str, int]


@attrs.frozen
class Releases:
    """The release archives on a loopback server.

    Attributes:
        archive_sha: sha256 of each archive (what ``--sha256`` checks), by version.
        member_sha: sha256 of each archive's member (what a slot holds), by version.
    """

    server: ReleaseServer
    files: dict[str, Path]
    archive_sha: dict[str, str]
    member_sha: dict[str, str]
    deltas: dict[str, Path] = attrs.Factory(dict)

    def args(self, version: str) -> list[str]:
        """``--archive URL --sha256 HEX`` for one version."""
        return ["--archive", self.server.url(self.files[version]), "--sha256", self.archive_sha[version]]

    def upgrade_args(self, path: str) -> list[str]:
        """The ``upgrade`` options of a recorded path: the archive of its candidate, or for the delta paths
        ``--delta URL --delta-sha256 HEX --member-sha256 HEX`` with the candidate's archive as fall-back."""
        if path not in self.deltas:
            return self.args(GOOD if path == "success" else BAD)
        delta = self.deltas[path]
        return ["--delta", self.server.url(delta), "--delta-sha256", sha256_file(delta),
                "--member-sha256", self.member_sha[GOOD], *self.args(GOOD)]

    def version_of(self, sha: str | None) -> str | None:
        """The version whose member has this sha256 (None if none does)."""
        return next((v for v, s in self.member_sha.items() if s == sha), None)


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Releases]:
    """1.0.0 and 1.1.0 good, 1.2.0 dies 0.1 s after it starts serving (case C16), served on loopback.

    0.1 s, well inside the 0.3 s window: the sample that completes a window is taken when it ends, so a
    candidate dying at the window's very end would be judged by a race, not by the rules."""
    out = tmp_path_factory.mktemp("releases")
    files = {
        v: build_release(out, v, behaviour, name="crash-agent", arch=ARCH)
        for v, behaviour in ((OLD, "good"), (GOOD, "good"), (BAD, "exit-after:0.1"))
    }
    member_sha: dict[str, str] = {}
    members: dict[str, bytes] = {}
    for v, f in files.items():
        with tarfile.open(f) as tar:
            member = tar.extractfile(MEMBER)
            assert member is not None, f"{f} has no member {MEMBER}"
            members[v] = member.read()
            member_sha[v] = hashlib.sha256(members[v]).hexdigest()
    # the delta paths: 1.0.0 -> 1.1.0 against the installed 1.0.0, and against a base the host never ran
    other = members[GOOD].replace(b"import", b"IMPORT")
    deltas = {}
    for path, base in (("delta", members[OLD]), ("delta-fallback", other)):
        deltas[path] = zstd_patch(base, members[GOOD], out / f"{path}.zst")
    server = ReleaseServer.start(out)
    try:
        yield Releases(server, files, {v: sha256_file(f) for v, f in files.items()}, member_sha, deltas)
    finally:
        server.close()


def _new_agent(sandbox: PrivateSystemd, base: Path, releases: Releases) -> CliAgent:
    """A fresh agent with 1.0.0 installed through the CLI (committed, serving)."""
    agent = CliAgent.create(sandbox, base, prefix="crash", member=MEMBER, stability_s=0.3, timeout_s=6.0,
                            max_attempts=2)
    done = agent.cli("install", *releases.args(OLD), "--expect-version", OLD)
    assert done.returncode == 0, f"install of {OLD} failed ({done.returncode}): {done.stderr[-800:]}"
    return agent


@attrs.frozen
class RecordedRun:
    """A recorded full run: its kill points and its result."""

    points: list[KillPoint]
    result: str


@pytest.fixture(scope="module")
def recorded(sandbox: PrivateSystemd, releases: Releases,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, RecordedRun]:
    """The success and the rollback run, recorded; their upgrade episodes' ``(TAG, N)`` lists."""
    runs: dict[str, RecordedRun] = {}
    for path, expect in (("success", 0), ("rollback", 1), ("delta", 0), ("delta-fallback", 0)):
        agent = _new_agent(sandbox, tmp_path_factory.mktemp(f"recorded-{path}"), releases)
        try:
            done = agent.cli("upgrade", *releases.upgrade_args(path), "--operation", OPERATION)
            assert done.returncode == expect, f"recorded {path} run: exit {done.returncode}: {done.stderr}"
            points = list(tags_with_occurrence(agent.episode(OPERATION)))
            runs[path] = RecordedRun(points, json.loads(done.stdout)["result"])
        finally:
            agent.teardown()
    return runs


@attrs.define
class Row:
    """One kill point's outcome (a line of the printed table)."""

    path: str
    point: str
    killed: str = "?"
    recover_exit: int | None = None
    result: str | None = None
    current: str | None = None
    last_good: str | None = None
    serving: str | None = None
    problems: list[str] = attrs.Factory(list)

    def line(self) -> str:
        """The row as fixed-width text."""
        verdict = "ok" if not self.problems else "FAIL: " + "; ".join(self.problems)
        return (f"{self.path:<8} {self.point:<26} {self.killed:<10} {self.recover_exit!s:<4} "
                f"{self.result or '-':<12} {self.current or '-':<6} {self.last_good or '-':<6} "
                f"{self.serving or '-':<7} {verdict}")


HEADER = (f"{'path':<8} {'kill after':<26} {'upgrader':<10} {'rec':<4} {'result':<12} {'cur':<6} "
          f"{'lastg':<6} {'serving':<7} verdict")


def _expected_results(points: Sequence[KillPoint], index: int, path: str) -> set[str]:
    """What design §4.5 allows after a kill right after ``points[index]`` was durable."""
    switch_intended = points.index(("SwitchIntended", 1))
    if index <= switch_intended:
        return {"aborted"}  # the link was not flipped yet: never downgrade, abort
    if path == "rollback":
        return {"rolled_back"}  # the candidate is active and unhealthy: roll back
    if ("UpgradeCommitted", 1) in points and index >= points.index(("UpgradeCommitted", 1)):
        return {"committed"}  # a durable commit is a one-way door
    return {"committed", "rolled_back"}  # active, uncommitted: remaining attempts decide


def check_host(agent: CliAgent, releases: Releases, row: Row, expected: set[str], candidate: str) -> None:
    """Check the design §4.6 invariants after recovery; append each violation to ``row.problems``."""
    p = row.problems
    open_eps = agent.open_episodes()
    if open_eps:
        p.append(f"open episodes {open_eps}")
    episode = agent.episode(OPERATION)
    tags = [type(r.event).TAG for r in episode]
    published = [r.event for r in episode if type(r.event).TAG == "ResultPublished"]
    if len(published) != 1:
        p.append(f"{len(published)} ResultPublished records")
    if tags.count("EpisodeClosed") != 1 or tags[-1:] != ["EpisodeClosed"]:
        p.append(f"episode not closed exactly once at its end: {tags[-3:]}")
    elif "ResultPublished" not in tags[: tags.index("EpisodeClosed")]:
        p.append("closed before its result was published")
    file = agent.result_file(OPERATION)
    if published:
        journal_result = attrs.asdict(published[0].result)  # type: ignore[attr-defined]
        row.result = journal_result["result"]
        if file is None:
            p.append("no result file")
        elif {k: file.get(k) for k in journal_result} != journal_result:
            p.append(f"result file {file} != journal {journal_result}")
        closed = [r.event for r in episode if type(r.event).TAG == "EpisodeClosed"]
        if closed and getattr(closed[0], "result", None) != row.result:
            p.append(f"closed as {getattr(closed[0], 'result', None)} but published {row.result}")
        if row.result not in expected:
            p.append(f"result {row.result}, expected {sorted(expected)}")
    # Links: both resolve to a verified binary (the installed one, or the candidate if it was verified).
    verified = {releases.member_sha[OLD]}
    if "CandidateVerified" in tags:
        verified.add(releases.member_sha[candidate])
    cur_sha, lg_sha = agent.slot_sha("current"), agent.slot_sha("last-good")
    cur, lg = agent.link("current"), agent.link("last-good")
    row.current = cur.rsplit("-", 1)[-1] if cur else None
    row.last_good = lg.rsplit("-", 1)[-1] if lg else None
    if cur_sha not in verified or lg_sha not in verified:
        p.append(f"current/last-good not a verified binary ({releases.version_of(cur_sha)}, "
                 f"{releases.version_of(lg_sha)})")
    # last-good only ever names the committed, previously running 1.0.0 here (inv. 6).
    if row.last_good != "blue" or lg_sha != releases.member_sha[OLD]:
        p.append(f"last-good is {row.last_good} ({releases.version_of(lg_sha)}), not blue (1.0.0)")
    # Consistency between the result and the links (inv. 1, 3, 4).
    if row.result == "committed":
        if row.current != "green" or cur_sha != releases.member_sha[candidate]:
            p.append(f"committed but current is {row.current} ({releases.version_of(cur_sha)})")
    elif row.current != "blue" or cur_sha != releases.member_sha[OLD]:
        p.append(f"{row.result} but current is {row.current} ({releases.version_of(cur_sha)})")
    if file is not None and file.get("slot") != row.current:
        p.append(f"result slot {file.get('slot')} != current {row.current}")
    # The unit is active and its MainPID runs what current names (the agent answers with its version).
    want = releases.version_of(cur_sha)
    deadline = time.monotonic() + 10.0
    while True:
        svc = agent.service()
        pid = svc.get("MainPID", "0")
        cmd = agent.main_cmdline(pid) if pid != "0" else []
        row.serving = agent.served_version()
        names = {str(agent.lib / f"{agent.name}-current"), str(agent.lib / (cur or "?"))}
        running = (svc.get("ActiveState"), svc.get("SubState")) == ("active", "running")
        ok = running and bool(names & set(cmd)) and row.serving == want
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not ok:
        p.append(f"unit {svc.get('ActiveState')}/{svc.get('SubState')} pid {pid} cmd {cmd[1:2]} "
                 f"serving {row.serving}, current is {want}")
    # Replaying again decides the same: nothing open, nothing moves (inv. 5).
    again = agent.recover()
    if again.returncode != 0 or json.loads(again.stdout or "{}").get("result") != "noop":
        p.append(f"second recover: exit {again.returncode} {again.stdout.strip()}")
    if (agent.link("current"), agent.link("last-good")) != (cur, lg):
        p.append("second recover moved a link")


def run_kill_point(sandbox: PrivateSystemd, releases: Releases, base: Path, path: str,
                   points: Sequence[KillPoint], index: int) -> Row:
    """Fresh agent, upgrade killed after ``points[index]``, recover, check; never raises on a finding."""
    tag, nth = points[index]
    row = Row(path, f"{tag}#{nth}")
    candidate = BAD if path == "rollback" else GOOD
    agent = None
    try:
        agent = _new_agent(sandbox, base, releases)
        done = agent.cli("upgrade", *releases.upgrade_args(path), "--operation", OPERATION,
                         env={KILL_ENV: f"{tag}#{nth}"})
        if done.returncode == -9:
            row.killed = "SIGKILL"
        else:
            # Allowed only when this run ended before reaching the point (e.g. fewer health failures).
            row.killed = f"exit {done.returncode}"
            if (tag, nth) in list(tags_with_occurrence(agent.episode(OPERATION))):
                row.problems.append(f"{tag}#{nth} was journaled but the upgrader was not killed")
        rec = agent.recover()
        row.recover_exit = rec.returncode
        if rec.returncode != 0:
            row.problems.append(f"recover exit {rec.returncode}: {rec.stderr.strip()[-300:]}")
        check_host(agent, releases, row, _expected_results(points, index, path), candidate)
    except Exception as exc:  # a broken harness step is a finding of this row, reported with the rest
        row.problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        if agent is not None:
            agent.teardown()
    return row


def _run_all(sandbox: PrivateSystemd, releases: Releases, tmp_path: Path, path: str,
             points: Sequence[KillPoint]) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = [
            pool.submit(run_kill_point, sandbox, releases, tmp_path / f"k{i:02d}", path, points, i)
            for i in range(len(points))
        ]
        rows = [f.result() for f in futures]
    print(f"\n{path} path: {len(rows)} kill points from the recorded run\n{HEADER}")
    for row in rows:
        print(row.line())
    bad = [row.line() for row in rows if row.problems]
    assert not bad, f"{len(bad)} of {len(rows)} kill points broke an invariant:\n" + "\n".join(bad)


def test_recorded_runs_cover_both_paths(recorded: dict[str, RecordedRun]) -> None:
    """The recorded runs really are a commit and a rollback, and pass the events that matter."""
    assert recorded["success"].result == "committed"
    assert recorded["rollback"].result == "rolled_back"
    for path, must in (("success", ["SwitchIntended", "SwitchCommitted", "UpgradeCommitted"]),
                       ("rollback", ["SwitchIntended", "HealthFailed", "RollbackStarted", "RolledBack"])):
        tags = [t for t, _ in recorded[path].points]
        assert tags[0] == "EpisodeOpened" and tags[-2:] == ["ResultPublished", "EpisodeClosed"], tags
        assert all(m in tags for m in must), (path, tags)


def test_kill_every_event_of_the_success_run(sandbox: PrivateSystemd, releases: Releases,
                                             recorded: dict[str, RecordedRun], tmp_path: Path) -> None:
    """SIGKILL after each event of the committed run, recover: design §4.6 holds at every point."""
    _run_all(sandbox, releases, tmp_path, "success", recorded["success"].points)


def test_kill_every_event_of_the_rollback_run(sandbox: PrivateSystemd, releases: Releases,
                                              recorded: dict[str, RecordedRun], tmp_path: Path) -> None:
    """SIGKILL after each event of the rolled-back run, recover: it always ends on the old slot."""
    _run_all(sandbox, releases, tmp_path, "rollback", recorded["rollback"].points)


@pytest.mark.parametrize("path", ["delta", "delta-fallback"])
def test_kill_every_event_of_the_delta_runs(
    sandbox: PrivateSystemd, releases: Releases, recorded: dict[str, RecordedRun], tmp_path: Path, path: str
) -> None:
    """SIGKILL after each event of a delta upgrade (rebuilt from the current slot, or fallen back to the
    archive), recover: design §4.6 holds at every point, as for a full upgrade."""
    assert recorded[path].result == "committed"
    _run_all(sandbox, releases, tmp_path, path, recorded[path].points)


@pytest.mark.parametrize(
    ("path", "upgrade_kill", "recover_kill", "expected"),
    [
        ("success", "SwitchCommitted#1", "RestartObserved#1", "committed"),
        ("rollback", "SwitchCommitted#1", "RollbackStarted#1", "rolled_back"),
    ],
)
def test_crash_during_recovery(sandbox: PrivateSystemd, releases: Releases, tmp_path: Path, path: str,
                               upgrade_kill: str, recover_kill: str, expected: str) -> None:
    """Recovery killed after one of its own events; recovering again reaches the same end (design §4.5)."""
    candidate = GOOD if path == "success" else BAD
    agent = _new_agent(sandbox, tmp_path / secrets.token_hex(2), releases)
    try:
        done = agent.cli("upgrade", *releases.args(candidate), "--operation", OPERATION,
                         env={KILL_ENV: upgrade_kill})
        assert done.returncode == -9, f"upgrader not killed after {upgrade_kill}: {done.returncode}"
        first = agent.cli("recover", "--trigger", "manual", env={KILL_ENV: recover_kill})
        assert first.returncode == -9, f"recover not killed after {recover_kill}: {first.returncode}"
        assert agent.open_episodes() == [OPERATION]
        recovery_tags = [f"{t}#{n}" for t, n in tags_with_occurrence(agent.episode(OPERATION))]
        assert "RecoveryStarted#1" in recovery_tags
        row = Row(path, f"{upgrade_kill}+rec:{recover_kill}", killed="SIGKILL x2")
        rec = agent.recover()
        row.recover_exit = rec.returncode
        assert rec.returncode == 0, rec.stderr
        check_host(agent, releases, row, {expected}, candidate)
        print(f"\n{HEADER}\n{row.line()}")
        assert not row.problems, row.line()
        # The second recovery journaled its own start: the crash inside recovery left a trace, not a gap.
        starts = [r for r in agent.episode(OPERATION) if type(r.event).TAG == "RecoveryStarted"]
        assert len(starts) >= 2
    finally:
        agent.teardown()

"""CLI scenarios under the real private systemd (design §4.3, 4.5, 7; cases C15, C16, C19, C20).

Every scenario runs ``upgrade-agent`` as an operator would (a subprocess with ``--json``), except C19, which
needs a clock it can make jump and so runs the same wired ports in process. Outcomes are read from the
real host: exit codes, the JSON object, ``os.readlink`` of the links, slot digests, the unit's MainPID
(exe and argv read in the sandbox's ``/proc``), the result file and the journal (``journal dump``).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime

import anyio
import attrs
import pytest

from agent.config.loader import load_config
from agent.host.clock import read_boot_id
from agent.host.lock import HostLock
from agent.session.wiring import JournalPort, journal_dir, wire
from journal import JournalWriter
from upgrade_core import EVENT_CODEC, UpgradeRequest, UpgradeResult, run_upgrade

from . import agent_env
from .agent_env import AgentEnv, Release, poll, tree

pytestmark = pytest.mark.systemd

# the shared fixtures, visible to this module's tests
make_env = agent_env.make_env
release_server = agent_env.release_server

MakeEnv = Callable[..., AgentEnv]


def test_install_then_good_upgrade_commits(make_env: MakeEnv) -> None:
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    installed = env.install(v1)
    assert installed.json is not None and installed.json["slot"] == "blue"
    assert env.link("current") == env.link("last-good") == f"{env.name}-blue"
    old_pid = env.assert_running("blue", v1)

    up = env.upgrade(v2, "to-1.1.0")
    assert up.code == 0, up.stderr
    expected = {"operation": "to-1.1.0", "result": "committed", "from_version": "1.0.0",
                "to_version": "1.1.0", "slot": "green", "reason": None}
    assert up.json == expected
    assert env.result_file("to-1.1.0") == expected
    new_pid = env.assert_running("green", v2)
    assert new_pid != old_pid
    assert env.link("last-good") == f"{env.name}-blue"  # kept until the next episode needs that slot
    assert env.slot_sha256("blue") == v1.member_sha256

    status = env.cli("status")
    assert status.code == 0 and status.json is not None
    assert status.json["current"] == {"slot": "green", "path": str(env.lib / f"{env.name}-green"),
                                      "sha256": v2.member_sha256, "version": "1.1.0"}
    assert status.json["last_good"]["slot"] == "blue" and status.json["last_good"]["version"] == "1.0.0"
    assert status.json["service"]["active_state"] == "active"
    assert status.json["service"]["main_pid"] == new_pid
    assert status.json["episode"] is None

    history = env.cli("history")
    assert history.code == 0 and history.json is not None
    rows = history.json["episodes"]
    assert [(r["operation"], r["result"], r["from_version"], r["to_version"]) for r in rows] == [
        ("to-1.1.0", "committed", "1.0.0", "1.1.0"),
        (installed.json["operation"], "committed", None, "1.0.0"),
    ]
    assert all(r["opened_at"].endswith("Z") and r["closed_at"].endswith("Z") for r in rows)
    assert rows[0]["opened_at"] >= rows[1]["closed_at"]


def _assert_rolled_back(env: AgentEnv, up_json: dict[str, object] | None, op: str, old: object) -> None:
    """Exit-1 result ``rolled_back``; current back on blue; the unit runs the old binary again."""
    assert up_json is not None and up_json["result"] == "rolled_back", up_json
    assert up_json["operation"] == op and up_json["slot"] == "blue" and up_json["reason"]
    assert env.result_file(op) == up_json
    assert env.link("current") == env.link("last-good") == f"{env.name}-blue"
    env.assert_running("blue", old)  # type: ignore[arg-type]
    events = env.events(op)
    assert events[-3:] == ["RolledBack", "ResultPublished", "EpisodeClosed"]
    assert "RollbackStarted" in events and "UpgradeCommitted" not in events


# C16 (a): exits 1 after 0.3 s; (b) crashes late in the stability window (see the docstring); (c) dies at
# once and loops in Restart=on-failure. Each upgrade runs while the unit is already active (after install).
@pytest.mark.parametrize(
    ("case", "behaviour"),
    [("a-exit-0.3s", "exit-after:0.3"), ("b-crash-late", "exit-after:0.45"),
     ("c-restart-loop", "exit-after:0")],
)
def test_candidate_that_dies_after_start_is_rolled_back(make_env: MakeEnv, case: str, behaviour: str) -> None:
    """C16: ``systemctl restart`` returning 0 proves nothing; each candidate passes its version check.

    (b) The field case says "crash after 5 s"; with ``stability_s = 0.5`` (the suite's budget, design §8) a
    crash after 5 s is after a passed window and commits, correctly. What is testable, and what the case is
    about, is a crash that comes after the candidate was seen active, running and answering its probe, but
    before the window ends: 0.45 s after it started serving, i.e. always inside a 0.5 s window that can only
    start once it serves. The journal must show that the candidate was observed (``RestartObserved``).
    """
    env = make_env()
    v1, bad = env.release("1.0.0"), env.release("2.0.0", behaviour)
    env.install(v1)
    assert env.show()["ActiveState"] == "active"  # an upgrade while the unit is already active
    op = f"c16{case[0]}"
    up = env.upgrade(bad, op)
    assert up.code == 1, up.stderr
    _assert_rolled_back(env, up.json, op, v1)
    assert env.slot_sha256("green") == bad.member_sha256  # staged, verified and switched: then refused
    events = env.events(op)
    assert events.count("HealthAttemptStarted") == 3  # both candidate attempts, then the last-good's
    assert events.count("HealthFailed") == 2 and events.count("HealthPassed") == 1
    if case.startswith("b"):
        assert "RestartObserved" in events


def test_crash_loop_into_the_start_limit_still_rolls_back_to_last_good(make_env: MakeEnv) -> None:
    """A candidate that crash-loops until systemd's start limit (``StartLimitBurst = max_attempts + 2``)
    makes systemd give up ("Start request repeated too quickly"; systemd 252 keeps ``Result=exit-code``)
    and trigger ``OnFailure=``: ``recover-agent-upgrade --trigger on-failure`` spends the remaining attempt
    and rolls back; the last-good binary is restarted although the unit had hit its start limit (design §4.4,
    C16c).

    The upgrader is SIGKILLed (the documented hook) right after it journaled that it saw the candidate
    running, so nothing but systemd's own machinery is left to act. The CLI runs inside the sandbox so that
    the units systemd starts there read a configuration valid inside (see ``agent_env``).
    """
    env = make_env(inside=True)
    v1, bad = env.release("1.0.0"), env.release("2.0.0", "exit-after:0.3")
    env.install(v1)
    op = "loop-to-limit"
    killed = env.upgrade(bad, op, env={"UPGRADE_AGENT_TEST_KILL_AFTER": "RestartObserved"})
    assert killed.code in (-9, 137), killed.stderr  # nsenter reports its child's SIGKILL as 128+9
    assert env.result_file(op) is None
    assert env.link("current") == f"{env.name}-green"

    poll(lambda: env.result_file(op) is not None, 60.0, "the OnFailure= recovery to publish a result")
    result = env.result_file(op)
    assert result is not None and result["result"] == "rolled_back", result
    records = [r for r in env.journal() if r["episode"] == op]
    triggers = [r["event"].get("trigger") for r in records if r["event"]["_type"] == "RecoveryStarted"]
    assert "on-failure" in triggers, triggers
    console = env.sandbox.console_log.read_text(errors="replace")  # PID 1 logs to its console
    assert f"{env.unit}: Start request repeated too quickly." in console, "\n".join([
        ln for ln in console.splitlines() if env.name in ln][-40:])
    poll(lambda: env.events(op)[-1:] == ["EpisodeClosed"], 10.0, "the episode to close")
    assert env.link("current") == env.link("last-good") == f"{env.name}-blue"
    env.assert_running("blue", v1)


def test_upgrade_started_from_inside_the_agent_unit_commits(make_env: MakeEnv) -> None:
    """C15: the upgrader runs in the agent unit's own cgroup, default ``KillMode=control-group``.

    The CLI is moved into ``system.slice/NAME.service`` (its pid written to that cgroup's
    ``cgroup.procs``) and sees the sandbox's cgroup namespace, so ``/proc/self/cgroup`` names the unit's
    ``ControlGroup`` exactly as for a process the unit forked. The upgrader must hand steps 6-9 to a
    transient ``recover --trigger manual`` unit (the restart kills every process of the unit's cgroup,
    itself included): the candidate still commits and no episode is left open.
    """
    env = make_env(inside=True)
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    op = "from-inside"
    assert env.sandbox.prefix[-1] == "--"
    join = f'echo $$ > /sys/fs/cgroup/system.slice/{env.unit}/cgroup.procs && exec "$@"'
    inner = [sys.executable, "-m", "agent.cli.main", "--config", str(env.config), "--json",
             "upgrade", "--archive", v2.url, "--sha256", v2.sha256, "--operation", op]
    argv = [*env.sandbox.prefix[:-1], "-C", "--", "sh", "-c", join, "c15", *inner]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env.env(), stdin=subprocess.DEVNULL)
    try:
        poll(lambda: env.result_file(op) is not None or proc.poll() is not None, 60.0,
             "the handed-off episode to publish")
        poll(lambda: env.result_file(op) is not None, 30.0, "the result file")
        _out, err = proc.communicate(timeout=60.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = env.result_file(op)
    assert result is not None and result["result"] == "committed", (result, err)
    events = env.events(op)
    assert events[-3:] == ["UpgradeCommitted", "ResultPublished", "EpisodeClosed"], events
    triggers = [r["event"].get("trigger") for r in env.journal()
                if r["episode"] == op and r["event"]["_type"] == "RecoveryStarted"]
    assert triggers == ["manual"], triggers  # the hand-off unit finished it
    status = env.cli("status")
    assert status.json is not None and status.json["episode"] is None
    env.assert_running("green", v2)


class JumpingClock:
    """A :class:`upgrade_core.ports.Clock` whose wall clock jumps ``step_s`` at every sleep (C19).

    ``monotonic`` and ``sleep`` are the real ones (CLOCK_MONOTONIC, anyio): what a wall-clock jump cannot
    touch. ``wall`` is the real Unix time plus ``step_s`` times the number of sleeps so far, so during a
    health window (polled every 0.25 s) it moves by an hour between two samples.
    """

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.jumps = 0

    def monotonic(self) -> float:
        """CLOCK_MONOTONIC seconds."""
        return time.monotonic()

    def wall(self) -> float:
        """Unix seconds, shifted by ``step_s`` per sleep so far."""
        return time.time() + self.jumps * self.step_s

    async def sleep(self, seconds: float) -> None:
        """Sleep for real, then jump the wall clock."""
        await anyio.sleep(seconds)
        self.jumps += 1

    def boot_id(self) -> str | None:
        """The real boot id."""
        return read_boot_id()


def _run_in_process(env: AgentEnv, rel: Release, op: str, clock: JumpingClock) -> UpgradeResult:
    """``run_upgrade`` with the CLI's real ports (agent.session.wiring.wire), the clock replaced by ``clock``,
    and a
    journal writer stamping each record's informational wall time with ``clock.wall``."""
    cfg = load_config(str(env.config))
    request = UpgradeRequest(op, rel.url, rel.url, rel.sha256, rel.version)

    async def flow() -> UpgradeResult:
        with HostLock(cfg.host.lock_path) as lock:
            wired = await wire(cfg, str(env.config), lock=lock)
            await wired.journal.writer.aclose()
            writer = await JournalWriter.open(journal_dir(cfg), EVENT_CODEC, wall_clock=clock.wall)
            ports = attrs.evolve(wired.ports, clock=clock, journal=JournalPort(writer, None, lock))
            try:
                result: UpgradeResult = await run_upgrade(ports, wired.policy, request)
            finally:
                await writer.aclose()
        return result

    return anyio.run(flow)


@pytest.mark.parametrize(
    ("step_s", "behaviour", "expected"),
    [(3600.0, "good", "committed"), (-3600.0, "good", "committed"),
     (3600.0, "exit-after:0.3", "rolled_back")],
    ids=["forward-good", "back-good", "forward-bad"],
)
def test_wall_clock_jumps_during_the_health_window(
    make_env: MakeEnv, step_s: float, behaviour: str, expected: str
) -> None:
    """C19: the window runs on the monotonic clock. A wall-clock window would be cut short by a forward
    jump (the bad candidate would commit) or never end after a backward one (the good one would roll back).
    The journal's wall times show the jumps; order is by sequence number regardless."""
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("2.0.0", behaviour)
    env.install(v1)
    clock = JumpingClock(step_s)
    op = f"c19-{'fwd' if step_s > 0 else 'back'}-{behaviour.split(':')[0]}"
    result = _run_in_process(env, v2, op, clock)
    assert result.result == expected, result
    assert clock.jumps >= 2  # the window spanned several samples, each after a jump
    slot = "green" if expected == "committed" else "blue"
    env.assert_running(slot, v2 if expected == "committed" else v1)
    assert env.result_file(op) == {"operation": op, "result": expected, "from_version": "1.0.0",
                                   "to_version": "2.0.0", "slot": slot, "reason": result.reason}
    records = env.journal()
    seqs = [r["seq"] for r in records]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    mine = [r for r in records if r["episode"] == op]
    walls = [datetime.fromisoformat(r["time"]).timestamp() for r in mine]
    steps = [b - a for a, b in itertools.pairwise(walls)]
    if step_s > 0:
        assert max(steps) >= 3000, steps
    else:
        assert min(steps) <= -3000, steps  # later records carry earlier wall times: order is by seq
    types = [r["event"]["_type"] for r in mine]
    assert types[-1] == "EpisodeClosed"
    assert ("UpgradeCommitted" in types) == (expected == "committed"), types


def test_failed_version_requested_again_is_checked_again(make_env: MakeEnv) -> None:
    """C20: X fails health and rolls back, leaving X's bytes in the inactive slot. Requested again under a
    new operation id, X is refused explicitly as known-bad (docs/trust.md: fetched and staged, then
    aborted before any switch or restart, naming the operation that condemned it); with
    ``--retry-known-bad`` it is staged, verified, switched and health-checked again (never reported done
    because the files look present), and rolls back again. The same operation id repeated after its close
    prints the recorded result and does nothing: no fetch, no new journal record."""
    env = make_env()
    v1, bad = env.release("1.0.0"), env.release("2.0.0", "exit-after:0.3")
    env.install(v1)
    first = env.upgrade(bad, "x-first")
    assert first.code == 1 and first.json is not None and first.json["result"] == "rolled_back"
    assert env.slot_sha256("green") == bad.member_sha256  # the files look present

    pid = env.assert_running("blue", v1)
    refused = env.upgrade(bad, "x-refused")
    assert refused.code == 1 and refused.json is not None and refused.json["result"] == "aborted", refused
    assert "x-first" in refused.json["reason"] and "--retry-known-bad" in refused.json["reason"]
    events = env.events("x-refused")
    assert "CandidateStaged" in events and "Aborted" in events and "SwitchIntended" not in events, events
    assert env.assert_running("blue", v1) == pid  # nothing restarted

    fetched = len(env.server.requests)
    again = env.cli("upgrade", "--archive", bad.url, "--sha256", bad.sha256, "--operation", "x-again",
                    "--retry-known-bad")
    assert again.code == 1, again.stderr
    _assert_rolled_back(env, again.json, "x-again", v1)
    assert len(env.server.requests) == fetched + 1  # fetched again
    events = env.events("x-again")
    for step in ("ArchiveFetched", "CandidateStaged", "CandidateVerified", "SwitchIntended",
                 "SwitchCommitted", "RestartRequested", "HealthAttemptStarted", "HealthFailed",
                 "RollbackStarted", "RolledBack"):
        assert step in events, (step, events)
    assert "CandidateUnchanged" not in events and "UpgradeCommitted" not in events

    before = env.journal()
    fetched = len(env.server.requests)
    pid = env.assert_running("blue", v1)
    repeat = env.cli("upgrade", "--archive", bad.url, "--sha256", bad.sha256, "--operation", "x-again",
                     "--retry-known-bad")
    assert repeat.code == 1, repeat.stderr
    assert repeat.json == again.json
    assert env.journal() == before
    assert len(env.server.requests) == fetched
    assert env.assert_running("blue", v1) == pid  # nothing restarted


def test_reset_then_uninstall_leave_nothing_and_remove_nothing_else(make_env: MakeEnv) -> None:
    """``reset`` stops, disables and removes the three units; ``uninstall`` then removes the NAME layout,
    ``state_dir`` and the lock, and nothing else: the test directory's tree is exactly as before install
    (the config, and the pre-existing parents of ``state_dir`` and the lock, stay)."""
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    units_before = env.units_present()
    assert units_before == []
    before = tree(env.work)
    env.install(v1)
    assert env.upgrade(v2, "up").code == 0  # both slots, both links, a journal and two results exist
    assert len(env.units_present()) >= 4  # three units and the enable links

    reset = env.cli("reset")
    assert reset.code == 0, reset.stderr
    assert reset.json is not None
    assert sorted(reset.json["removed"]) == sorted(
        str(env.sandbox.unit_dir / u) for u in (env.unit, f"{env.name}-recover.service",
                                                 f"{env.name}-recover-boot.service",
                                                 f"{env.name}-recover.timer",
                                                 f"{env.name}-recover-timer.service"))
    assert env.units_present() == []
    state = env.show()
    assert (state["LoadState"], state["ActiveState"]) == ("not-found", "inactive"), state
    assert env.link("current") == f"{env.name}-green"  # reset leaves the layout alone

    gone = env.cli("uninstall")
    assert gone.code == 0, gone.stderr
    assert gone.json is not None
    assert {str(env.lib), str(env.root / "bin" / env.name), str(env.state_dir),
            str(env.lock_path), str(env.root)} <= set(gone.json["removed"])
    assert tree(env.work) == before
    assert env.units_present() == []

    status = env.cli("status")
    assert status.code == 0, status.stderr
    assert status.json is not None and status.json["current"] is None and status.json["last_good"] is None
    assert status.json["episode"] is None
    assert tree(env.work) == before  # a reader creates nothing


def test_reset_then_install_restores_the_units_and_the_service(make_env: MakeEnv) -> None:
    """``reset`` removes the units (the service is gone); ``install`` with the same archive
    is ``noop``, exit 0, and repairs: ``repaired`` lists every unit file the agent renders, they are written
    again, enabled, and the agent started. ``status`` shows the service active, its MainPID running the
    ``current`` link (blue, v1's bytes), and a canary in the unit directory is byte-identical."""
    env = make_env()
    v1 = env.release("1.0.0")
    canary = env.sandbox.unit_dir / f"{env.name}-canary.txt"
    canary.write_text("not the agent's\n")
    canary_before = tree(env.sandbox.unit_dir)[canary.name]
    env.install(v1)
    rendered = env.cli("units")
    assert rendered.code == 0 and rendered.json is not None
    unit_files = sorted(str(env.sandbox.unit_dir / n) for n in rendered.json["units"])

    reset = env.cli("reset")
    assert reset.code == 0, reset.stderr
    assert reset.json is not None and sorted(reset.json["removed"]) == unit_files
    assert env.show()["LoadState"] == "not-found"

    again = env.cli("install", "--archive", v1.url, "--sha256", v1.sha256)
    assert again.code == 0, again.stderr
    assert again.json is not None and again.json["result"] == "noop", again
    assert sorted(again.json["repaired"]) == unit_files, again.json
    assert all((env.sandbox.unit_dir / n).read_text() == t for n, t in rendered.json["units"].items())

    def healthy() -> bool:
        try:
            env.assert_running("blue", v1)
        except (AssertionError, OSError):
            return False
        return True

    poll(healthy, 20.0, "the repaired agent unit to run v1 and answer /healthz")
    status = env.cli("status")
    assert status.code == 0 and status.json is not None, status.stderr
    assert status.json["service"]["active_state"] == "active" and status.json["service"]["main_pid"], status
    assert status.json["current"]["slot"] == "blue"
    assert tree(env.sandbox.unit_dir)[canary.name] == canary_before
    canary.unlink()


def test_preflight_fetches_nothing_creates_nothing_and_reports_the_lock(make_env: MakeEnv) -> None:
    """``upgrade --preflight`` (design §7): no fetch, no directories, no lock file; the plan's JSON keys; a
    held lock -> ``lock: busy``, exit 75; not installed -> exit 2, still creating nothing."""
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    bare = tree(env.work)
    missing = env.cli("upgrade", "--archive", v2.url, "--preflight")
    assert missing.code == 2 and missing.json is not None and missing.json["exit_code"] == 2, missing
    assert tree(env.work) == bare

    env.install(v1)
    env.lock_path.unlink()
    env.lock_path.parent.rmdir()
    before = tree(env.work)
    fetched = len(env.server.requests)
    plan = env.cli("upgrade", "--archive", v2.url, "--sha256", v2.sha256, "--preflight")
    assert plan.code == 0, plan.stderr
    assert plan.json is not None
    assert set(plan.json) == {"preflight", "plan", "inactive_slot", "lock", "open_episode",  # design §7
                              "episode", "missing_units", "drifted_units", "next"}  # docs/cli.md
    assert (plan.json["episode"], plan.json["missing_units"], plan.json["drifted_units"], plan.json["next"]) \
        == (None, [], [], None), plan.json  # install wrote every unit, nothing is open
    assert plan.json["preflight"] is True and plan.json["inactive_slot"] == "green"
    assert plan.json["lock"] == "free" and plan.json["open_episode"] is None
    assert plan.json["plan"] and all(isinstance(step, str) for step in plan.json["plan"])
    assert len(env.server.requests) == fetched
    assert tree(env.work) == before
    assert not env.lock_path.parent.exists()
    assert env.link("current") == f"{env.name}-blue"

    with HostLock(str(env.lock_path)):
        held = tree(env.work)
        busy = env.cli("upgrade", "--archive", v2.url, "--preflight")
        assert busy.code == 75, busy.stderr
        assert busy.json is not None and busy.json["lock"] == "busy"
        assert tree(env.work) == held
    assert len(env.server.requests) == fetched


def test_busy_lock_upgrade_and_recover_exit_75_at_once(make_env: MakeEnv) -> None:
    """design §4.3 step 1: the lock is taken non-blocking; busy -> exit 75, nothing fetched or journaled. Also
    ``recover`` facing an open episode while another process holds the lock; once free, it aborts that
    (pre-switch) episode without touching the links."""
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    journal = env.journal()
    fetched = len(env.server.requests)
    with HostLock(str(env.lock_path)):
        busy = env.upgrade(v2, "while-busy")
        assert busy.code == 75, busy.stderr
        assert busy.json is not None and busy.json["exit_code"] == 75 and "lock" in busy.json["error"]
        assert len(env.server.requests) == fetched
        assert env.journal() == journal
        assert env.result_file("while-busy") is None

    killed = env.upgrade(v2, "left-open", env={"UPGRADE_AGENT_TEST_KILL_AFTER": "CandidateStaged"})
    assert killed.code == -9, killed.stderr
    status = env.cli("status")
    assert status.json is not None and status.json["episode"] == {"operation": "left-open", "state": "staged",
                                                      "upgrader_pid": None, "abandoned": True}
    journal = env.journal()
    with HostLock(str(env.lock_path)):
        busy = env.cli("recover", "--trigger", "manual")
        assert busy.code == 75, busy.stderr
        assert busy.json is not None and busy.json["exit_code"] == 75
        assert env.journal() == journal

    done = env.cli("recover", "--trigger", "manual")
    assert done.code == 0, done.stderr
    assert done.json is not None
    assert (done.json["operation"], done.json["result"]) == ("left-open", "aborted")
    assert env.result_file("left-open") == done.json
    assert env.link("current") == env.link("last-good") == f"{env.name}-blue"
    assert not [p for p in env.lib.iterdir() if ".stage-" in p.name]
    env.assert_running("blue", v1)


def test_install_without_an_archive_adopts_a_plain_binary(make_env: MakeEnv) -> None:
    """design §3 adoption through the CLI: a plain executable at ``R/bin/NAME`` is copied into blue, verified,
    run and health-checked; ``R/bin/NAME`` becomes the compatibility link. Nothing to adopt: exit 2."""
    import stat

    from agent.testing.releases import agent_script

    env = make_env()
    nothing = env.cli("install")
    assert nothing.code == 2 and nothing.json is not None and "nothing to adopt" in nothing.json["error"]
    v1 = env.release("1.0.0")
    plain = env.root / "bin" / env.name
    plain.parent.mkdir(parents=True)
    plain.write_bytes(agent_script("1.0.0"))
    plain.chmod(0o755)
    adopted = env.cli("install")
    assert adopted.code == 0, adopted.stderr
    assert adopted.json is not None
    assert (adopted.json["result"], adopted.json["slot"]) == ("committed", "blue")
    assert env.link("current") == env.link("last-good") == f"{env.name}-blue"
    env.assert_running("blue", v1)  # the adopted bytes are the 1.0.0 release's member
    assert stat.S_ISLNK(plain.lstat().st_mode) and plain.resolve() == env.lib / f"{env.name}-blue"

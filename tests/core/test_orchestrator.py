"""The flows of design §4.3-4.5 on the simulated host (asyncio and trio)."""

from __future__ import annotations

import re

import anyio
import attrs
import pytest

from agent.errors import UsageError
from upgrade_core import (
    OPERATION_ID_RE,
    EpisodeState,
    Folder,
    HandedOff,
    Policy,
    RestartScheduled,
    UpgradeRequest,
    UpgradeResult,
    fold,
    recover,
    resume_self_upgrade,
    run_install,
    run_upgrade,
    self_upgrade_prepare,
)
from upgrade_core import _events as ev
from upgrade_core.errors import AlreadyInstalledError, NotInstalledError, UpgradeError

from ..sim.host import SIM_POLICY, Behavior, CrashPlan, SimCrash, World, make_candidate
from ..sim.invariants import check_settled, events_by_episode

pytestmark = pytest.mark.anyio

GOOD = Behavior("good")
EXITS = Behavior("exit", 0.3)  # C16 (a): exits 1 after 0.3 s
CRASH_LOOP = Behavior("exit", 0.05)  # C16 (c)
HANGS = Behavior("hang")


def world(candidate: Behavior = GOOD, *, base: Behavior = GOOD, policy: Policy = SIM_POLICY,
          inside_unit: bool = False) -> World:
    w = World(policy, inside_unit=inside_unit)
    w.install_bare(make_candidate("base", base))
    w.add_archive("https://h/a.tar.gz", make_candidate("cand", candidate))
    return w


def request(op: str = "op1", source: str = "https://h/a.tar.gz") -> UpgradeRequest:
    return UpgradeRequest(op, source, source)


def tags(w: World, op: str = "op1") -> list[str]:
    return [e.TAG for e in events_by_episode(w)[op]]


async def test_healthy_candidate_commits_and_last_good_keeps_the_previous_slot() -> None:
    w = world()
    result = await run_upgrade(w.ports(), SIM_POLICY, request())
    assert (result.result, result.slot, result.to_version) == ("committed", "green", w.archives["https://h/a.tar.gz"].version)
    assert (w.current, w.last_good) == ("green", "blue")
    assert tags(w) == [
        "EpisodeOpened", "ArchiveFetched", "CandidateStaged", "CandidateVerified", "CandidateInstalled",
        "SwitchIntended", "SwitchCommitted", "MirrorsSynced", "HealthAttemptStarted", "RestartRequested",
        "RestartObserved", "HealthPassed", "UpgradeCommitted", "ResultPublished", "EpisodeClosed",
    ]
    assert w.results["op1"] == [result]
    check_settled(w)


@pytest.mark.parametrize("bad", [EXITS, CRASH_LOOP, HANGS], ids=["exits-0.3s", "crash-loop", "hangs"])
async def test_unhealthy_candidate_spends_its_attempts_then_rolls_back(bad: Behavior) -> None:
    w = world(bad)
    result = await run_upgrade(w.ports(), SIM_POLICY, request())
    assert (result.result, result.slot) == ("rolled_back", "blue")
    assert result.reason is not None and result.reason.startswith("candidate unhealthy after 3 attempt(s)")
    assert (w.current, w.last_good) == ("blue", "blue")
    t = tags(w)
    assert t.count("HealthAttemptStarted") == 4 and t.count("HealthFailed") == 3
    order = ["RollbackStarted", "RolledBack", "ResultPublished", "EpisodeClosed"]
    assert [t.index(tag) for tag in order] == sorted(t.index(tag) for tag in order)
    check_settled(w)


async def test_crash_after_five_seconds_within_a_long_window_rolls_back() -> None:
    """C16 (b): a candidate that dies after 5 s fails a 6 s stability window."""
    policy = attrs.evolve(SIM_POLICY, stability_s=6.0, health_timeout_s=10.0)
    w = world(Behavior("exit", 5.0), policy=policy)
    result = await run_upgrade(w.ports(), policy, request())
    assert result.result == "rolled_back" and "MainPID changed" in (result.reason or "")
    check_settled(w)


async def test_restart_unit_names_follow_the_pattern() -> None:
    w = world()
    await run_upgrade(w.ports(), SIM_POLICY, request("0123456789abcdef"))
    units = [e.unit for e in events_by_episode(w)["0123456789abcdef"] if isinstance(e, ev.RestartRequested)]
    assert units and all(re.fullmatch(r"agent-restart-01234567-\d+-[0-9a-f]{4}", u) for u in units)


async def test_last_good_attention_when_it_fails_too() -> None:
    w = world(EXITS, base=HANGS)
    result = await run_upgrade(w.ports(), SIM_POLICY, request())
    assert result.result == "needs_attention"
    assert "last-good blue failed its own health check" in (result.reason or "")
    assert w.current == "blue"
    view = fold(w.replay())
    assert view.open_episode is None and view.failed_digests == {w.archives["https://h/a.tar.gz"].sha256}


@pytest.mark.parametrize(("behavior", "source", "reason"), [
    (Behavior("verify_fail"), "https://h/a.tar.gz", "version command exited 1"),
    (GOOD, "https://h/missing.tar.gz", "no such archive"),
])
async def test_refused_candidate_aborts_with_links_and_slots_untouched(behavior: Behavior, source: str,
                                                                       reason: str) -> None:
    w = world(behavior)
    blue_before = dict(w.files)
    result = await run_upgrade(w.ports(), SIM_POLICY, request(source=source))
    assert result.result == "aborted" and reason in (result.reason or "")
    assert (w.current, w.last_good) == ("blue", "blue")
    assert w.files == blue_before  # the staging file is gone, blue unchanged
    check_settled(w)


async def test_same_digest_as_current_is_noop() -> None:
    w = world()
    w.add_archive("same", make_candidate("base", GOOD))
    result = await run_upgrade(w.ports(), SIM_POLICY, request(source="same"))
    assert (result.result, result.slot) == ("noop", "blue")
    assert "SwitchIntended" not in tags(w) and not any("/.agent-" in p for p in w.files)
    check_settled(w)


async def test_same_operation_again_returns_the_recorded_result_and_does_nothing() -> None:
    w = world()
    first = await run_upgrade(w.ports(), SIM_POLICY, request())
    n = len(w.records)
    again = await run_upgrade(w.ports(), SIM_POLICY, request())
    assert again == first and len(w.records) == n


async def test_an_open_episode_of_another_operation_is_recovered_first() -> None:
    w = world()
    w.arm(CrashPlan(12, "after", "crash"))
    with pytest.raises(SimCrash):
        await run_upgrade(w.ports(), SIM_POLICY, request("op1"))
    w.crash("crash")
    assert fold(w.replay()).open_episode is not None
    w.add_archive("second", make_candidate("second", GOOD))
    result = await run_upgrade(w.ports(), SIM_POLICY, request("op2", "second"))
    assert result.result == "committed"
    view = check_settled(w)
    assert set(view.closed_results) == {"op1", "op2"}
    assert "RecoveryStarted" in tags(w, "op1")


async def test_c20_failed_version_requested_again_is_refused_explicitly_or_checked_again() -> None:
    """C20: refused explicitly (known-bad, docs/trust.md), or with ``--retry-known-bad`` checked again."""
    w = world(EXITS)
    assert (await run_upgrade(w.ports(), SIM_POLICY, request("x1"))).result == "rolled_back"
    refused = await run_upgrade(w.ports(), SIM_POLICY, request("x2"))
    assert refused.result == "aborted" and "was rolled back by operation x1" in (refused.reason or "")
    assert "SwitchIntended" not in tags(w, "x2")
    retry = attrs.evolve(request("x3"), retry_known_bad=True)
    again = await run_upgrade(w.ports(), SIM_POLICY, retry)
    assert again.result == "rolled_back"
    assert {"CandidateStaged", "CandidateVerified", "SwitchCommitted", "HealthFailed"} <= set(tags(w, "x3"))
    check_settled(w)


async def test_cancellation_before_the_switch_aborts_publishes_and_closes() -> None:
    w = world()
    w.stall_stage = True
    with anyio.move_on_after(0.05):
        await run_upgrade(w.ports(), SIM_POLICY, request())
    assert tags(w)[-3:] == ["Aborted", "ResultPublished", "EpisodeClosed"]
    assert w.results["op1"][0].reason == "interrupted before the switch"
    assert w.current == "blue"
    check_settled(w)


async def test_cancellation_after_switch_intended_carries_on_to_a_terminal_state() -> None:
    w = world()
    outcome = []
    with anyio.CancelScope() as scope:
        def cancel_after_flip(name: str, when: str) -> None:
            if (name, when) == ("host.point_current", "after"):
                scope.cancel()
        w.on_call = cancel_after_flip
        outcome.append(await run_upgrade(w.ports(), SIM_POLICY, request()))
    assert scope.cancel_called
    assert tags(w)[-1] == "EpisodeClosed" and w.results["op1"][0].result == "committed"
    check_settled(w)


async def test_inside_the_agent_unit_hands_off_and_waits_for_the_close() -> None:
    w = world(inside_unit=True)
    result = await run_upgrade(w.ports(), SIM_POLICY, request())
    assert result.result == "committed"
    t = tags(w)
    assert t.index("SwitchCommitted") < t.index("RecoveryStarted") < t.index("HealthAttemptStarted")
    check_settled(w)


async def test_boot_recovery_never_waits_journals_the_spent_attempt_and_hands_off() -> None:
    w = world()
    w.arm(CrashPlan(await call_index_of_append(GOOD, "HealthAttemptStarted"), "after", "power"))
    with pytest.raises(SimCrash):
        await run_upgrade(w.ports(), SIM_POLICY, request())
    w.crash("power")
    now = w.now
    handed = await recover(w.ports(), SIM_POLICY, "boot")
    assert isinstance(handed, HandedOff) and handed.operation == "op1"
    assert w.now == now  # no health polling at boot
    assert w.handoffs and w.handoffs[0][1] is True  # after_unit
    assert w.handoffs[0][0] == handed.unit
    assert tags(w)[-2:] == ["RecoveryStarted", "HealthFailed"]
    result = await recover(w.ports(), SIM_POLICY, "manual")
    assert result is not None and result.result == "committed"
    assert fold(w.replay()).episodes["op1"].attempts_started == 2
    check_settled(w)


async def call_index_of_append(candidate: Behavior, tag: str) -> int:
    """The port-call index of the journal append of the first ``tag`` in a dry run of the same upgrade."""
    dry = world(candidate)
    await run_upgrade(dry.ports(), SIM_POLICY, request())
    count = appended = 0
    for call, when in dry.trace:
        count += when == "before"
        if (call, when) == ("journal.append", "after"):
            appended += 1
            if tag == dry.records[appended - 1].event.TAG:
                return count
    raise AssertionError(f"{tag} never appended")


async def test_self_upgrade_prepare_then_resume_commits() -> None:
    w = world()
    scheduled = await self_upgrade_prepare(w.ports(), SIM_POLICY, request())
    assert isinstance(scheduled, RestartScheduled) and scheduled.unit.startswith("agent-restart-op1-0-")
    assert w.current == "green" and fold(w.replay()).open_episode is not None
    outcome = await resume_self_upgrade(w.ports(), SIM_POLICY)
    assert outcome.status == "committed" and outcome.result is not None
    assert outcome.result.result == "committed"
    check_settled(w)


async def test_self_upgrade_bad_candidate_fails_resume_then_on_failure_rolls_back() -> None:
    w = world(EXITS)
    await self_upgrade_prepare(w.ports(), SIM_POLICY, request())
    left = []
    for _ in range(3):
        outcome = await resume_self_upgrade(w.ports(), SIM_POLICY)
        assert outcome.status == "failed"
        left.append(outcome.attempts_left)
        w.start_unit()  # systemd's Restart= brings the daemon back
    assert left == [2, 1, 0]
    result = await recover(w.ports(), SIM_POLICY, "on-failure")
    assert result is not None and result.result == "rolled_back" and w.current == "blue"
    check_settled(w)


async def test_resume_with_nothing_open_serves() -> None:
    w = world()
    assert (await resume_self_upgrade(w.ports(), SIM_POLICY)).status == "none"


async def test_install_on_a_bare_host_points_current_and_last_good_at_blue() -> None:
    w = World(SIM_POLICY)
    w.add_archive("a", make_candidate("first", GOOD))
    result = await run_install(w.ports(), SIM_POLICY, request(source="a"))
    assert (result.result, result.slot) == ("committed", "blue")
    assert (w.current, w.last_good) == ("blue", "blue")
    with pytest.raises(AlreadyInstalledError, match="use upgrade"):
        await run_install(w.ports(), SIM_POLICY, request("op2", source="a"))


async def test_install_of_an_unhealthy_binary_aborts() -> None:
    w = World(SIM_POLICY)
    w.add_archive("a", make_candidate("first", EXITS))
    result = await run_install(w.ports(), SIM_POLICY, request(source="a"))
    assert result.result == "aborted" and "unhealthy" in (result.reason or "")
    assert fold(w.replay()).open_episode is None


async def test_upgrade_on_a_bare_host_is_not_installed() -> None:
    w = World(SIM_POLICY)
    with pytest.raises(NotInstalledError, match="agent-current") as info:
        await run_upgrade(w.ports(), SIM_POLICY, request())
    assert info.value.exit_code == 2 and w.records == []


async def test_recover_with_nothing_open_is_noop() -> None:
    w = world()
    result = await recover(w.ports(), SIM_POLICY, "manual")
    assert result is not None and (result.operation, result.result) == (None, "noop")
    assert w.records == []


@pytest.mark.parametrize("bad", ["a b", "", "x" * 65, "a/b", "é"])
def test_bad_operation_id_is_caller_misuse(bad: str) -> None:
    """The core's one operation-id rule (design §4.3 step 1); the agent validates user input first (exit
    2)."""
    assert not OPERATION_ID_RE.fullmatch(bad)
    with pytest.raises(ValueError, match="must match") as info:
        UpgradeRequest(bad, "x", "x")
    assert not isinstance(info.value, UpgradeError)
    assert OPERATION_ID_RE.fullmatch("x" * 64) and UpgradeRequest("op-1.2_3", "x", "x")


async def test_mirrors_follow_current_back_on_rollback() -> None:
    w = world(EXITS)
    w.mirror_paths = ("/machines/kube1/usr/local/bin/agent",)
    result = await run_upgrade(w.ports(), SIM_POLICY, request())
    assert result.result == "rolled_back"
    assert w.mirror_files == {"/machines/kube1/usr/local/bin/agent": w.slot_sha("blue")}
    check_settled(w)


async def test_mirrors_get_the_candidate_on_commit() -> None:
    w = world()
    w.mirror_paths = ("/m",)
    result = await run_upgrade(w.ports(), SIM_POLICY, request())
    assert result.result == "committed"
    assert w.mirror_files == {"/m": w.slot_sha("green")}


# -- the pre-switch phase rule, the caller's folder, one fold and one links() read per flow ------------------
class _Boom(Exception):
    pass


@pytest.mark.parametrize(
    ("error", "returned"),
    [(UsageError("unsupported scheme ftp"), True), (AttributeError("a bug"), False), (_Boom("x"), False)],
    ids=["usage-error-aborts-and-returns", "bug-aborts-then-raises", "foreign-aborts-then-raises"],
)
async def test_any_error_before_the_switch_aborts_the_episode(
    error: Exception, returned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Phase rule, not a list of types: the journal never keeps an episode open for a pre-switch error."""
    from ..sim.host import SimVerifier

    async def verify(self: object, path: str, expected_version: str | None) -> str:
        raise error

    monkeypatch.setattr(SimVerifier, "verify", verify)
    w = world()
    if returned:
        result = await run_upgrade(w.ports(), SIM_POLICY, request())
        assert (result.result, result.reason) == ("aborted", str(error))
    else:
        with pytest.raises(type(error)):
            await run_upgrade(w.ports(), SIM_POLICY, request())
    assert tags(w)[-3:] == ["Aborted", "ResultPublished", "EpisodeClosed"]
    assert (w.current, w.last_good) == ("blue", "blue")
    assert fold(w.replay()).open_episode is None
    check_settled(w)


async def test_a_journal_error_before_the_switch_is_not_journaled(monkeypatch: pytest.MonkeyPatch) -> None:
    from upgrade_core.errors import JournalDurabilityError

    from ..sim.host import SimJournal

    real = SimJournal.append

    async def append(self: SimJournal, episode_id: str, event: ev.Event) -> object:
        if isinstance(event, ev.CandidateVerified):
            raise JournalDurabilityError("no space left")
        return await real(self, episode_id, event)

    monkeypatch.setattr(SimJournal, "append", append)
    w = world()
    with pytest.raises(JournalDurabilityError):
        await run_upgrade(w.ports(), SIM_POLICY, request())
    assert tags(w)[-1] == "CandidateStaged"  # left to recover; no Aborted could be journaled anyway


async def test_a_callers_folder_is_used_and_kept_current() -> None:
    w = world()
    folder = Folder()
    folder.apply_all(w.ports(crashable=False).journal.records())
    result = await run_upgrade(w.ports(), SIM_POLICY, request(), folder=folder)
    assert result.result == "committed"
    assert folder.state_of("op1") is EpisodeState.CLOSED
    assert folder.view() == fold(w.replay())
    handed = await recover(w.ports(), SIM_POLICY, "manual", folder=folder)
    assert isinstance(handed, UpgradeResult) and handed.result == "noop"


async def test_one_upgrade_reads_the_links_once() -> None:
    w = world()
    await run_upgrade(w.ports(), SIM_POLICY, request())
    assert w.per_method.get("host.links") == 1


async def test_transient_unit_names_follow_one_pattern() -> None:
    w = world(EXITS)
    await run_upgrade(w.ports(), SIM_POLICY, request("op123456789"))
    units = [e.unit for e in events_by_episode(w)["op123456789"] if isinstance(e, ev.RestartRequested)]
    assert units and all(re.fullmatch(r"agent-restart-op123456-\d-[0-9a-f]{4}", u) for u in units), units


async def test_a_stale_callers_folder_is_refused_before_anything_happens() -> None:
    w = world()
    await run_upgrade(w.ports(), SIM_POLICY, request())
    n = len(w.records)
    with pytest.raises(ValueError, match="fold it first"):
        await run_upgrade(w.ports(), SIM_POLICY, request("op2"), folder=Folder())
    assert len(w.records) == n

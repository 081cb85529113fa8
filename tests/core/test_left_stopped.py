"""``activate`` on a host whose agent unit was stopped on purpose (design §4.7), on the simulated host.

The unit found ``inactive`` before the switch is journaled (``UnitFoundStopped``); ``current`` is switched to
the staged candidate, the unit is not started, ``last-good`` and the mirrors stay on the verified slot, and
the episode ends ``switched_stopped`` (``LeftStopped``). Recovery with the unit still stopped does nothing;
once the unit was started (running, or ``failed`` after ``OnFailure=``), recovery checks the candidate in an
``activate`` episode of its own: commit, or roll back to ``last-good``. The lifecycle rows, the decisions,
and a cut after every journal append and a fault around every port call of both episodes.
"""

from __future__ import annotations

import pytest

from upgrade_core import (
    EVENT_CODEC,
    CheckLeftStopped,
    EpisodeState,
    Folder,
    HostFacts,
    LeaveStopped,
    NoOp,
    UpgradeRequest,
    decide,
    fold,
    operation_status,
    recover,
    run_activate,
    run_rollback,
    run_upgrade,
    summarize_history,
)
from upgrade_core import _events as ev
from upgrade_core.errors import IllegalTransitionError, UnverifiedCurrentError
from upgrade_core.ports import LinkState
from upgrade_core.wire import left_stopped_may_wait

from ..sim.host import SIM_POLICY, CrashPlan, FaultKind, SimCrash, SimRecord, World
from ..sim.invariants import check_always, check_settled, events_by_episode, settle_after_fault
from .test_staging import staged_world

pytestmark = pytest.mark.anyio
S = EpisodeState
STOPPED_ACTIVATE = [
    "EpisodeOpened", "StagedCandidateChecked", "UnitFoundStopped", "SwitchIntended", "SwitchCommitted",
    "LeftStopped", "ResultPublished", "EpisodeClosed",
]
CHECK_LENGTH = {"good": 13, "exit": 26}  # appends of the check recovery runs once the unit was started


async def stopped_and_activated(kind: str = "good") -> World:
    """Staged candidate (``kind``), the unit stopped on purpose, then ``activate`` as ``ac1``."""
    w = await staged_world(kind)
    w.unit_active = False  # systemctl stop
    result = await run_activate(w.ports(), SIM_POLICY, "ac1")
    assert result.result == "switched_stopped"
    return w


def _check_episode(w: World) -> str:
    (op,) = [op for op in events_by_episode(w) if op.startswith("ac1-check-")]
    return op


# -- the flow --------------------------------------------------------------------------------------------
async def test_activate_on_a_stopped_unit_switches_and_leaves_it_stopped() -> None:
    w = await staged_world()
    w.mirror_paths = ("/m/agent",)
    w.mirror_files["/m/agent"] = w.slot_sha("blue") or ""
    w.unit_active = False
    result = await run_activate(w.ports(), SIM_POLICY, "ac1")
    cand = w.archives["a"]
    assert (result.result, result.slot, result.to_version) == ("switched_stopped", "green", cand.version)
    assert result.reason is not None and "not health-checked" in result.reason
    assert (w.current, w.last_good) == ("green", "blue")
    assert not w.unit_active  # never started
    assert w.mirror_files["/m/agent"] == w.slot_sha("blue")  # the mirrors keep the verified binary
    assert [e.TAG for e in events_by_episode(w)["ac1"]] == STOPPED_ACTIVATE
    view = check_settled(w)
    left = view.left_stopped
    assert left is not None
    assert (left.operation, left.staged_by, left.slot, left.sha256, left.last_good) == (
        "ac1", "st1", "green", cand.sha256, "blue")
    assert view.staged is None


async def test_a_snapshot_carries_the_candidate_waiting_for_its_check() -> None:
    """``journal quarantine`` seeds a fresh journal with ``summarize_history``'s snapshot alone: it must still
    say that ``current`` is unverified, and a newer record (the check's switch) wins over it."""
    w = await stopped_and_activated()
    records = w.replay()
    snapshot = summarize_history(records)
    assert snapshot.left_stopped is not None
    assert (snapshot.left_stopped.operation, snapshot.left_stopped.slot) == ("ac1", "green")
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(snapshot)) == snapshot
    seeded = fold([SimRecord(1, ev.SNAPSHOT_EPISODE, 1.0, snapshot)])
    assert seeded.left_stopped == fold(records).left_stopped
    assert (await run_rollback(w.ports(), SIM_POLICY, "rb1")).result == "committed"
    later = w.replay()
    kept = later[len(records):]  # compaction dropped the activate, kept the newer rollback
    compacted = [*kept, SimRecord(len(later) + 1, ev.SNAPSHOT_EPISODE, 3.0, snapshot)]
    assert fold(compacted).left_stopped is None  # the kept, newer switch wins
    assert b"left_stopped" not in EVENT_CODEC.encode(ev.HistorySnapshot(()))  # None: the bytes as before


async def test_the_boot_readers_byte_test_sees_a_waiting_candidate_and_lets_go_once_it_was_checked() -> None:
    """``upgrade_core.wire.left_stopped_may_wait`` over the encoded live records (what the boot reader
    reads): True while the candidate waits, after quarantine's snapshot too; False once the check switched,
    so that an old ``switched_stopped`` episode does not send every later boot to the full path."""
    def segment(records: list[SimRecord]) -> bytes:
        return b"\n".join(EVENT_CODEC.encode(r.event) for r in records)

    w = await stopped_and_activated()
    assert left_stopped_may_wait(segment(w.replay()))
    assert left_stopped_may_wait(EVENT_CODEC.encode(summarize_history(w.replay())))  # quarantine's seed
    w.unit_active = True  # someone started the unit: the timer's recovery checks and commits it
    assert (await recover(w.ports(), SIM_POLICY, "timer")).result == "committed"  # type: ignore[union-attr]
    records = w.replay()
    assert fold(records).left_stopped is None
    assert not left_stopped_may_wait(segment(records))
    assert not left_stopped_may_wait(EVENT_CODEC.encode(summarize_history(records)))


@pytest.mark.parametrize("trigger", ["boot", "timer", "manual", "on-failure"])
async def test_recovery_leaves_a_still_stopped_unit_alone(trigger: str) -> None:
    w = await stopped_and_activated()
    before = list(w.records)
    result = await recover(w.ports(), SIM_POLICY, trigger)  # type: ignore[arg-type]
    assert (result.result, result.operation) == ("noop", None)  # type: ignore[union-attr]
    assert result.reason == (  # type: ignore[union-attr]
        "current names green (" + w.archives["a"].version + "), switched to with the unit stopped by "
        "activate ac1; it is checked once the unit runs")
    assert w.records == before and not w.unit_active
    assert (w.current, w.last_good) == ("green", "blue")


async def test_a_started_healthy_candidate_is_checked_and_committed_by_the_timer() -> None:
    w = await stopped_and_activated("good")
    w.start_unit()  # systemctl start
    result = await recover(w.ports(), SIM_POLICY, "timer")
    op = _check_episode(w)
    assert (result.result, result.operation, result.slot) == ("committed", op, "green")  # type: ignore[union-attr]
    assert (w.current, w.last_good, w.unit_slot) == ("green", "blue", "green")
    view = check_settled(w)
    assert view.left_stopped is None
    ep = view.episodes[op]
    assert (ep.kind, ep.source, ep.staged_by) == ("activate", "left stopped by ac1: green", "st1")
    tags = [e.TAG for e in events_by_episode(w)[op]]
    assert tags[:5] == ["EpisodeOpened", "RecoveryStarted", "StagedCandidateChecked", "SwitchIntended",
                        "SwitchCommitted"]
    assert "UpgradeCommitted" in tags
    # the managed operation that staged it takes the check's status (the latest activate of its staging)
    status = operation_status(view, "st1")
    assert status is not None and (status.phase, status.result) == ("Succeeded", "committed")
    # a later upgrade is no longer refused: the candidate has its health evidence
    assert (await recover(w.ports(), SIM_POLICY, "timer")).result == "noop"  # type: ignore[union-attr]


async def test_a_started_candidate_that_fails_is_rolled_back_on_failure() -> None:
    w = await stopped_and_activated("exit")
    w.start_unit()
    w.now += 60.0  # it crash-looped into its start limit: OnFailure= runs recover-agent-upgrade
    assert w.snapshot().active_state == "failed"
    result = await recover(w.ports(), SIM_POLICY, "on-failure")
    op = _check_episode(w)
    assert (result.result, result.slot) == ("rolled_back", "blue")  # type: ignore[union-attr]
    assert (w.current, w.last_good, w.unit_slot) == ("blue", "blue", "blue")
    view = check_settled(w)
    assert view.left_stopped is None
    assert w.archives["a"].sha256 in view.known_bad  # condemned as an activated candidate is
    assert view.known_bad[w.archives["a"].sha256].operation == op


async def test_upgrade_is_refused_while_current_is_left_unverified_and_rollback_is_not() -> None:
    w = await stopped_and_activated()
    before = list(w.records)
    for stage in (False, True):
        match = "start the unit and run recover-agent-upgrade"
        with pytest.raises(UnverifiedCurrentError, match=match) as info:
            await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("up2", "b", "b", stage=stage))
        assert info.value.exit_code == 2
    assert w.records == before
    result = await run_rollback(w.ports(), SIM_POLICY, "rb1")
    assert (result.result, w.current, w.last_good) == ("committed", "blue", "blue")
    assert check_settled(w).left_stopped is None


async def test_changed_bytes_abort_the_check_once_and_recovery_then_leaves_them_to_an_operator() -> None:
    w = await stopped_and_activated()
    w.files[w.slot_path("green")] = w.archives["b"].sha256  # someone replaced the candidate's binary
    w.start_unit()
    first = await recover(w.ports(), SIM_POLICY, "timer")
    assert first.result == "aborted" and first.reason is not None  # type: ignore[union-attr]
    assert first.reason.startswith("candidate in slot green (")  # type: ignore[union-attr]
    assert (w.current, w.last_good) == ("green", "blue")  # nothing switched
    left = fold(w.replay()).left_stopped
    assert left is not None and left.changed
    before = list(w.records)
    again = await recover(w.ports(), SIM_POLICY, "timer")
    assert again.reason == ("current names green, whose bytes are no longer those activate ac1 switched to; "  # type: ignore[union-attr]
                            "run upgrade-agent rollback")
    assert w.records == before  # no check is repeated every timer tick
    assert (await run_rollback(w.ports(), SIM_POLICY, "rb1")).result == "committed"
    assert fold(w.replay()).left_stopped is None and (w.current, w.last_good) == ("blue", "blue")


# -- the lifecycle rows and the decisions -------------------------------------------------------------------
def _records(w: World, upto: str) -> list[SimRecord]:
    recs = w.replay()
    tags = [(r.episode_id, r.event.TAG) for r in recs]
    return recs[: tags.index(("ac1", upto)) + 1]


async def test_no_restart_health_mirror_or_rollback_follows_a_unit_found_stopped() -> None:
    w = await stopped_and_activated()
    folder_events = _records(w, "SwitchCommitted")
    folder = Folder()
    folder.apply_all(folder_events)
    assert folder.state_of("ac1") is S.SWITCHED
    for refused in (ev.HealthAttemptStarted(1, "candidate"), ev.RestartRequested("u", 1.0),
                    ev.MirrorsSynced(("/m",)), ev.RollbackStarted("x", "blue"), ev.LeftStopped("blue"),
                    ev.Aborted("x")):
        with pytest.raises(IllegalTransitionError):
            folder.check("ac1", refused)
    assert folder.check("ac1", ev.LeftStopped("green")) is S.LEFT_STOPPED
    folder.apply_all(_records(w, "LeftStopped")[len(folder_events):])
    with pytest.raises(IllegalTransitionError, match="committed published in state left_stopped"):
        folder.check("ac1", ev.ResultPublished(ev.UpgradeResult("ac1", "committed")))


async def test_decisions_for_an_activate_that_found_the_unit_stopped() -> None:
    w = await stopped_and_activated()
    on_green = HostFacts(LinkState("green", "blue"), w.archives["a"].sha256)
    on_blue = HostFacts(LinkState("blue", "blue"), w.archives["a"].sha256)
    intended = fold(_records(w, "SwitchIntended"))
    assert decide(intended, on_green) == LeaveStopped(confirm_switch=True)
    assert decide(intended, on_blue).__class__.__name__ == "Abort"  # the flip never happened
    assert decide(fold(_records(w, "SwitchCommitted")), on_green) == LeaveStopped()
    closed = fold(w.replay())
    left = closed.left_stopped
    assert left is not None
    for state in (None, "inactive"):
        plan = decide(closed, HostFacts(LinkState("green", "blue"), None, state))
        assert isinstance(plan, NoOp) and plan.reason is not None
    for state in ("active", "activating", "failed"):
        assert decide(closed, HostFacts(LinkState("green", "blue"), None, state)) == CheckLeftStopped(left)
    # current moved off the candidate by hand: recovery never switches back onto an unchecked candidate
    moved = decide(closed, HostFacts(LinkState("blue", "blue"), None, "active"))
    assert moved == NoOp(
        "current names blue, not green, the candidate activate ac1 left stopped; nothing to check")


# -- crashes -------------------------------------------------------------------------------------------------
async def _recover_all(w: World, fault: FaultKind) -> None:
    """What the host runs after the cut: a power cut boots (boot recovery; the enabled unit starts), then
    the timer; a crash is followed by the timer only."""
    if fault == "power":
        await recover(w.ports(), SIM_POLICY, "boot")
    for _ in range(3):  # a handed-off check, then (after a check aborted before its switch) a new one
        if fold(w.replay()).open_episode is None and not (fold(w.replay()).left_stopped and w.unit_active):
            break
        await recover(w.ports(), SIM_POLICY, "timer")


@pytest.mark.parametrize("fault", ["crash", "power"])
@pytest.mark.parametrize("kind", ["good", "exit"])
async def test_stopped_activate_cut_after_every_append_then_recover(kind: str, fault: FaultKind) -> None:
    for k in range(1, len(STOPPED_ACTIVATE) + 1):
        w = await staged_world(kind)
        w.unit_active = False
        w.arm(CrashPlan(k, "after", fault, method="journal.append"))
        with pytest.raises(SimCrash):
            await run_activate(w.ports(), SIM_POLICY, "ac1")
        w.crash(fault)  # a power cut boots: the enabled unit starts on whatever current names
        check_always(w)
        cut = [e.TAG for e in events_by_episode(w)["ac1"]]
        assert cut == STOPPED_ACTIVATE[:k]
        await _recover_all(w, fault)
        view = check_settled(w)
        published = view.episodes["ac1"].published
        assert published is not None
        where = (k, cut[-1])
        if "SwitchCommitted" not in cut:
            assert (published.result, w.current) == ("aborted", "blue"), where
            assert view.staged is not None, where  # activate can run again
            continue
        assert published.result == "switched_stopped", where
        if fault == "crash":  # still stopped: nothing checked, nothing moved
            assert (w.current, w.last_good, w.unit_active) == ("green", "blue", False), where
            assert view.left_stopped is not None, where
        else:  # booted: the unit runs the candidate, and the timer checked it
            assert view.left_stopped is None, where
            expected = ("green", "committed") if kind == "good" else ("blue", "rolled_back")
            check = view.episodes[_check_episode(w)].published
            assert check is not None and (w.current, check.result) == expected, where


@pytest.mark.parametrize("fault", ["crash", "power"])
@pytest.mark.parametrize("kind", ["good", "exit"])
async def test_check_after_start_cut_after_every_append_then_recover(kind: str, fault: FaultKind) -> None:
    for k in range(1, CHECK_LENGTH[kind] + 1):
        w = await stopped_and_activated(kind)
        w.start_unit()
        if kind == "exit":
            w.now += 60.0
        w.arm(CrashPlan(k, "after", fault, method="journal.append"))
        with pytest.raises(SimCrash):
            await recover(w.ports(), SIM_POLICY, "on-failure" if kind == "exit" else "timer")
        w.crash(fault)
        check_always(w)
        await _recover_all(w, fault)
        view = check_settled(w)
        assert view.left_stopped is None, k
        checks = [op for op in view.episodes if op.startswith("ac1-check-")]
        final = view.episodes[checks[-1]].published
        assert final is not None
        expected = ("green", "committed") if kind == "good" else ("blue", "rolled_back")
        assert (w.current, final.result) == expected, (k, [view.episodes[c].published for c in checks])


async def test_dry_run_lengths_are_pinned() -> None:
    for kind, n in CHECK_LENGTH.items():
        w = await stopped_and_activated(kind)
        w.start_unit()
        if kind == "exit":
            w.now += 60.0
        before = len(w.records)
        await recover(w.ports(), SIM_POLICY, "timer")
        assert len(w.records) - before == n, kind


@pytest.mark.parametrize("flow", ["activate", "check"])
async def test_fault_around_every_port_call_then_recover(flow: str) -> None:
    """A crash or power cut before/after every port call of the stopped activation and of the check."""

    async def prepared() -> World:
        if flow == "activate":
            w = await staged_world()
            w.unit_active = False
        else:
            w = await stopped_and_activated()
            w.start_unit()
        return w

    async def run(w: World) -> object:
        if flow == "activate":
            return await run_activate(w.ports(), SIM_POLICY, "ac1")
        return await recover(w.ports(), SIM_POLICY, "timer")

    dry = await prepared()
    dry.arm(None)
    await run(dry)
    for index in range(1, dry.calls + 1):
        for when in ("before", "after"):
            for fault in ("crash", "power"):
                w = await prepared()
                w.arm(CrashPlan(index, when, fault))  # type: ignore[arg-type]
                with pytest.raises(SimCrash):
                    await run(w)
                await settle_after_fault(w, fault)  # type: ignore[arg-type]

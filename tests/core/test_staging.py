"""Staging and activation on the simulated host: ``upgrade --stage`` then ``activate`` (docs/cli.md).

What the host shows after each flow (links, slot bytes, the sink), what the fold derives (the staged
candidate), and recovery after a cut after every journal append and a fault around every port call of
both flows, as ``test_prefix_recovery`` does for the upgrade: before ``SwitchIntended`` nothing moves, a
durable ``StagedForActivation`` publishes ``staged``, after the switch the candidate is checked as an
upgrade's is.
"""

from __future__ import annotations

import pytest

from upgrade_core import (
    EVENT_CODEC,
    HandedOff,
    UpgradeRequest,
    fold,
    operation_status,
    recover,
    run_activate,
    run_upgrade,
    summarize_history,
    window_waiting_status,
)
from upgrade_core import _events as ev
from upgrade_core.errors import NothingStagedError

from ..sim.host import (
    SIM_POLICY,
    Behavior,
    CrashPlan,
    FaultKind,
    SimCrash,
    SimRecord,
    World,
    archive_sha256,
    make_candidate,
)
from ..sim.invariants import (
    assert_cut_verdict,
    check_always,
    check_settled,
    events_by_episode,
    settle_after_fault,
)

pytestmark = pytest.mark.anyio
STAGE = UpgradeRequest("st1", "a", "a", stage=True)
STAGE_LENGTH = 8  # appends of an uninterrupted staging (pinned by test_dry_runs_have_the_pinned_lengths)
ACTIVATE_LENGTH = {"good": 12, "exit": 25}


def fresh(kind: str = "good") -> World:
    w = World(SIM_POLICY)
    w.install_bare(make_candidate("base", Behavior("good")))
    behavior = Behavior("good") if kind == "good" else Behavior("exit", 0.3)
    w.add_archive("a", make_candidate("cand", behavior))
    w.add_archive("b", make_candidate("other", Behavior("good")))
    return w


async def staged_world(kind: str = "good") -> World:
    w = fresh(kind)
    result = await run_upgrade(w.ports(), SIM_POLICY, STAGE)
    assert result.result == "staged"
    return w


async def test_stage_installs_in_the_inactive_slot_and_switches_nothing() -> None:
    w = fresh()
    result = await run_upgrade(w.ports(), SIM_POLICY, STAGE)
    cand = w.archives["a"]
    assert (result.result, result.slot, result.from_version) == ("staged", "blue", None)
    assert (w.current, w.last_good) == ("blue", "blue")
    assert w.slot_sha("green") == cand.sha256
    assert w.unit_slot == "blue"  # nothing restarted onto the candidate
    staged = fold(w.replay()).staged
    assert staged is not None
    assert (staged.operation, staged.slot, staged.sha256) == ("st1", "green", cand.sha256)
    assert staged.archive_sha256 == archive_sha256(cand)
    check_settled(w)


async def test_activate_switches_to_the_staged_candidate_and_commits() -> None:
    w = await staged_world()
    result = await run_activate(w.ports(), SIM_POLICY, "ac1")
    assert (result.result, result.slot) == ("committed", "green")
    assert (w.current, w.last_good) == ("green", "blue")
    assert w.unit_slot == "green"
    view = check_settled(w)
    assert view.staged is None  # switched to: nothing is staged any more
    assert view.episodes["ac1"].kind == "activate"
    tags = [e.TAG for e in events_by_episode(w)["ac1"]]
    assert tags[:3] == ["EpisodeOpened", "StagedCandidateChecked", "SwitchIntended"]
    assert "CandidateVerified" not in tags and "ArchiveFetched" not in tags


async def test_activate_of_an_unhealthy_candidate_rolls_back() -> None:
    w = await staged_world("exit")
    result = await run_activate(w.ports(), SIM_POLICY, "ac1")
    assert (result.result, w.current, w.last_good) == ("rolled_back", "blue", "blue")
    view = check_settled(w)
    assert view.staged is None
    assert w.archives["a"].sha256 in view.known_bad  # condemned as an upgrade's candidate is


async def test_activate_refuses_changed_bytes_and_forgets_them() -> None:
    w = await staged_world()
    other = w.archives["b"]
    w.files[w.slot_path("green")] = other.sha256  # someone replaced the staged binary
    result = await run_activate(w.ports(), SIM_POLICY, "ac1")
    assert result.result == "aborted"
    assert result.reason is not None and result.reason.startswith("staged candidate in slot green (")
    assert (w.current, w.last_good, w.unit_slot) == ("blue", "blue", "blue")
    view = check_settled(w)
    assert view.staged is None
    checked = [e for e in events_by_episode(w)["ac1"] if isinstance(e, ev.StagedCandidateChecked)]
    assert [(c.sha256, c.staged_sha256) for c in checked] == [(other.sha256, w.archives["a"].sha256)]
    with pytest.raises(NothingStagedError):
        await run_activate(w.ports(), SIM_POLICY, "ac2")


async def test_activate_with_nothing_staged_is_refused_before_any_episode() -> None:
    w = fresh()
    with pytest.raises(NothingStagedError, match="nothing staged"):
        await run_activate(w.ports(), SIM_POLICY, "ac1")
    assert w.records == []


async def test_a_new_upgrade_replaces_the_staged_candidate() -> None:
    w = await staged_world()
    result = await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("st2", "b", "b", stage=True))
    assert result.result == "staged"
    staged = fold(w.replay()).staged
    assert staged is not None and (staged.operation, staged.sha256) == ("st2", w.archives["b"].sha256)
    assert w.slot_sha("green") == w.archives["b"].sha256
    result = await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("up3", "a", "a"))
    assert result.result == "committed"
    assert fold(w.replay()).staged is None
    check_settled(w)


async def test_stage_after_a_commit_moves_last_good_off_the_staged_slot() -> None:
    """On a host where last-good names the inactive slot, staging moves last-good to current first: the
    staged slot is never what a link names."""
    w = fresh()
    assert (await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("up1", "b", "b"))).result == "committed"
    assert (w.current, w.last_good) == ("green", "blue")
    await run_upgrade(w.ports(), SIM_POLICY, STAGE)
    assert (w.current, w.last_good) == ("green", "green")
    assert w.slot_sha("blue") == w.archives["a"].sha256
    result = await run_activate(w.ports(), SIM_POLICY, "ac1")
    assert (result.result, w.current, w.last_good) == ("committed", "blue", "green")


async def test_dry_runs_have_the_pinned_lengths() -> None:
    w = fresh()
    await run_upgrade(w.ports(), SIM_POLICY, STAGE)
    assert len(w.records) == STAGE_LENGTH
    for kind, n in ACTIVATE_LENGTH.items():
        w = await staged_world(kind)
        before = len(w.records)
        await run_activate(w.ports(), SIM_POLICY, "ac1")
        assert len(w.records) - before == n


async def _recover(w: World, fault: FaultKind) -> None:
    if fault == "power" and isinstance(await recover(w.ports(), SIM_POLICY, "boot"), HandedOff):
        assert w.handoffs and w.handoffs[-1][1] is True
    assert await recover(w.ports(), SIM_POLICY, "manual") is not None


@pytest.mark.parametrize("fault", ["crash", "power"])
async def test_stage_cut_after_every_prefix_then_recover(fault: FaultKind) -> None:
    for k in range(1, STAGE_LENGTH + 1):
        w = fresh()
        w.arm(CrashPlan(k, "after", fault, method="journal.append"))
        with pytest.raises(SimCrash):
            await run_upgrade(w.ports(), SIM_POLICY, STAGE)
        w.crash(fault)
        check_always(w)
        cut = [e.TAG for e in events_by_episode(w)["st1"]]
        await _recover(w, fault)
        view = check_settled(w)
        published = view.episodes["st1"].published
        assert published is not None
        assert (w.current, w.last_good) == ("blue", "blue"), (k, cut[-1])
        if "StagedForActivation" in cut:
            assert published.result == "staged", (k, cut[-1])
            assert view.staged is not None and w.slot_sha("green") == view.staged.sha256
        else:
            assert published.result == "aborted" and view.staged is None, (k, cut[-1])


@pytest.mark.parametrize("fault", ["crash", "power"])
@pytest.mark.parametrize("kind", ["good", "exit"])
async def test_activate_cut_after_every_prefix_then_recover(kind: str, fault: FaultKind) -> None:
    for k in range(1, ACTIVATE_LENGTH[kind] + 1):
        w = await staged_world(kind)
        staged_sha = w.archives["a"].sha256
        w.arm(CrashPlan(k, "after", fault, method="journal.append"))
        with pytest.raises(SimCrash):
            await run_activate(w.ports(), SIM_POLICY, "ac1")
        w.crash(fault)
        check_always(w)
        cut = [e.TAG for e in events_by_episode(w)["ac1"]]
        assert len(cut) == k
        await _recover(w, fault)
        view = check_settled(w)
        published = view.episodes["ac1"].published
        assert published is not None
        assert_cut_verdict(w, cut, published.result, kind)
        if "SwitchCommitted" not in cut:
            # an activate cut before it moved current leaves the candidate staged, to activate again
            assert view.staged is not None and view.staged.sha256 == staged_sha, (k, cut[-1])
            again = await run_activate(w.ports(), SIM_POLICY, "ac2")
            assert again.result == ("committed" if kind == "good" else "rolled_back"), (k, cut[-1])


@pytest.mark.parametrize("flow", ["stage", "activate"])
async def test_fault_around_every_port_call_then_recover(flow: str) -> None:
    """A crash or power cut before/after every port call of staging and of activation."""
    dry = await staged_world() if flow == "activate" else fresh()
    dry.arm(None)  # counts the calls of the next process from zero
    await (run_activate(dry.ports(), SIM_POLICY, "ac1") if flow == "activate"
           else run_upgrade(dry.ports(), SIM_POLICY, STAGE))
    for index in range(1, dry.calls + 1):
        for when in ("before", "after"):
            for fault in ("crash", "power"):
                w = await staged_world() if flow == "activate" else fresh()
                w.arm(CrashPlan(index, when, fault))  # type: ignore[arg-type]
                with pytest.raises(SimCrash):
                    await (run_activate(w.ports(), SIM_POLICY, "ac1") if flow == "activate"
                           else run_upgrade(w.ports(), SIM_POLICY, STAGE))
                await settle_after_fault(w, fault)  # type: ignore[arg-type]


def _compacted(records: list[SimRecord], dropped: int) -> list[SimRecord]:
    """The journal after compaction dropped its first ``dropped`` records: the kept ones, then the snapshot
    summarising the dropped ones (appended last, as the journal writer does)."""
    snapshot = summarize_history(records[:dropped])
    return [*records[dropped:], SimRecord(len(records) + 1, ev.SNAPSHOT_EPISODE, 1.0, snapshot)]


async def test_a_staged_candidate_survives_compaction_of_its_episode() -> None:
    w = await staged_world()
    records = w.replay()
    snapshot = summarize_history(records)
    assert snapshot.staged is not None and snapshot.staged.operation == "st1"
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(snapshot)) == snapshot
    staged = fold(_compacted(records, len(records))).staged
    assert staged is not None and (staged.operation, staged.sha256) == ("st1", w.archives["a"].sha256)
    # a kept, newer episode that installed other bytes wins over the snapshot
    dropped = len(records)
    assert (await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("up2", "b", "b"))).result == "committed"
    assert fold(_compacted(w.replay(), dropped)).staged is None
    # a snapshot without a staged candidate encodes to the bytes it always did
    assert b"staged" not in EVENT_CODEC.encode(ev.HistorySnapshot(()))


async def test_a_staging_left_for_the_window_says_so_through_result_fold_and_compaction() -> None:
    """docs/configuration.md ``[schedule]``: ``upgrade --in-window`` outside the window stages with
    ``switch_in_window``; the recovery timer reads it from the fold, and it survives compaction; a plain
    staging encodes as before."""
    w = fresh()
    request = UpgradeRequest("up1", "a", "a", stage=True, switch_in_window=True)
    result = await run_upgrade(w.ports(), SIM_POLICY, request)
    assert (result.result, result.reason) == (
        "staged", f"candidate {w.archives['a'].version} staged in slot green; the recovery timer switches to "
        "it inside the maintenance window")
    records = w.replay()
    (marked,) = [r.event for r in records if isinstance(r.event, ev.StagedForActivation)]
    assert marked.switch_in_window and b"switch_in_window" in EVENT_CODEC.encode(marked)
    staged = fold(records).staged
    assert staged is not None and staged.switch_in_window
    snapshot = summarize_history(records)
    assert snapshot.staged is not None and snapshot.staged.switch_in_window
    assert EVENT_CODEC.decode(EVENT_CODEC.encode(snapshot)) == snapshot
    kept = fold(_compacted(records, len(records))).staged
    assert kept is not None and kept.switch_in_window
    plain = (await staged_world()).replay()
    (event,) = [r.event for r in plain if isinstance(r.event, ev.StagedForActivation)]
    assert not event.switch_in_window and b"switch_in_window" not in EVENT_CODEC.encode(event)


async def test_a_managed_operation_staged_for_its_window_takes_its_activations_status() -> None:
    """docs/configuration.md ``[schedule]``: the operator stages an operation under its own id outside the
    window; its status is ``InProgress``/``Staged`` until an activate switches to that staging, then it is
    the activation's, derived from the journal alone."""
    w = await staged_world()
    staged = operation_status(fold(w.replay()), "st1")
    assert staged is not None and (staged.phase, staged.step, staged.result) == ("InProgress", "Staged", None)
    assert staged.to_version == w.archives["a"].version
    waiting = window_waiting_status("st1", 1_764_640_800.0, 5.0, staged)
    assert (waiting.phase, waiting.step, waiting.started_at) == ("InProgress", "Waiting", staged.started_at)
    assert waiting.message == ("waiting for the maintenance window: the next opens at 2025-12-02T02:00:00Z; "
                               f"{staged.message}")
    await run_activate(w.ports(), SIM_POLICY, "ac1")
    view = fold(w.replay())
    done = operation_status(view, "st1")
    assert done is not None and (done.phase, done.result, done.step) == ("Succeeded", "committed", None)
    assert done.journal_seq == view.episodes["ac1"].published_seq
    assert done.started_at == view.episodes["st1"].opened_at

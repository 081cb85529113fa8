"""C22: cut the event sequence of a full upgrade (and of a failing one) after every prefix, then recover.

The cut is real: the upgrading process dies right after the k-th journal append (a process crash, or a
power cut that also reboots the unit), so the host is exactly as the flow left it at that record. Recovery
then runs (``boot`` first after a power cut, then the handed-off ``manual`` check). Expected, per C22:
before the switch the old version stays; between switch and commit the candidate is checked (kept if
healthy, rolled back if not); after a durable commit nothing rolls back.
"""

from __future__ import annotations

import pytest

from upgrade_core import HandedOff, UpgradeRequest, recover, run_upgrade
from upgrade_core import _events as ev

from ..sim.host import SIM_POLICY, Behavior, CrashPlan, FaultKind, SimCrash, World, make_candidate
from ..sim.invariants import (
    assert_cut_verdict,
    check_always,
    check_settled,
    events_by_episode,
    settle_after_fault,
)

pytestmark = pytest.mark.anyio
FULL_LENGTH = {"good": 15, "exit": 28}  # appends of an uninterrupted run (pinned by the dry-run test)


def fresh(kind: str) -> World:
    w = World(SIM_POLICY)
    w.install_bare(make_candidate("base", Behavior("good")))
    w.add_archive("a", make_candidate("cand", Behavior("good") if kind == "good" else Behavior("exit", 0.3)))
    return w


async def test_dry_runs_have_the_pinned_lengths() -> None:
    for kind, n in FULL_LENGTH.items():
        w = fresh(kind)
        await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("op1", "a", "a"))
        assert len(w.records) == n


@pytest.mark.parametrize("fault", ["crash", "power"])
@pytest.mark.parametrize("kind", ["good", "exit"])
async def test_cut_after_every_prefix_then_recover(kind: str, fault: FaultKind) -> None:
    for k in range(1, FULL_LENGTH[kind] + 1):
        w = fresh(kind)
        w.arm(CrashPlan(k, "after", fault, method="journal.append"))
        try:
            await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("op1", "a", "a"))
        except SimCrash:
            w.crash(fault)
        else:
            raise AssertionError(f"no crash after append {k}")
        check_always(w)
        cut = [e.TAG for e in events_by_episode(w)["op1"]]
        assert len(cut) == k
        if fault == "power":
            handed = await recover(w.ports(), SIM_POLICY, "boot")
            if isinstance(handed, HandedOff):
                assert w.handoffs and w.handoffs[-1][1] is True
        result = await recover(w.ports(), SIM_POLICY, "manual")
        assert result is not None
        check_settled(w)
        final = events_by_episode(w)["op1"]
        published = next(e for e in final if isinstance(e, ev.ResultPublished)).result
        if "EpisodeClosed" in cut:
            assert result.operation is None  # nothing was open
        assert_cut_verdict(w, cut, published.result, kind)


@pytest.mark.parametrize("kind", ["good", "exit"])
async def test_fault_around_every_port_call_then_recover(kind: str) -> None:
    """Not only after appends: a crash or power cut before/after every port call of the whole flow."""
    dry = fresh(kind)
    await run_upgrade(dry.ports(), SIM_POLICY, UpgradeRequest("op1", "a", "a"))
    for index in range(1, dry.calls + 1):
        for when in ("before", "after"):
            for fault in ("crash", "power"):
                w = fresh(kind)
                w.arm(CrashPlan(index, when, fault))  # type: ignore[arg-type]
                with pytest.raises(SimCrash):
                    await run_upgrade(w.ports(), SIM_POLICY, UpgradeRequest("op1", "a", "a"))
                await settle_after_fault(w, fault)  # type: ignore[arg-type]

"""Crash injection, in process (design §8): a hypothesis state machine over the simulated host.

Workloads: upgrades to good, exiting, crash-looping and hanging candidates, refused ones, the same digest
again, the same operation id repeated, a second operation while one is open, upgrades started from inside
the agent's unit (hand-off), and operator rollbacks to ``last-good`` (docs/recovery.md). Any step may crash
before or after any port call, as a process crash or a power cut, and recoveries (boot, on-failure, manual)
may crash again, repeatedly. After every step the design §4.6 invariants that must hold at any instant are
checked; after every completed step (and at teardown, after a clean recovery) the settled ones are, and
``fold(replay(disk))`` is compared with the model: which operations were started, and which results each
candidate's nature allows.

Coverage is shown, not assumed: each fired crash is tagged with ``hypothesis.event`` and collected;
``test_every_crash_point_fired`` (run after the machines) fails if a (port call, before/after, fault kind)
combination never fired, or if committed, rolled_back or aborted never occurred.

Sizes: 2,000 examples on asyncio and 200 on trio, <= 30 steps each; ``UPGRADE_CORE_LONG=1`` for 10x;
``UPGRADE_CORE_STATEFUL_SCALE=0.05`` for a quick local run (the coverage check may then fail).
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import hypothesis
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from upgrade_core import (
    HandedOff,
    UpgradeRequest,
    UpgradeResult,
    fold,
    recover,
    run_activate,
    run_rollback,
    run_upgrade,
)
from upgrade_core import _events as ev
from upgrade_core.errors import NothingStagedError, NothingToRollBackError, UnverifiedCurrentError

from ..sim.host import (
    CRASH_METHODS,
    SIM_POLICY,
    Behavior,
    CrashPlan,
    SimCrash,
    World,
    make_candidate,
)
from ..sim.invariants import INTERRUPTED, check_always, check_settled, events_by_episode

LONG = os.environ.get("UPGRADE_CORE_LONG") == "1"
FIRED: set[tuple[str, str, str]] = set()
RESULTS: set[str] = set()
ROLLBACK_RESULTS: set[str] = set()
STAGING_RESULTS: set[str] = set()  # results of upgrade --stage and of activate ("activate committed", ...)

BEHAVIORS: dict[str, Behavior | None] = {
    "good": Behavior("good"),
    "exits": Behavior("exit", 0.3),
    "crash_loop": Behavior("exit", 0.05),
    "hangs": Behavior("hang"),
    "verify_fails": Behavior("verify_fail"),
    "missing": None,  # the source has no such archive: a fetch/archive error
    "same": None,  # the digest current already runs: noop
}
BAD = {"exits", "crash_loop", "hangs"}

# Methods called once per flow (or only on some paths) are listed first and twice: hypothesis favours the
# first entries of ``sampled_from``, and the coverage check needs every method to be hit.
_COMMON = ("journal.append", "host.links", "service.snapshot", "probe.check", "service.restart")
_RARE = tuple(m for m in CRASH_METHODS if m not in _COMMON)
_METHOD_CHOICES = (*_RARE, *_RARE, *_COMMON)

crash_plans = st.one_of(
    st.none(),
    *[st.builds(
        CrashPlan,
        call_index=st.integers(1, 2),
        when=st.sampled_from(["before", "after"]),
        kind=st.sampled_from(["crash", "power"]),
        method=st.sampled_from(_METHOD_CHOICES),
    )] * 4,
    st.builds(
        CrashPlan,
        call_index=st.integers(1, 120),
        when=st.sampled_from(["before", "after"]),
        kind=st.sampled_from(["crash", "power"]),
    ),
)


class CrashMachine(RuleBasedStateMachine):
    backend = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.w = World(SIM_POLICY)
        self.nature: dict[str, str] = {}  # operation -> candidate nature (the model)
        self.started: list[str] = []
        self.completed: set[str] = set()  # operations whose call returned without a crash
        self.counter = 0
        self.just_settled = False  # the last step already ran every check (saves a fold per step)

    @initialize(upgraded_before=st.booleans())
    def install(self, upgraded_before: bool) -> None:
        w = self.w
        w.install_bare(make_candidate("base", Behavior("good")))
        if upgraded_before:
            # A host after a committed upgrade: current on green, last-good still on blue (design §3).
            second = make_candidate("base-2", Behavior("good"))
            w.by_sha[second.sha256] = second
            w.files[w.slot_path("green")] = second.sha256
            w.verified_digests.add(second.sha256)
            w.base_digests.add(second.sha256)
            w.current = "green"
            w.start_unit()

    # -- running a process with a crash plan ---------------------------------------------------------------
    def _run(self, plan: CrashPlan | None, fn: Any, *args: Any) -> tuple[bool, Any]:
        w = self.w
        self.just_settled = False
        w.arm(plan)
        try:
            result = anyio.run(fn, *args, backend=self.backend)
        except SimCrash:
            assert w.fired is not None and plan is not None
            name, when, kind = w.fired
            FIRED.add((name, when, kind))
            hypothesis.event(f"crash {name} {when} {kind}")
            w.crash(kind)
            return False, None
        finally:
            w.plan = None
        return True, result

    # -- rules -------------------------------------------------------------------------------------------
    @rule(nature=st.sampled_from(sorted(BEHAVIORS)), repeat=st.booleans(), inside_unit=st.booleans(),
          plan=crash_plans)
    def upgrade(
        self, nature: str, repeat: bool, inside_unit: bool, plan: CrashPlan | None, stage: bool = False
    ) -> None:
        if repeat and self.started:
            op = self.started[-1]
        else:
            self.counter += 1
            op = f"op{self.counter}"
            source = f"src-{op}"
            if nature == "same":
                current_sha = self.w.slot_sha(self.w.current)
                assert current_sha is not None
                self.w.archives[source] = self.w.by_sha[current_sha]
            elif nature != "missing":
                behavior = BEHAVIORS[nature]
                assert behavior is not None
                self.w.add_archive(source, make_candidate(f"{op}-{nature}", behavior))
            self.nature[op] = nature
            self.started.append(op)
        self.w.inside_unit = inside_unit
        request = UpgradeRequest(op, f"src-{op}", f"src-{op}", stage=stage)

        async def flow() -> UpgradeResult | None:
            try:
                return await run_upgrade(self.w.ports(), SIM_POLICY, request)
            except UnverifiedCurrentError:
                return None

        ok, result = self._run(plan, flow)
        self.w.inside_unit = False
        if ok and result is None:
            # design §4.7: current runs a candidate an activate left stopped; refused, nothing journaled
            assert fold(self.w.replay()).left_stopped is not None
            assert fold(self.w.replay()).episodes.get(op) is None or op in self.completed
            hypothesis.event("upgrade refused: current left unverified")
            return
        if ok:
            self.completed.add(op)
            RESULTS.add(result.result)
            if stage:
                STAGING_RESULTS.add(f"stage {result.result}")
            hypothesis.event(f"result {result.result}")
            self._settled()

    @rule(nature=st.sampled_from(sorted(BEHAVIORS)), plan=crash_plans)
    def stage(self, nature: str, plan: CrashPlan | None) -> None:
        """``upgrade --stage``: fetch, verify, install in the inactive slot; no switch (docs/cli.md)."""
        self.upgrade(nature, False, False, plan, stage=True)

    @rule(inside_unit=st.booleans(), plan=crash_plans)
    def activate(self, inside_unit: bool, plan: CrashPlan | None) -> None:
        """``activate``: switch to the staged candidate as an upgrade does; refused (nothing journaled for
        it) when nothing is staged."""
        self.counter += 1
        op = f"op{self.counter}"

        async def flow() -> UpgradeResult | None:
            try:
                return await run_activate(self.w.ports(), SIM_POLICY, op)
            except NothingStagedError:
                return None

        self.w.inside_unit = inside_unit
        ok, result = self._run(plan, flow)
        self.w.inside_unit = False
        if ok and result is None:
            assert fold(self.w.replay()).result_of(op) is None
            hypothesis.event("activate refused: nothing staged")
            return
        if fold(self.w.replay()).episodes.get(op) is None:
            return  # crashed before its episode opened (perhaps while recovering an older one)
        self.nature[op] = "activate"
        self.started.append(op)
        if ok:
            self.completed.add(op)
            RESULTS.add(result.result)
            STAGING_RESULTS.add(f"activate {result.result}")
            hypothesis.event(f"activate result {result.result}")
            self._settled()

    @rule()
    def stop_unit(self) -> None:
        """An operator stops the agent unit on purpose (``systemctl stop``: ``inactive``); an ``activate``
        then leaves it stopped (design §4.7)."""
        self.w.unit_active = False

    @rule()
    def start_unit(self) -> None:
        """An operator starts the agent unit again (``systemctl start``) on whatever ``current`` names."""
        if self.w.current is not None:
            self.w.start_unit()

    @rule(method=st.sampled_from(CRASH_METHODS), when=st.sampled_from(["before", "after"]),
          kind=st.sampled_from(["crash", "power"]))
    def upgrade_twice_crash_in_second(self, method: str, when: str, kind: str) -> None:
        """A committed upgrade, then one whose workload reaches ``method``, crashed around its first call.

        Workloads follow the method: the same digest again for ``discard_staging``; from inside the agent's
        unit for the hand-off calls; a second upgrade after a commit so ``last-good`` must move.
        """
        self.upgrade("good", False, False, None)
        nature = "same" if method == "host.discard_staging" else "good"
        inside = method in ("service.hand_off_recovery", "journal.reread")
        self.upgrade(nature, False, inside, CrashPlan(1, when, kind, method))  # type: ignore[arg-type]

    @rule(inside_unit=st.booleans(), plan=crash_plans)
    def rollback(self, inside_unit: bool, plan: CrashPlan | None) -> None:
        """``upgrade-agent rollback``: current to last-good as its own episode; refused (nothing journaled)
        when last-good names current's slot."""
        self.counter += 1
        op = f"op{self.counter}"

        async def flow() -> UpgradeResult | None:
            try:
                return await run_rollback(self.w.ports(), SIM_POLICY, op)
            except NothingToRollBackError:
                return None

        before = len(self.w.replay())
        self.w.inside_unit = inside_unit
        ok, result = self._run(plan, flow)
        self.w.inside_unit = False
        if ok and result is None:
            # refused before any episode opened: only a recovery of an older open episode may have written
            assert fold(self.w.replay()).result_of(op) is None
            hypothesis.event("rollback refused: nothing to roll back to")
            return
        self.nature[op] = "rollback"
        self.started.append(op)
        if ok:
            self.completed.add(op)
            RESULTS.add(result.result)
            ROLLBACK_RESULTS.add(result.result)
            hypothesis.event(f"rollback result {result.result}")
            assert len(self.w.replay()) > before
            self._settled()

    @rule(trigger=st.sampled_from(["boot", "on-failure", "manual", "timer"]), plan=crash_plans)
    def recover(self, trigger: str, plan: CrashPlan | None) -> None:
        ok, result = self._run(plan, recover, self.w.ports(), SIM_POLICY, trigger)
        if ok and isinstance(result, HandedOff):
            # boot handed the health check to a transient unit: that unit runs now (it may crash too)
            assert self.w.handoffs
            self.w.handoffs.clear()
            ok, result = self._run(None, recover, self.w.ports(), SIM_POLICY, "manual")
        if ok:
            assert isinstance(result, UpgradeResult)
            RESULTS.add(result.result)
            self._settled()

    # -- checks ------------------------------------------------------------------------------------------
    @invariant()
    def always(self) -> None:
        if self.w.current is not None and not self.just_settled:
            check_always(self.w)
        self.just_settled = False

    def _settled(self) -> None:
        self.just_settled = True
        view = check_settled(self.w)
        episodes = events_by_episode(self.w)
        # design §4.7: a recovery checks a candidate an activate left stopped in an episode of its own
        for op in view.episodes:
            if op not in self.nature and "-check-" in op:
                self.nature[op] = "check"
                self.started.append(op)
        # fold(replay(disk)) agrees with the model: only started operations, and results each allows.
        assert set(view.episodes) <= set(self.started)
        assert self.completed <= set(view.closed_results)
        for op, result in view.closed_results.items():
            nature = self.nature[op]
            events = episodes[op]
            ep = view.episodes[op]
            value = result.result
            if value == "switched_stopped":
                # design §4.7: switched with the unit left stopped: no attempt, no verdict on the candidate
                assert ep.kind == "activate" and ep.unit_found_stopped and ep.switch_landed, (op, value)
                assert ep.attempts_started == 0 and ep.last_good_slot != ep.candidate_slot, (op, value)
            elif not ep.switch_landed:
                assert value in ("aborted", "noop", "staged"), (op, nature, value)
                if value == "staged":
                    assert ep.kind == "upgrade" and ep.installed, (op, nature)
            else:
                # Judge by what actually ran: a "same" request may stage another digest by then.
                assert ep.candidate_sha256 is not None
                kind = self.w.by_sha[ep.candidate_sha256].behavior.kind
                candidate_failures = [e.reason for e in events
                                      if isinstance(e, ev.HealthFailed) and e.target == "candidate"]
                if kind != "good":
                    assert value in ("rolled_back", "needs_attention"), (op, kind, value)
                elif value != "committed":
                    # a good candidate is only given up on when crashes spent every attempt
                    assert value in ("rolled_back", "needs_attention"), (op, value)
                    assert candidate_failures and all(r == INTERRUPTED for r in candidate_failures), (
                        op, candidate_failures)
            if nature in ("missing", "verify_fails"):
                assert value == "aborted"
            if nature == "rollback" and value == "committed":
                # the rollback took effect: both links name the rolled-back-to slot (last-good never moves)
                assert ep.kind == "rollback" and ep.candidate_slot == ep.switch_last_good
            if nature == "same" and not ep.switch_landed:
                assert value in ("noop", "aborted")

    def teardown(self) -> None:
        # Whatever state the run ended in, a clean recovery settles it.
        if self.w.current is None:
            return
        self.w.plan = None
        result = anyio.run(recover, self.w.ports(crashable=False), SIM_POLICY, "manual", backend=self.backend)
        assert result is not None
        RESULTS.add(result.result)
        self._settled()
        assert fold(self.w.replay()).open_episode is None


class TrioCrashMachine(CrashMachine):
    backend = "trio"


# The normal run is derandomized so the session coverage check cannot flake from one CI run to the next;
# the long run (UPGRADE_CORE_LONG=1) explores fresh random programs every time.
_SETTINGS = dict(stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck),
               derandomize=not LONG, database=None if not LONG else settings.default.database,
               print_blob=True)
_SCALE = float(os.environ.get("UPGRADE_CORE_STATEFUL_SCALE", "10" if LONG else "1"))  # quick runs: 0.05
TestCrashAsyncio = CrashMachine.TestCase
TestCrashAsyncio.settings = settings(max_examples=max(1, int(2_000 * _SCALE)), **_SETTINGS)  # type: ignore[arg-type]
TestCrashTrio = TrioCrashMachine.TestCase
TestCrashTrio.settings = settings(max_examples=max(1, int(200 * _SCALE)), **_SETTINGS)  # type: ignore[arg-type]


def test_every_crash_point_fired() -> None:
    """Session-level coverage check (design §8): every (port call, before/after, fault) and every result."""
    if not FIRED:
        pytest.skip("the state machines did not run in this session (run the whole module)")
    expected = {(m, w, k) for m in CRASH_METHODS for w in ("before", "after") for k in ("crash", "power")}
    missing = sorted(expected - FIRED)
    assert not missing, f"crash points never exercised: {missing}"
    assert {"committed", "rolled_back", "aborted"} <= RESULTS, RESULTS
    assert "committed" in ROLLBACK_RESULTS, ROLLBACK_RESULTS
    staging = {"stage staged", "activate committed", "activate rolled_back", "activate switched_stopped"}
    assert staging <= STAGING_RESULTS, STAGING_RESULTS

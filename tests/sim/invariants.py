"""design §4.6 invariants, checked on a simulated host after every crash and recovery."""

from __future__ import annotations

from upgrade_core import EpisodeView, HandedOff, HostFacts, JournalView, decide, fold, recover
from upgrade_core import _events as ev
from upgrade_core.ports import LinkState

from .host import SIM_POLICY, FaultKind, World

INTERRUPTED = "attempt interrupted before its verdict"


def events_by_episode(world: World) -> dict[str, list[ev.Event]]:
    out: dict[str, list[ev.Event]] = {}
    for rec in world.replay():
        out.setdefault(rec.episode_id, []).append(rec.event)
    return out


def good_digests(world: World, by_episode: dict[str, list[ev.Event]]) -> set[str]:
    """Digests that ran healthy: the installed base plus every candidate with a durable commit."""
    good = set(world.base_digests)
    for events in by_episode.values():
        if any(isinstance(e, ev.UpgradeCommitted) for e in events):
            good.update(e.sha256 for e in events if isinstance(e, ev.CandidateInstalled))
            # an activate commits the candidate an earlier upgrade --stage installed
            good.update(e.staged_sha256 for e in events if isinstance(e, ev.StagedCandidateChecked))
    return good


def check_always(world: World) -> JournalView:
    """Invariants that hold at every instant, even right after a crash (2, 4, 6, and fold agrees)."""
    view = fold(world.replay())  # also: the durable history is a legal one
    # 2. Always runnable: current and last-good resolve to binaries that passed verification.
    for link in (world.current, world.last_good):
        assert link is not None, "a link vanished"
        sha = world.slot_sha(link)
        assert sha is not None and sha in world.verified_digests, f"{link} holds an unverified binary"
    # 6. last-good names a committed or previously running good slot.
    by_episode = events_by_episode(world)
    good = good_digests(world, by_episode)
    assert world.slot_sha(world.last_good) in good, "last-good names an unproven slot"
    # design §4.7: a candidate an activate left stopped is what current names, never what last-good names.
    if view.left_stopped is not None:
        assert (world.current, world.last_good != world.current) == (view.left_stopped.slot, True), (
            "a candidate left stopped is not current, or last-good names it")
    # A staged candidate (upgrade --stage) waits in a slot neither link names.
    if view.staged is not None:
        assert view.staged.slot not in (world.current, world.last_good), "a link names the staged slot"
    # 4. One-way commit: nothing after UpgradeCommitted rolls back (also enforced by the table).
    for op, events in by_episode.items():
        tags = [e.TAG for e in events]
        if "UpgradeCommitted" in tags:
            after = tags[tags.index("UpgradeCommitted"):]
            assert "RollbackStarted" not in after and "Aborted" not in after, f"{op} rolled back after commit"
    return view


def check_settled(world: World) -> JournalView:
    """After a completed recovery: nothing open, results published before close, decisions stable."""
    view = check_always(world)
    assert view.open_episode is None, f"episode {view.open_episode} left open"
    for op, events in events_by_episode(world).items():
        if op == ev.SNAPSHOT_EPISODE:
            continue
        published = [e for e in events if isinstance(e, ev.ResultPublished)]
        closed = [e for e in events if isinstance(e, ev.EpisodeClosed)]
        # 5. Exactly one terminal result, published (sink first) before the close.
        counts = (len(published), len(closed))
        assert counts == (1, 1), f"{op}: (published, closed) = {counts}"
        assert events.index(published[0]) < events.index(closed[0])
        assert published[0].result in world.results.get(op, []), f"{op}: result never reached the sink"
        assert all(r == published[0].result for r in world.results[op]), f"{op}: sink saw different results"
        # 4. A durable commit ends committed.
        if any(isinstance(e, ev.UpgradeCommitted) for e in events):
            assert published[0].result.result == "committed"
        # 3. A candidate that never ran healthy is never committed.
        ep = view.episodes[op]
        if ep.candidate_sha256 is not None and published[0].result.result == "committed":
            assert world.by_sha[ep.candidate_sha256].behavior.kind == "good", f"{op}: bad candidate committed"
        # A good last-good is only given up on when crashes spent every one of its attempts.
        if published[0].result.result == "needs_attention":
            last_good_failures = [e.reason for e in events
                                  if isinstance(e, ev.HealthFailed) and e.target == "last_good"]
            kind = world.by_sha[world.slot_sha(ep.rollback_slot) or ""].behavior.kind
            assert kind != "good" or all(r == INTERRUPTED for r in last_good_failures), (
                f"{op}: good last-good judged unhealthy: {last_good_failures}")
    # 1. No spurious downgrade / the last episode's verdict is what the links show.
    last = _last_episode(view)
    if last is not None and last.published is not None:
        result = last.published.result
        if result in ("aborted", "noop", "staged") and last.kind != "install":
            assert world.current == last.from_slot, f"{last.episode_id}: {result} but current moved"
        elif result == "committed":
            assert world.current == last.candidate_slot
        elif result == "switched_stopped":  # design §4.7: current moved, last-good did not
            assert world.current == last.candidate_slot != world.last_good
        elif result == "rolled_back":
            assert world.current == last.rollback_slot
    # Replaying again gives the same decision.
    facts = HostFacts(world_links(world))
    assert decide(view, facts) == decide(fold(world.replay()), facts)
    return view


def _last_episode(view: JournalView) -> EpisodeView | None:
    eps = list(view.episodes.values())
    return max(eps, key=lambda e: e.opened_seq) if eps else None


def world_links(world: World) -> LinkState:
    return LinkState(world.current, world.last_good)


def assert_cut_verdict(world: World, cut: list[str], result: str, candidate_kind: str) -> None:
    """C22, for an episode cut after its last journaled record ``cut[-1]`` and then recovered: before the
    switch took effect the old slot (blue) stays and the result is ``aborted``; after it a good candidate, or
    one with a durable commit, ends ``committed`` on green; any other ``rolled_back`` on blue."""
    where = (len(cut), cut[-1])
    if "SwitchCommitted" not in cut:  # a cut right after SwitchIntended: the flip never happened
        assert result == "aborted" and world.current == "blue", where
    elif "UpgradeCommitted" in cut or candidate_kind == "good":
        assert result == "committed" and world.current == "green", where
    else:
        assert result == "rolled_back" and world.current == "blue", where


async def settle_after_fault(world: World, fault: FaultKind) -> JournalView:
    """After a process crashed with ``fault``: the instant invariants, then the recovery that follows (a
    power cut boots: ``boot``, then the handed-off ``manual`` check), then the settled invariants."""
    world.crash(fault)
    check_always(world)
    trigger = "boot" if fault == "power" else "manual"
    if isinstance(await recover(world.ports(), SIM_POLICY, trigger), HandedOff):
        await recover(world.ports(), SIM_POLICY, "manual")
    return check_settled(world)

"""Every (state, event kind) pair, through the orchestrator's checked append, on the REAL journal.

The lifecycle table is checked before every append (docs/adr/0002-lifecycle-as-one-table.md). For every
episode kind, a journal prefix reaching every reachable state is built from the table
(:data:`upgrade_core.TRANSITIONS`, breadth first, with plausible event fields). Then, for every
state and every event class in :data:`upgrade_core.ALL_EVENTS`, plausible events (and variants that break
a context rule: ``Aborted`` after the switch of an upgrade, a wrong attempt number, a health event for the
wrong target, a mismatched slot or digest, a wrong published or closing result, a second open episode) are
appended through :class:`upgrade_core.CheckedJournal` over ``agent.session.wiring.JournalPort`` and
``journal.JournalWriter`` in a temporary directory. Each one is either

- appended, and the journal then replays and folds cleanly, with the event as its last record; or
- refused with :class:`~upgrade_core.errors.IllegalTransitionError`, the journal directory byte-identical
  (every file hashed before and after) and still replayable.

The mutant ``f_append_without_precheck`` (the helper appends before checking) is killed here: the refused
event would already be durable and every later replay would raise.
"""

from __future__ import annotations

import hashlib
import shutil
from collections import deque
from pathlib import Path

import pytest

from agent.session.wiring import JournalPort
from journal import JournalWriter, replay
from upgrade_core import (
    ALL_EVENTS,
    EVENT_CODEC,
    TRANSITIONS,
    CheckedJournal,
    EpisodeState,
    Event,
    Folder,
    UpgradeResult,
    fold,
)
from upgrade_core import _events as ev
from upgrade_core.errors import HistoryError, IllegalTransitionError

pytestmark = pytest.mark.anyio
S = EpisodeState
OP = "op1"
CAND = "c" * 64
KINDS = ("upgrade", "install", "self_upgrade", "rollback", "activate")
# A rollback episode (docs/recovery.md) fetches and stages nothing: never fetched, staged or unchanged; nor
# does an activate (its candidate was staged by an earlier upgrade --stage). Only an upgrade stages for a
# later activate (ready).
# Only an activate that found the unit stopped leaves it stopped (left_stopped).
_MOVE = {S.MOVING, S.MOVED}  # HostMoveIntended: a host-move episode's only (tests/core/test_host_move.py)
UNREACHABLE = {
    "upgrade": {S.LEFT_STOPPED, *_MOVE},
    "rollback": {S.FETCHED, S.STAGED, S.UNCHANGED, S.READY, S.LEFT_STOPPED, *_MOVE},
    "activate": {S.FETCHED, S.STAGED, S.UNCHANGED, S.READY, *_MOVE},
    "install": {S.READY, S.LEFT_STOPPED, *_MOVE},
    "self_upgrade": {S.READY, S.LEFT_STOPPED, *_MOVE},
}
RESULT_OF_STATE = {
    S.COMMITTED: "committed", S.UNCHANGED: "noop", S.ABORTED: "aborted", S.ROLLED_BACK: "rolled_back",
    S.NEEDS_ATTENTION: "needs_attention", S.READY: "staged", S.LEFT_STOPPED: "switched_stopped",
}


@pytest.fixture
def anyio_backend() -> str:
    """The matrix is about rules and bytes on disk; the journal's backend coverage lives in tests/journal."""
    return "asyncio"


def _target(state: EpisodeState) -> ev.HealthTarget:
    return "last_good" if state is S.ROLLING_BACK else "candidate"


def _other_target(state: EpisodeState) -> ev.HealthTarget:
    return "candidate" if state is S.ROLLING_BACK else "last_good"


def variants(cls: type[Event], kind: str, folder: Folder, op: str = OP) -> list[tuple[str, Event]]:
    """Plausible events of ``cls`` for ``op`` in the folder's state: ("ok", e) first, then rule breakers."""
    state = folder.state_of(op)
    ctx = folder.context_of(op)
    slot = ctx.candidate_slot or ("blue" if kind == "install" else "green")
    sha = ctx.candidate_sha256 or CAND
    started = ctx.rollback_attempts_started if state is S.ROLLING_BACK else ctx.attempts_started
    n = max(started, 1)
    out: list[tuple[str, Event]] = []
    if cls is ev.EpisodeOpened:
        from_slot = None if kind == "install" else "blue"
        def opened(operation: str) -> Event:
            source, expected = (
                ("last-good green", CAND) if kind == "rollback"
                else ("staged green by op0", CAND) if kind == "activate" else ("file:///a.tar.gz", None)
            )
            return ev.EpisodeOpened(operation, kind, source, expected, None,  # type: ignore[arg-type]
                                    from_slot, None, 3, 1.0, 3.0)
        out += [("ok", opened(op)), ("names another operation", opened("other"))]
    elif cls is ev.ArchiveFetched:
        out.append(("ok", ev.ArchiveFetched(500, "a" * 64)))
    elif cls is ev.CandidateStaged:
        out.append(("ok", ev.CandidateStaged(slot, sha, 1000, f"/R/lib/agent/.agent-{slot}.stage-01")))
    elif cls is ev.CandidateVerified:
        out.append(("ok", ev.CandidateVerified("2.0.0")))
    elif cls is ev.ReleaseTrusted:
        version = ctx.verified_version or "2.0.0"
        out += [("ok", ev.ReleaseTrusted("0123456789ABCDEF", "agent", version, 3)),
                ("another version", ev.ReleaseTrusted("0123456789ABCDEF", "agent", version + ".1", 3))]
    elif cls is ev.CandidateUnchanged:
        out.append(("ok", ev.CandidateUnchanged("blue", "1.0.0")))
    elif cls is ev.CandidateInstalled:
        out += [("ok", ev.CandidateInstalled(slot, sha)),
                ("other bytes", ev.CandidateInstalled(slot, "f" * 64)),
                ("other slot", ev.CandidateInstalled("green" if slot == "blue" else "blue", sha))]
    elif cls is ev.LastGoodRepointed:
        out.append(("ok", ev.LastGoodRepointed("blue")))
    elif cls is ev.SwitchIntended:
        if kind == "rollback":  # current (blue) to the slot last-good names (green)
            out += [("ok", ev.SwitchIntended("green", "blue", "green")),
                    ("other slot", ev.SwitchIntended("blue", "blue", "blue")),
                    ("not last-good", ev.SwitchIntended("green", "blue", "blue"))]
        else:
            out += [("ok", ev.SwitchIntended(slot, None if kind == "install" else "blue", "blue")),
                    ("other slot", ev.SwitchIntended("green" if slot == "blue" else "blue", "blue", "blue"))]
    elif cls is ev.SwitchCommitted:
        out += [("ok", ev.SwitchCommitted(slot)),
                ("other slot", ev.SwitchCommitted("green" if slot == "blue" else "blue"))]
    elif cls is ev.MirrorsSynced:
        out.append(("ok", ev.MirrorsSynced(("/m",))))
    elif cls is ev.RestartRequested:
        out.append(("ok", ev.RestartRequested("agent-restart-op1-1-0001", 10.0)))
    elif cls is ev.RestartObserved:
        out.append(("ok", ev.RestartObserved(101, "1" * 32)))
    elif cls is ev.HealthAttemptStarted:
        out += [("ok", ev.HealthAttemptStarted(started + 1, _target(state))),
                ("wrong attempt number", ev.HealthAttemptStarted(started + 2, _target(state))),
                ("same attempt again", ev.HealthAttemptStarted(started, _target(state))),
                ("wrong target", ev.HealthAttemptStarted(started + 1, _other_target(state)))]
    elif cls is ev.HealthPassed:
        out += [("ok", ev.HealthPassed(n, _target(state))),
                ("wrong target", ev.HealthPassed(n, _other_target(state)))]
    elif cls is ev.HealthFailed:
        out += [("ok", ev.HealthFailed(n, "MainPID changed", _target(state))),
                ("wrong target", ev.HealthFailed(n, "MainPID changed", _other_target(state)))]
    elif cls is ev.UpgradeCommitted:
        out.append(("ok", ev.UpgradeCommitted(slot, "2.0.0")))
    elif cls is ev.RollbackStarted:
        out.append(("ok", ev.RollbackStarted("candidate unhealthy", "blue")))
    elif cls is ev.RolledBack:
        out.append(("ok", ev.RolledBack("blue")))
    elif cls is ev.AttentionNeeded:
        out.append(("ok", ev.AttentionNeeded("last-good failed")))
    elif cls is ev.Aborted:
        out.append(("ok", ev.Aborted("interrupted")))
    elif cls is ev.ResultPublished:
        value = RESULT_OF_STATE.get(state, "aborted")
        wrong = "committed" if value != "committed" else "aborted"
        out += [("ok", ev.ResultPublished(UpgradeResult(op, value))),  # type: ignore[arg-type]
                ("other result", ev.ResultPublished(UpgradeResult(op, wrong)))]  # type: ignore[arg-type]
    elif cls is ev.EpisodeClosed:
        value = ctx.published or RESULT_OF_STATE.get(state, "aborted")
        wrong = "committed" if value != "committed" else "aborted"
        out += [("ok", ev.EpisodeClosed(value)), ("other result", ev.EpisodeClosed(wrong))]  # type: ignore[arg-type]
    elif cls is ev.RecoveryStarted:
        out.append(("ok", ev.RecoveryStarted("manual")))
    elif cls is ev.HistorySnapshot:
        out.append(("ok", ev.HistorySnapshot(())))
    elif cls is ev.JournalQuarantined:  # legal only in a ``quarantine`` episode: refused for KINDS
        out.append(("ok", ev.JournalQuarantined("/q/journal", "blue", CAND, "1.0.0", "blue", CAND, "1.0.0")))
    elif cls is ev.StagedForActivation:
        version = ctx.verified_version or "2.0.0"
        out += [("ok", ev.StagedForActivation(slot, sha, version, "a" * 64)),
                ("other bytes", ev.StagedForActivation(slot, "f" * 64, version, "a" * 64)),
                ("another version", ev.StagedForActivation(slot, sha, version + ".1", "a" * 64))]
    elif cls is ev.StagedCandidateChecked:
        out += [("ok", ev.StagedCandidateChecked("op0", "green", CAND, CAND, "2.0.0")),
                ("changed bytes", ev.StagedCandidateChecked("op0", "green", CAND, "f" * 64, "2.0.0"))]
    elif cls is ev.UnitFoundStopped:
        out += [("ok", ev.UnitFoundStopped("inactive", "dead")),
                ("failed unit", ev.UnitFoundStopped("failed", "failed"))]
    elif cls is ev.LeftStopped:
        other = "green" if slot == "blue" else "blue"
        out += [("ok", ev.LeftStopped(slot)), ("other slot", ev.LeftStopped(other))]
    elif cls is ev.TrustReset:  # legal only in a ``trust-reset`` episode: refused for KINDS
        out.append(("ok", ev.TrustReset(5, (CAND,))))
    elif cls is ev.HostMoveIntended:  # legal only in a ``host-move`` episode: refused for KINDS
        out.append(("ok", ev.HostMoveIntended("/opt/a", "/usr/local", "/opt/.a.move-1", "blue", CAND, "blue",
                                              CAND)))
    elif cls is ev.HostMoved:  # follows only HostMoveIntended, which no kind of KINDS may journal
        out.append(("ok", ev.HostMoved("/opt/a")))
    else:  # a new event class must be given plausible fields here
        raise AssertionError(f"no plausible fields for {cls.__name__}")
    return out


def prefixes(kind: str) -> dict[EpisodeState, list[Event]]:
    """Breadth first over the table: the shortest legal journal prefix reaching each reachable state.

    The search runs over (state, episode context), so self-loops that change a fact the rules need
    (``CandidateInstalled`` before ``SwitchIntended``) are explored; one health attempt per target is enough.
    """
    found: dict[EpisodeState, list[Event]] = {S.NEW: []}
    start = Folder()
    seen = {(S.NEW, start.context_of(OP))}
    todo: deque[list[Event]] = deque([[]])
    by_tag = {cls.TAG: cls for cls in ALL_EVENTS}
    while todo:
        events = todo.popleft()
        folder = Folder()
        folder.apply_all(_records(events))
        state = folder.state_of(OP)
        for (src, tag), _dst in TRANSITIONS.items():
            if src is not state:
                continue
            (_why, event), *_ = variants(by_tag[tag], kind, folder)
            try:
                after = Folder()
                after.apply_all(_records([*events, event]))
            except IllegalTransitionError:
                continue  # a context rule forbids it for this kind (e.g. Aborted after an upgrade's switch)
            key = (after.state_of(OP), after.context_of(OP))
            if key in seen or key[1].attempts_started > 1 or key[1].rollback_attempts_started > 1:
                continue
            seen.add(key)
            found.setdefault(key[0], [*events, event])
            todo.append([*events, event])
    return found


def _records(events: list[Event]) -> list[ev.Recorded]:
    from ..sim.host import SimRecord

    return [SimRecord(i + 1, OP, 1_700_000_000.0 + i, e) for i, e in enumerate(events)]


def _hashes(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


async def _write(directory: Path, events: list[Event]) -> None:
    writer = await JournalWriter.open(str(directory), EVENT_CODEC)
    try:
        for event in events:
            await writer.append(OP, event)
    finally:
        await writer.aclose()


async def _try_append(directory: Path, episode: str, event: Event) -> tuple[bool, list[ev.Recorded]]:
    """Open the real journal, fold it once, append through the checked helper. (appended?, records after)."""
    writer = await JournalWriter.open(str(directory), EVENT_CODEC)
    try:
        port = JournalPort(writer)
        folder = Folder()
        folder.apply_all(port.records())
        checked = CheckedJournal(port, folder)
        before = _hashes(directory)
        try:
            await checked.append(episode, event)
        except IllegalTransitionError:
            appended = False
        else:
            appended = True
            assert folder.view() == fold(port.records())  # the helper applied what it appended
    finally:
        await writer.aclose()
    if not appended:
        assert _hashes(directory) == before, f"refused {event.TAG} changed the journal"
    records = list(replay(str(directory), EVENT_CODEC).records)
    fold(records)  # replays and folds cleanly either way (raises HistoryError otherwise)
    return appended, records


REACHABLE = {kind: prefixes(kind) for kind in KINDS}


def test_every_state_is_reached_for_every_kind() -> None:
    for kind in KINDS:
        expected = set(S) - UNREACHABLE.get(kind, set())
        assert set(REACHABLE[kind]) == expected, (kind, expected ^ set(REACHABLE[kind]))


# Every (kind, state) a kind can reach (test_every_state_is_reached_for_every_kind pins which ones it can't).
PAIRS = [(kind, state) for state in S for kind in KINDS if state not in UNREACHABLE.get(kind, ())]


@pytest.mark.parametrize(("kind", "state"), PAIRS, ids=[f"{s.value}-{k}" for k, s in PAIRS])
async def test_every_event_kind_in_every_state_is_appended_or_refused_untouched(
    kind: str, state: EpisodeState, tmp_path: Path
) -> None:
    prefix = REACHABLE[kind][state]
    base = tmp_path / "base"
    await _write(base, prefix)
    folder = Folder()
    folder.apply_all(_records(prefix))
    assert folder.state_of(OP) is state
    cases: list[tuple[str, str, Event]] = [
        (cls.TAG, why, e) for cls in ALL_EVENTS for why, e in variants(cls, kind, folder)
    ]
    # The journal-level rules: a second episode opens only once op1 is closed.
    other = Folder()
    other.apply_all(_records(prefix))
    cases.append(("EpisodeOpened", "second episode", variants(ev.EpisodeOpened, kind, other, "op2")[0][1]))
    assert {tag for tag, _why, _e in cases} == {cls.TAG for cls in ALL_EVENTS}
    outcomes: dict[tuple[str, str], bool] = {}
    for i, (tag, why, event) in enumerate(cases):
        work = tmp_path / f"case{i}"
        shutil.copytree(base, work)
        episode = "op2" if why == "second episode" else OP
        legal = _legal(folder, episode, event)
        appended, records = await _try_append(work, episode, event)
        assert appended == legal, (kind, state.value, tag, why)
        if appended:
            assert records[-1].event == event and len(records) == len(prefix) + 1
        else:
            assert [r.event for r in records] == prefix
        outcomes[(tag, why)] = appended
    _check_named_rules(kind, state, outcomes)


def _legal(folder: Folder, episode: str, event: Event) -> bool:
    try:
        folder.check(episode, event)
    except IllegalTransitionError as exc:
        assert isinstance(exc, HistoryError) and exc.exit_code == 3 and exc.seq is None
        return False
    return True


def _check_named_rules(kind: str, state: EpisodeState, outcomes: dict[tuple[str, str], bool]) -> None:
    """The context rules, pinned independently of the function under test."""
    after_switch = state in (S.SWITCHED, S.RESTARTED)
    if after_switch:
        assert outcomes[("Aborted", "ok")] == (kind == "install"), "Aborted after the switch: install only"
    in_health = state in (S.SWITCHED, S.RESTARTED, S.ROLLING_BACK)
    assert outcomes[("HealthAttemptStarted", "ok")] == in_health
    for tag in ("HealthAttemptStarted", "HealthPassed", "HealthFailed"):
        assert not outcomes[(tag, "wrong target")]
    assert not outcomes[("HealthAttemptStarted", "wrong attempt number")]
    assert not outcomes[("HealthAttemptStarted", "same attempt again")]
    for tag in ("CandidateInstalled", "SwitchIntended", "SwitchCommitted"):
        assert not outcomes[(tag, "other slot")]
    assert not outcomes[("CandidateInstalled", "other bytes")]
    assert outcomes[("CandidateInstalled", "ok")] == (state is S.VERIFIED and kind != "rollback")
    if kind == "rollback":  # operator rollback: no fetch, no last-good move, verify right after opening
        assert not outcomes[("ArchiveFetched", "ok")] and not outcomes[("LastGoodRepointed", "ok")]
        assert outcomes[("CandidateVerified", "ok")] == (state is S.OPENED)
        assert not outcomes[("SwitchIntended", "not last-good")]
        assert outcomes[("SwitchIntended", "ok")] == (state is S.VERIFIED)
    else:
        assert outcomes[("CandidateVerified", "ok")] == (state is S.STAGED)
    assert not outcomes[("EpisodeOpened", "names another operation")]
    assert not outcomes[("EpisodeClosed", "other result")]
    if state is S.UNCHANGED:
        assert outcomes[("ResultPublished", "ok")] and not outcomes[("ResultPublished", "other result")]
    assert outcomes[("EpisodeOpened", "ok")] == (state is S.NEW)  # an id opens once, never again
    assert outcomes[("EpisodeOpened", "second episode")] == (state in (S.NEW, S.CLOSED))
    assert not outcomes[("HistorySnapshot", "ok")]  # compaction writes snapshots, never a flow
    # design §4.7: only an activate whose staged bytes matched records a unit stopped on purpose, before its
    # switch; a failed unit is never "stopped on purpose"; LeftStopped needs that record and the candidate
    assert outcomes[("UnitFoundStopped", "ok")] == (kind == "activate" and state is S.VERIFIED)
    assert not outcomes[("UnitFoundStopped", "failed unit")]
    assert not outcomes[("LeftStopped", "other slot")]
    if state is S.LEFT_STOPPED:
        assert outcomes[("ResultPublished", "ok")] and not outcomes[("ResultPublished", "other result")]


async def test_aborted_on_a_switched_upgrade_never_reaches_the_journal(tmp_path: Path) -> None:
    """A reproduced defect: before the fix this Aborted was made durable and every replay raised."""
    await _write(tmp_path, REACHABLE["upgrade"][S.SWITCHED])
    before = _hashes(tmp_path)
    writer = await JournalWriter.open(str(tmp_path), EVENT_CODEC)
    try:
        port = JournalPort(writer)
        folder = Folder()
        folder.apply_all(port.records())
        match = "Aborted after the switch of a upgrade episode"
        with pytest.raises(IllegalTransitionError, match=match) as info:
            await CheckedJournal(port, folder).append(OP, ev.Aborted("bug"))
        assert (info.value.state, info.value.event, info.value.seq) == ("switched", "Aborted", None)
    finally:
        await writer.aclose()
    assert _hashes(tmp_path) == before
    assert fold(replay(str(tmp_path), EVENT_CODEC).records).open_episode is not None

"""``host move`` in the pure core (docs/host.md, "Moving a linked host into a real root"): what "predates"
means (:func:`upgrade_core.move_refusal`), the installed digests the journal keeps for it, the lifecycle
rules of a ``host-move`` episode, and a crash after each record or step settled by ``recover`` from what the
host shows (the exchange landed: committed; it did not: the copy removed, aborted).

The files are :class:`SimMover`'s here, a model of the root link, the copy and the exchange in the manner of
``tests/sim``; the real mover runs on real directories in ``tests/agent_host/test_host_move_files.py`` and
under the private systemd in ``tests/systemd/test_host_move_real.py``.
"""

from __future__ import annotations

from typing import Literal

import attrs
import pytest

from upgrade_core import (
    EpisodeContext,
    EpisodeState,
    PublishAndClose,
    SettleHostMove,
    decide,
    fold,
    move_refusal,
    next_state,
    recover,
    run_host_move,
)
from upgrade_core import _events as ev
from upgrade_core._decide import HostFacts
from upgrade_core.errors import HostError, HostMoveRefusedError, IllegalTransitionError
from upgrade_core.ports import LinkState

from ..sim.host import SIM_POLICY, CrashPlan, SimCrash, SimRecord, World, make_candidate
from .test_orchestrator import GOOD

pytestmark = pytest.mark.anyio
S = EpisodeState
A, B = "a" * 64, "b" * 64
STAGING = "/opt/.upgrade-agent.move-00000000"
INTENT = ev.HostMoveIntended("/opt/upgrade-agent", "/usr/local", STAGING, "blue", A, "green", B)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _view(installed: dict[str, str], seq: int = 5) -> ev.Event:
    facts = tuple(ev.SlotVersion(seq, s, "1.0", sha) for s, sha in installed.items())  # type: ignore[arg-type]
    return ev.HistorySnapshot((), ev.JournalFacts(9, slot_versions=facts))


def _refusal(installed: dict[str, str], links: LinkState, digests: dict[str, str | None]) -> str | None:
    view = fold([SimRecord(9, ev.SNAPSHOT_EPISODE, 0.0, _view(installed))])
    return move_refusal(view, links, digests)  # type: ignore[arg-type]


def test_a_slot_predates_the_host_root_until_an_episode_installed_its_bytes() -> None:
    links = LinkState("blue", "green")
    assert _refusal({}, links, {"blue": A, "green": B}).startswith("slot blue (current) predates")  # type: ignore[union-attr]
    assert _refusal({"blue": A}, links, {"blue": A, "green": B}).startswith(  # type: ignore[union-attr]
        "slot green (last-good) predates the host root: its bytes (bbbbbbbbbbbb) were not installed")
    assert _refusal({"blue": A, "green": B}, links, {"blue": A, "green": B}) is None
    changed = _refusal({"blue": A, "green": B}, links, {"blue": "c" * 64, "green": B})
    assert changed is not None and "slot blue (current) predates" in changed  # bytes changed by hand
    one = LinkState("blue", "blue")  # an unnamed slot does not matter
    assert _refusal({"blue": A}, one, {"blue": A, "green": None}) is None
    assert _refusal({"blue": A}, LinkState("blue", "green"), {"blue": A, "green": None}) == \
        "slot green (last-good) is missing or empty"


def test_installed_digests_come_from_installs_and_survive_a_snapshot() -> None:
    opened = ev.EpisodeOpened("u", "upgrade", "x", None, None, "blue", "1.0", 2, 1.0, 3.0)
    records = [SimRecord(i + 1, "u", 0.0, e) for i, e in enumerate([
        opened, ev.ArchiveFetched(10, "f" * 64), ev.CandidateStaged("green", B, 10, "/s"),
        ev.CandidateVerified("2.0"), ev.CandidateInstalled("green", B),
    ])]
    view = fold(records)
    assert view.installed_digests == {"green": B}
    from upgrade_core import Folder

    folder = Folder()
    folder.apply_all(records)
    carried = fold([SimRecord(9, ev.SNAPSHOT_EPISODE, 0.0, ev.HistorySnapshot((), folder.facts()))])
    assert carried.installed_digests == {"green": B}


def test_quarantine_keeps_a_digest_only_for_the_bytes_installed() -> None:
    before = SimRecord(1, ev.SNAPSHOT_EPISODE, 0.0, _view({"blue": A, "green": B}, seq=0))
    opened = ev.EpisodeOpened("q", "quarantine", "/q", None, None, "blue", "1.0", 2, 1.0, 3.0)
    seen = ev.JournalQuarantined("/q", "blue", A, "1.0", "green", "c" * 64, "0.9")
    view = fold([before, SimRecord(2, "q", 0.0, opened), SimRecord(3, "q", 0.0, seen)])
    assert view.installed_digests == {"blue": A}


def test_only_a_host_move_episode_moves_and_it_does_nothing_else() -> None:
    assert next_state(S.OPENED, EpisodeContext("m", kind="host-move"), INTENT) is S.MOVING
    with pytest.raises(IllegalTransitionError, match="HostMoveIntended in a upgrade episode"):
        next_state(S.OPENED, EpisodeContext("u", kind="upgrade"), INTENT)
    with pytest.raises(IllegalTransitionError, match="ArchiveFetched in a host-move episode"):
        next_state(S.OPENED, EpisodeContext("m", kind="host-move"), ev.ArchiveFetched(1, A))
    assert next_state(S.MOVING, EpisodeContext("m", kind="host-move"), ev.HostMoved("/opt/upgrade-agent")) \
        is S.MOVED
    published = ev.ResultPublished(ev.UpgradeResult("m", "noop"))
    with pytest.raises(IllegalTransitionError, match="noop published in state moved"):
        next_state(S.MOVED, EpisodeContext("m", kind="host-move"), published)


def test_recovery_lets_the_host_decide_a_cut_move() -> None:
    opened = ev.EpisodeOpened("m", "host-move", "host move", None, None, "blue", "1.0", 1, 0.0, 1.0)
    cut = fold([SimRecord(1, "m", 0.0, opened), SimRecord(2, "m", 0.0, INTENT)])
    assert decide(cut, HostFacts(LinkState("blue", "green"))) == SettleHostMove()
    moved = fold([SimRecord(1, "m", 0.0, opened), SimRecord(2, "m", 0.0, INTENT),
                  SimRecord(3, "m", 0.0, ev.HostMoved("/opt/upgrade-agent"))])
    plan = decide(moved, HostFacts(LinkState("blue", "green")))
    assert isinstance(plan, PublishAndClose) and plan.result.result == "committed"
    assert plan.result.reason == ("host root /opt/upgrade-agent is a real directory now, no longer a link to "
                                  "/usr/local (whose files are left in place)")


@attrs.define
class SimMover:
    """The root link, the copy and the exchange as state: ``root`` is ``link`` or ``dir``; ``staging`` is
    ``absent``, ``copy`` (a real directory) or ``link`` (the old link after an exchange). ``crash_at`` raises
    :class:`SimCrash` right after that step (a SIGKILL there); ``fail_copy`` makes the copy fail."""

    root: Literal["link", "dir"] = "link"
    staging: Literal["absent", "copy", "link"] = "absent"
    digests: dict[str, str] = attrs.Factory(lambda: {"blue": A, "green": B})
    crash_at: str | None = None
    fail_copy: bool = False

    def _step(self, name: str) -> None:
        if self.crash_at == name:
            self.crash_at = None
            raise SimCrash(f"crash after {name}")

    async def copy(self, staging: str) -> dict[str, str]:
        if self.fail_copy:
            self.staging = "copy"
            raise HostError(f"{staging}: no space left on device")
        self.staging = "copy"
        self._step("copy")
        return dict(self.digests)

    async def swap(self, staging: str) -> None:
        assert (self.root, self.staging) == ("link", "copy")
        self.root, self.staging = "dir", "link"
        self._step("swap")

    def landed(self, staging: str) -> bool:
        return self.root == "dir"

    async def finish(self, staging: str) -> None:
        if self.staging == "link":
            self.staging = "absent"
        self._step("finish")

    async def undo(self, staging: str) -> None:
        if self.staging == "copy":
            self.staging = "absent"


def _world_with_both_slots_installed() -> World:
    """A host on blue (current and last-good) whose journal knows it installed blue's bytes."""
    w = World(SIM_POLICY)
    cand = make_candidate("base", GOOD)
    w.install_bare(cand)
    w.records.append(SimRecord(1, ev.SNAPSHOT_EPISODE, 0.0, _view({"blue": cand.sha256}, seq=0)))
    w.durable_records = 1
    return w


async def _move(w: World, mover: SimMover, digests: dict[str, str | None]) -> ev.UpgradeResult:
    ports = attrs.evolve(w.ports(), mover=mover)
    return await run_host_move(ports, SIM_POLICY, "m", root="/opt/upgrade-agent", legacy_root="/usr/local",
                               staging_path=STAGING, digests=digests)  # type: ignore[arg-type]


async def test_a_slot_no_episode_installed_refuses_the_move_with_nothing_journaled() -> None:
    w = _world_with_both_slots_installed()
    before = len(w.replay())
    with pytest.raises(HostMoveRefusedError, match="predates the host root"):
        await _move(w, SimMover(), {"blue": "d" * 64, "green": None})
    assert len(w.replay()) == before


def _digests(w: World) -> dict[str, str | None]:
    view = fold(w.replay())
    return {"blue": view.installed_digests.get("blue"), "green": view.installed_digests.get("green")}


async def test_a_failed_copy_is_undone_and_aborted() -> None:
    w = _world_with_both_slots_installed()
    digests = _digests(w)
    mover = SimMover(digests={k: v for k, v in digests.items() if v}, fail_copy=True)
    result = await _move(w, mover, digests)
    assert result.result == "aborted" and "no space left on device" in (result.reason or "")
    assert (mover.root, mover.staging) == ("link", "absent")


@pytest.mark.parametrize(("crash", "expected"), [
    ("journal.append#1", "aborted"), ("journal.append#2", "aborted"), ("copy", "aborted"),
    ("swap", "committed"), ("finish", "committed"), ("journal.append#3", "committed"),
    ("journal.append#4", "committed"),
])
async def test_a_crash_at_each_step_is_settled_by_recover(crash: str, expected: str) -> None:
    w = _world_with_both_slots_installed()
    installed = fold(w.replay()).installed_digests["blue"]
    mover = SimMover(digests={"blue": installed})
    if crash.startswith("journal.append#"):
        w.arm(CrashPlan(int(crash.split("#")[1]), "after", "crash", method="journal.append"))
    else:
        mover.crash_at = crash
    with pytest.raises(SimCrash):
        await _move(w, mover, {"blue": installed, "green": None})
    w.crash("crash")
    result = await recover(attrs.evolve(w.ports(), mover=mover), SIM_POLICY, "manual")
    assert result.result == expected, (crash, result)
    assert (mover.root == "dir") == (expected == "committed")
    assert mover.staging == "absent"
    view = fold(w.replay())
    assert view.open_episode is None and view.episodes["m"].kind == "host-move"

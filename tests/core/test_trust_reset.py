"""``trust reset`` in the pure core (docs/trust.md): its own episode kind, what it clears, a crash in it.

Expected, written down: only a ``trust-reset`` episode may journal ``TrustReset`` (opened -> unchanged, then
``noop``); from that record on, a watermark raise or a known-bad mark journaled before it no longer counts,
also once a snapshot (read after newer records) carries them; a crash after any of its records leaves an
episode that ``recover`` closes: before the ``TrustReset`` record nothing was cleared (``aborted``), after it
the reset holds (``noop``).
"""

from __future__ import annotations

import pytest

from upgrade_core import EpisodeContext, EpisodeState, fold, next_state, record_trust_reset, recover
from upgrade_core import _events as ev
from upgrade_core.errors import IllegalTransitionError

from ..sim.host import SIM_POLICY, CrashPlan, SimCrash, SimRecord, World, make_candidate
from .test_orchestrator import GOOD

pytestmark = pytest.mark.anyio
S = EpisodeState
SHA = "c" * 64
CLEARED = ev.TrustReset(5, (SHA,))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_only_a_trust_reset_episode_records_a_trust_reset() -> None:
    assert next_state(S.OPENED, EpisodeContext("t", kind="trust-reset"), CLEARED) is S.UNCHANGED
    with pytest.raises(IllegalTransitionError, match="TrustReset in a upgrade episode"):
        next_state(S.OPENED, EpisodeContext("op", kind="upgrade"), CLEARED)


def test_a_snapshot_read_after_a_reset_does_not_bring_back_what_it_cleared() -> None:
    """A snapshot summarising records from before the reset is read after it (it sits later in the
    journal): its raise at seq 3 and its mark at seq 4 stay cleared by the reset at seq 6."""
    older = ev.JournalFacts(
        5, raises=(ev.WatermarkRaise(3, 9),), known_bad=(ev.KnownBadMark(4, SHA, "op", "health"),)
    )
    opened = ev.EpisodeOpened("t", "trust-reset", "trust reset", None, None, "blue", "1.0", 3, 1.0, 3.0)
    noop = ev.UpgradeResult("t", "noop")
    records = [
        SimRecord(6, "t", 0.0, opened), SimRecord(7, "t", 0.0, CLEARED),
        SimRecord(8, "t", 0.0, ev.ResultPublished(noop)), SimRecord(9, "t", 0.0, ev.EpisodeClosed("noop")),
    ]
    reset_at_7 = fold([*records, SimRecord(10, ev.SNAPSHOT_EPISODE, 0.0, ev.HistorySnapshot((), older))])
    assert (reset_at_7.security_watermark, reset_at_7.known_bad) == (None, {})
    later = ev.JournalFacts(12, raises=(ev.WatermarkRaise(11, 2),))  # a commit after the reset counts
    after = fold([*records, SimRecord(10, ev.SNAPSHOT_EPISODE, 0.0, ev.HistorySnapshot((), later))])
    assert after.security_watermark == 2


@pytest.mark.parametrize("k", [1, 2, 3, 4])
async def test_a_crash_after_each_record_is_closed_by_recover(k: int) -> None:
    w = World(SIM_POLICY)
    w.install_bare(make_candidate("base", GOOD))
    w.arm(CrashPlan(k, "after", "crash", method="journal.append"))
    with pytest.raises(SimCrash):
        await record_trust_reset(w.ports(), SIM_POLICY, "t", CLEARED, current="blue", current_version="1.0")
    w.crash("crash")
    result = await recover(w.ports(), SIM_POLICY, "manual")
    assert result is not None
    view = fold(w.replay())
    assert view.open_episode is None
    assert view.result_of("t") is not None
    assert result.result == ("aborted" if k == 1 else "noop"), result
    assert view.episodes["t"].kind == "trust-reset"

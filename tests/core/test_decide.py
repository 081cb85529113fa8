"""Golden table for the recovery decision (design §4.5): every row, plus the switch-intended cases."""

from __future__ import annotations

import pytest

from upgrade_core import (
    Abort,
    CloseOnly,
    Commit,
    FinishRollback,
    HostFacts,
    NoOp,
    Plan,
    PublishAndClose,
    ResumeHealth,
    Rollback,
    UpgradeResult,
    decide,
    fold,
)
from upgrade_core import _events as ev
from upgrade_core._events import Event
from upgrade_core.ports import LinkState

from .journals import (
    CAND_SHA,
    COMMITTED,
    COMMITTED_RESULT,
    FAILED_3,
    FULL_COMMIT,
    FULL_ROLLBACK,
    HEALTHY,
    LG_SHA,
    OLD_SHA,
    OPENED,
    PRE_SWITCH,
    RB_COMMITTED,
    RB_COMMITTED_RESULT,
    RB_FAILED_3,
    RB_HEALTHY,
    RB_INTENDED,
    RB_OPENED,
    RB_REASON,
    RB_RETURNED,
    RB_RETURNED_RESULT,
    RB_RETURNING,
    RB_SWITCHED,
    RB_VERIFIED,
    ROLLBACK_REASON,
    ROLLED_BACK,
    ROLLED_BACK_RESULT,
    ROLLING_BACK,
    SWITCH_INTENDED,
    SWITCHED,
    attempt,
    records,
)

ON_BLUE = HostFacts(LinkState("blue", "blue"))
ON_GREEN = HostFacts(LinkState("green", "blue"), CAND_SHA)
ON_GREEN_OTHER_BYTES = HostFacts(LinkState("green", "blue"), OLD_SHA)
ON_GREEN_UNKNOWN = HostFacts(LinkState("green", "blue"), None)
ABORTED_RESULT = UpgradeResult("op1", "aborted", "1.0.0", "2.0.0", "blue", "verify failed")
ATTENTION = "last-good blue failed its own health check: MainPID changed"
INSTALL_OPENED = ev.EpisodeOpened("op1", "install", "file:///a", None, None, None, None, 3, 1.0, 3.0)
INSTALL_SWITCHED: list[Event] = [
    INSTALL_OPENED, ev.ArchiveFetched(1, "a" * 64), ev.CandidateStaged("blue", CAND_SHA, 1, "/s"),
    ev.CandidateVerified("2.0.0"), ev.CandidateInstalled("blue", CAND_SHA),
    ev.SwitchIntended("blue", None, None),
    ev.SwitchCommitted("blue"), ev.LastGoodRepointed("blue"),
]
OUT_REASON = "candidate unhealthy after 3 attempt(s): "
# An operator rollback: current blue (2.0.0) goes to last-good green (1.0.0); last-good never moves.
RB_ON_BLUE = HostFacts(LinkState("blue", "green"))
RB_ON_GREEN = HostFacts(LinkState("green", "green"), LG_SHA)
RB_ON_GREEN_OTHER_BYTES = HostFacts(LinkState("green", "green"), OLD_SHA)
RB_ATTENTION = f"{RB_REASON}; but the previous current blue failed its own health check: MainPID changed"
RB_ABORTED = UpgradeResult("op1", "aborted", "2.0.0", None, "blue", "last-good green: version command failed")

# (name, journal prefix, host facts, plan)
RECOVERY_CASES: list[tuple[str, list[Event], HostFacts, Plan]] = [
    # -- no open episode -> nothing
    ("empty journal", [], ON_BLUE, NoOp()),
    ("closed committed episode", FULL_COMMIT, ON_GREEN, NoOp()),
    ("closed rolled-back episode", FULL_ROLLBACK, ON_BLUE, NoOp()),
    # -- opened, never reached switch intended -> abort, links untouched
    ("opened only", [OPENED], ON_BLUE, Abort("interrupted before the switch")),
    ("fetched", PRE_SWITCH[:2], ON_BLUE, Abort("interrupted before the switch")),
    ("staged", PRE_SWITCH[:3], ON_BLUE, Abort("interrupted before the switch")),
    ("verified", PRE_SWITCH[:4], ON_BLUE, Abort("interrupted before the switch")),
    ("installed onto the slot", PRE_SWITCH, ON_BLUE, Abort("interrupted before the switch")),
    ("recovery crashed before the switch", [*PRE_SWITCH, ev.RecoveryStarted("boot")], ON_BLUE,
     Abort("interrupted before the switch")),
    # -- switch intended, not committed: look at the host; never downgrade
    ("intended, current is the candidate -> treat as switched", SWITCH_INTENDED, ON_GREEN,
     ResumeHealth(3, confirm_switch=True)),
    ("intended, current is the candidate, digest unreadable", SWITCH_INTENDED, ON_GREEN_UNKNOWN,
     ResumeHealth(3, confirm_switch=True)),
    ("intended, current still the old slot -> abort", SWITCH_INTENDED, ON_BLUE,
     Abort("interrupted before the switch took effect")),
    ("intended, candidate slot holds other bytes -> abort", SWITCH_INTENDED, ON_GREEN_OTHER_BYTES,
     Abort("interrupted before the switch took effect")),
    # -- switched, not committed: remaining attempts, then rollback
    ("switched, no attempt yet", SWITCHED, ON_GREEN, ResumeHealth(3)),
    ("switched, attempt 1 cut inside", [*SWITCHED, *attempt(1, None)], ON_GREEN,
     ResumeHealth(2, close_open_attempt=True)),
    ("switched, attempt 1 failed", [*SWITCHED, *attempt(1, "MainPID changed")], ON_GREEN, ResumeHealth(2)),
    ("switched, current moved elsewhere: still the candidate's attempts", SWITCHED, ON_BLUE, ResumeHealth(3)),
    ("switched, out of attempts -> rollback", FAILED_3, ON_GREEN, Rollback(ROLLBACK_REASON, "blue")),
    ("switched, third attempt cut inside -> rollback",
     [*SWITCHED, *attempt(1, "x"), *attempt(2, "y"), *attempt(3, None)], ON_GREEN,
     Rollback(OUT_REASON + "y", "blue", close_open_attempt=True)),
    ("health passed, commit missing -> commit", HEALTHY, ON_GREEN, Commit()),
    ("install, out of attempts: nothing to roll back to -> abort",
     [*INSTALL_SWITCHED, *attempt(1, "a"), *attempt(2, "b"), *attempt(3, "c")],
     HostFacts(LinkState("blue", "blue")), Abort(OUT_REASON + "c")),
    # -- upgrade committed, result not published -> publish and close; never roll back
    ("committed", COMMITTED, ON_GREEN,
     PublishAndClose(COMMITTED_RESULT)),
    ("committed, host shows the old slot: still no rollback", COMMITTED, ON_BLUE,
     PublishAndClose(COMMITTED_RESULT)),
    ("committed, recovery crashed twice",
     [*COMMITTED, ev.RecoveryStarted("boot"), ev.RecoveryStarted("manual")], ON_GREEN,
     PublishAndClose(COMMITTED_RESULT)),
    # -- rollback started, not rolled back -> finish idempotently
    ("rollback started", ROLLING_BACK, ON_GREEN, FinishRollback("blue", 3)),
    ("rollback started, link already flipped", ROLLING_BACK, ON_BLUE, FinishRollback("blue", 3)),
    ("rollback, last-good attempt cut inside", [*ROLLING_BACK, *attempt(1, None, "last_good")], ON_BLUE,
     FinishRollback("blue", 2, close_open_attempt=True)),
    ("rolled back, not published", ROLLED_BACK, ON_BLUE, PublishAndClose(ROLLED_BACK_RESULT)),
    ("needs attention, not published", [*ROLLING_BACK, ev.AttentionNeeded(ATTENTION)], ON_BLUE,
     PublishAndClose(UpgradeResult("op1", "needs_attention", "1.0.0", "2.0.0", "blue", ATTENTION))),
    ("aborted, not published", [*PRE_SWITCH[:4], ev.Aborted("verify failed")], ON_BLUE,
     PublishAndClose(UpgradeResult("op1", "aborted", "1.0.0", "2.0.0", "blue", "verify failed"))),
    ("unchanged candidate (noop), not published", [*PRE_SWITCH[:3], ev.CandidateUnchanged("blue", "1.0.0")],
     ON_BLUE, PublishAndClose(UpgradeResult("op1", "noop", "1.0.0", "1.0.0", "blue", None))),
    # -- an operator rollback (kind rollback) at every durable step: the same rows, the return slot is the
    #    previous current (blue), never last-good's (green)
    ("rollback: opened only", [RB_OPENED], RB_ON_BLUE, Abort("interrupted before the switch")),
    ("rollback: last-good verified", RB_VERIFIED, RB_ON_BLUE, Abort("interrupted before the switch")),
    ("rollback: intended, current is last-good's slot -> treat as switched", RB_INTENDED, RB_ON_GREEN,
     ResumeHealth(3, confirm_switch=True)),
    ("rollback: intended, current still the previous slot -> abort", RB_INTENDED, RB_ON_BLUE,
     Abort("interrupted before the switch took effect")),
    ("rollback: intended, last-good's slot holds other bytes -> abort", RB_INTENDED, RB_ON_GREEN_OTHER_BYTES,
     Abort("interrupted before the switch took effect")),
    ("rollback: switched, no attempt yet", RB_SWITCHED, RB_ON_GREEN, ResumeHealth(3)),
    ("rollback: attempt 1 cut inside", [*RB_SWITCHED, *attempt(1, None)], RB_ON_GREEN,
     ResumeHealth(2, close_open_attempt=True)),
    ("rollback: out of attempts -> back to the previous current", RB_FAILED_3, RB_ON_GREEN,
     Rollback(RB_REASON, "blue")),
    ("rollback: third attempt cut inside -> back to the previous current",
     [*RB_SWITCHED, *attempt(1, "x"), *attempt(2, "y"), *attempt(3, None)], RB_ON_GREEN,
     Rollback(RB_REASON.replace("start-limit-hit", "y"), "blue", close_open_attempt=True)),
    ("rollback: health passed, commit missing", RB_HEALTHY, RB_ON_GREEN, Commit()),
    ("rollback: committed, not published", RB_COMMITTED, RB_ON_GREEN, PublishAndClose(RB_COMMITTED_RESULT)),
    ("rollback: committed, host shows the previous slot: still no return", RB_COMMITTED, RB_ON_BLUE,
     PublishAndClose(RB_COMMITTED_RESULT)),
    ("rollback: returning started", RB_RETURNING, RB_ON_GREEN, FinishRollback("blue", 3)),
    ("rollback: returning, link already flipped", RB_RETURNING, RB_ON_BLUE, FinishRollback("blue", 3)),
    ("rollback: returning, attempt cut inside", [*RB_RETURNING, *attempt(1, None, "last_good")], RB_ON_BLUE,
     FinishRollback("blue", 2, close_open_attempt=True)),
    ("rollback: returned, not published", RB_RETURNED, RB_ON_BLUE, PublishAndClose(RB_RETURNED_RESULT)),
    ("rollback: neither healthy, not published", [*RB_RETURNING, ev.AttentionNeeded(RB_ATTENTION)],
     RB_ON_BLUE,
     PublishAndClose(UpgradeResult("op1", "needs_attention", "2.0.0", "1.0.0", "blue", RB_ATTENTION))),
    ("rollback: last-good failed its version command, not published",
     [RB_OPENED, ev.Aborted(RB_ABORTED.reason or "")], RB_ON_BLUE, PublishAndClose(RB_ABORTED)),
    ("rollback: returned and published", [*RB_RETURNED, ev.ResultPublished(RB_RETURNED_RESULT)], RB_ON_BLUE,
     CloseOnly(RB_RETURNED_RESULT)),
    # -- published, not closed -> close only
    ("published, not closed", [*COMMITTED, ev.ResultPublished(COMMITTED_RESULT)], ON_GREEN,
     CloseOnly(COMMITTED_RESULT)),
    ("aborted and published",
     [*PRE_SWITCH[:4], ev.Aborted("verify failed"), ev.ResultPublished(ABORTED_RESULT)], ON_BLUE,
     CloseOnly(ABORTED_RESULT)),
]


@pytest.mark.parametrize(
    ("name", "events", "facts", "plan"), RECOVERY_CASES, ids=[c[0] for c in RECOVERY_CASES]
)
def test_recovery_decision(name: str, events: list[Event], facts: HostFacts, plan: Plan) -> None:
    view = fold(records(events))
    assert decide(view, facts) == plan
    # Replaying twice gives the same decision (design §4.6 inv. 5).
    assert decide(fold(records(events)), facts) == plan


def test_unreadable_journal_is_an_error_naming_file_and_offset_not_a_plan() -> None:
    """design §4.5 "journal unreadable in the middle": reading raises; decide never sees it (exit 3)."""
    from upgrade_core.errors import HostError, JournalError, JournalUnreadableError

    err = JournalUnreadableError("/var/lib/upgrade-agent/a/journal/0001.seg", 4096, "bad CRC")
    assert (err.path, err.offset, err.exit_code) == ("/var/lib/upgrade-agent/a/journal/0001.seg", 4096, 3)
    assert "0001.seg" in str(err) and "4096" in str(err)
    assert isinstance(err, JournalError) and not isinstance(err, HostError)


def test_no_row_after_a_commit_ever_rolls_back() -> None:
    for name, events, _facts, _plan in RECOVERY_CASES:
        if any(isinstance(e, ev.UpgradeCommitted) for e in events):
            for facts in (ON_BLUE, ON_GREEN, ON_GREEN_OTHER_BYTES, RB_ON_BLUE, RB_ON_GREEN):
                plan = decide(fold(records(events)), facts)
                assert not isinstance(plan, Rollback | FinishRollback | Abort), name

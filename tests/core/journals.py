"""Hand-written journal prefixes for the golden tables (fold and decide)."""

from __future__ import annotations

from upgrade_core import UpgradeResult
from upgrade_core import _events as ev
from upgrade_core._events import Event

from ..sim.host import SimRecord

OP = "op1"
CAND_SHA = "c" * 64
OLD_SHA = "b" * 64

OPENED = ev.EpisodeOpened(
    operation=OP, kind="upgrade", source="https://example.invalid/a.tar.gz", expected_sha256=None,
    expected_version=None, from_slot="blue", from_version="1.0.0", max_health_attempts=3, stability_s=1.0,
    health_timeout_s=3.0,
)
PRE_SWITCH: list[Event] = [
    OPENED,
    ev.ArchiveFetched(500, "a" * 64),
    ev.CandidateStaged("green", CAND_SHA, 1000, "/R/lib/agent/.agent-green.stage-01"),
    ev.CandidateVerified("2.0.0"),
    ev.LastGoodRepointed("blue"),
    ev.CandidateInstalled("green", CAND_SHA),
]
SWITCH_INTENDED: list[Event] = [*PRE_SWITCH, ev.SwitchIntended("green", "blue", "blue")]
SWITCHED: list[Event] = [*SWITCH_INTENDED, ev.SwitchCommitted("green"), ev.MirrorsSynced(())]


def attempt(n: int, outcome: str | None, target: ev.HealthTarget = "candidate") -> list[Event]:
    """One attempt's events; ``outcome`` None (cut inside), "pass" or a failure reason."""
    events: list[Event] = [
        ev.HealthAttemptStarted(n, target),
        ev.RestartRequested(f"agent-restart-op1-{n}-000{n}", 10.0 * n),
        ev.RestartObserved(100 + n, f"{n:032x}"),
    ]
    if outcome == "pass":
        events.append(ev.HealthPassed(n, target))
    elif outcome is not None:
        events.append(ev.HealthFailed(n, outcome, target))
    return events


HEALTHY: list[Event] = [*SWITCHED, *attempt(1, "pass")]
COMMITTED: list[Event] = [*HEALTHY, ev.UpgradeCommitted("green", "2.0.0")]
COMMITTED_RESULT = UpgradeResult(OP, "committed", "1.0.0", "2.0.0", "green", None)
FAILED_3: list[Event] = [*SWITCHED, *attempt(1, "MainPID changed"), *attempt(2, "MainPID changed"),
                         *attempt(3, "start-limit-hit")]
ROLLBACK_REASON = "candidate unhealthy after 3 attempt(s): start-limit-hit"
ROLLING_BACK: list[Event] = [*FAILED_3, ev.RollbackStarted(ROLLBACK_REASON, "blue")]
ROLLED_BACK: list[Event] = [*ROLLING_BACK, *attempt(1, "pass", "last_good"), ev.RolledBack("blue")]
ROLLED_BACK_RESULT = UpgradeResult(OP, "rolled_back", "1.0.0", "2.0.0", "blue", ROLLBACK_REASON)
FULL_COMMIT: list[Event] = [*COMMITTED, ev.ResultPublished(COMMITTED_RESULT), ev.EpisodeClosed("committed")]
FULL_ROLLBACK: list[Event] = [*ROLLED_BACK, ev.ResultPublished(ROLLED_BACK_RESULT),
                              ev.EpisodeClosed("rolled_back")]


def records(events: list[Event], episode: str = OP, start: int = 1) -> list[SimRecord]:
    """Wrap events in envelopes with consecutive sequence numbers."""
    return [SimRecord(start + i, episode, 1_700_000_000.0 + i, e) for i, e in enumerate(events)]


# -- an operator rollback (docs/recovery.md): current blue runs 2.0.0, last-good green holds 1.0.0 ---------
LG_SHA = "d" * 64
RB_OPENED = ev.EpisodeOpened(
    operation=OP, kind="rollback", source="last-good green", expected_sha256=LG_SHA, expected_version=None,
    from_slot="blue", from_version="2.0.0", max_health_attempts=3, stability_s=1.0, health_timeout_s=3.0,
)
RB_VERIFIED: list[Event] = [RB_OPENED, ev.CandidateVerified("1.0.0")]
RB_INTENDED: list[Event] = [*RB_VERIFIED, ev.SwitchIntended("green", "blue", "green")]
RB_SWITCHED: list[Event] = [*RB_INTENDED, ev.SwitchCommitted("green"), ev.MirrorsSynced(())]
RB_HEALTHY: list[Event] = [*RB_SWITCHED, *attempt(1, "pass")]
RB_COMMITTED: list[Event] = [*RB_HEALTHY, ev.UpgradeCommitted("green", "1.0.0")]
RB_COMMITTED_RESULT = UpgradeResult(OP, "committed", "2.0.0", "1.0.0", "green", None)
RB_FAILED_3: list[Event] = [*RB_SWITCHED, *attempt(1, "MainPID changed"), *attempt(2, "MainPID changed"),
                            *attempt(3, "start-limit-hit")]
RB_REASON = "last-good green (1.0.0) unhealthy after 3 attempt(s): start-limit-hit; back to blue (2.0.0)"
RB_RETURNING: list[Event] = [*RB_FAILED_3, ev.RollbackStarted(RB_REASON, "blue")]
RB_RETURNED: list[Event] = [*RB_RETURNING, *attempt(1, "pass", "last_good"), ev.RolledBack("blue")]
RB_RETURNED_RESULT = UpgradeResult(OP, "rolled_back", "2.0.0", "1.0.0", "blue", RB_REASON)

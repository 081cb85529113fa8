"""upgrade-core: the pure logic of crash-safe blue/green agent upgrades (SPEC 2).

No I/O here: events, the lifecycle table, ``fold`` and ``decide``, and the async orchestrator that drives
the ports of :mod:`upgrade_core.ports`.
"""

from ._decide import (
    Abort,
    CloseOnly,
    Commit,
    FinishRollback,
    HostFacts,
    NeedsAttention,
    NoOp,
    Plan,
    PublishAndClose,
    ResumeHealth,
    Rollback,
    UnreadableJournal,
    decide,
)
from ._events import *  # noqa: F403
from ._events import ALL_EVENTS, SLOTS, Event, Recorded, Slot, UpgradeResult, other_slot
from ._fold import EpisodeView, Folder, JournalView, fold
from ._health import Expectation, Failed, HealthJudge, Passed, Pending, Verdict
from ._history import summarize_history
from ._orchestrator import (
    Policy,
    Ports,
    RestartScheduled,
    ResumeOutcome,
    UpgradeRequest,
    recover,
    resume_self_upgrade,
    run_install,
    run_upgrade,
    self_upgrade_prepare,
)
from ._state import TRANSITIONS, EpisodeState, advance, diagram_mermaid
from .codec import EVENT_CODEC, EventCodec, EventDecodeError

__all__ = [
    "ALL_EVENTS",
    "EVENT_CODEC",
    "SLOTS",
    "TRANSITIONS",
    "Abort",
    "CloseOnly",
    "Commit",
    "EpisodeState",
    "EpisodeView",
    "Event",
    "EventCodec",
    "EventDecodeError",
    "Expectation",
    "Failed",
    "FinishRollback",
    "Folder",
    "HealthJudge",
    "HostFacts",
    "JournalView",
    "NeedsAttention",
    "NoOp",
    "Passed",
    "Pending",
    "Plan",
    "Policy",
    "Ports",
    "PublishAndClose",
    "Recorded",
    "RestartScheduled",
    "ResumeHealth",
    "ResumeOutcome",
    "Rollback",
    "Slot",
    "UnreadableJournal",
    "UpgradeRequest",
    "UpgradeResult",
    "Verdict",
    "advance",
    "decide",
    "diagram_mermaid",
    "fold",
    "other_slot",
    "recover",
    "resume_self_upgrade",
    "run_install",
    "run_upgrade",
    "self_upgrade_prepare",
    "summarize_history",
]

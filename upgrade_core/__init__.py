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
    NoOp,
    Plan,
    PublishAndClose,
    ResumeHealth,
    Rollback,
    decide,
)
from ._events import *  # noqa: F403
from ._events import ALL_EVENTS, SLOTS, Event, Recorded, Slot, UpgradeResult, other_slot
from ._fold import EpisodeView, Folder, JournalView, fold
from ._health import Expectation, Failed, HealthJudge, Passed, Pending, Verdict
from ._history import summarize_history
from ._orchestrator import (
    OPERATION_ID_RE,
    CheckedJournal,
    HandedOff,
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
from ._state import TRANSITIONS, EpisodeContext, EpisodeState, advance, diagram_mermaid, next_state
from .codec import EVENT_CODEC, EventCodec, EventDecodeError

__all__ = [
    "ALL_EVENTS",
    "EVENT_CODEC",
    "OPERATION_ID_RE",
    "SLOTS",
    "TRANSITIONS",
    "Abort",
    "CheckedJournal",
    "CloseOnly",
    "Commit",
    "EpisodeContext",
    "EpisodeState",
    "EpisodeView",
    "Event",
    "EventCodec",
    "EventDecodeError",
    "Expectation",
    "Failed",
    "FinishRollback",
    "Folder",
    "HandedOff",
    "HealthJudge",
    "HostFacts",
    "JournalView",
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
    "UpgradeRequest",
    "UpgradeResult",
    "Verdict",
    "advance",
    "decide",
    "diagram_mermaid",
    "fold",
    "next_state",
    "other_slot",
    "recover",
    "resume_self_upgrade",
    "run_install",
    "run_upgrade",
    "self_upgrade_prepare",
    "summarize_history",
]

"""The eager surface of :mod:`upgrade_core`, loaded on the first use of one of its names (see the package
docstring): importing :mod:`upgrade_core.wire` alone must not load attrs, cattrs or transitions."""

# ruff: noqa: F401
from ._decide import (
    Abort,
    CheckLeftStopped,
    CloseOnly,
    Commit,
    FinishRollback,
    HostFacts,
    LeaveStopped,
    NoOp,
    Plan,
    PublishAndClose,
    ResumeHealth,
    Rollback,
    SettleHostMove,
    decide,
)
from ._events import *  # noqa: F403
from ._events import ALL_EVENTS, SLOTS, Event, Recorded, Slot, UpgradeResult, other_slot
from ._executor import CheckedJournal
from ._flow_types import OPERATION_ID_RE, HandedOff, Policy, RestartScheduled, ResumeOutcome, UpgradeRequest
from ._flows import (
    record_quarantine,
    record_trust_reset,
    recover,
    resume_self_upgrade,
    rollback_target,
    run_activate,
    run_host_move,
    run_install,
    run_rollback,
    run_upgrade,
    self_upgrade_prepare,
)
from ._fold import EpisodeView, Folder, JournalView, LeftStoppedCandidate, PendingActivation, fold
from ._health import Expectation, Failed, HealthJudge, Passed, Pending, Verdict
from ._history import summarize_history
from ._hostmove import move_refusal
from ._operations import (
    PHASE_OF_RESULT,
    TERMINAL_PHASES,
    OperationPhase,
    OperationStatus,
    OperationStep,
    operation_status,
    refused_status,
    waiting_status,
    window_waiting_status,
)
from ._state import TRANSITIONS, EpisodeContext, EpisodeState, advance, diagram_mermaid, next_state
from ._watermark import release_refusal, rollback_refusal
from ._window import WindowVerdict, host_delay_s, window_verdict
from .codec import EVENT_CODEC, EventCodec, EventDecodeError
from .ports import Ports

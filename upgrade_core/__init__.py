"""upgrade-core: the pure logic of crash-safe blue/green agent upgrades (design §2).

No I/O here: events, the lifecycle table, ``fold`` and ``decide``, and the async orchestrator that drives
the ports of :mod:`upgrade_core.ports`.
"""

# Lazy (PEP 562), like ``journal``: the boot-time no-op recovery (design §9 ``recover.noop``) reads one tag
# with :mod:`upgrade_core.wire`, and importing any submodule runs this file first; loading attrs, cattrs
# and transitions here would cost it ~90 ms. The public names are those of :mod:`upgrade_core._api`.
# Not ``typing.TYPE_CHECKING``: importing typing costs several ms at boot (mypy treats this name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._api import *  # noqa: F403
# ruff: noqa: F405

__all__ = [
    "ALL_EVENTS",
    "EVENT_CODEC",
    "OPERATION_ID_RE",
    "PHASE_OF_RESULT",
    "SLOTS",
    "TERMINAL_PHASES",
    "TRANSITIONS",
    "Abort",
    "CheckLeftStopped",
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
    "LeaveStopped",
    "LeftStoppedCandidate",
    "NoOp",
    "OperationPhase",
    "OperationStatus",
    "OperationStep",
    "Passed",
    "Pending",
    "PendingActivation",
    "Plan",
    "Policy",
    "Ports",
    "PublishAndClose",
    "Recorded",
    "RestartScheduled",
    "ResumeHealth",
    "ResumeOutcome",
    "Rollback",
    "SettleHostMove",
    "Slot",
    "UpgradeRequest",
    "UpgradeResult",
    "Verdict",
    "WindowVerdict",
    "advance",
    "decide",
    "diagram_mermaid",
    "fold",
    "host_delay_s",
    "move_refusal",
    "next_state",
    "operation_status",
    "other_slot",
    "record_quarantine",
    "record_trust_reset",
    "recover",
    "refused_status",
    "release_refusal",
    "resume_self_upgrade",
    "rollback_refusal",
    "rollback_target",
    "run_activate",
    "run_host_move",
    "run_install",
    "run_rollback",
    "run_upgrade",
    "self_upgrade_prepare",
    "summarize_history",
    "waiting_status",
    "window_verdict",
    "window_waiting_status",
]


def __getattr__(name: str) -> object:
    # A name starting with "_" never loads the API: dunder probes (copy, pickle, importlib), and
    # ``from . import _events`` asking for a private submodule not imported yet, which must then fall back
    # to the import system (loading ``_api`` there imported ``_fold`` inside its own import: ImportError).
    if name.startswith("_"):
        raise AttributeError(f"module 'upgrade_core' has no attribute {name!r}")
    import importlib

    _api = importlib.import_module("upgrade_core._api")
    try:
        value = getattr(_api, name)
    except AttributeError:
        raise AttributeError(f"module 'upgrade_core' has no attribute {name!r}") from None
    globals()[name] = value
    return value

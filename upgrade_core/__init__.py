"""upgrade-core: the pure logic of crash-safe blue/green agent upgrades (SPEC 2).

No I/O here: events, the lifecycle table, ``fold`` and ``decide``, and the async orchestrator that drives
the ports of :mod:`upgrade_core.ports`.
"""

from ._events import *  # noqa: F403
from ._events import ALL_EVENTS, SLOTS, Event, Recorded, Slot, UpgradeResult, other_slot
from .codec import EVENT_CODEC, EventCodec, EventDecodeError

__all__ = [
    "ALL_EVENTS",
    "EVENT_CODEC",
    "SLOTS",
    "Event",
    "EventCodec",
    "EventDecodeError",
    "Recorded",
    "Slot",
    "UpgradeResult",
    "other_slot",
]

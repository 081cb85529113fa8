"""journal: an append-only, framed, checksummed, fsynced record log (design §5).

Readers call :func:`replay` (sync, no event loop, never writes). The host-lock holder opens a
:class:`JournalWriter` (async, anyio). The journal knows nothing of upgrade events: the caller supplies a
:class:`Codec`.

Imports are lazy (PEP 562) so that ``from journal import replay`` loads neither anyio nor zstandard, and
``import journal`` loads neither typing nor attrs: a boot-time recovery with nothing to do must start fast
(design §9, ``recover.noop``). :func:`scan` gives the validated, undecoded records (codec bytes) with no
attrs at all, for a caller that only needs to look at the tail; :func:`live_tail` gives just the newest
episode record's payload (or :data:`UNSURE`), for the boot-time no-op recovery.
"""

from __future__ import annotations

from ._reader import UNSURE, Scan, live_tail, read_owner, replay, salvage, scan
from .errors import (
    JournalBusyError,
    JournalClosedError,
    JournalCorruptError,
    JournalDecodeError,
    JournalFullError,
    JournalOwnerError,
    JournalPoisonedError,
    JournalRefusedError,
    JournalStoreError,
    JournalVersionError,
)

# Not ``typing.TYPE_CHECKING``: importing typing costs several ms at boot (mypy treats this name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._framing import encode_records
    from ._records import SNAPSHOT_EPISODE, Codec, Record, Replay, TornTail
    from ._writer import CompactStats, JournalWriter

__all__ = [
    "SNAPSHOT_EPISODE",
    "UNSURE",
    "Codec",
    "CompactStats",
    "JournalBusyError",
    "JournalClosedError",
    "JournalCorruptError",
    "JournalDecodeError",
    "JournalFullError",
    "JournalOwnerError",
    "JournalPoisonedError",
    "JournalRefusedError",
    "JournalStoreError",
    "JournalVersionError",
    "JournalWriter",
    "Record",
    "Replay",
    "Scan",
    "TornTail",
    "encode_records",
    "live_tail",
    "read_owner",
    "replay",
    "salvage",
    "scan",
]

_LAZY = {
    "encode_records": "_framing",
    "SNAPSHOT_EPISODE": "_records",
    "Codec": "_records",
    "Record": "_records",
    "Replay": "_records",
    "TornTail": "_records",
    "CompactStats": "_writer",
    "JournalWriter": "_writer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'journal' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"journal.{module}"), name)
    globals()[name] = value
    return value

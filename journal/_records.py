"""The values the journal hands back: :class:`Record`, :class:`TornTail`, :class:`Replay`, :class:`Codec`."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import attrs

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

SNAPSHOT_EPISODE = "-"
"""The episode id of snapshot records written by ``JournalWriter.compact``; reserved."""


class Codec(Protocol[T]):
    """Turns the caller's events into bytes and back; supplied by the caller (the journal knows no event).

    ``decode`` may raise anything on bad bytes; the journal wraps it in ``JournalDecodeError(path, offset)``.
    """

    def encode(self, event: T, /) -> bytes:
        """Serialise ``event``."""
        ...

    def decode(self, data: bytes, /) -> T:
        """Deserialise bytes written by :meth:`encode`; raise on an unknown tag, never drop."""
        ...


@attrs.frozen
class Record(Generic[T]):
    """One durable record.

    Attributes:
        seq: sequence number, +1 per record across all segments, monotonic even after sealing and
            dropping; the only order.
        episode_id: the episode the event belongs to (``"-"`` for a compaction snapshot).
        wall_time: Unix seconds at append; informational only.
        event: the decoded event.
    """

    seq: int
    episode_id: str
    wall_time: float
    event: T


@attrs.frozen
class TornTail:
    """A torn write found at the end of the last live segment (reported, not raised; design §5).

    Attributes:
        file: absolute path of the segment.
        offset: byte offset where the valid prefix ends; the writer truncates the file here.
    """

    file: str
    offset: int


@attrs.frozen
class Replay(Generic[T]):
    """The durable history of a journal directory.

    Attributes:
        records: every visible record in sequence order (records summarised by a snapshot are hidden).
        torn_tail: the torn write at the end of the last segment, or None.
    """

    records: list[Record[T]]
    torn_tail: TornTail | None

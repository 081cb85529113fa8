"""Test support for journal tests: a small event vocabulary and codec of its own (the journal knows no
upgrade event), plus helpers to build journals with the real writer and to locate frames in a segment."""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Sequence
from typing import Any

import anyio
import attrs

from journal import JournalWriter, Record
from journal._framing import SEGMENT_HEADER_SIZE, frame_size


@attrs.frozen
class Opened:
    name: str


@attrs.frozen
class Noted:
    n: int
    text: str


@attrs.frozen
class Closed:
    pass


@attrs.frozen
class Summary:
    episodes: tuple[str, ...]
    records: int


SmallEvent = Opened | Noted | Closed | Summary
_TAGS: dict[str, type[Any]] = {"O": Opened, "N": Noted, "C": Closed, "S": Summary}
_BY_CLASS = {cls: tag for tag, cls in _TAGS.items()}


class SmallCodec:
    """``<tag>`` + compact JSON of the fields; an unknown tag raises KeyError (never dropped)."""

    def encode(self, event: SmallEvent) -> bytes:
        fields = attrs.asdict(event)
        if isinstance(event, Summary):
            fields["episodes"] = list(event.episodes)
        return _BY_CLASS[type(event)].encode() + json.dumps(fields, separators=(",", ":")).encode()

    def decode(self, data: bytes) -> SmallEvent:
        cls = _TAGS[data[:1].decode()]
        fields = json.loads(data[1:])
        if cls is Summary:
            fields["episodes"] = tuple(fields["episodes"])
        return cls(**fields)


CODEC = SmallCodec()


def summarize(records: Sequence[Record[SmallEvent]]) -> SmallEvent:
    """A compaction summary: the episode ids it covers (older summaries folded in) and a record count."""
    episodes: list[str] = []
    count = 0
    for r in records:
        if isinstance(r.event, Summary):
            episodes.extend(r.event.episodes)
            count += r.event.records
        else:
            count += 1
            if r.episode_id not in episodes:
                episodes.append(r.episode_id)
    return Summary(tuple(episodes), count)


async def write_journal(directory: str, items: Sequence[tuple[str, SmallEvent]]) -> list[Record[SmallEvent]]:
    """Append ``items`` one by one with the real writer and close it; returns the durable records."""
    out = []
    async with await JournalWriter.open(directory, CODEC, wall_clock=lambda: 1_700_000_000.5) as w:
        for episode_id, event in items:
            out.append(await w.append(episode_id, event))
    return out


def build_journal(directory: str, items: Sequence[tuple[str, SmallEvent]]) -> list[Record[SmallEvent]]:
    """Sync wrapper of :func:`write_journal` (for hypothesis tests, which are not anyio tests)."""
    return anyio.run(write_journal, directory, items)


def frame_bounds(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each frame of an intact segment, padding included, from the length fields."""
    out = []
    pos = SEGMENT_HEADER_SIZE
    while pos < len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        end = pos + frame_size(length)
        out.append((pos, end))
        pos = end
    return out


def only_segment(directory: str) -> str:
    """Path of the single segment file of ``directory``."""
    names = sorted(os.listdir(directory))
    assert len(names) == 1, names
    return os.path.join(directory, names[0])


def visible(records: Sequence[Record[Any]]) -> list[tuple[int, str, Any]]:
    """Comparable form of records (seq, episode id, event)."""
    return [(r.seq, r.episode_id, r.event) for r in records]


async def wait_for(condition, what: str, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Poll ``condition()`` every millisecond on the event loop; fail after ``timeout_s`` seconds naming
    ``what``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await anyio.sleep(0.001)

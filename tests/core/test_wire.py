"""The boot path's stdlib-only look at the newest journal record (upgrade_core/wire.py
``surely_closes``): True exactly for the codec's own ``EpisodeClosed`` bytes, and never for another event
or a look-alike."""

from __future__ import annotations

import json

import pytest

from upgrade_core import EVENT_CODEC, UpgradeResult
from upgrade_core import _events as ev
from upgrade_core.wire import event_tag, surely_closes


@pytest.mark.parametrize("result", ["committed", "rolled_back", "aborted", "needs_attention"])
def test_the_codecs_episode_closed_is_recognised(result: str) -> None:
    data = EVENT_CODEC.encode(ev.EpisodeClosed(result))  # type: ignore[arg-type]
    assert surely_closes(data)
    assert event_tag(data) == "EpisodeClosed"


@pytest.mark.parametrize(
    "event",
    [ev.CandidateVerified("1.0.0"), ev.HealthPassed(1), ev.SwitchCommitted("green"),
     ev.ResultPublished(UpgradeResult("op", "committed", "1", "2", "green", None))],
)
def test_other_events_are_not(event: ev.Event) -> None:
    assert not surely_closes(EVENT_CODEC.encode(event))


@pytest.mark.parametrize(
    "payload",
    [
        b'{"_type":"EpisodeClosed","result":"committed"}',  # another member order: decode it properly
        b'{"result":"committed","_v":2,"_type":"EpisodeClosed"}'[:-1] + b',"x":1}',
        b'{"result":"x\\",\\"_type\\":\\"EpisodeClosed\\"}',  # an escaped look-alike inside a string
        b'{"_type":"HealthPassed","result":"committed","_type":"EpisodeClosed"}',  # two tags
        b'["result","_type":"EpisodeClosed"}',
        b"",
    ],
)
def test_look_alikes_and_other_forms_are_left_to_the_decoder(payload: bytes) -> None:
    assert not surely_closes(payload)


def test_an_escape_anywhere_is_left_to_the_decoder() -> None:
    data = json.dumps({"result": "comm\u00e9tted", "_type": "EpisodeClosed"}, separators=(",", ":")).encode()
    assert b"\\" in data and not surely_closes(data)

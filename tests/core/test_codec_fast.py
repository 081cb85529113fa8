"""The codec's fast decoding path (design §9 ``journal.replay``) against the cattrs hooks it stands in
for: same events, same refusals, same value types; the JSON the fast parser refuses goes to the standard
one."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from upgrade_core import EVENT_CODEC, EventDecodeError, UpgradeResult, codec
from upgrade_core import _events as ev

from .journals import FULL_COMMIT, FULL_ROLLBACK

SUMMARY = ev.EpisodeSummary(
    "op0", UpgradeResult("op0", "committed", "1", "2", "green", None), 1.5, 2.5, "a" * 64
)
EVENTS: list[ev.Event] = [
    *FULL_COMMIT,
    *FULL_ROLLBACK,
    ev.CandidateUnchanged("blue", None),
    ev.MirrorsSynced(("/opt/a", "/opt/b")),
    ev.HealthFailed(2, "probe failed", "candidate", "environment"),
    ev.Aborted("bad version", "verification"),
    ev.RecoveryStarted("boot"),
    ev.ReleaseTrusted("0123456789ABCDEF", "agent", "2.0.0", 7),
    ev.HistorySnapshot((SUMMARY,)),
    ev.StagedForActivation("green", "c" * 64, "2.0.0", "a" * 64),
    ev.StagedCandidateChecked("op0", "green", "c" * 64, "f" * 64, "2.0.0"),
    ev.UnitFoundStopped("inactive", "dead"),
    ev.LeftStopped("green"),
]


def _cattrs(payload: bytes) -> ev.Event:
    data = json.loads(payload)
    tag = data.pop("_type")
    cls = codec._BY_TAG[tag]
    return codec._converter.get_structure_hook(cls)(data, cls)  # type: ignore[no-any-return]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.TAG)
def test_fast_path_decodes_what_cattrs_decodes(event: ev.Event) -> None:
    payload = EVENT_CODEC.encode(event)
    fast = EVENT_CODEC.decode(payload)
    assert fast == _cattrs(payload) == event
    assert type(fast) is type(event)


def test_every_event_but_the_snapshot_has_a_fast_structurer() -> None:
    assert {tag for tag in codec._BY_TAG if codec._fast(tag) is None} == {"HistorySnapshot"}


def test_an_integer_in_a_float_field_decodes_as_the_float_cattrs_gives() -> None:
    payload = b'{"unit":"u","requested_monotonic":12,"_type":"RestartRequested"}'
    event = EVENT_CODEC.decode(payload)
    assert event == _cattrs(payload)
    assert type(event.requested_monotonic) is float  # type: ignore[attr-defined]


@pytest.mark.parametrize(("payload", "message"), [
    (b'{"_type":"SwitchCommitted","slot":"purple"}', "does not fit"),  # a Literal field's value
    (b'{"_type":"HealthPassed","attempt":1,"target":"elsewhere"}', "does not fit"),
    (b'{"_type":"Aborted","reason":"x","cause":"gremlins"}', "does not fit"),
    (b'{"_type":"ArchiveFetched","size":1}', "does not fit"),  # a required field missing
    (b'{"_type":"ResultPublished","result":"committed"}', "does not fit"),  # not an object
    (b'{"_type":["SwitchCommitted"],"slot":"blue"}', "unknown event tag"),
    (b'{"_type":"SwitchCommitted","_v":2,"slot":"blue"}', "payload version 2"),
    (b"", "not JSON"),
])
def test_fast_path_refuses_what_does_not_fit(payload: bytes, message: str) -> None:
    with pytest.raises(EventDecodeError, match=message):
        EVENT_CODEC.decode(payload)


@pytest.mark.parametrize(("payload", "field", "value"), [
    (b'{"_type":"ArchiveFetched","size":18446744073709551616,"sha256":"a"}', "size", 2**64),
    (b'{"_type":"CandidateVerified","version":"\\ud800"}', "version", "\ud800"),
])
def test_json_the_fast_parser_refuses_is_read_by_the_standard_one(
    payload: bytes, field: str, value: Any
) -> None:
    assert getattr(EVENT_CODEC.decode(payload), field) == value


def test_encoding_keeps_the_standard_serialisers_bytes() -> None:
    for event in EVENTS:
        expected = json.dumps(codec.to_dict(event), separators=(",", ":"), ensure_ascii=False).encode()
        assert EVENT_CODEC.encode(event) == expected


_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**65), st.floats(allow_nan=False), st.text(max_size=3),
    st.sampled_from(["blue", "green", "candidate", "last_good", "environment", "verification"]),
)


@st.composite
def _field_dicts(draw: st.DrawFn) -> tuple[type, dict[str, Any]]:
    """An event class and a dict of some of its field names (every field, exactly the required ones, as
    many keys as required fields with an optional one in a required one's place, or any subset) to values
    of any JSON type."""
    cls = draw(st.sampled_from(sorted(codec._BY_TAG.values(), key=lambda c: c.TAG)))
    names = [a.name for a in attrs.fields(cls)]
    required = [a.name for a in attrs.fields(cls) if a.default is attrs.NOTHING]
    optional = [n for n in names if n not in required]
    keys = draw(st.one_of(
        st.just(names), st.just(required), st.lists(st.sampled_from(names), unique=True),
        st.permutations(required).map(lambda r: r[1:] + optional[:1]),
    ))
    return cls, {key: draw(st.one_of(_SCALAR, st.lists(_SCALAR, max_size=3))) for key in keys}


def _outcome(make: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        event = make()
    except Exception as exc:  # the comparison is of what each call raises
        return ("refused", type(exc).__name__, str(exc))
    return ("made", event, tuple(type(getattr(event, a.name)) for a in attrs.fields(type(event))))


@settings(max_examples=400, deadline=None)
@given(case=_field_dicts())
def test_positional_construction_is_the_keyword_call(case: tuple[type, dict[str, Any]]) -> None:
    """The structurers' positional call makes what ``cls(**data)`` makes, and raises what it
    raises, for any dict of known field names: values in the right slots whatever the dict's key order."""
    cls, data = case
    n_all, take_all, build = codec._constructor(cls)
    expected = _outcome(lambda: cls(**data))
    assert _outcome(lambda: build(dict(data))) == expected
    if len(data) == n_all:
        assert _outcome(lambda: cls(*take_all(data))) == expected


def test_a_class_whose_init_takes_its_fields_in_another_order_is_built_by_keyword() -> None:
    @attrs.frozen(init=False)
    class Swapped:
        a: int
        b: str

        def __init__(self, b: str, a: int) -> None:
            self.__attrs_init__(a, b)

    n_all, _take_all, build = codec._constructor(Swapped)
    assert n_all == -1
    assert build({"a": 1, "b": "x"}) == Swapped(b="x", a=1)
    n_all, _take_all, _build = codec._constructor(ev.Aborted)
    assert n_all == len(attrs.fields(ev.Aborted))


@attrs.frozen
class _KwOnly:
    a: int
    b: str = attrs.field(kw_only=True)


@attrs.frozen
class _NotInInit:
    a: int
    b: str = attrs.field(init=False, default="fixed")


@attrs.frozen
class _Aliased:
    a: int
    _b: str


@pytest.mark.parametrize(
    ("cls", "data"),
    [(_KwOnly, {"a": 1, "b": "x"}), (_NotInInit, {"a": 1}), (_Aliased, {"a": 1, "b": "x"})],
    ids=["kw_only", "init=False", "alias"],
)
def test_a_class_the_positional_call_cannot_serve_is_built_by_keyword(
    cls: type, data: dict[str, Any]
) -> None:
    n_all, _take_all, build = codec._constructor(cls)
    assert n_all == -1
    assert build(dict(data)) == cls(**data)


def test_attrs_refuses_a_required_field_after_a_defaulted_one() -> None:
    """What ``_constructor`` relies on for its required-fields-only call: the required fields come first."""
    with pytest.raises(ValueError, match="No mandatory attributes allowed after"):
        @attrs.frozen(init=False)
        class _OptionalFirst:
            a: int = 0
            b: str

            def __init__(self, a: int, b: str) -> None:
                self.__attrs_init__(a, b)

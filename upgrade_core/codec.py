"""Event (de)serialisation for the journal: a cattrs tagged union over :data:`ALL_EVENTS` (design §2).

Wire form (:mod:`upgrade_core.wire`, which also gives the stdlib-only :func:`event_tag`): compact JSON
of ``{"_type": TAG, **fields}`` (UTF-8), plus ``"_v": N`` when the class's ``VERSION`` is above 1.
Tags are the classes' stable ``TAG`` strings, pinned by ``tests/test_codec.py``.
An unknown tag or a payload that does not fit its class raises :class:`EventDecodeError`; nothing is
dropped. A payload written with a newer ``_v`` than this code knows is refused the same way.

Speed (design §9 ``journal.replay``): decoding parses with ``orjson`` (falling back to the standard
library's parser for whatever it refuses, so the accepted inputs and results are the standard parser's) and
structures through one constructor per event class, built once at import from the class's fields
(:func:`_fast_structurer`). Encoding keeps the standard library's serialiser, so the bytes on disk are the
ones this codec has always written.
"""

from __future__ import annotations

import functools
import json
import operator
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import attrs
import cattrs
import orjson
from cattrs.gen import make_dict_unstructure_fn, override

from ._events import (
    ALL_EVENTS,
    Aborted,
    ArchiveFetched,
    EpisodeOpened,
    EpisodeSummary,
    Event,
    HealthFailed,
    HistorySnapshot,
    LeftStoppedCandidate,
    SlotVersion,
    StagedForActivation,
    StagedSummary,
)
from .wire import TAG_KEY as _TAG
from .wire import VERSION_KEY as _VER
from .wire import event_tag

__all__ = ["EVENT_CODEC", "EventCodec", "EventDecodeError", "event_tag", "from_dict", "to_dict"]



class EventDecodeError(ValueError):
    """A journal payload is not a known event (unknown tag, bad shape, or a newer payload version)."""


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    # Fields added after journals were written are omitted while they hold their default: a value without
    # them encodes to the bytes it always did, and old payloads (which lack them) decode to the default.
    omit = override(omit_if_default=True)
    conv.register_unstructure_hook(
        EpisodeSummary,
        make_dict_unstructure_fn(
            EpisodeSummary, conv, security_version=omit, known_bad=omit, opened_seq=omit, published_seq=omit,
            boot_id=omit, kind=omit,
        ),
    )
    for staged in (StagedForActivation, StagedSummary):  # before HistorySnapshot, which nests StagedSummary
        conv.register_unstructure_hook(staged, make_dict_unstructure_fn(staged, conv, switch_in_window=omit))
    conv.register_unstructure_hook(
        LeftStoppedCandidate, make_dict_unstructure_fn(LeftStoppedCandidate, conv, changed=omit)
    )
    conv.register_unstructure_hook(SlotVersion, make_dict_unstructure_fn(SlotVersion, conv, sha256=omit))
    conv.register_unstructure_hook(
        HistorySnapshot,
        make_dict_unstructure_fn(HistorySnapshot, conv, facts=omit, staged=omit, left_stopped=omit),
    )
    conv.register_unstructure_hook(HealthFailed, make_dict_unstructure_fn(HealthFailed, conv, cause=omit))
    conv.register_unstructure_hook(Aborted, make_dict_unstructure_fn(Aborted, conv, cause=omit))
    conv.register_unstructure_hook(
        ArchiveFetched, make_dict_unstructure_fn(ArchiveFetched, conv, delta_refused=omit)
    )
    conv.register_unstructure_hook(
        EpisodeOpened, make_dict_unstructure_fn(EpisodeOpened, conv, boot_id=omit, below_watermark=omit)
    )
    return conv


_converter = _make_converter()
_BY_TAG: dict[str, type[Event]] = {cls.TAG: cls for cls in ALL_EVENTS}
# Each class's cattrs hooks are asked of the converter when the class is first encoded or decoded, not made
# here for every event: cattrs generates and compiles a function per class (made for all of them at import
# they cost each command's start about 15 ms, design §9 upgrade.end_to_end, where an episode uses a dozen),
# and the converter keeps what it made (``get_structure_hook``/``get_unstructure_hook`` return the same
# function again, about 0.14 us a call).
# Upcasters: (TAG, from_version) -> function mapping the old field dict to the next version's dict.
UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}


class _Unfit(ValueError):
    """A payload's fields do not fit its class (raised by the fast structurers)."""


_SCALARS = (str, int, bool, types.NoneType)
_ABSENT = object()  # a field the payload leaves out


def _fast_structurer(cls: type) -> Callable[[dict[str, Any]], Any] | None:
    """A constructor for ``cls`` from its field dict (which it may change), or None when a field's type is
    not one it handles (the cattrs hook is used then).

    Why not the cattrs hook: replay structures every record of the journal, and the generated cattrs
    function costs about 2.5 times ``cls(**fields)`` here (per-field hook calls that convert values which
    already have their type, and error bookkeeping); this keeps only what our own encoder's output needs
    and what guards the state machine. It checks what the cattrs hook checks for our encoder's output: no
    unknown key, every required field present, each ``Literal`` field one of its values; it converts what
    the cattrs hook converts: a JSON integer in a ``float`` field to a float, a list to a tuple, a nested
    attrs class (recursively, the same way). It does not re-check the JSON type of ``str``/``int``/``bool``
    fields: the frame CRC guarantees the bytes are the ones our typed encoder wrote.
    """
    hints = typing.get_type_hints(cls)
    names = frozenset(a.name for a in attrs.fields(cls))
    if any(a.alias != a.name for a in attrs.fields(cls)):
        return None
    literals: list[tuple[str, frozenset[Any]]] = []
    floats: list[str] = []
    tuples: list[str] = []
    nested: list[tuple[str, Callable[[dict[str, Any]], Any]]] = []
    for name in sorted(names):
        hint = hints[name]
        args: tuple[Any, ...] = (hint,)
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = typing.get_args(hint)
        inner = [a for a in args if a is not types.NoneType]
        if len(inner) != 1:
            return None
        (kind,) = inner
        origin = typing.get_origin(kind)
        if origin is Literal:
            allowed = {*typing.get_args(kind), _ABSENT}  # absent: the default applies, or cls() refuses
            if len(args) > 1:
                allowed.add(None)
            literals.append((name, frozenset(allowed)))
        elif kind is float:
            floats.append(name)
        elif origin is tuple and typing.get_args(kind)[1:] == (...,) and typing.get_args(kind)[0] in _SCALARS:
            tuples.append(name)
        elif attrs.has(kind):
            sub = _fast_structurer(kind)
            if sub is None:
                return None
            nested.append((name, sub))
        elif kind not in _SCALARS:
            return None

    # The common case inline (every field present: positional, see _constructor), the rest through it.
    n_all, take_all, build = _constructor(cls)

    if not (literals or floats or tuples or nested):

        def plain(data: dict[str, Any]) -> Any:
            if not names.issuperset(data):
                raise _Unfit(f"unknown fields {sorted(set(data) - names)}")
            if len(data) == n_all:
                return cls(*take_all(data))
            return build(data)

        return plain

    def structure(data: dict[str, Any]) -> Any:
        if not names.issuperset(data):
            raise _Unfit(f"unknown fields {sorted(set(data) - names)}")
        for name, allowed in literals:
            if data.get(name, _ABSENT) not in allowed:
                raise _Unfit(f"{name}={data[name]!r} is not one of {sorted(map(repr, allowed - {_ABSENT}))}")
        for name in floats:
            if type(data.get(name)) is int:
                data[name] = float(data[name])
        for name in tuples:
            value = data.get(name)
            if type(value) is list:
                data[name] = tuple(value)
        for name, sub in nested:
            value = data.get(name)
            if type(value) is dict:
                data[name] = sub(value)
            elif value is not None:
                raise _Unfit(f"{name} is not an object")
        if len(data) == n_all:
            return cls(*take_all(data))
        return build(data)

    return structure


def _constructor(
    cls: type,
) -> tuple[int, Callable[[dict[str, Any]], tuple[Any, ...]], Callable[[dict[str, Any]], Any]]:
    """``cls(**data)`` for a field dict holding no unknown key (the caller checked), passing the values
    positionally when the dict holds every field of ``cls`` or exactly its required ones.

    Returns ``(n, take, build)``: when ``len(data) == n``, ``cls(*take(data))`` is the call (the caller makes
    it inline: one Python call less per event); ``build(data)`` makes the call for any dict.

    Why: the keys of a parsed JSON object are not interned, so a keyword call matches each of them against
    the parameter names by comparing strings (about 0.2 us per event). Positionally the call is
    the same one: every field is an ``__init__`` parameter of its own name, in field order (checked here on
    the class's actual ``__init__``, else the keyword call is always used). Any other dict (some defaulted
    fields left out) takes the keyword call, which also raises the errors it always raised (a required field
    missing).
    """
    fields = attrs.fields(cls)
    required = [a.name for a in fields if a.default is attrs.NOTHING]
    n_required = len(required)
    # The positional parameters of the __init__ the class really has (attrs' own, or one written by hand):
    # a field left out of it (init=False), keyword-only or renamed (an alias) makes them differ. When they
    # match, the required fields come first: attrs refuses a mandatory positional field after a defaulted
    # one, even with a hand-written __init__.
    code = getattr(getattr(cls, "__init__", None), "__code__", None)
    params = code.co_varnames[1 : code.co_argcount] if code is not None else None
    if params != tuple(a.name for a in fields):
        return -1, _take(()), lambda data: cls(**data)  # -1: never a dict's length
    n_all = len(fields)
    take_all = _take(tuple(a.name for a in fields))
    take_required = _take(tuple(required))

    def build(data: dict[str, Any]) -> Any:
        n = len(data)
        if n == n_all:  # no unknown key and as many keys as fields: every field is there
            return cls(*take_all(data))
        if n == n_required:
            try:
                args = take_required(data)
            except KeyError:  # an optional field in a required one's place: the call names what is missing
                return cls(**data)
            return cls(*args)
        return cls(**data)

    return n_all, take_all, build


def _take(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """The values of ``names`` in a dict, as a tuple (``operator.itemgetter``, which gives a bare value for a
    single name); raises KeyError for a missing one."""
    if not names:
        return lambda data: ()
    if len(names) == 1:
        (name,) = names
        return lambda data: (data[name],)
    return operator.itemgetter(*names)


# The fast structurers are made on first use too. _FAST_V1 holds them, for the decode loop, under the tags
# whose payloads decode without upcasting (payload version 1, the only one written so far), None for the
# others.
_FAST_V1: dict[str, Callable[[dict[str, Any]], Any] | None] = {}


@functools.cache
def _fast(tag: str) -> Callable[[dict[str, Any]], Any] | None:
    """The fast structurer of the event tagged ``tag`` (a key of ``_BY_TAG``), or None; made once."""
    return _fast_structurer(_BY_TAG[tag])


def _fast_v1(tag: str) -> Callable[[dict[str, Any]], Any] | None:
    """:func:`_fast` for a version-1 event's ``tag``; None for an unknown tag (never cached: the journal's
    bytes choose it) or a class past version 1."""
    cls = _BY_TAG.get(tag)
    if cls is None:
        return None
    fn = _FAST_V1[tag] = _fast(tag) if cls.VERSION == 1 else None
    return fn


def to_dict(event: Event) -> dict[str, Any]:
    """Unstructure ``event`` into its tagged dict (the JSON object stored in the journal)."""
    cls = type(event)
    data: dict[str, Any] = _converter.get_unstructure_hook(cls)(event)
    data[_TAG] = cls.TAG
    if cls.VERSION > 1:
        data[_VER] = cls.VERSION
    return data


def from_dict(data: dict[str, Any]) -> Event:
    """Structure a tagged dict back into its event, upcasting older payload versions.

    Raises:
        EventDecodeError: unknown tag, a newer payload version, or fields that do not fit.
    """
    return _from_owned_dict(dict(data))


def _from_owned_dict(data: dict[str, Any]) -> Event:
    """:func:`from_dict` on a dict the caller gives up (``decode``'s fresh JSON object): no copy."""
    return _from_fields(data.pop(_TAG, None), data)


def _from_fields(tag: Any, data: dict[str, Any]) -> Event:
    """Structure the fields ``data`` (tag removed, payload version still in) of the event tagged ``tag``."""
    version = data.pop(_VER, 1)
    cls = _BY_TAG.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise EventDecodeError(f"unknown event tag {tag!r}")
    if not isinstance(version, int) or version > cls.VERSION:
        raise EventDecodeError(
            f"event {tag} has payload version {version!r}; this code reads <= {cls.VERSION}"
        )
    while version < cls.VERSION:
        data = UPCASTERS[(tag, version)](data)
        version += 1
    try:
        fast = _fast(tag)
        event: Event = fast(data) if fast is not None else _converter.get_structure_hook(cls)(data, cls)
        return event
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
        raise EventDecodeError(f"event {tag} does not fit its class: {exc}") from None


# The serialiser ``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)`` builds on every call: same
# bytes, made once.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


class EventCodec:
    """The journal codec for upgrade events: ``encode(event) -> bytes``, ``decode(bytes) -> event``."""

    def encode(self, event: Event) -> bytes:
        """Compact UTF-8 JSON of :func:`to_dict`."""
        return _ENCODER.encode(to_dict(event)).encode()

    def decode(self, data: bytes) -> Event:
        """Inverse of :meth:`encode`.

        Raises:
            EventDecodeError: not JSON, not an object, or see :func:`from_dict`.
        """
        try:
            obj = orjson.loads(data)
        except ValueError:
            # orjson refuses some JSON the standard parser reads (integers beyond 64 bits, lone surrogate
            # escapes, non-UTF-8 encodings): the standard parser decides, with its own error message.
            try:
                obj = json.loads(data)
            except ValueError as exc:
                raise EventDecodeError(f"event payload is not JSON: {exc}") from None
        if type(obj) is not dict:
            raise EventDecodeError("event payload is not a JSON object")
        tag = obj.pop(_TAG, None)
        fast = _FAST_V1.get(tag) if type(tag) is str else None
        if fast is None and type(tag) is str and tag not in _FAST_V1:
            fast = _fast_v1(tag)  # the first payload of its kind
        if fast is None or _VER in obj:
            return _from_fields(tag, obj)
        try:
            event: Event = fast(obj)
        except (TypeError, ValueError, KeyError) as exc:
            raise EventDecodeError(f"event {tag} does not fit its class: {exc}") from None
        return event


EVENT_CODEC = EventCodec()

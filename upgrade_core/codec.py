"""Event (de)serialisation for the journal: a cattrs tagged union over :data:`ALL_EVENTS` (SPEC 2).

Wire form (:mod:`upgrade_core.wire`, which also gives the stdlib-only :func:`event_tag`): compact JSON
of ``{"_type": TAG, **fields}`` (UTF-8), plus ``"_v": N`` when the class's ``VERSION`` is above 1.
Tags are the classes' stable ``TAG`` strings, pinned by ``tests/test_codec.py``.
An unknown tag or a payload that does not fit its class raises :class:`EventDecodeError`; nothing is
dropped. A payload written with a newer ``_v`` than this code knows is refused the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from ._events import ALL_EVENTS, Aborted, EpisodeOpened, EpisodeSummary, Event, HealthFailed
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
        make_dict_unstructure_fn(EpisodeSummary, conv, security_version=omit, known_bad=omit),
    )
    conv.register_unstructure_hook(HealthFailed, make_dict_unstructure_fn(HealthFailed, conv, cause=omit))
    conv.register_unstructure_hook(Aborted, make_dict_unstructure_fn(Aborted, conv, cause=omit))
    conv.register_unstructure_hook(
        EpisodeOpened, make_dict_unstructure_fn(EpisodeOpened, conv, boot_id=omit)
    )
    return conv


_converter = _make_converter()
_BY_TAG: dict[str, type[Event]] = {cls.TAG: cls for cls in ALL_EVENTS}
_STRUCTURE: dict[str, Callable[[Any, Any], Any]] = {
    tag: _converter.get_structure_hook(cls) for tag, cls in _BY_TAG.items()
}
_UNSTRUCTURE: dict[type[Event], Callable[[Any], Any]] = {
    cls: _converter.get_unstructure_hook(cls) for cls in ALL_EVENTS
}
# Upcasters: (TAG, from_version) -> function mapping the old field dict to the next version's dict.
UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}


def to_dict(event: Event) -> dict[str, Any]:
    """Unstructure ``event`` into its tagged dict (the JSON object stored in the journal)."""
    cls = type(event)
    data: dict[str, Any] = _UNSTRUCTURE[cls](event)
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
    tag = data.pop(_TAG, None)
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
        event: Event = _STRUCTURE[tag](data, cls)
        return event
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
        raise EventDecodeError(f"event {tag} does not fit its class: {exc}") from None


class EventCodec:
    """The journal codec for upgrade events: ``encode(event) -> bytes``, ``decode(bytes) -> event``."""

    def encode(self, event: Event) -> bytes:
        """Compact UTF-8 JSON of :func:`to_dict`."""
        return json.dumps(to_dict(event), separators=(",", ":"), ensure_ascii=False).encode()

    def decode(self, data: bytes) -> Event:
        """Inverse of :meth:`encode`.

        Raises:
            EventDecodeError: not JSON, not an object, or see :func:`from_dict`.
        """
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise EventDecodeError(f"event payload is not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise EventDecodeError("event payload is not a JSON object")
        return _from_owned_dict(obj)


EVENT_CODEC = EventCodec()

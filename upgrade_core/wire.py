"""The codec's wire format, readable with the standard library alone (design §2, design §9 ``recover.noop``).

An event is stored as compact UTF-8 JSON of ``{"_type": TAG, **fields}`` plus ``"_v": N`` when the class's
``VERSION`` is above 1 (:mod:`upgrade_core.codec` writes and reads it with cattrs). The boot-time no-op
recovery only needs the tag of the journal's newest record; it reads it with :func:`event_tag` so that it
imports neither cattrs nor attrs, and never parses the wire format itself. This module is tiny and the
package imports lazily (``upgrade_core/__init__.py``), so ``from upgrade_core.wire import event_tag`` costs
one small module plus ``json``.
"""

from __future__ import annotations

import json

__all__ = ["TAG_KEY", "VERSION_KEY", "event_tag"]

TAG_KEY = "_type"
"""The key of the event's stable tag (its class's ``TAG``)."""
VERSION_KEY = "_v"
"""The key of the payload version, present when above 1."""


def event_tag(payload: bytes) -> str | None:
    """The tag of one encoded event (e.g. ``"EpisodeClosed"``), or None if ``payload`` is not one.

    Never raises on bad input: not JSON, not an object, or no string tag gives None. The tag is not checked
    against the known events (decoding does that).
    """
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    tag = obj.get(TAG_KEY) if isinstance(obj, dict) else None
    return tag if isinstance(tag, str) else None

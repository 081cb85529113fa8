"""The codec's wire format, readable with the standard library alone (design §2, design §9 ``recover.noop``).

An event is stored as compact UTF-8 JSON of ``{"_type": TAG, **fields}`` plus ``"_v": N`` when the class's
``VERSION`` is above 1 (:mod:`upgrade_core.codec` writes and reads it with cattrs). The boot-time no-op
recovery only needs to know whether the journal's newest record closes its episode; it asks
:func:`surely_closes` so that it imports neither cattrs nor attrs, nor even :mod:`json` (which loads
:mod:`re`: about 5 ms of a boot-time budget of about 6). This module is tiny and the package imports
lazily (``upgrade_core/__init__.py``), so ``from upgrade_core.wire import surely_closes`` costs one small
module.
"""

from __future__ import annotations

__all__ = [
    "TAG_KEY", "VERSION_KEY", "event_tag", "left_stopped_may_wait", "surely_closes", "window_switch_may_wait",
]

TAG_KEY = "_type"
"""The key of the event's stable tag (its class's ``TAG``)."""
VERSION_KEY = "_v"
"""The key of the payload version, present when above 1."""


def event_tag(payload: bytes) -> str | None:
    """The tag of one encoded event (e.g. ``"EpisodeClosed"``), or None if ``payload`` is not one.

    Never raises on bad input: not JSON, not an object, or no string tag gives None. The tag is not checked
    against the known events (decoding does that).
    """
    import json

    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    tag = obj.get(TAG_KEY) if isinstance(obj, dict) else None
    return tag if isinstance(tag, str) else None


_CLOSED_END = b',"_type":"EpisodeClosed"}'

_LEFT_STOPPED = b',"_type":"LeftStopped"}'
_SWITCH_INTENDED = b',"_type":"SwitchIntended"}'
_SNAPSHOT_LEFT_STOPPED = b'"left_stopped":{'


def left_stopped_may_wait(segment: bytes) -> bool:
    """True when the live segment's records may leave a candidate an ``activate`` left stopped waiting for
    its check (design §4.7), so that the boot reader must take the full path (:func:`journal.live_tail`);
    False only when they certainly do not.

    The fold's own rule, read as bytes: a ``LeftStopped`` record with no ``SwitchIntended`` after it in the
    segment (the next switch, the check's or an operator rollback's, ends the wait), or a snapshot that
    carries one (``HistorySnapshot.left_stopped``, written by quarantine; compaction does not run while one
    waits). A false True only costs the full path. Once the check has switched, the records of that old
    episode no longer send every boot and timer run there.
    """
    last = segment.rfind(_LEFT_STOPPED)
    if last >= 0 and segment.find(_SWITCH_INTENDED, last) < 0:
        return True
    return _SNAPSHOT_LEFT_STOPPED in segment


_WINDOW_STAGED = b'"switch_in_window":true'
_CANDIDATE_INSTALLED = b',"_type":"CandidateInstalled"}'


def window_switch_may_wait(segment: bytes) -> bool:
    """True when the live segment's records may leave a candidate ``upgrade --in-window`` staged for the
    recovery timer to switch to (``StagedForActivation.switch_in_window``, docs/configuration.md
    ``[schedule]``), so that a timer run must take the full path, which judges the window; False only when
    they certainly do not.

    The fold's rule, read as bytes: the newest record or snapshot that says ``"switch_in_window":true`` with
    no ``CandidateInstalled`` (other bytes staged) and no ``SwitchIntended`` (``current`` moved) after it. A
    false True only costs the full path. (A configuration that names a window never reaches this test: the
    boot reader leaves a window expression to the full loader. It matters once the window was removed from
    the configuration with such a candidate still staged: the window is then always open.)
    """
    last = segment.rfind(_WINDOW_STAGED)
    return last >= 0 and all(segment.find(end, last) < 0 for end in (_SWITCH_INTENDED, _CANDIDATE_INSTALLED))


def surely_closes(payload: bytes) -> bool:
    """True only when ``payload`` is certainly an ``EpisodeClosed`` event of version 1, read without a JSON
    parser; False when it is another event *or when unsure*.

    It accepts exactly the form the codec writes (:class:`upgrade_core.codec.EventCodec`: compact JSON, the
    fields first and the tag last): an object ending in ``,"_type":"EpisodeClosed"}`` with ``"_type"`` once
    and no backslash. Without a backslash every ``"`` in the payload delimits a string, so that ending is
    the top-level object's own last member and no string value can imitate it. Anything else (a version
    key, another member order, an escape anywhere) is False, and the caller decodes properly.
    """
    return (payload[:1] == b"{" and payload.endswith(_CLOSED_END) and payload.count(b'"_type"') == 1
            and b"\\" not in payload)

"""Whether the boot-time recovery has nothing to do, read with the standard library only (docs/design.md §9
``recover.noop``; docs/adr: the boot path).

The session's cheapest question, asked before any session exists: the configuration's ``state_dir`` from
the boot reader (:func:`agent.config.boot.quick_paths`), then the newest episode record of the journal's
live segment (:func:`journal.live_tail`), read without a JSON parser
(:func:`upgrade_core.wire.surely_closes`). The answer is True only when it is *certain* that no episode is
open: no journal directory or no segment; an intact, empty live segment (sealing only ever happens once
every episode is closed); or a live segment whose newest record other than a compaction snapshot is
``EpisodeClosed`` in the codec's own form, and no candidate an ``activate`` left stopped may still wait
for its check (design §4.7; :func:`upgrade_core.wire.left_stopped_may_wait`); for the recovery timer also the
host's ``current`` link is there (else its converge step has work: docs/recovery.md, "A damaged layout").
Anything else is False, and
the full path (lock, repair, replay, fold, decide) takes over and words every error. It never writes or
creates a file.
"""

from __future__ import annotations

import os
import stat

import journal
from agent.config.boot import STATE_SUBDIRS, discover_config_path, quick_paths
from journal import safefs
from upgrade_core.wire import left_stopped_may_wait, surely_closes, window_switch_may_wait

__all__ = ["nothing_open"]


def _shared(directory: str) -> bool:
    """True when ``directory`` is world-writable and sticky (``/tmp``'s kind): an agent path placed directly
    in it is a configuration error (:func:`agent.host.ownership.check_placement`)."""
    try:
        mode = os.stat(directory).st_mode
    except OSError:
        return False
    return bool(mode & 0o002 and mode & stat.S_ISVTX)


def _plainly_ours(directory: str) -> bool:
    """True when ``directory`` is missing, or passes :func:`journal.safefs.check_owned` (the rule
    :func:`agent.host.ownership.check_state` applies to ``state_dir`` and its subdirectories). A look
    (``lstat``), so the boot path stays lean; anything else sends the caller to the full path, which refuses
    with the path named (exit 4)."""
    try:
        safefs.check_owned(os.lstat(directory), directory, directory=True)
    except FileNotFoundError:
        return True
    except (OSError, journal.JournalRefusedError):
        return False
    return True


def _timer_may_act(segment: bytes) -> bool:
    return left_stopped_may_wait(segment) or window_switch_may_wait(segment)


def nothing_open(config_path: str | None, *, timer: bool = False) -> bool:
    """True when the configuration at ``config_path`` (None: discovered) certainly has no open episode (and,
    for the recovery timer, ``timer``, no candidate ``upgrade --in-window`` left for it to switch to:
    :func:`upgrade_core.wire.window_switch_may_wait`).

    Never raises: any doubt (a bad configuration, a torn or corrupt tail, an unusual file set) is False.
    """
    try:
        paths = quick_paths(discover_config_path(config_path))
        if paths is None:  # the full loader words whatever is wrong with the file
            return False
        if any(_shared(os.path.dirname(p)) for p in paths[1:]):  # the full path names the key (exit 2)
            return False
        name, state_dir, lock_path, root = paths
        if timer and not os.path.lexists(os.path.join(root, "lib", name, f"{name}-current")):
            return False  # the timer's converge step adopts a layout whose current link is gone
        # A directory the writers would refuse is refused by the full path too, with nothing to do or not:
        # the journal's own walk checks state_dir, these the rest of what check_state checks.
        owned = (state_dir, *(os.path.join(state_dir, sub) for sub in STATE_SUBDIRS),
                 os.path.dirname(lock_path) or "/")
        if not all(_plainly_ours(d) for d in owned):
            return False
        # a candidate an activate left stopped may wait for its check (design §4.7): full path
        tail = journal.live_tail(
            os.path.join(state_dir, "journal"), _timer_may_act if timer else left_stopped_may_wait
        )
    except Exception:
        return False
    if tail is None:
        return True
    if not isinstance(tail, bytes):  # journal.UNSURE
        return False
    return surely_closes(tail)

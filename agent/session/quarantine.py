"""``upgrade-agent journal quarantine`` (design §10): a way out of a journal that cannot be trusted.

The session (:meth:`agent.session.session.Session.quarantine`) runs it under the host lock, in this order:

1. :func:`read_host`: both links must name a slot that exists, is not empty and whose version command
   answers (the same verification a candidate gets); otherwise it refuses (:class:`QuarantineRefusedError`,
   exit 3) naming the link, the slot file and what to check, and nothing has changed.
2. :func:`move_aside`: the journal directory is renamed to ``state_dir/quarantine/<UTC time>/journal``
   (``quarantine/`` and ``<UTC time>/`` created 0700; each parent directory fsynced after its entry
   changed). Never copied, never deleted: an operator or a support engineer can read it there.
3. A new journal is opened (empty) and its first episode records what the host shows
   (:func:`upgrade_core.record_quarantine`): a closed ``quarantine`` episode whose ``JournalQuarantined``
   event carries the quarantine path, both slots, their digests and versions.

A crash between 2 and 3 leaves an empty journal (no episode open, the old one in quarantine): every command
works and ``status`` shows the links without versions; running the command again records it.
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

import attrs

from agent.fs.tree import open_dir
from upgrade_core import Slot
from upgrade_core.errors import UpgradeError

__all__ = ["QUARANTINE_DIR", "HostRecord", "QuarantineRefusedError", "move_aside", "read_host", "utc_stamp"]

QUARANTINE_DIR = "quarantine"
"""``state_dir/quarantine/``: where quarantined journals go, one ``<UTC time>/journal`` each."""

COMMAND = "upgrade-agent journal quarantine"
HINT = f"to move it aside and start a new journal from the host, run `{COMMAND}`"
"""What ``upgrade``, ``recover``, ``status`` and the other readers add to a corrupt-journal error."""


class QuarantineRefusedError(UpgradeError):
    """The links disagree with the slots (a link missing, or naming a missing, empty or unverifiable slot):
    a new journal would record a host that cannot run. Nothing was changed. Exit 3."""

    exit_code: ClassVar[int] = 3


@attrs.frozen
class SlotRecord:
    """One link's slot as verified: slot name, file, sha256 (64 hex) and reported version."""

    slot: Slot
    path: str
    sha256: str
    version: str


@attrs.frozen
class HostRecord:
    """What the host shows: the slots ``current`` and ``last-good`` name, verified."""

    current: SlotRecord
    last_good: SlotRecord


async def read_host(host: Any, verifier: Any) -> HostRecord:
    """Read and verify both links' slots (the caller holds the host lock); changes nothing.

    Args:
        host: the :class:`agent.host.adapter.AgentHost`.
        verifier: the candidate verifier (:class:`agent.release.verify.VerifierImpl`): each slot's version
        command
            runs under its timeout and output bound.

    Raises:
        QuarantineRefusedError: a link is missing or names a missing, empty or unverifiable slot (exit 3).
        LayoutConflictError: a link is a real file or names something else than a slot (exit 2).
    """
    h, v = host, verifier
    links = h.links()
    seen: dict[Slot, SlotRecord] = {}
    out: list[SlotRecord] = []
    for label, slot, link in (
        ("current", links.current, h.layout.current_link),
        ("last-good", links.last_good, h.layout.last_good_link),
    ):
        if slot is None:
            raise QuarantineRefusedError(
                f"{link}: missing; the links disagree with the slots: point {label} at a good slot "
                f"({h.slot_path('blue')} or {h.slot_path('green')}) before `{COMMAND}`"
            )
        if slot not in seen:
            path = h.slot_path(slot)
            sha = await h.slot_sha256(slot)
            if sha is None:
                raise QuarantineRefusedError(
                    f"{link}: names {slot}, but {path} is missing or empty; check the slot files and point "
                    f"{label} at a slot that runs before `{COMMAND}`"
                )
            try:
                version = await v.verify(path, None)
            except UpgradeError as exc:
                raise QuarantineRefusedError(
                    f"{link}: names {slot}, whose binary {path} does not verify ({exc}); check the slot "
                    f"files and point {label} at a slot that runs before `{COMMAND}`"
                ) from None
            seen[slot] = SlotRecord(slot, path, sha, version)
        out.append(seen[slot])
    return HostRecord(out[0], out[1])


def utc_stamp(now: float | None = None) -> str:
    """``YYYYmmddTHHMMSSZ`` (UTC) for ``now`` (Unix seconds; None: the current time)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))


def move_aside(state_dir: str, journal_dir: str, now: float | None = None) -> str:
    """Rename ``journal_dir`` to ``state_dir/quarantine/<UTC time>[-N]/journal``, durably, through checked
    directory handles (:mod:`agent.fs.tree`: ``renameat`` between the state directory and the new one).

    Args:
        state_dir: ``host.state_dir`` (exists: the caller holds the lock and found a journal).
        journal_dir: ``state_dir/journal``.
        now: the time to name the directory after (tests); None: now.

    Returns:
        The new path of the journal directory.

    Raises:
        FileNotFoundError: there is no journal directory (nothing to quarantine).
        HostRefusedError: a directory on the way is not the agent's (exit 4).
        OSError: a directory could not be created, renamed or fsynced (the journal stays where it was
            unless the rename itself returned).
    """
    state = open_dir(state_dir)
    if state is None:
        raise FileNotFoundError(2, "no journal directory to quarantine", journal_dir)
    with state:
        journal_name = os.path.basename(journal_dir)
        journal = state.child(journal_name)  # the agent's own directory, never a link
        if journal is None:
            raise FileNotFoundError(2, "no journal directory to quarantine", journal_dir)
        journal.close()
        root = state.child(QUARANTINE_DIR, create=0o700)
        assert root is not None
        with root:
            stamp = utc_stamp(now)
            name, n = stamp, 0
            while not root.make_dir(name, 0o700):
                n += 1
                name = f"{stamp}-{n}"
            target_dir = root.child(name)
            assert target_dir is not None
            with target_dir:
                state.rename(journal_name, "journal", into=target_dir)
                target_dir.fsync()
                state.fsync()
                return target_dir.join("journal")

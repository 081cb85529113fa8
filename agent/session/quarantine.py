"""``upgrade-agent journal quarantine`` (design §10): a way out of a journal that cannot be trusted.

The session (:meth:`agent.session.session.Session.quarantine`) runs it under the host lock, in this order:

1. :func:`read_host`: both links must name a slot that exists, is not empty and whose version command
   answers (the same verification a candidate gets); otherwise it refuses (:class:`QuarantineRefusedError`,
   exit 3) naming the link, the slot file and what to check, and nothing has changed.
2. :func:`move_aside`: the journal directory is renamed to ``state_dir/quarantine/<UTC time>/journal``
   (``quarantine/`` and ``<UTC time>/`` created 0700; each parent directory fsynced after its entry
   changed). Never copied, never deleted: an operator or a support engineer can read it there.
   Before the move, :func:`carry_over` reads what the old journal still tells, as far as it can be read
   (:func:`journal.salvage`: the records before its first corruption, then the fold up to the first record
   that breaks a lifecycle rule): the anti-rollback watermark, the known-bad releases and the summaries of
   its closed episodes.
3. A new journal is opened (empty). Its first record is a snapshot (``HistorySnapshot``) carrying those facts
   (docs/trust.md: they survive quarantine; only ``trust reset`` clears them); its first episode records what
   the host shows (:func:`upgrade_core.record_quarantine`): a closed ``quarantine`` episode whose
   ``JournalQuarantined`` event carries the quarantine path, both slots, their digests and versions.

A crash between 2 and 3 leaves an empty journal (no episode open, the old one in quarantine): every command
works and ``status`` shows the links without versions; running the command again records it, and carries
over what the journal the first run moved aside tells (:func:`carry_over` falls back to earlier quarantined
journals when the current one tells nothing).
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

import attrs

from agent.fs.tree import open_dir
from journal import JournalStoreError, salvage
from upgrade_core import (
    EVENT_CODEC,
    Folder,
    HistorySnapshot,
    JournalFacts,
    Slot,
    summarize_history,
)
from upgrade_core.errors import HistoryError, UpgradeError

__all__ = [
    "QUARANTINE_DIR", "CarriedOver", "HostRecord", "QuarantineRefusedError", "carry_over", "move_aside",
    "read_host", "utc_stamp",
]

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


@attrs.frozen
class CarriedOver:
    """What ``journal quarantine`` keeps of the old journal: the new journal's first record and its gist.

    Attributes:
        snapshot: the ``HistorySnapshot`` to seed the new journal with: the old journal's closed episodes'
            summaries (their sequence numbers dropped: they name records of the old journal) and its facts
            (watermark raises, known-bad marks and slot versions, all at seq 0: older than any record of the
            new journal).
        read_through: the sequence number of the last record used (of ``source`` when set; 0: none).
        problem: why reading the old journal stopped before the end (one line naming the file and offset, or
            the rule), None when the whole old journal was read.
        source: None when the facts come from the old journal; else (nothing of it could be used) the
            newest earlier quarantined journal that tells something, which they were read from.
    """

    snapshot: HistorySnapshot
    read_through: int
    problem: str | None
    source: str | None

    @property
    def watermark(self) -> int | None:
        """The watermark carried over (the highest raise the snapshot keeps), None when none."""
        raises = self.snapshot.facts.raises if self.snapshot.facts is not None else ()
        return max((r.security_version for r in raises), default=None)

    @property
    def known_bad(self) -> tuple[str, ...]:
        """The digests carried over as known-bad (marks still condemning), sorted."""
        marks = self.snapshot.facts.known_bad if self.snapshot.facts is not None else ()
        return tuple(sorted(m.sha256 for m in marks if m.failed is not None))


def _readable(directory: str) -> tuple[list[Any], str | None]:
    """The old journal's records that can be used (before its first corruption and its first illegal
    record), and why reading stopped before the end (None: it did not)."""
    problem: str | None = None
    try:
        replayed, error = salvage(directory, EVENT_CODEC)
        records = replayed.records
        if error is not None:
            problem = str(error)
    except (JournalStoreError, OSError) as exc:
        records, problem = [], str(exc)
    folder = Folder()
    used = 0
    for record in records:
        try:
            folder.apply(record)
        except HistoryError as exc:
            problem = str(exc)
            break
        used += 1
    return records[:used], problem


def _earlier_quarantines(state_dir: str) -> list[str]:
    """The journals earlier quarantines moved aside, newest first (``<UTC time>[-N]`` sorts by time)."""
    root = os.path.join(state_dir, QUARANTINE_DIR)
    try:
        d = open_dir(root)
    except (OSError, UpgradeError):
        return []
    if d is None:
        return []
    with d:
        stamps = d.names()
    return [os.path.join(root, stamp, "journal") for stamp in sorted(stamps, key=_stamp_order, reverse=True)]


def _stamp_order(stamp: str) -> tuple[str, int]:
    base, _, n = stamp.partition("-")
    return base, int(n) if n.isdigit() else 0


def carry_over(directory: str, state_dir: str) -> CarriedOver:
    """Read the old journal ``directory`` as far as it can be read, and what the new one must keep of it.

    When nothing of it can be used (empty: a quarantine interrupted after its move; or unreadable from its
    first record), the journals earlier quarantines moved aside are read instead, newest first, and the first
    one that tells something is used (``source`` names it): an empty journal must not wipe the watermark.

    Never raises for the journals' contents: a refused directory (not ours), an unreadable segment, a
    corrupt or undecodable record or an illegal order ends the reading there, and ``problem`` says which.
    Changes nothing.
    """
    legal, problem = _readable(directory)
    source: str | None = None
    if not legal:
        for earlier in _earlier_quarantines(state_dir):
            found, _ = _readable(earlier)
            if found:
                legal, source = found, earlier
                break
    snapshot = summarize_history(legal)  # legal: _readable folded them without an error
    facts = snapshot.facts
    assert facts is not None  # summarize_history always keeps the facts
    # Every fact and summary moves to seq 0: older than any record of the new journal, which restarts at 1
    # (its sequence numbers name records of the old journal; a reset before them is already applied).
    carried = JournalFacts(
        through_seq=0,
        raises=tuple(attrs.evolve(r, seq=0) for r in facts.raises),
        known_bad=tuple(attrs.evolve(m, seq=0) for m in facts.known_bad),
        slot_versions=tuple(attrs.evolve(v, seq=0) for v in facts.slot_versions),
    )
    summaries = tuple(attrs.evolve(s, opened_seq=None, published_seq=None) for s in snapshot.episodes)
    return CarriedOver(
        attrs.evolve(snapshot, episodes=summaries, facts=carried), legal[-1].seq if legal else 0, problem,
        source,
    )

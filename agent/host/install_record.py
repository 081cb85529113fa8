"""The install record and the removal rules (design §10, docs/host.md): remove only what the agent made.

``install`` keeps ``state_dir/install.json`` listing every directory, file, link and unit file it created.
The record is rewritten durably (temp + fsync + rename + directory fsync, mode 0600) **before** each thing
is created, intent before effect as in the journal: a crash half way through an install leaves a record
that lists everything that may exist, and an entry whose path is absent at clean-up is simply dropped::

    {"format": 1, "agent": "demo-agent", "unit": "demo-agent.service", "config": "/etc/upgrade-agent/x.toml",
     "entries": [{"kind": "dir",  "path": "/opt/upgrade-agent/lib"},
                 {"kind": "dir",  "path": "/opt/upgrade-agent/lib/demo-agent"},
                 {"kind": "file", "path": "/opt/upgrade-agent/lib/demo-agent/demo-agent-blue"},
                 {"kind": "link", "path": "/opt/upgrade-agent/lib/demo-agent/demo-agent-current"},
                 {"kind": "unit", "path": "/etc/systemd/system/demo-agent.service"}, ...]}

A ``dir`` entry means "the agent created this directory" (it did not exist before): a pre-existing ``/opt``,
host root or mount point is never listed. Entries are removed in reverse order.

Removal rules (:class:`Remover`; clean-up after a failed install, ``reset`` and ``uninstall`` all use them):

- **never through a symlink**: every decision is made on ``lstat``; a ``link`` entry unlinks the link itself,
  anything else found as a symlink is kept;
- ``file``: only a regular file; ``link``: only a symlink;
- ``unit``: only a regular file whose first line is this agent's own header
(:func:`agent.systemd.units.unit_owner`);
- ``dir``: only a real directory that is not a mount point (``st_dev`` differs from its parent's, or it is
  listed in ``/proc/self/mountinfo``), removed with ``rmdir`` only, so never a non-empty one. Inside
  ``R/lib/NAME`` (and ``R/bin``) the files that match the layout exactly (:meth:`Remover.layout_marked`)
  go first: slots written by later upgrades belong to the agent as much as those install made.

With no record (an install made before records existed, or a host where nothing was installed), only what
carries the agent's marker goes: unit files with its header line, and the layout files of
:meth:`Remover.layout_marked`; directories are kept (except an empty ``R/lib/NAME``), and the command says so.

Anything listed but not removed is reported as one line ``PATH: kept: why`` (``kept``), an operation that
failed as ``PATH: cannot remove: why`` (``errors``); neither ever raises out of :class:`Remover`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal

import attrs

from agent.fs import durable
from agent.fs.mounts import read_mounts
from agent.fs.statefile import read_state_file, remove_state_file, write_state_file
from agent.fs.tree import Dir, open_ancestor, open_dir
from agent.host.layout import Layout
from agent.systemd.units import unit_owner
from upgrade_core.errors import HostError

__all__ = [
    "RECORD_NAME",
    "Cleanup",
    "Entry",
    "InstallRecord",
    "RecordError",
    "Remover",
    "is_mount_point",
    "missing_dirs",
    "remove_state_files",
]

RECORD_NAME: Final = "install.json"
_FORMAT: Final = 1
_MAX_RECORD_BYTES: Final = 1 << 20
Kind = Literal["dir", "file", "link", "unit"]
_KINDS: Final = ("dir", "file", "link", "unit")


class RecordError(Exception):
    """The record exists but cannot be trusted (not a regular file, not our JSON, another agent's).

    Attributes:
        refused: True when the path is of the wrong type (a symlink, FIFO, directory): the host refused.
    """

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@attrs.frozen
class Entry:
    """One thing install created (or was about to create: intent is recorded first)."""

    kind: Kind
    path: str


@attrs.define
class Cleanup:
    """What a clean-up did: paths removed, listed paths kept by the rules, and removals that failed.

    Attributes:
        removed: absolute paths removed, in removal order.
        kept: ``PATH: kept: why`` for what the rules kept (not ours, a mount point, not empty, ...).
        errors: ``PATH: cannot remove: why`` for a removal the host refused (EBUSY, EACCES, EROFS, ...).
    """

    removed: list[str] = attrs.Factory(list)
    kept: list[str] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)
    notes: list[str] = attrs.Factory(list)

    def extend(self, other: Cleanup) -> None:
        self.removed += other.removed
        self.kept += other.kept
        self.errors += other.errors
        self.notes += [n for n in other.notes if n not in self.notes]


def _confined(entry: Entry, allowed: Sequence[str]) -> bool:
    """True when ``entry`` names a normalised path under one of ``allowed`` (or, for a ``dir``, one of
    their ancestors)."""
    path = entry.path
    if os.path.normpath(path) != path:
        return False
    for top in allowed:
        if path == top or path.startswith(top.rstrip("/") + "/"):
            return True
        if entry.kind == "dir" and (top.startswith(path.rstrip("/") + "/")):
            return True
    return False


def missing_dirs(path: str) -> list[str]:
    """The directories ``durable.make_dirs(path)`` would create, outermost first (what to list first)."""
    return durable.missing_dirs(path)


# ----------------------------------------------------------------------------------------------- the record
class InstallRecord:
    """``state_dir/install.json``: load, add intent before an effect, forget what was removed.

    Args:
        state_dir: ``host.state_dir`` (must exist before :meth:`intend`).
        agent: ``agent.name``; a record naming another agent is refused (:class:`RecordError`).
        unit: ``agent.unit`` (informative).
        config: the absolute configuration path (informative).
    """

    def __init__(self, state_dir: str, agent: str, unit: str, config: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, RECORD_NAME)
        self.agent, self.unit, self.config = agent, unit, config
        self.entries: list[Entry] = []
        self.exists = False

    @classmethod
    def load(
        cls, state_dir: str, agent: str, unit: str, config: str, *, allowed: Sequence[str]
    ) -> InstallRecord:
        """The record in ``state_dir`` (``exists`` False and no entries when there is none); creates nothing.

        The record is a state file (docs/host.md): read through the checked ``state_dir`` handle, a regular
        file of the effective user's, single link, not group- or world-writable. Every entry must lie under
        one of ``allowed`` (the host root, the unit directory, ``state_dir``); a ``dir`` entry may also be
        an ancestor of one of them (the directories an install created on the way to the host root). A
        record planted by another user, or one that names anything else, would turn a removal against a
        file the agent never made: it is refused whole.

        Args:
            allowed: absolute, normalised directories the entries may lie under.

        Raises:
            HostRefusedError: a symlink, FIFO, hard link or another user's file stands there, or a directory
                on the way is not ours (exit 4).
            RecordError: the content is not an install record of ``agent``; ``refused`` when an entry lies
                outside ``allowed`` (the message names the path and the entry).
        """
        rec = cls(state_dir, agent, unit, config)
        raw = read_state_file(state_dir, "", RECORD_NAME)
        if raw is None:
            return rec
        try:
            if len(raw) > _MAX_RECORD_BYTES:
                raise ValueError(f"larger than {_MAX_RECORD_BYTES} bytes")
            doc: Any = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
                raise ValueError("not an install record of format 1")
            entries = [Entry(e["kind"], e["path"]) for e in doc["entries"]]
            if any(e.kind not in _KINDS or not isinstance(e.path, str) or not os.path.isabs(e.path)
                   for e in entries):
                raise ValueError("an entry has an unknown kind or a relative path")
        except (ValueError, KeyError, TypeError) as e:
            raise RecordError(f"{rec.path}: unreadable install record: {e}") from None
        if doc.get("agent") != agent:
            raise RecordError(f"{rec.path}: the install record belongs to agent {doc.get('agent')!s}, "
                              f"not {agent}")
        for entry in entries:
            if not _confined(entry, allowed):
                raise RecordError(
                    f"{rec.path}: the install record lists {entry.path}, outside the host root, the unit "
                    "directory and state_dir; refusing to use it", refused=True)
        rec.entries, rec.exists = entries, True
        return rec

    def lists(self, path: str, kind: Kind | None = None) -> bool:
        """True when ``path`` (of ``kind``, if given) is listed."""
        return any(e.path == path and (kind is None or e.kind == kind) for e in self.entries)

    def intend(self, kind: Kind, paths: Iterable[str]) -> None:
        """List ``paths`` (those not listed yet) durably, before they are created (intent before effect).

        Raises:
            OSError: the record cannot be written; nothing was created yet.
        """
        new: list[Entry] = []
        for p in paths:
            if not self.lists(p, kind) and Entry(kind, p) not in new:
                new.append(Entry(kind, p))
        if new:
            self.entries += new
            self._save()

    def forget(self, paths: Iterable[str]) -> None:
        """Drop ``paths`` (removed, or found absent) and save; the record file goes when nothing is left.

        Raises:
            OSError: the record cannot be written or removed.
        """
        gone = set(paths)
        before = len(self.entries)
        self.entries = [e for e in self.entries if e.path not in gone]
        if len(self.entries) == before:
            return
        if self.entries:
            self._save()
        elif self.exists:
            remove_state_file(self.state_dir, "", RECORD_NAME)
            self.exists = False

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _FORMAT, "agent": self.agent, "unit": self.unit, "config": self.config,
            "entries": [{"kind": e.kind, "path": e.path} for e in self.entries],
        }

    def _save(self) -> None:
        data = (json.dumps(self.to_json(), indent=1) + "\n").encode()
        write_state_file(self.state_dir, "", RECORD_NAME, data)
        self.exists = True


# ----------------------------------------------------------------------------------------------- the rules
def is_mount_point(path: str, st: os.stat_result | None = None, parent: os.stat_result | None = None) -> bool:
    """True when ``path`` (a directory, not followed) is a mount point: another device than its parent,
    the same inode as its parent (a root), or listed in ``/proc/self/mountinfo`` (a bind mount). ``st`` and
    ``parent``, when given, are its and its parent's ``stat`` taken through checked handles."""
    try:
        st = st or os.lstat(path)
        parent = parent or os.lstat(os.path.dirname(path) or ".")
    except OSError:
        return False
    if st.st_dev != parent.st_dev or st.st_ino == parent.st_ino:
        return True
    return os.path.realpath(path) in {m.point for m in read_mounts()}


def _kind_of(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"


class Remover:
    """Applies the removal rules (module docstring) for one agent's layout and unit directory.

    Args:
        layout: the agent's host layout.
        unit_dir: ``host.unit_dir``.
        legacy_root: ``host.legacy_root`` ("" for none): its real path is never removed.
    """

    def __init__(self, layout: Layout, unit_dir: str, legacy_root: str = "") -> None:
        self.layout = layout
        self.unit_dir = unit_dir
        self.legacy_root = legacy_root
        name = re.escape(layout.name)
        self._temp_re = re.compile(rf"\.{name}-(blue|green|current|last-good)\.(tmp|link)-[0-9a-f]{{16}}")

    # -- markers -------------------------------------------------------------------------------------------
    def unit_is_ours(self, path: str) -> tuple[bool, str]:
        """(True, "") when ``path`` is a regular unit file whose first line is this agent's header; else
        (False, why). Never follows a symlink, never waits on a FIFO."""
        try:
            d = self._parent(path)
        except (OSError, HostError) as e:
            return False, f"unreadable: {_why(e)}"
        if d is None:
            return False, "absent"
        with d:
            name = os.path.basename(path)
            st = d.lstat(name)
            if st is None:
                return False, "absent"
            if stat.S_ISLNK(st.st_mode):
                return False, "a symlink, not a unit file this agent wrote"
            if not stat.S_ISREG(st.st_mode):
                return False, "not a regular file"
            try:
                head = d.read(name, limit=4096)
            except (OSError, HostError) as e:
                return False, f"unreadable: {_why(e)}"
        owner = unit_owner(head.decode("utf-8", errors="replace"))
        if owner == self.layout.name:
            return True, ""
        if owner is None:
            return False, "no upgrade-agent header line: not written by this agent"
        return False, f"written by upgrade-agent for {owner}, not {self.layout.name}"

    def layout_marked(self, path: str, st: os.stat_result, d: Dir) -> bool:
        """True when ``path`` is a layout file of this agent exactly: a slot file or staging/temp file in
        ``R/lib/NAME`` (regular), ``current``/``last-good`` naming a slot, or ``R/bin/NAME`` naming
        ``current`` (symlinks with exactly those targets). ``d`` is the checked handle of its directory."""
        lay = self.layout
        base, parent = os.path.basename(path), os.path.dirname(path)
        if parent == lay.agent_dir:
            if stat.S_ISREG(st.st_mode):
                return (
                    path in (lay.slot_path("blue"), lay.slot_path("green"))
                    or lay.staging_slot(base) is not None
                    or (self._temp_re.fullmatch(base) is not None and ".tmp-" in base)
                )
            if stat.S_ISLNK(st.st_mode):
                target = d.readlink(base) or ""
                if path in (lay.current_link, lay.last_good_link) or (
                    self._temp_re.fullmatch(base) is not None and ".link-" in base
                ):
                    return lay.slot_of_target(target) is not None
            return False
        return path == lay.bin_link and stat.S_ISLNK(st.st_mode) and d.readlink(base) == lay.bin_link_target

    # -- removals ------------------------------------------------------------------------------------------
    def _parent(self, path: str) -> Dir | None:
        """The checked handle of ``path``'s directory, walked from ``/`` with the own-directory rule from the
        host root or the unit directory down (whichever holds ``path``), else by the ancestor rule (the
        parent of the host root); None when it is gone.

        Raises:
            HostRefusedError: a directory on the way is not the agent's (exit 4).
            OSError: it cannot be opened.
        """
        parent = os.path.dirname(path) or "/"
        for top in (self.layout.root, self.unit_dir):
            if top and (parent == top or parent.startswith(top.rstrip("/") + "/")):
                return open_dir(parent, owned_from=top, own_link=top == self.layout.root)
        # the host root itself (or a directory install made above it): its parent is an ancestor
        return open_ancestor(parent)

    def remove(self, entries: Iterable[Entry]) -> Cleanup:
        """Remove the listed ``file``/``link``/``dir`` entries (newest first) by the rules; ``unit`` entries
        are the service manager's (see :meth:`agent.session.session.Session.remove_units`) and are skipped
        here. Each entry is reached through its directory's checked handle and removed with ``unlinkat`` /
        ``rmdir`` on that handle (:mod:`agent.fs.tree`), so a directory swapped for a link meanwhile is
        refused, never followed.

        Returns:
            What was removed, kept and refused; never raises for a host condition.
        """
        out = Cleanup()
        for entry in reversed(list(entries)):
            if entry.kind == "unit":
                continue
            try:
                d = self._parent(entry.path)
            except (OSError, HostError) as e:
                out.errors.append(f"{entry.path}: cannot remove: {_why(e)}")
                continue
            if d is None:
                continue
            with d:
                name = os.path.basename(entry.path)
                try:
                    st = d.lstat(name)
                except OSError as e:
                    out.errors.append(f"{entry.path}: cannot remove: {e.strerror}")
                    continue
                if st is None:
                    continue
                if entry.kind == "dir":
                    self._remove_dir(d, name, st, out)
                elif entry.kind == "link" and not stat.S_ISLNK(st.st_mode):
                    out.kept.append(f"{entry.path}: kept: {_kind_of(st.st_mode)}, not the link install made")
                elif entry.kind == "file" and not stat.S_ISREG(st.st_mode):
                    out.kept.append(f"{entry.path}: kept: {_kind_of(st.st_mode)}, not the file install made")
                else:
                    _unlink(d, name, out)
        return out

    def remove_marked_layout(self) -> Cleanup:
        """No record: remove only the layout files that carry the agent's marker, then ``R/lib/NAME`` if
        it is left empty (it is named for the agent); ``R/lib``, ``R/bin`` and R stay."""
        out = Cleanup()
        for path in (self.layout.agent_dir, self.layout.bin_link):
            try:
                d = self._parent(path)
            except (OSError, HostError) as e:
                out.errors.append(f"{path}: cannot remove: {_why(e)}")
                continue
            if d is None:
                continue
            with d:
                name = os.path.basename(path)
                st = d.lstat(name)
                if st is None:
                    continue
                if path == self.layout.bin_link:
                    if self.layout_marked(path, st, d):
                        _unlink(d, name, out)
                else:
                    self._remove_dir(d, name, st, out)
        return out

    def _empty_agent_files(self, d: Dir, out: Cleanup) -> None:
        try:
            names = d.names()
        except OSError:
            return
        for n in names:
            st = d.lstat(n)
            if st is not None and self.layout_marked(d.join(n), st, d):
                _unlink(d, n, out)

    def _remove_dir(self, parent: Dir, name: str, st: os.stat_result, out: Cleanup) -> None:
        path = parent.join(name)
        if not stat.S_ISDIR(st.st_mode):
            out.kept.append(f"{path}: kept: {_kind_of(st.st_mode)}, not the directory install made")
            return
        if self.legacy_root and os.path.realpath(path) == os.path.realpath(self.legacy_root):
            out.kept.append(f"{path}: kept: the legacy root")
            return
        try:
            d = parent.child(name)
        except (OSError, HostError) as e:
            out.kept.append(f"{path}: kept: {_why(e)}")
            return
        if d is None:
            return
        with d:
            if is_mount_point(path, d.fstat(), parent.fstat()):
                out.kept.append(f"{path}: kept: a mount point")
                return
            if path in (self.layout.agent_dir, self.layout.bin_dir):
                self._empty_agent_files(d, out)
            _rmdir_if_empty(parent, name, d, out)


def _open_for_removal(parent: Dir, name: str, out: Cleanup, what: str) -> Dir | None:
    """The checked handle of the directory ``parent/name`` that a removal is about to empty; None (with the
    reason in ``out``) when it is absent, not a directory (kept: ``what`` names what it should have been),
    or refused by its checks."""
    path = parent.join(name)
    st = parent.lstat(name)
    if st is None:
        return None
    if not stat.S_ISDIR(st.st_mode):
        out.kept.append(f"{path}: kept: {_kind_of(st.st_mode)}, not {what}")
        return None
    try:
        return parent.child(name)
    except (OSError, HostError) as e:
        out.errors.append(f"{path}: cannot remove: {_why(e)}")
        return None


def _why(e: BaseException) -> str:
    return getattr(e, "strerror", None) or str(e)


def _unlink(d: Dir, name: str, out: Cleanup) -> None:
    path = d.join(name)
    try:
        if d.remove(name):
            out.removed.append(path)
    except OSError as e:
        out.errors.append(f"{path}: cannot remove: {e.strerror or e}")


# ----------------------------------------------------------------------------------------------- state_dir
# What the agent itself writes under state_dir; anything else there is someone else's and stays.
# Segments, their temps, and the owner record (``journal/owner.json``, with its atomic-write temp).
_JOURNAL_FILE_RE: Final = re.compile(r"[0-9]{20}\.jnl(\.zst)?|.*\.tmp|owner\.json(\.tmp.*)?")
_RESULT_FILE_RE: Final = re.compile(
    r"[A-Za-z0-9._-]{1,64}\.json|\.[A-Za-z0-9._-]{1,64}\.json\.tmp-[0-9a-f]{16}"
)
_RECORD_TEMP_RE: Final = re.compile(r"\.install\.json\.tmp-[0-9a-f]{16}")


def remove_state_files(state_dir: str, *, keep_record: bool = False) -> Cleanup:
    """``uninstall``: remove the files the agent writes in ``state_dir`` (journal segments and temps in
    ``journal/``, ``results/<operation>.json``, the install record and its temps), then each of
    ``journal/``, ``results/`` and ``state_dir`` with ``rmdir`` if left empty. Everything is reached through
    checked directory handles (:mod:`agent.fs.tree`) and removed with ``unlinkat``/``rmdir`` on them: never
    follows a symlink, never removes another file, a mount point or a non-empty directory. Never raises for a
    host condition.

    Args:
        keep_record: keep the install record (it still lists what was kept, for a later uninstall).
    """
    out = Cleanup()
    state_parent = os.path.dirname(state_dir) or "/"
    try:
        top = open_ancestor(state_parent)  # above state_dir: the ancestor rule
    except (OSError, HostError) as e:
        out.errors.append(f"{state_dir}: cannot remove: {_why(e)}")
        return out
    if top is None:
        return out
    with top:
        name = os.path.basename(state_dir)
        state = _open_for_removal(top, name, out, "the state directory")
        if state is None:
            return out
        with state:
            for sub, pattern in (("journal", _JOURNAL_FILE_RE), ("results", _RESULT_FILE_RE)):
                d = _open_for_removal(state, sub, out, "the agent's directory")
                if d is None:
                    continue
                with d:
                    _remove_matching(d, pattern, out)
                    _rmdir_if_empty(state, sub, d, out)
            names = _RECORD_TEMP_RE.pattern + ("" if keep_record else "|" + re.escape(RECORD_NAME))
            _remove_matching(state, re.compile(names), out)
            _rmdir_if_empty(top, name, state, out)
    return out


def _remove_matching(d: Dir, pattern: re.Pattern[str], out: Cleanup) -> None:
    try:
        names = d.names()
    except OSError as e:
        out.errors.append(f"{d.path}: cannot list: {e.strerror}")
        return
    for n in names:
        if not pattern.fullmatch(n):
            continue
        st = d.lstat(n)
        if st is None:
            continue
        if stat.S_ISREG(st.st_mode):
            _unlink(d, n, out)
        else:
            out.kept.append(f"{d.join(n)}: kept: {_kind_of(st.st_mode)}, not a file the agent wrote")


def _rmdir_if_empty(parent: Dir, name: str, d: Dir, out: Cleanup) -> None:
    """``rmdir`` of ``parent/name`` (whose open handle is ``d``) when it is empty and not a mount point."""
    path = parent.join(name)
    try:
        left = d.names()
    except OSError as e:
        out.errors.append(f"{path}: cannot list: {e.strerror}")
        return
    if left:
        shown = ", ".join(left[:4]) + (" ..." if len(left) > 4 else "")
        out.kept.append(f"{path}: kept: not empty ({shown})")
        return
    if is_mount_point(path, d.fstat(), parent.fstat()):
        out.kept.append(f"{path}: kept: a mount point")
        return
    now = parent.lstat(name)
    if now is None or (now.st_dev, now.st_ino) != (d.fstat().st_dev, d.fstat().st_ino):
        out.kept.append(f"{path}: kept: replaced while it was being emptied")
        return
    try:
        parent.remove_dir(name)
    except FileNotFoundError:
        return
    except OSError as e:
        out.errors.append(f"{path}: cannot remove: {e.strerror}")
        return
    out.removed.append(path)

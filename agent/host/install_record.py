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

import contextlib
import errno
import json
import os
import re
import stat
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal

import attrs

from agent.fs import durable
from agent.fs.statefile import read_state_file, remove_state_file, write_state_file
from agent.host.layout import Layout
from agent.systemd.units import unit_owner

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
def _mount_points() -> set[str]:
    """Mount points of this mount namespace (``/proc/self/mountinfo``, octal escapes decoded)."""
    points: set[str] = set()
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def is_mount_point(path: str, st: os.stat_result | None = None) -> bool:
    """True when ``path`` (a directory, not followed) is a mount point: another device than its parent,
    the same inode as its parent (a root), or listed in ``/proc/self/mountinfo`` (a bind mount)."""
    try:
        st = st or os.lstat(path)
        parent = os.lstat(os.path.dirname(path) or ".")
    except OSError:
        return False
    if st.st_dev != parent.st_dev or st.st_ino == parent.st_ino:
        return True
    return os.path.realpath(path) in _mount_points()


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
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return False, "absent"
        except OSError as e:
            if e.errno == errno.ELOOP:
                return False, "a symlink, not a unit file this agent wrote"
            return False, f"unreadable: {e.strerror}"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False, "not a regular file"
            head = os.read(fd, 4096)
        finally:
            os.close(fd)
        owner = unit_owner(head.decode("utf-8", errors="replace"))
        if owner == self.layout.name:
            return True, ""
        if owner is None:
            return False, "no upgrade-agent header line: not written by this agent"
        return False, f"written by upgrade-agent for {owner}, not {self.layout.name}"

    def layout_marked(self, path: str, st: os.stat_result) -> bool:
        """True when ``path`` is a layout file of this agent exactly: a slot file or staging/temp file in
        ``R/lib/NAME`` (regular), ``current``/``last-good`` naming a slot, or ``R/bin/NAME`` naming
        ``current`` (symlinks with exactly those targets)."""
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
                target = os.readlink(path)
                if path in (lay.current_link, lay.last_good_link) or (
                    self._temp_re.fullmatch(base) is not None and ".link-" in base
                ):
                    return lay.slot_of_target(target) is not None
            return False
        return path == lay.bin_link and stat.S_ISLNK(st.st_mode) and os.readlink(path) == lay.bin_link_target

    # -- removals ------------------------------------------------------------------------------------------
    def remove(self, entries: Iterable[Entry]) -> Cleanup:
        """Remove the listed ``file``/``link``/``dir`` entries (newest first) by the rules; ``unit`` entries
        are the service manager's (see :meth:`agent.session.session.Session.remove_units`) and are skipped
        here.

        Returns:
            What was removed, kept and refused; never raises for a host condition.
        """
        out = Cleanup()
        for entry in reversed(list(entries)):
            if entry.kind == "unit":
                continue
            try:
                st = os.lstat(entry.path)
            except FileNotFoundError:
                continue
            except OSError as e:
                out.errors.append(f"{entry.path}: cannot remove: {e.strerror}")
                continue
            if entry.kind == "dir":
                self._remove_dir(entry.path, st, out)
            elif entry.kind == "link" and not stat.S_ISLNK(st.st_mode):
                out.kept.append(f"{entry.path}: kept: {_kind_of(st.st_mode)}, not the link install made")
            elif entry.kind == "file" and not stat.S_ISREG(st.st_mode):
                out.kept.append(f"{entry.path}: kept: {_kind_of(st.st_mode)}, not the file install made")
            else:
                self._unlink(entry.path, out)
        return out

    def remove_marked_layout(self) -> Cleanup:
        """No record: remove only the layout files that carry the agent's marker, then ``R/lib/NAME`` if
        it is left empty (it is named for the agent); ``R/lib``, ``R/bin`` and R stay."""
        out = Cleanup()
        self._empty_agent_files(self.layout.agent_dir, out)
        with contextlib.suppress(OSError):
            st = os.lstat(self.layout.bin_link)
            if self.layout_marked(self.layout.bin_link, st):
                self._unlink(self.layout.bin_link, out)
        with contextlib.suppress(FileNotFoundError):
            self._remove_dir(self.layout.agent_dir, os.lstat(self.layout.agent_dir), out)
        return out

    def _empty_agent_files(self, directory: str, out: Cleanup) -> None:
        try:
            names = sorted(os.listdir(directory)) if not os.path.islink(directory) else []
        except OSError:
            return
        for n in names:
            path = os.path.join(directory, n)
            with contextlib.suppress(FileNotFoundError):
                if self.layout_marked(path, os.lstat(path)):
                    self._unlink(path, out)

    def _remove_dir(self, path: str, st: os.stat_result, out: Cleanup) -> None:
        if not stat.S_ISDIR(st.st_mode):
            out.kept.append(f"{path}: kept: {_kind_of(st.st_mode)}, not the directory install made")
            return
        if self.legacy_root and os.path.realpath(path) == os.path.realpath(self.legacy_root):
            out.kept.append(f"{path}: kept: the legacy root")
            return
        if is_mount_point(path, st):
            out.kept.append(f"{path}: kept: a mount point")
            return
        if path in (self.layout.agent_dir, self.layout.bin_dir):
            self._empty_agent_files(path, out)
        _rmdir_if_empty(path, out)

    @staticmethod
    def _unlink(path: str, out: Cleanup) -> None:
        try:
            if durable.remove_if_present(path):
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
    ``journal/``, ``results/`` and ``state_dir`` with ``rmdir`` if left empty. Never follows a symlink,
    never removes another file, a mount point or a non-empty directory. Never raises for a host condition.

    Args:
        keep_record: keep the install record (it still lists what was kept, for a later uninstall).
    """
    out = Cleanup()
    try:
        st = os.lstat(state_dir)
    except FileNotFoundError:
        return out
    except OSError as e:
        out.errors.append(f"{state_dir}: cannot remove: {e.strerror}")
        return out
    if not stat.S_ISDIR(st.st_mode):
        out.kept.append(f"{state_dir}: kept: {_kind_of(st.st_mode)}, not the state directory")
        return out
    for sub, pattern in (("journal", _JOURNAL_FILE_RE), ("results", _RESULT_FILE_RE)):
        directory = os.path.join(state_dir, sub)
        try:
            sub_st = os.lstat(directory)
        except FileNotFoundError:
            continue
        except OSError as e:
            out.errors.append(f"{directory}: cannot remove: {e.strerror}")
            continue
        if not stat.S_ISDIR(sub_st.st_mode):
            out.kept.append(f"{directory}: kept: {_kind_of(sub_st.st_mode)}, not the agent's directory")
            continue
        _remove_matching(directory, pattern, out)
        _rmdir_if_empty(directory, out)
    names = _RECORD_TEMP_RE.pattern + ("" if keep_record else "|" + re.escape(RECORD_NAME))
    _remove_matching(state_dir, re.compile(names), out)
    _rmdir_if_empty(state_dir, out)
    return out


def _remove_matching(directory: str, pattern: re.Pattern[str], out: Cleanup) -> None:
    try:
        names = sorted(os.listdir(directory))
    except OSError as e:
        out.errors.append(f"{directory}: cannot list: {e.strerror}")
        return
    for n in names:
        path = os.path.join(directory, n)
        if not pattern.fullmatch(n):
            continue
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            out.errors.append(f"{path}: cannot remove: {e.strerror}")
            continue
        if stat.S_ISREG(st.st_mode):
            Remover._unlink(path, out)
        else:
            out.kept.append(f"{path}: kept: {_kind_of(st.st_mode)}, not a file the agent wrote")


def _rmdir_if_empty(path: str, out: Cleanup) -> None:
    try:
        left = sorted(os.listdir(path))
    except OSError as e:
        out.errors.append(f"{path}: cannot list: {e.strerror}")
        return
    if left:
        shown = ", ".join(left[:4]) + (" ..." if len(left) > 4 else "")
        out.kept.append(f"{path}: kept: not empty ({shown})")
        return
    if is_mount_point(path):
        out.kept.append(f"{path}: kept: a mount point")
        return
    try:
        os.rmdir(path)
        durable.fsync_dir(os.path.dirname(path))
    except FileNotFoundError:
        return
    except OSError as e:
        out.errors.append(f"{path}: cannot remove: {e.strerror}")
        return
    out.removed.append(path)

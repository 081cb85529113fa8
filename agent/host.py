"""The real host layout: the ``upgrade_core.ports.Host`` port plus install, adoption and removal (SPEC 3, 6).

Every change follows the C12 order of :mod:`agent.durable` (data fsync, rename, directory fsync) and is
run in a worker thread under a shielded cancel scope: a link flip or a rename is never abandoned half way,
and the caller's journal event comes only after the directory fsync returned.

Foreign errors are translated here (python-tuf's wrap-at-the-port rule): ``OSError`` becomes a
:class:`~upgrade_core.errors.HostError` (``ENOSPC`` -> :class:`~upgrade_core.errors.NoSpaceError`) whose
message names the path.

Slots are never opened for writing (case C09): a slot only ever changes by a rename onto it, so a process
executing the old file keeps running it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Sequence
from typing import Literal, ParamSpec, TypeVar

import anyio
import anyio.to_thread
import attrs

from upgrade_core import Slot
from upgrade_core.errors import HostError, LayoutConflictError, NoExecError, NoSpaceError
from upgrade_core.ports import LinkState, StagedCandidate

from . import durable
from .config import AgentConfig
from .layout import Layout

__all__ = ["Adoption", "AgentHost", "ProtectedPathError", "SlotInUseError"]

P = ParamSpec("P")
T = TypeVar("T")


class SlotInUseError(HostError):
    """A candidate was about to be renamed onto the slot ``current`` or ``last-good`` names (SPEC 4.3 step 3:
    ``last-good`` is repointed first). Refused; nothing changed. Exit 1."""


class ProtectedPathError(HostError):
    """A write would land under ``/usr`` outside ``/usr/local`` (SPEC 3, case C14). Refused. Exit 2."""

    exit_code = 2


@attrs.frozen
class Adoption:
    """Something found on the host that ``install`` without ``--archive`` takes over (SPEC 3).

    Attributes:
        kind: ``legacy_layout`` (R is absent; a layout under LEGACY is linked as R) or ``binary`` (a plain
            executable is copied into blue).
        source: the legacy root, or the path of the adopted binary.
        sha256: 64 lowercase hex of the adopted binary; None for a legacy layout.
    """

    kind: Literal["legacy_layout", "binary"]
    source: str
    sha256: str | None = None


def _host_error(op: str, path: str, e: OSError) -> HostError:
    detail = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpaceError(f"{path}: no space left while trying to {op}")
    if e.errno == errno.EROFS:
        return HostError(f"{path}: read-only filesystem; cannot {op}")
    return HostError(f"{path}: cannot {op}: {detail}")


async def _in_thread_shielded(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking host change in a worker thread; cancellation waits for it (never abandoned)."""
    with anyio.CancelScope(shield=True):
        result = await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
    return result


def _is_plain_executable(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0 and bool(st.st_mode & 0o111)


class AgentHost:
    """The host layout of one agent under host root R (implements ``upgrade_core.ports.Host``).

    Args:
        root: ``host.root`` (absolute; may be or become a symlink to the legacy root).
        name: ``agent.name``.
        legacy_root: ``host.legacy_root`` or "" for none.
        max_member_bytes: ``limits.max_member_bytes``; free space on the slot filesystem must exceed it.
        mirrors: ``[[mirrors]].path`` values (absolute).
        protected_prefix: writes are refused under this prefix unless under ``protected_prefix/local``
            (SPEC 3 "nothing under /usr"); tests pass a fake prefix.
    """

    def __init__(
        self,
        root: str,
        name: str,
        *,
        legacy_root: str = "",
        max_member_bytes: int = 268435456,
        mirrors: Sequence[str] = (),
        protected_prefix: str = "/usr",
    ) -> None:
        self._root = os.path.normpath(root)
        self._name = name
        self._legacy_root = os.path.normpath(legacy_root) if legacy_root else ""
        self._max_member_bytes = max_member_bytes
        self._mirrors = tuple(mirrors)
        self._protected = os.path.normpath(protected_prefix)
        self.layout = Layout(self._root, name)

    @classmethod
    def from_config(cls, cfg: AgentConfig) -> AgentHost:
        """Build from the loaded configuration (``host.*``, ``limits.max_member_bytes``, ``[[mirrors]]``)."""
        return cls(
            cfg.host.root,
            cfg.agent.name,
            legacy_root=cfg.host.legacy_root,
            max_member_bytes=cfg.limits.max_member_bytes,
            mirrors=[m.path for m in cfg.mirrors],
        )

    # -- reading -----------------------------------------------------------------------------------
    def _read_link(self, link: str) -> Slot | None:
        try:
            st = os.lstat(link)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            raise LayoutConflictError(f"{link}: a file stands where a layout directory must be") from None
        except OSError as e:
            raise _host_error("read the link", link, e) from None
        if not stat.S_ISLNK(st.st_mode):
            kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
            raise LayoutConflictError(f"{link}: a real {kind} stands where a symlink must be")
        target = os.readlink(link)
        slot = self.layout.slot_of_target(target)
        if slot is None:
            raise LayoutConflictError(
                f"{link}: names {target!r}, not {self.layout.slot_target('blue')!r} or "
                f"{self.layout.slot_target('green')!r}"
            )
        return slot

    def links(self) -> LinkState:
        """Resolve ``current`` and ``last-good`` (SPEC 3).

        Returns:
            The slot each link names, None for an absent link.

        Raises:
            LayoutConflictError: a link is a real file/directory, or names something other than a bare slot.
            HostError: the links cannot be read.
        """
        return LinkState(
            current=self._read_link(self.layout.current_link),
            last_good=self._read_link(self.layout.last_good_link),
        )

    def slot_path(self, slot: Slot) -> str:
        """Absolute path of ``R/lib/NAME/NAME-<slot>``."""
        return self.layout.slot_path(slot)

    def current_link_path(self) -> str:
        """Absolute path of ``R/lib/NAME/NAME-current`` (what ``ExecStart`` runs)."""
        return self.layout.current_link

    def _slot_sha256_sync(self, slot: Slot) -> str | None:
        path = self.layout.slot_path(slot)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise _host_error("stat the slot", path, e) from None
        if not stat.S_ISREG(st.st_mode):
            raise LayoutConflictError(f"{path}: a slot must be a regular file")
        if st.st_size == 0:
            return None  # a zero-length slot is evidence of a crash, never a binary (case C12)
        try:
            return durable.file_sha256(path)
        except OSError as e:
            raise _host_error("hash the slot", path, e) from None

    async def slot_sha256(self, slot: Slot) -> str | None:
        """sha256 (64 lowercase hex) of the slot file.

        Returns:
            None when the slot is missing or zero-length (a zero-length file is a crash's leftover, C12).

        Raises:
            LayoutConflictError: something other than a regular file stands at the slot.
            HostError: the slot cannot be read.

        Cancellation: no effect (read only; the worker thread is waited for).
        """
        return await anyio.to_thread.run_sync(self._slot_sha256_sync, slot)

    def is_installed(self) -> bool:
        """True when ``R/lib/NAME/NAME-current`` exists as a symlink (whatever it names)."""
        try:
            return stat.S_ISLNK(os.lstat(self.layout.current_link).st_mode)
        except OSError:
            return False

    def check_bare(self) -> None:
        """Refuse to install unless the host is bare: ``R/lib/NAME`` absent or empty (SPEC 6, 7).

        A failed install removes the layout it made, so it must never start over slots, links or files it
        did not create.

        Raises:
            LayoutConflictError: a real file or directory where a link must be, or a layout without its
                ``current`` link (exit 2); nothing was changed.
        """
        self.links()  # a file or directory where current/last-good must be
        agent_dir = self.layout.agent_dir
        try:
            entries = sorted(os.listdir(agent_dir))
        except FileNotFoundError:
            return
        except NotADirectoryError:
            entries = [agent_dir]
        if entries:
            shown = ", ".join(entries[:4]) + (" ..." if len(entries) > 4 else "")
            raise LayoutConflictError(
                f"{agent_dir}: holds {shown} but no {os.path.basename(self.layout.current_link)} link; "
                "refusing to install over a partial layout (restore the link, or run uninstall first)"
            )

    # -- staging -----------------------------------------------------------------------------------
    def _sweep_sync(self) -> list[str]:
        agent_dir = self.layout.agent_dir
        try:
            names = os.listdir(agent_dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise _host_error("list the layout", agent_dir, e) from None
        protected = set()
        for link in (self.layout.current_link, self.layout.last_good_link):
            with contextlib.suppress(OSError):
                protected.add(os.readlink(link))
        removed = []
        for n in sorted(names):
            if self.layout.staging_slot(n) is None or n in protected:
                continue
            path = os.path.join(agent_dir, n)
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue  # not a file we could have made: leave it for the operator
                if durable.remove_if_present(path, sync_dir=False):
                    removed.append(path)
            except OSError as e:
                raise _host_error("remove a staging leftover", path, e) from None
        if removed:
            try:
                durable.fsync_dir(agent_dir)
            except OSError as e:
                raise _host_error("fsync the layout directory", agent_dir, e) from None
        return removed

    async def sweep_staging(self) -> list[str]:
        """Remove leftover ``.NAME-<slot>.stage-<hex>`` regular files (case C05).

        Nothing else is ever swept: not the slots, not a link target, not temp links, not directories.

        Returns:
            The removed paths, sorted.

        Raises:
            HostError: a leftover could not be removed.

        Cancellation: shielded; runs to completion.
        """
        return await _in_thread_shielded(self._sweep_sync)

    def _refuse_protected(self, path: str) -> None:
        real = os.path.realpath(path)
        local = os.path.join(self._protected, "local")
        inside = real == self._protected or real.startswith(self._protected + os.sep)
        in_local = real == local or real.startswith(local + os.sep)
        if inside and not in_local:
            raise ProtectedPathError(
                f"{path}: resolves to {real}, under {self._protected}; nothing is written there "
                f"(only under {local}, through a host-root link)"
            )

    def _prepare_staging_sync(self, slot: Slot) -> str:
        agent_dir = self.layout.agent_dir
        self._refuse_protected(agent_dir)
        try:
            st = os.statvfs(agent_dir)
        except OSError as e:
            raise _host_error("inspect the slot filesystem", agent_dir, e) from None
        if st.f_flag & os.ST_NOEXEC:
            raise NoExecError(f"{agent_dir}: mounted noexec; a staged binary could never run")
        if st.f_flag & os.ST_RDONLY:
            raise HostError(f"{agent_dir}: read-only filesystem; cannot stage a candidate")
        free = st.f_bavail * st.f_frsize
        if free <= self._max_member_bytes:
            raise NoSpaceError(
                f"{agent_dir}: {free} bytes free, not more than limits.max_member_bytes "
                f"({self._max_member_bytes}); nothing was written"
            )
        return self.layout.new_staging_path(slot)

    async def prepare_staging(self, slot: Slot) -> str:
        """Check the slot filesystem and return a fresh staging path for ``slot`` (not created).

        Raises:
            NoExecError: the slot filesystem is mounted ``noexec`` (SPEC 3).
            NoSpaceError: free space (``f_bavail * f_frsize``, bytes) does not exceed
                ``limits.max_member_bytes`` (case C05); nothing was written.
            ProtectedPathError: the layout resolves under ``/usr`` outside ``/usr/local``.
            HostError: the layout directory is missing or read-only.

        Cancellation: no effect.
        """
        return await anyio.to_thread.run_sync(self._prepare_staging_sync, slot)

    def _check_staging_path(self, staging_path: str) -> Slot:
        slot = self.layout.staging_slot(os.path.basename(staging_path))
        if slot is None or os.path.dirname(staging_path) != self.layout.agent_dir:
            raise RuntimeError(f"{staging_path}: not a staging path of {self.layout.agent_dir}")
        return slot

    def _discard_sync(self, staging_path: str) -> None:
        self._check_staging_path(staging_path)
        try:
            durable.remove_if_present(staging_path)
        except OSError as e:
            raise _host_error("remove the staging file", staging_path, e) from None

    async def discard_staging(self, staging_path: str) -> None:
        """Remove a staging file if present (EROFS-safe, case C14), then fsync its directory.

        Raises:
            RuntimeError: ``staging_path`` is not a staging name in this layout (caller misuse).
            HostError: it exists and cannot be removed.

        Cancellation: shielded; no effect beyond the removal.
        """
        await _in_thread_shielded(self._discard_sync, staging_path)

    def _install_sync(self, staged: StagedCandidate) -> None:
        slot = self._check_staging_path(staged.staging_path)
        if slot != staged.slot:
            raise RuntimeError(f"{staged.staging_path}: staged for {slot}, not {staged.slot}")
        links = self.links()
        if staged.slot in (links.current, links.last_good):
            which = "current" if staged.slot == links.current else "last-good"
            raise SlotInUseError(
                f"{self.layout.slot_path(staged.slot)}: {which} names this slot; a candidate never replaces"
                " it"
            )
        path = staged.staging_path
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size != staged.size or st.st_size == 0:
                raise HostError(
                    f"{path}: staged file is {st.st_size} bytes, expected {staged.size}; not installed"
                )
            # Slots are 0755 whoever wrote the file (SPEC 3). The archive source fsynced it already; fsync
            # again (cheap when clean) so the C12 order holds whoever wrote it.
            os.chmod(path, 0o755)
            durable.fsync_file(path)
            os.rename(path, self.layout.slot_path(staged.slot))
            durable.fsync_dir(self.layout.agent_dir)
        except OSError as e:
            raise _host_error("install the staged candidate", path, e) from None

    async def install_staged(self, staged: StagedCandidate) -> None:
        """Rename the staging file onto its slot, then fsync the slot directory (case C12).

        Raises:
            SlotInUseError: ``current`` or ``last-good`` names the target slot; nothing changed.
            HostError: the staging file is missing, of the wrong size, or the rename/fsync failed.
            RuntimeError: the path or slot do not belong together (caller misuse).

        Cancellation: shielded; may have happened when interrupted by a crash: re-check ``slot_sha256``.
        """
        await _in_thread_shielded(self._install_sync, staged)

    # -- links -------------------------------------------------------------------------------------
    def _point_sync(self, link: str, slot: Slot) -> None:
        slot_path = self.layout.slot_path(slot)
        try:
            st = os.lstat(slot_path)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            raise HostError(f"{slot_path}: missing or empty; {os.path.basename(link)} is not pointed at it")
        try:
            durable.atomic_symlink(self.layout.slot_target(slot), link)
        except OSError as e:
            raise _host_error("switch the link", link, e) from None

    async def point_current(self, slot: Slot) -> None:
        """Flip ``current`` to ``slot``: temp link + rename + directory fsync (atomic, case C11).

        Raises:
            LayoutConflictError: a real file or directory stands at the link; nothing changed.
            HostError: the slot is missing or empty, or the flip failed (the old link stays).

        Cancellation: shielded; may have happened when interrupted by a crash: re-check with ``links``.
        """
        await _in_thread_shielded(self._point_sync, self.layout.current_link, slot)

    async def point_last_good(self, slot: Slot) -> None:
        """Flip ``last-good`` to ``slot``, like :meth:`point_current`."""
        await _in_thread_shielded(self._point_sync, self.layout.last_good_link, slot)

    # -- mirrors -----------------------------------------------------------------------------------
    def _sync_mirrors_sync(self, slot: Slot, sha256: str) -> tuple[str, ...]:
        src = self.layout.slot_path(slot)
        for mirror in self._mirrors:
            parent = os.path.dirname(mirror)
            if not os.path.isdir(parent):
                raise HostError(f"{mirror}: mirror directory {parent} does not exist")
            try:
                durable.copy_file_durable(src, mirror, 0o755, expected_sha256=sha256)
            except ValueError as e:
                raise HostError(f"{mirror}: not synced: {e}") from None
            except LayoutConflictError as e:
                raise HostError(str(e)) from None
            except OSError as e:
                raise _host_error("write the mirror", mirror, e) from None
        return self._mirrors

    async def sync_mirrors(self, slot: Slot, sha256: str) -> tuple[str, ...]:
        """Copy the slot to every ``[[mirrors]].path`` (temp + fsync + digest check + rename + dir fsync).

        A mirror that already holds the bytes is left alone. A mirror is replaced by rename, never opened
        for writing, so a process running it keeps running (case C09).

        Args:
            slot: the slot to copy.
            sha256: 64 lowercase hex the copied bytes must hash to.

        Returns:
            The mirror paths, in configuration order.

        Raises:
            HostError: a mirror directory is missing, a copy failed, or the bytes differ from ``sha256``;
                mirrors after the failing one are not touched.

        Cancellation: shielded; each mirror is either the old file or the new one.
        """
        return await _in_thread_shielded(self._sync_mirrors_sync, slot, sha256)

    # -- install, adoption, removal (CLI) ----------------------------------------------------------
    def create_layout_dirs(self) -> list[str]:
        """Create ``R/lib/NAME`` and ``R/bin`` with missing parents, 0755, durably (SPEC 3).

        Returns:
            The directories created, outermost first.

        Raises:
            ProtectedPathError: the layout would land under ``/usr`` outside ``/usr/local``.
            HostError: a directory cannot be created (read-only, a file in the way, ...).
        """
        created: list[str] = []
        for d in (self.layout.agent_dir, self.layout.bin_dir):
            self._refuse_protected(d)
            try:
                created.extend(durable.make_dirs(d, 0o755))
            except OSError as e:
                raise _host_error("create the layout directory", d, e) from None
        return created

    def ensure_compat_link(self) -> bool:
        """Make ``R/bin/NAME -> ../lib/NAME/NAME-current`` (atomic, idempotent).

        A plain file at ``R/bin/NAME`` is replaced only when it holds exactly the bytes of the blue slot (it
        was adopted by :meth:`adopt`), so nothing is lost.

        Returns:
            True when the link was created or changed.

        Raises:
            LayoutConflictError: a directory, or a file that is not the adopted binary, stands there.
            HostError: the link cannot be written.
        """
        link = self.layout.bin_link
        target = self.layout.bin_link_target
        try:
            if _is_plain_executable(link):
                blue = self.layout.slot_path("blue")
                if not _is_plain_executable(blue) or durable.file_sha256(link) != durable.file_sha256(blue):
                    raise LayoutConflictError(f"{link}: a file that is not the adopted binary stands here")
                tmp = os.path.join(self.layout.bin_dir, f".{self._name}.link-adopt")
                durable.remove_if_present(tmp, sync_dir=False)
                os.symlink(target, tmp)
                os.rename(tmp, link)
                durable.fsync_dir(self.layout.bin_dir)
                return True
            return durable.atomic_symlink(target, link)
        except OSError as e:
            raise _host_error("write the compatibility link", link, e) from None

    def _legacy_layout_ok(self) -> bool:
        if not self._legacy_root:
            return False
        legacy = Layout(self._legacy_root, self._name)
        for link in (legacy.current_link, legacy.last_good_link):
            try:
                slot = legacy.slot_of_target(os.readlink(link))
            except OSError:
                return False
            if slot is None or not _is_plain_executable(legacy.slot_path(slot)):
                return False
        return True

    def find_adoptable(self) -> Adoption | None:
        """What :meth:`adopt` would take over, without changing anything (SPEC 3 adoption).

        Order: a legacy layout under LEGACY while R is absent; else a plain executable regular file at
        ``R/bin/NAME``; else one at ``LEGACY/bin/NAME``. Paths are compared after resolving symlinks, so
        LEGACY that is R, or two names of one file, count once.

        Returns:
            The adoption, or None when the layout is installed already or nothing can be adopted.
        """
        if self.is_installed():
            return None
        root_real = os.path.realpath(self._root)
        legacy_real = os.path.realpath(self._legacy_root) if self._legacy_root else ""
        if not os.path.lexists(self._root) and legacy_real != root_real and self._legacy_layout_ok():
            return Adoption("legacy_layout", self._legacy_root)
        seen: set[str] = set()
        candidates = [self.layout.bin_link]
        if self._legacy_root:
            candidates.append(Layout(self._legacy_root, self._name).bin_link)
        for path in candidates:
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            if _is_plain_executable(path):
                return Adoption("binary", path)
        return None

    def adopt(self) -> Adoption | None:
        """Take over what :meth:`find_adoptable` found; idempotent (SPEC 3).

        - ``legacy_layout``: R's missing parents are created 0755, then R becomes a relative symlink to
          LEGACY (atomic). Nothing is written under LEGACY.
        - ``binary``: the layout directories are created and the binary is copied into blue (temp + fsync +
          rename + dir fsync; an identical blue is left alone). The source file is not touched; pointing
          ``current``/``last-good`` and :meth:`ensure_compat_link` are the installer's next steps.

        Returns:
            The adoption done (with the blue sha256 for ``binary``), or None when there was nothing to adopt.

        Raises:
            ProtectedPathError: R would be created under ``/usr`` outside ``/usr/local``.
            HostError: a directory, link or copy could not be written.
        """
        found = self.find_adoptable()
        if found is None:
            return None
        if found.kind == "legacy_layout":
            parent = os.path.dirname(self._root)
            self._refuse_protected(parent)
            try:
                durable.make_dirs(parent, 0o755)
                target = os.path.relpath(os.path.realpath(self._legacy_root), os.path.realpath(parent))
                durable.atomic_symlink(target, self._root)
            except OSError as e:
                raise _host_error("link the host root to the legacy root", self._root, e) from None
            return found
        self.create_layout_dirs()
        blue = self.layout.slot_path("blue")
        try:
            durable.copy_file_durable(found.source, blue, 0o755)
            sha = durable.file_sha256(blue)
        except (OSError, ValueError) as e:
            detail = e if isinstance(e, ValueError) else (e.strerror or str(e))
            raise HostError(f"{found.source}: cannot adopt into {blue}: {detail}") from None
        return attrs.evolve(found, sha256=sha)

    def host_root(self) -> str:
        """The host root operations use, resolved; changes nothing (``upgrade-agent host-root``).

        R when it exists (resolved through its symlink, if any); else LEGACY when a legacy layout there
        would be adopted; else R as configured (resolved as far as it exists).
        """
        if os.path.lexists(self._root):
            return os.path.realpath(self._root)
        if self._legacy_layout_ok():
            return os.path.realpath(self._legacy_root)
        return os.path.realpath(self._root)

    def _made_legacy_link(self) -> bool:
        return bool(
            self._legacy_root
            and os.path.islink(self._root)
            and os.path.realpath(self._root) == os.path.realpath(self._legacy_root)
        )

    def remove_layout(self) -> list[str]:
        """Remove what install/adoption created, for ``uninstall`` (SPEC 7); EROFS-safe.

        When R is the link to LEGACY that adoption made, only that link goes: the legacy layout was there
        before and stays (never the legacy root or anything we did not create). Otherwise ``R/lib/NAME``
        (the slots, links and leftovers), ``R/bin/NAME`` when it is a symlink, then ``R/lib``, ``R/bin``
        and R only if they are empty real directories.

        Returns:
            The removed paths, in removal order.

        Raises:
            HostError: something that exists could not be removed.
        """
        removed: list[str] = []
        try:
            if self._made_legacy_link():
                if durable.remove_if_present(self._root):
                    removed.append(self._root)
                return removed
            agent_dir = self.layout.agent_dir
            if os.path.islink(agent_dir):
                if durable.remove_if_present(agent_dir):
                    removed.append(agent_dir)
            elif os.path.isdir(agent_dir):
                shutil.rmtree(agent_dir)
                durable.fsync_dir(self.layout.lib_dir)
                removed.append(agent_dir)
            if os.path.islink(self.layout.bin_link) and durable.remove_if_present(self.layout.bin_link):
                removed.append(self.layout.bin_link)
            for d in (self.layout.lib_dir, self.layout.bin_dir, self._root):
                if os.path.isdir(d) and not os.path.islink(d) and not os.listdir(d):
                    os.rmdir(d)
                    durable.fsync_dir(os.path.dirname(d))
                    removed.append(d)
        except OSError as e:
            raise _host_error("remove the layout", e.filename or self._root, e) from None
        return removed


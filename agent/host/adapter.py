"""The real host layout: the ``upgrade_core.ports.Host`` port (design §3, 6). Install, adoption and removal,
which only the CLI does, are :mod:`agent.host.provision`.

Every change follows the C12 order of :mod:`agent.fs.durable` (data fsync, rename, directory fsync) and is
run in a worker thread under a shielded cancel scope: a link flip or a rename is never abandoned half way,
and the caller's journal event comes only after the directory fsync returned.

Foreign errors are translated here (python-tuf's wrap-at-the-port rule): ``OSError`` becomes a
:class:`~upgrade_core.errors.HostError` (``ENOSPC`` -> :class:`~upgrade_core.errors.NoSpaceError`) whose
message names the path.

Slots are never opened for writing (case C09): a slot only ever changes by a rename onto it, so a process
executing the old file keeps running it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread

from agent.config.loader import AgentConfig
from agent.fs import durable
from agent.fs.tree import Dir, open_dir
from agent.host.layout import Layout
from agent.host.mirrors import Mirror
from agent.host.selinux import restore_labels
from upgrade_core import Slot
from upgrade_core.errors import HostError, LayoutConflictError, NoExecError, NoSpaceError
from upgrade_core.ports import LinkState, StagedCandidate

__all__ = ["AgentHost", "ProtectedPathError", "SlotInUseError", "host_error"]

P = ParamSpec("P")
T = TypeVar("T")


class SlotInUseError(HostError):
    """A candidate was about to be renamed onto the slot ``current`` or ``last-good`` names (design §4.3
    step 3:
    ``last-good`` is repointed first). Refused; nothing changed. Exit 1."""


class ProtectedPathError(HostError):
    """A write would land under ``/usr`` outside ``/usr/local`` (design §3, case C14). Refused. Exit 2."""

    exit_code = 2


def host_error(op: str, path: str, e: OSError) -> HostError:
    """Translate ``e`` from doing ``op`` on ``path`` into the project's error naming the path."""
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


class AgentHost:
    """The host layout of one agent under host root R (implements ``upgrade_core.ports.Host``).

    Args:
        root: ``host.root`` (absolute; may be or become a symlink to the legacy root).
        name: ``agent.name``.
        legacy_root: ``host.legacy_root`` or "" for none.
        max_member_bytes: ``limits.max_member_bytes``; free space on the slot filesystem must exceed it.
        mirrors: ``[[mirrors]]`` entries: :class:`~agent.host.mirrors.Mirror` (a fixed path, or one in the
            machine a JSON file names as active), ``(path, root)`` pairs, or a path alone (root "" = the
            path's directory); each copy is confined beneath its root (docs/configuration.md ``[[mirrors]]``).
        protected_prefix: writes are refused under this prefix unless under ``protected_prefix/local``
            (design §3 "nothing under /usr"); tests pass a fake prefix.
    """

    def __init__(
        self,
        root: str,
        name: str,
        *,
        legacy_root: str = "",
        max_member_bytes: int = 268435456,
        mirrors: Sequence[str | tuple[str, str] | Mirror] = (),
        protected_prefix: str = "/usr",
    ) -> None:
        self._root = os.path.normpath(root)
        self._name = name
        self._legacy_root = os.path.normpath(legacy_root) if legacy_root else ""
        self._max_member_bytes = max_member_bytes
        self._mirrors = tuple(
            m if isinstance(m, Mirror) else Mirror(m) if isinstance(m, str) else Mirror(*m) for m in mirrors
        )
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
            mirrors=[Mirror(m.path, m.root, m.active_from, m.active_key) for m in cfg.mirrors],
        )

    @property
    def root(self) -> str:
        """``host.root``, normalised (may be a symlink to the legacy root)."""
        return self._root

    @property
    def name(self) -> str:
        """``agent.name``."""
        return self._name

    @property
    def legacy_root(self) -> str:
        """``host.legacy_root``, normalised, or "" for none."""
        return self._legacy_root

    # -- reading -----------------------------------------------------------------------------------
    def agent_dir(self) -> Dir | None:
        """The checked handle of ``R/lib/NAME`` (:func:`agent.fs.tree.open_dir`: ``R`` and what lies below it
        by the own-directory rule, never through a link below ``R``), or None when it does not exist yet.

        Raises:
            HostRefusedError: a directory on the way is not the agent's (exit 4).
            HostError: it cannot be opened (EACCES, EIO).
        """
        try:
            return open_dir(self.layout.agent_dir, owned_from=self._root, own_link=True)
        except NotADirectoryError:
            where = self.layout.agent_dir
            raise LayoutConflictError(f"{where}: a file stands where a layout directory must be") from None
        except OSError as e:
            raise host_error("open the layout directory", self.layout.agent_dir, e) from None

    def _read_link(self, d: Dir | None, link: str) -> Slot | None:
        if d is None:
            return None
        name = os.path.basename(link)
        try:
            st = d.lstat(name)
            if st is None:
                return None
            if not stat.S_ISLNK(st.st_mode):
                kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
                raise LayoutConflictError(f"{link}: a real {kind} stands where a symlink must be")
            target = d.readlink(name) or ""
        except OSError as e:
            raise host_error("read the link", link, e) from None
        slot = self.layout.slot_of_target(target)
        if slot is None:
            raise LayoutConflictError(
                f"{link}: names {target!r}, not {self.layout.slot_target('blue')!r} or "
                f"{self.layout.slot_target('green')!r}"
            )
        return slot

    def links(self) -> LinkState:
        """Resolve ``current`` and ``last-good`` (design §3).

        Returns:
            The slot each link names, None for an absent link.

        Raises:
            LayoutConflictError: a link is a real file/directory, or names something other than a bare slot.
            HostError: the links cannot be read.
        """
        d = self.agent_dir()
        try:
            return LinkState(
                current=self._read_link(d, self.layout.current_link),
                last_good=self._read_link(d, self.layout.last_good_link),
            )
        finally:
            if d is not None:
                d.close()

    def slot_path(self, slot: Slot) -> str:
        """Absolute path of ``R/lib/NAME/NAME-<slot>``."""
        return self.layout.slot_path(slot)

    def current_link_path(self) -> str:
        """Absolute path of ``R/lib/NAME/NAME-current`` (what ``ExecStart`` runs)."""
        return self.layout.current_link

    def slot_sha256_sync(self, slot: Slot) -> str | None:
        """:meth:`slot_sha256` in the calling thread (a reader that runs no event loop)."""
        path = self.layout.slot_path(slot)
        name = self.layout.slot_target(slot)
        d = self.agent_dir()
        if d is None:
            return None
        with d:
            try:
                st = d.lstat(name)
            except OSError as e:
                raise host_error("stat the slot", path, e) from None
            if st is None:
                return None
            if not stat.S_ISREG(st.st_mode):
                raise LayoutConflictError(f"{path}: a slot must be a regular file")
            if st.st_nlink != 1:
                # A slot only ever comes from a rename of a staging file the agent created (one link); a
                # second name elsewhere means it is not what the agent staged (or shares its inode with a
                # file outside): never run or roll back to it.
                raise LayoutConflictError(f"{path}: a slot with {st.st_nlink} hard links; refused")
            if st.st_size == 0:
                return None  # a zero-length slot is evidence of a crash, never a binary (case C12)
            try:
                return d.sha256(name)
            except OSError as e:
                raise host_error("hash the slot", path, e) from None

    async def slot_sha256(self, slot: Slot) -> str | None:
        """sha256 (64 lowercase hex) of the slot file.

        Returns:
            None when the slot is missing or zero-length (a zero-length file is a crash's leftover, C12).

        Raises:
            LayoutConflictError: something other than a regular file stands at the slot.
            HostError: the slot cannot be read.

        Cancellation: no effect (read only; the worker thread is waited for).
        """
        return await anyio.to_thread.run_sync(self.slot_sha256_sync, slot)

    def _read_slot_sync(self, slot: Slot, limit: int) -> bytes | None:
        path = self.layout.slot_path(slot)
        d = self.agent_dir()
        if d is None:
            return None
        name = self.layout.slot_target(slot)
        with d:
            try:
                st = d.lstat(name)
                if st is None:
                    return None
                # never a buffer of ``limit`` bytes for a smaller slot: os.read allocates what it is asked for
                return d.read(name, limit=min(limit, st.st_size + 1))
            except FileNotFoundError:
                return None
            except OSError as e:
                raise host_error("read the slot", path, e) from None

    async def read_slot(self, slot: Slot, limit: int) -> bytes | None:
        """The bytes of the slot file, at most ``limit`` of them (a delta's base, docs/delta.md).

        Returns:
            None when the slot is missing. A result of ``limit`` bytes may be cut: ask for one byte more
            than the largest size accepted.

        Raises:
            HostRefusedError: something other than a regular file stands at the slot (never opened).
            HostError: the slot cannot be read.

        Cancellation: no effect (read only; the worker thread is waited for).
        """
        return await anyio.to_thread.run_sync(self._read_slot_sync, slot, limit)

    def is_installed(self) -> bool:
        """True when ``R/lib/NAME/NAME-current`` exists as a symlink (whatever it names)."""
        try:
            d = self.agent_dir()
        except HostError:
            return False
        if d is None:
            return False
        with d:
            st = d.lstat(os.path.basename(self.layout.current_link))
        return st is not None and stat.S_ISLNK(st.st_mode)

    # -- staging -----------------------------------------------------------------------------------
    def _sweep_sync(self) -> list[str]:
        agent_dir = self.layout.agent_dir
        d = self.agent_dir()
        if d is None:
            return []
        with d:
            try:
                names = d.names()
                protected = {d.readlink(os.path.basename(link))
                             for link in (self.layout.current_link, self.layout.last_good_link)}
            except OSError as e:
                raise host_error("list the layout", agent_dir, e) from None
            removed = []
            for n in names:
                if self.layout.staging_slot(n) is None or n in protected:
                    continue
                path = os.path.join(agent_dir, n)
                try:
                    st = d.lstat(n)
                    if st is None or not stat.S_ISREG(st.st_mode):
                        continue  # not a file we could have made: leave it for the operator
                    if d.remove(n, sync=False):
                        removed.append(path)
                except OSError as e:
                    raise host_error("remove a staging leftover", path, e) from None
            if removed:
                try:
                    d.fsync()
                except OSError as e:
                    raise host_error("fsync the layout directory", agent_dir, e) from None
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

    def refuse_protected(self, path: str) -> None:
        """Refuse a write at ``path`` under ``/usr`` outside ``/usr/local`` (design §3, case C14).

        Raises:
            ProtectedPathError: ``path`` resolves there (exit 2); nothing was changed.
        """
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
        self.refuse_protected(agent_dir)
        d = self.agent_dir()
        if d is None:
            raise HostError(f"{agent_dir}: the layout directory does not exist; cannot stage a candidate")
        try:
            with d:
                st = d.statvfs()
        except OSError as e:
            raise host_error("inspect the slot filesystem", agent_dir, e) from None
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
            NoExecError: the slot filesystem is mounted ``noexec`` (design §3).
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
        d = self.agent_dir()
        if d is None:
            return
        with d:
            try:
                d.remove(os.path.basename(staging_path))
            except OSError as e:
                raise host_error("remove the staging file", staging_path, e) from None

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
        name = os.path.basename(path)
        d = self.agent_dir()
        if d is None:
            raise HostError(f"{path}: the layout directory is gone; not installed")
        with d:
            try:
                st = d.lstat(name)
                if st is None:
                    raise FileNotFoundError(errno.ENOENT, "no such file", path)
                if not stat.S_ISREG(st.st_mode) or st.st_size != staged.size or st.st_size == 0:
                    raise HostError(
                        f"{path}: staged file is {st.st_size} bytes, expected {staged.size}; not installed"
                    )
                # Slots are 0755 whoever wrote the file (design §3). The archive source fsynced it already;
                # fsync again (cheap when clean) so the C12 order holds whoever wrote it.
                fd = d.open_regular(name)
                try:
                    os.fchmod(fd, 0o755)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                d.rename(name, self.layout.slot_target(staged.slot))
                d.fsync()
            except OSError as e:
                raise host_error("install the staged candidate", path, e) from None

    async def install_staged(self, staged: StagedCandidate) -> None:
        """Rename the staging file onto its slot, then fsync the slot directory (case C12), then restore the
        slot's SELinux label when the host has SELinux enabled (:func:`agent.host.selinux.restore_labels`).

        Raises:
            SlotInUseError: ``current`` or ``last-good`` names the target slot; nothing changed.
            HostError: the staging file is missing, of the wrong size, or the rename/fsync failed; or
                ``restorecon`` failed on the slot (the candidate is in its slot, no link names it: the
                episode stops before the switch).
            HostRefusedError: the ``restorecon`` on ``PATH`` is not one the agent may run (exit 4).
            RuntimeError: the path or slot do not belong together (caller misuse).

        Cancellation: shielded; may have happened when interrupted by a crash: re-check ``slot_sha256``.
        """
        await _in_thread_shielded(self._install_sync, staged)
        await restore_labels([self.layout.slot_path(staged.slot)])

    # -- links -------------------------------------------------------------------------------------
    def _point_sync(self, link: str, slot: Slot) -> None:
        slot_path = self.layout.slot_path(slot)
        d = self.agent_dir()
        try:
            st = d.lstat(self.layout.slot_target(slot)) if d is not None else None
        except OSError:
            st = None
        try:
            if d is None or st is None or not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                label = os.path.basename(link)
                raise HostError(f"{slot_path}: missing or empty; {label} is not pointed at it")
            try:
                d.symlink(self.layout.slot_target(slot), os.path.basename(link))
            except OSError as e:
                raise host_error("switch the link", link, e) from None
        finally:
            if d is not None:
                d.close()

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
        done: list[str] = []
        for entry in self._mirrors:
            mirror, tree_root = entry.resolve()  # an active machine is read again for every copy
            parent = os.path.dirname(mirror)
            try:
                d = open_dir(parent, owned_from=tree_root, confined=True)
                if d is None:
                    raise HostError(f"{mirror}: mirror directory {parent} does not exist")
                with d:
                    durable.copy_file_durable(src, mirror, 0o755, expected_sha256=sha256, into=d)
            except ValueError as e:
                raise HostError(f"{mirror}: not synced: {e}") from None
            except LayoutConflictError as e:
                raise HostError(str(e)) from None
            except OSError as e:
                raise host_error("write the mirror", mirror, e) from None
            done.append(mirror)
        return tuple(done)

    def check_mirrors(self) -> None:
        """Walk to every mirror's directory as :meth:`sync_mirrors` will (confined beneath its root), writing
        nothing: a mirror that cannot be reached that way is named before an episode opens, not after the
        switch.

        Raises:
            HostRefusedError: a symlink or a non-directory on the way, or an ancestor of the mirror's root
                that is not root's (exit 4).
            ActiveMachineError: an ``active_from`` file cannot tell the active machine (exit 2, naming the
                file and the key).
            HostError: a mirror's directory is missing or cannot be opened.
        """
        for entry in self._mirrors:
            mirror, tree_root = entry.resolve()
            parent = os.path.dirname(mirror)
            try:
                d = open_dir(parent, owned_from=tree_root, confined=True)
            except OSError as e:
                raise host_error("open the mirror directory", parent, e) from None
            if d is None:
                raise HostError(f"{mirror}: mirror directory {parent} does not exist")
            d.close()

    async def sync_mirrors(self, slot: Slot, sha256: str) -> tuple[str, ...]:
        """Copy the slot to every ``[[mirrors]].path`` (temp + fsync + digest check + rename + dir fsync).

        A mirror that already holds the bytes is left alone. A mirror is replaced by rename, never opened
        for writing, so a process running it keeps running (case C09). The mirror tree may belong to another
        uid (a user-namespaced container's root): the walk from its ``root`` down to the mirror's directory
        accepts any owner but never a symlink (:func:`agent.fs.tree.open_dir` ``confined``), and the copy is
        made and renamed inside that directory's handle, so nothing is written outside the tree; the
        ancestors of ``root`` follow the ancestor rule.

        Args:
            slot: the slot to copy.
            sha256: 64 lowercase hex the copied bytes must hash to.

        Returns:
            The mirror paths written, in configuration order (an active-machine entry as resolved now).

        Raises:
            HostRefusedError: a mirror's directory cannot be walked that way (a symlink or a non-directory
                on the way, an ancestor of its root not root's) (exit 4); nothing written there.
            HostError: a mirror directory is missing, a copy failed, or the bytes differ from ``sha256``;
                an ``active_from`` file cannot tell the active machine (:class:`ActiveMachineError`);
                mirrors after the failing one are not touched.

        Cancellation: shielded; each mirror is either the old file or the new one.
        """
        return await _in_thread_shielded(self._sync_mirrors_sync, slot, sha256)

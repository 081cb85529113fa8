"""The files of ``upgrade-agent host move`` (docs/host.md, "Moving a linked host into a real root"): the
:class:`~upgrade_core.ports.HostMover` port over a real host. The episode and its rules are
:mod:`upgrade_core._hostmove`'s.

The host root ``R`` is a root-owned link to the legacy root ``L`` (``install`` adopted ``L``'s layout so). The
copy is made beside ``R``, in ``R``'s parent, as ``.<basename R>.move-<hex>``: ``lib/NAME`` with both slots
(their bytes and mode 0755, fsynced, digest-checked), the ``current`` and ``last-good`` links with their bare
targets, and ``bin/NAME -> ../lib/NAME/NAME-current``; its SELinux labels are restored
(:func:`agent.host.selinux.restore_labels`). Then the copy and the link are exchanged in one atomic rename
(:func:`agent.fs.exchange.exchange`, ``RENAME_EXCHANGE``): every path under ``R`` resolves before, during and
after it, so the agent unit (``ExecStart=R/lib/NAME/NAME-current``) runs on and restarts from either. The old
link, now at the copy's name, is removed last. ``L``'s files are never touched: the agent did not make
them, and the running process keeps executing the file it was started from until its next restart.

Every directory is reached through :mod:`agent.fs` handles: ``R``'s parent by the ancestor rule, everything
the copy makes by the own-directory rule; the copy is removed (:meth:`RootMover.undo`) entry by entry through
those handles, never through a link.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Literal

import anyio.to_thread

from agent.crashhook import crash_point
from agent.fs import durable
from agent.fs.exchange import exchange
from agent.fs.tree import Dir, iter_entries, open_ancestor
from agent.host.adapter import AgentHost, host_error
from agent.host.selinux import restore_labels
from agent.logline import WARNING, log
from upgrade_core import SLOTS, Slot
from upgrade_core.errors import HostError, HostMoveRefusedError

__all__ = ["RootMover"]

_MAX_DEPTH = 3  # the copy's depth: <copy>/lib/NAME/<file>


class RootMover:
    """The real :class:`~upgrade_core.ports.HostMover` of one host (see the module doc).

    Args:
        host: the agent's host (its root, legacy root and layout).
    """

    def __init__(self, host: AgentHost) -> None:
        self.host = host
        self.root = host.root
        self.parent = os.path.dirname(host.root)
        self.name = os.path.basename(host.root)

    # -- where the host stands -----------------------------------------------------------------------------
    def state(self) -> Literal["linked", "real"]:
        """``linked`` (``R`` is a link to ``host.legacy_root``: a move can start) or ``real`` (``R`` is a real
        directory: nothing to move).

        Raises:
            HostMoveRefusedError: ``R`` is missing, something else, or a link to anywhere but the legacy
                root (exit 2, naming both); nothing to do here.
        """
        try:
            st = os.lstat(self.root)
        except FileNotFoundError:
            raise HostMoveRefusedError(f"{self.root}: not installed; nothing to move") from None
        if stat.S_ISDIR(st.st_mode):
            return "real"
        legacy = self.host.legacy_root
        if not stat.S_ISLNK(st.st_mode):
            raise HostMoveRefusedError(f"{self.root}: not a directory and not a link; not moved")
        target = os.path.realpath(self.root)
        if not legacy or target != os.path.realpath(legacy):
            raise HostMoveRefusedError(
                f"{self.root}: a link to {target}, not to host.legacy_root ({legacy or 'unset'}): "
                "only a host install adopted through the compatibility link is moved"
            )
        return "linked"

    def staging_path(self, token: str) -> str:
        """The copy's directory beside ``R``: ``<dirname R>/.<basename R>.move-<token>``."""
        return os.path.join(self.parent, f".{self.name}.move-{token}")

    def _parent(self) -> Dir:
        d = open_ancestor(self.parent)
        if d is None:
            raise HostError(f"{self.parent}: the host root's directory is gone")
        return d

    def _staging_name(self, staging: str) -> str:
        if os.path.dirname(staging) != self.parent or not os.path.basename(staging).startswith(
            f".{self.name}.move-"
        ):
            raise RuntimeError(f"{staging}: not a host move copy of {self.root}")  # caller misuse
        return os.path.basename(staging)

    # -- the port --------------------------------------------------------------------------------------------
    async def copy(self, staging: str) -> dict[Slot, str]:
        """See :meth:`upgrade_core.ports.HostMover.copy`."""
        digests = await anyio.to_thread.run_sync(self._copy_sync, staging)
        await restore_labels([staging], recursive=True)
        crash_point("host-move-copied")
        return digests

    def _copy_sync(self, staging: str) -> dict[Slot, str]:
        name = self._staging_name(staging)
        lay = self.host.layout
        digests: dict[Slot, str] = {}
        try:
            with self._parent() as parent:
                self._remove_copy(parent, name)  # an earlier attempt's copy is not trusted
                parent.make_dir(name, 0o755)
                top = parent.child(name)
                assert top is not None
                with top:
                    lib = top.child("lib", create=0o755)
                    assert lib is not None
                    with lib:
                        agent = lib.child(self.host.name, create=0o755)
                        assert agent is not None
                        with agent:
                            for slot in SLOTS:
                                src = lay.slot_path(slot)
                                if self.host.slot_sha256_sync(slot) is None:
                                    continue  # missing or empty: nothing to carry
                                dst = os.path.join(agent.path, lay.slot_target(slot))
                                durable.copy_file_durable(src, dst, 0o755, into=agent)
                                digests[slot] = agent.sha256(lay.slot_target(slot))
                            links = self.host.links()
                            for link, slot_named in ((lay.current_link, links.current),
                                                     (lay.last_good_link, links.last_good)):
                                if slot_named is not None:
                                    agent.symlink(lay.slot_target(slot_named), os.path.basename(link))
                    bindir = top.child("bin", create=0o755)
                    assert bindir is not None
                    with bindir:
                        bindir.symlink(lay.bin_link_target, self.host.name)
        except (OSError, ValueError) as e:
            if isinstance(e, OSError):
                raise host_error("copy the layout for the host move", staging, e) from None
            raise HostError(f"{staging}: copy failed: {e}") from None
        return digests

    async def swap(self, staging: str) -> None:
        """See :meth:`upgrade_core.ports.HostMover.swap`."""

        def run() -> None:
            name = self._staging_name(staging)
            with self._parent() as parent:
                st = parent.lstat(name)
                if st is None or not stat.S_ISDIR(st.st_mode):
                    raise HostError(f"{staging}: the copy is not there; not exchanged")
                try:
                    exchange(parent, name, self.name)
                except OSError as e:
                    raise host_error("exchange the copy with the host root link", self.root, e) from None
            crash_point("host-move-exchanged")

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(run)

    def landed(self, staging: str) -> bool:
        """See :meth:`upgrade_core.ports.HostMover.landed`."""
        self._staging_name(staging)
        with self._parent() as parent:
            st = parent.lstat(self.name)
        return st is not None and stat.S_ISDIR(st.st_mode)

    async def finish(self, staging: str) -> None:
        """See :meth:`upgrade_core.ports.HostMover.finish`. The labels of ``R`` are restored once more under
        their final names, best effort (the copy's were restored before the exchange, which waited on it)."""

        def run() -> None:
            name = self._staging_name(staging)
            with self._parent() as parent:
                st = parent.lstat(name)
                if st is not None and stat.S_ISLNK(st.st_mode):
                    try:
                        parent.remove(name)
                    except OSError as e:
                        raise host_error("remove the old host root link", staging, e) from None

        await anyio.to_thread.run_sync(run)
        try:
            await restore_labels([self.root], recursive=True)
        except HostError as exc:
            log(f"host move: {exc}", WARNING)

    async def undo(self, staging: str) -> None:
        """See :meth:`upgrade_core.ports.HostMover.undo`."""

        def run() -> None:
            name = self._staging_name(staging)
            with self._parent() as parent:
                self._remove_copy(parent, name)

        await anyio.to_thread.run_sync(run)

    def _remove_copy(self, parent: Dir, name: str) -> None:
        """Remove the copy ``name`` (a real directory this episode made; a link there is left alone: after an
        exchange it is the old root link, :meth:`finish`'s)."""
        st = parent.lstat(name)
        if st is None or not stat.S_ISDIR(st.st_mode):
            return
        try:
            _remove_tree(parent, name, _MAX_DEPTH)
        except OSError as e:
            raise host_error("remove the host move's copy", parent.join(name), e) from None


def _remove_tree(parent: Dir, name: str, depth: int) -> None:
    """Remove the directory ``name`` of ``parent`` and what it holds, through handles, never following a link
    (a link inside is removed as a link); at most ``depth`` levels."""
    d = parent.child(name)
    if d is None:
        return
    with d:
        for entry, st in list(iter_entries(d)):
            if stat.S_ISDIR(st.st_mode):
                if depth <= 0:
                    raise OSError(errno.ENOTEMPTY, "deeper than a host move's copy; not removed",
                                  d.join(entry))
                _remove_tree(d, entry, depth - 1)
            else:
                d.remove(entry, sync=False)
        d.fsync()
    parent.remove_dir(name)

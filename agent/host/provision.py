"""Install, adoption and removal of an agent's host layout (design §3, 7): what only the CLI does.

The ``upgrade_core.ports.Host`` port (links, slots, staging, switch, mirrors) is
:class:`agent.host.adapter.AgentHost`; a :class:`Provisioner` works over the same layout and uses the host
for its
reads (``links()``, ``is_installed()``) and for the ``/usr`` protection. Changes follow the C12 order of
:mod:`agent.fs.durable`; ``OSError`` becomes a :class:`~upgrade_core.errors.HostError` naming the path
(:func:`agent.host.adapter.host_error`).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Literal

import attrs

from agent.fs import durable
from agent.fs.tree import Dir, open_dir
from agent.host.adapter import AgentHost, host_error
from agent.host.layout import Layout
from upgrade_core.errors import HostError, LayoutConflictError

__all__ = ["Adoption", "Provisioner", "is_plain_executable"]


@attrs.frozen
class Adoption:
    """Something found on the host that ``install`` without ``--archive`` takes over (design §3).

    Attributes:
        kind: ``legacy_layout`` (R is absent; a layout under LEGACY is linked as R), ``binary`` (a plain
            executable is copied into blue) or ``slot`` (a layout whose ``current`` link is gone: the slot
            holding a plain executable, blue first, is installed into blue again; the seeds'
            ``EnsureDaemonBinaryLinks``).
        source: the legacy root, or the path of the adopted binary or slot.
        sha256: 64 lowercase hex of the adopted binary; None for a legacy layout.
    """

    kind: Literal["legacy_layout", "binary", "slot"]
    source: str
    sha256: str | None = None


def is_plain_executable(path: str) -> bool:
    """A non-empty regular file with an execute bit (symlinks are not followed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return _plain_executable(st)


def _same_bytes(a: str, b: str) -> bool:
    try:
        return durable.file_sha256(a) == durable.file_sha256(b)
    except OSError:
        return False


def _plain_executable(st: os.stat_result | None) -> bool:
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_size > 0 and bool(st.st_mode & 0o111)


class Provisioner:
    """Install, adopt and remove the layout of ``host`` (design §3, 7).

    Args:
        host: the agent's host; its root, name, legacy root and layout are the ones worked on.
    """

    def __init__(self, host: AgentHost) -> None:
        self.host = host
        self.layout = host.layout

    def check_bare(self, *, adopting_slot: bool = False) -> None:
        """Refuse to install unless the host is bare: ``R/lib/NAME`` absent or empty (design §6, 7); with
        ``adopting_slot``, a directory holding only the two slots (no link, nothing else) is accepted too: a
        layout whose links are gone, adopted from its slots (:meth:`find_adoptable`).

        A failed install removes the layout it made, so it must never start over slots, links or files it
        did not create (the slots an adoption starts from are not listed in the install record).

        Raises:
            LayoutConflictError: a real file or directory where a link must be, or a layout without its
                ``current`` link (exit 2); nothing was changed.
        """
        self.host.links()  # a file or directory where current/last-good must be
        agent_dir = self.layout.agent_dir
        try:
            d = self.host.agent_dir()
        except LayoutConflictError:
            entries = [agent_dir]
        else:
            if d is None:
                return
            with d:
                entries = d.names()
        if adopting_slot:
            slots = {self.layout.slot_target(s) for s in ("blue", "green")}
            entries = [e for e in entries if e not in slots]
        if entries:
            shown = ", ".join(entries[:4]) + (" ..." if len(entries) > 4 else "")
            raise LayoutConflictError(
                f"{agent_dir}: holds {shown} but no {os.path.basename(self.layout.current_link)} link; "
                "refusing to install over a partial layout (restore the link, or run uninstall first)"
            )

    def create_layout_dirs(self) -> list[str]:
        """Create ``R/lib/NAME`` and ``R/bin`` with missing parents, 0755, durably (design §3).

        Returns:
            The directories created, outermost first.

        Raises:
            ProtectedPathError: the layout would land under ``/usr`` outside ``/usr/local``.
            HostError: a directory cannot be created (read-only, a file in the way, ...).
        """
        created: list[str] = []
        for d in (self.layout.agent_dir, self.layout.bin_dir):
            self.host.refuse_protected(d)
            try:
                made = open_dir(d, owned_from=self.host.root, create=0o755, made=created, own_link=True)
            except OSError as e:
                raise host_error("create the layout directory", d, e) from None
            assert made is not None
            made.close()
        return created

    def bin_dir(self) -> Dir | None:
        """The checked handle of ``R/bin`` (own-directory rule from R down), or None when it is missing.

        Raises:
            HostRefusedError: a directory on the way is not the agent's (exit 4).
        """
        return open_dir(self.layout.bin_dir, owned_from=self.host.root, own_link=True)

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
        name = os.path.basename(link)
        try:
            d = self.bin_dir()
            if d is None:
                raise FileNotFoundError(errno.ENOENT, "no such directory", self.layout.bin_dir)
            with d:
                if _plain_executable(d.lstat(name)):
                    blue = self.layout.slot_target("blue")
                    agent_dir = self.host.agent_dir()
                    same = False
                    if agent_dir is not None:
                        with agent_dir:
                            same = _plain_executable(agent_dir.lstat(blue)) \
                                and d.sha256(name) == agent_dir.sha256(blue)
                    if not same:
                        what = "a file that is not the adopted binary stands here"
                        raise LayoutConflictError(f"{link}: {what}")
                    return d.symlink(target, name, over_file=True)
                return d.symlink(target, name)
        except OSError as e:
            raise host_error("write the compatibility link", link, e) from None

    def _legacy_layout_ok(self) -> bool:
        if not self.host.legacy_root:
            return False
        legacy = Layout(self.host.legacy_root, self.host.name)
        for link in (legacy.current_link, legacy.last_good_link):
            try:
                slot = legacy.slot_of_target(os.readlink(link))
            except OSError:
                return False
            if slot is None or not is_plain_executable(legacy.slot_path(slot)):
                return False
        return True

    def find_adoptable(self) -> Adoption | None:
        """What :meth:`adopt` would take over, without changing anything (design §3 adoption).

        Order: a legacy layout under LEGACY while R is absent; else a plain executable regular file at
        ``R/bin/NAME`` or else ``LEGACY/bin/NAME``, as long as blue holds no executable or that file's own
        bytes (an adoption repeated); else, while ``R/lib/NAME`` holds slots but no ``current`` link (a layout
        damaged or reset by hand), the slot holding a plain executable, blue first: a slot holding a binary
        is never overwritten with other bytes (the seeds' ``EnsureDaemonBinaryLinks``). Paths are compared
        after resolving symlinks, so LEGACY that is R, or two names of one file, count once.

        Returns:
            The adoption, or None when the layout is installed already or nothing can be adopted.
        """
        if self.host.is_installed():
            return None
        root_real = os.path.realpath(self.host.root)
        legacy_real = os.path.realpath(self.host.legacy_root) if self.host.legacy_root else ""
        if not os.path.lexists(self.host.root) and legacy_real != root_real and self._legacy_layout_ok():
            return Adoption("legacy_layout", self.host.legacy_root)
        binary = self._adoptable_binary()
        blue = self.layout.slot_path("blue")
        if binary is not None and (not is_plain_executable(blue) or _same_bytes(blue, binary.source)):
            return binary  # blue holds nothing verified, or the binary's own bytes (adopted before)
        if not os.path.islink(self.layout.agent_dir):
            for slot in ("blue", "green"):
                if is_plain_executable(self.layout.slot_path(slot)):
                    return Adoption("slot", self.layout.slot_path(slot))
        return binary

    def _adoptable_binary(self) -> Adoption | None:
        """A plain executable at ``R/bin/NAME``, else at ``LEGACY/bin/NAME`` (each real file once)."""
        seen: set[str] = set()
        candidates = [self.layout.bin_link]
        if self.host.legacy_root:
            candidates.append(Layout(self.host.legacy_root, self.host.name).bin_link)
        for path in candidates:
            real = os.path.realpath(path)
            if real in seen:
                continue
            seen.add(real)
            if is_plain_executable(path):
                return Adoption("binary", path)
        return None

    def adopt(self) -> Adoption | None:
        """Take over what :meth:`find_adoptable` found; idempotent (design §3).

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
            parent = os.path.dirname(self.host.root)
            self.host.refuse_protected(parent)
            try:
                durable.make_dirs(parent, 0o755)
                target = os.path.relpath(os.path.realpath(self.host.legacy_root), os.path.realpath(parent))
                durable.atomic_symlink(target, self.host.root)
            except OSError as e:
                raise host_error("link the host root to the legacy root", self.host.root, e) from None
            return found
        self.create_layout_dirs()
        blue = self.layout.slot_path("blue")
        try:
            d = self.host.agent_dir()
            if d is None:
                raise FileNotFoundError(errno.ENOENT, "no such directory", self.layout.agent_dir)
            with d:
                durable.copy_file_durable(found.source, blue, 0o755, into=d)
                sha = d.sha256(os.path.basename(blue))
        except (OSError, ValueError) as e:
            detail = e if isinstance(e, ValueError) else (e.strerror or str(e))
            raise HostError(f"{found.source}: cannot adopt into {blue}: {detail}") from None
        return attrs.evolve(found, sha256=sha)

    def host_root(self) -> str:
        """The host root operations use, resolved; changes nothing (``upgrade-agent host-root``).

        R when it exists (resolved through its symlink, if any); else LEGACY when a legacy layout there
        would be adopted; else R as configured (resolved as far as it exists).
        """
        if os.path.lexists(self.host.root):
            return os.path.realpath(self.host.root)
        if self._legacy_layout_ok():
            return os.path.realpath(self.host.legacy_root)
        return os.path.realpath(self.host.root)

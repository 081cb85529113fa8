"""The one walk from ``/`` to a directory the agent acts in, and the handle everything is then done through
(design §10 "Touch only what is yours"; docs/host.md).

A root-run tool that opens ``/var/lib/agent/results/x`` by path trusts every directory on the way at the
moment of each call: a user who can rename one of them between a check and a use (or plant a symlink that
nobody checked) turns the tool's write or ``unlink`` against a file of root's elsewhere. So no module of the
agent names a host path to the kernel. It asks :func:`open_dir` for a :class:`Dir` and acts through that:

- the walk starts at ``/`` and opens one component at a time relative to the previous descriptor, with
  ``O_NOFOLLOW | O_DIRECTORY`` (never ``..``, never a symlink by accident), then ``fstat``-s the descriptor
  and checks it;
- a directory **above** the agent's own (an ancestor) must be owned by root (or the effective user) and
  not writable by group or others unless it is sticky and root-owned, like ``/tmp`` (OpenSSH
  ``StrictModes``, systemd-tmpfiles' "unsafe path transition"). A symlink there (``/var/run -> /run``, a
  host root adopted in place as a link to the legacy root) is resolved by the walk itself, only when the
  link is root's and sits in a directory that passed the check (so only root could have made it), and its
  target is walked by the same rules, at most 40 links deep (``SYMLOOP_MAX``);
- the agent's **own** directory (``owned_from``) and everything the walk opens below it must be a real
  directory, owned by root (or the effective user), not writable by group or others, sticky or not; a
  symlink there is refused, never followed; and the own directory may not sit directly in a directory
  every user may write (another user could have made it first);
- a **confined** walk (mirror trees, which may belong to another uid by design, such as a user-namespaced
  container's root) accepts any owner and mode below its root, but still only real directories: no
  component is ever followed if it is a symlink, so nothing is written outside the tree.

Everything the caller then does (create a file ``O_EXCL``, rename, link, ``unlink``, ``rmdir``, ``fchmod``,
read) goes through the :class:`Dir`'s descriptor with the ``*at`` calls: a check and its use act on the same
open handle, never on the same path twice. A failed check is
:class:`~upgrade_core.errors.HostRefusedError` (exit 4) naming the path and what is wrong; nothing was
changed. Standard library and the journal's ``safefs`` only (the boot-time recovery imports this module).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from agent.fs.regular import read_fd, sha256_fd, write_all
from journal import JournalRefusedError, safefs

__all__ = [
    "MAX_LINK_HOPS",
    "Dir",
    "check_ancestors",
    "iter_entries",
    "open_ancestor",
    "open_dir",
    "open_parent",
    "refusal",
]

MAX_LINK_HOPS = safefs.MAX_LINK_HOPS

_ROOT = "/"


def refusal(path: str, what: str) -> Exception:
    """The :class:`~upgrade_core.errors.HostRefusedError` (exit 4) naming ``path`` and what is wrong."""
    # Imported on use: the boot-time no-op recovery reaches this module and must not pay for attrs/cattrs.
    from upgrade_core.errors import HostRefusedError

    return HostRefusedError(path, what)


def _converted(exc: JournalRefusedError) -> Exception:
    return refusal(exc.path or "?", exc.what)


def _kind(mode: int) -> str:
    return safefs.kind(mode)


def _check_ancestor(st: os.stat_result, path: str) -> None:
    try:
        safefs.check_parent(st, path)
    except JournalRefusedError as exc:
        raise _converted(exc) from None


def _check_own(st: os.stat_result, path: str) -> None:
    """The rule for a directory of the agent's: real, root's (or the effective user's), not group/world
    writable (sticky does not help: these are the agent's own, not a shared ``/tmp``)."""
    mode = st.st_mode
    if not stat.S_ISDIR(mode):
        raise refusal(path, f"is {_kind(mode)}, not a directory; refused")
    euid = os.geteuid()
    if st.st_uid not in (0, euid):
        raise refusal(path, f"owned by uid {st.st_uid}, not {_owners(euid)}")
    if mode & 0o022:
        raise refusal(path, f"mode {stat.S_IMODE(mode):04o} is writable by group or others")


def _owners(euid: int) -> str:
    return str(euid) if euid == 0 else f"root or {euid}"


def _shared(st: os.stat_result) -> bool:
    """A directory every user may write (``/tmp``'s kind)."""
    return bool(st.st_mode & 0o002)


class Dir:
    """An open, checked directory: the only way the agent touches what lies in it.

    Every method takes a single entry ``name`` (no slash, not ``.`` or ``..``) and acts relative to the
    descriptor with the ``*at`` system calls; nothing re-resolves the directory's path. Use as a context
    manager, or :meth:`close` it.

    Attributes:
        fd: the ``O_RDONLY | O_DIRECTORY`` descriptor.
        path: the directory's path, for messages only (never opened again).
    """

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def join(self, name: str) -> str:
        """``path/name``, for messages."""
        return os.path.join(self.path, name)

    @staticmethod
    def _name(name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{name!r}: not a single directory entry")
        return name

    # -- looking -------------------------------------------------------------------------------------
    def lstat(self, name: str) -> os.stat_result | None:
        """``fstatat(AT_SYMLINK_NOFOLLOW)`` of ``name``, or None when nothing is there."""
        try:
            return os.stat(self._name(name), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def fstat(self) -> os.stat_result:
        """``fstat`` of the directory itself."""
        return os.fstat(self.fd)

    def statvfs(self) -> os.statvfs_result:
        """``fstatvfs`` of the directory's file system (free bytes, ``ST_NOEXEC``, ``ST_RDONLY``)."""
        return os.fstatvfs(self.fd)

    def names(self) -> list[str]:
        """The entries, sorted (``.`` and ``..`` excluded)."""
        return sorted(os.listdir(self.fd))

    def readlink(self, name: str) -> str | None:
        """The content of the symlink ``name``; None when ``name`` is missing or not a symlink."""
        try:
            return os.readlink(self._name(name), dir_fd=self.fd)
        except (FileNotFoundError, OSError) as exc:
            if isinstance(exc, FileNotFoundError) or exc.errno == errno.EINVAL:
                return None
            raise

    # -- directories -------------------------------------------------------------------------------
    def child(self, name: str, *, create: int | None = None, confined: bool = False) -> Dir | None:
        """The checked subdirectory ``name`` (the own-directory rule; with ``confined`` only "a real
        directory"), created with mode ``create`` (then fsynced into this one) when missing and asked.

        Returns:
            Its :class:`Dir`, or None when it is missing and ``create`` is None.

        Raises:
            HostRefusedError: a symlink, file, FIFO or device there, a foreign owner or a group/world-writable
                mode (exit 4).
            OSError: it cannot be created or opened (EROFS, EACCES, ENOSPC).
        """
        name = self._name(name)
        path = self.join(name)
        made = False
        if create is not None:
            try:
                os.mkdir(name, create, dir_fd=self.fd)
                made = True
            except FileExistsError:
                pass
        try:
            fd = os.open(name, safefs.DIR_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError:
            st = self.lstat(name)
            if st is not None and not stat.S_ISDIR(st.st_mode):
                what = f"is {_kind(st.st_mode)}, not a directory; refused, never followed"
                raise refusal(path, what) from None
            raise
        try:
            if made:
                os.fchmod(fd, create or 0)  # the umask must not narrow it
                os.fsync(self.fd)
            st = os.fstat(fd)
            if confined:
                if not stat.S_ISDIR(st.st_mode):
                    raise refusal(path, f"is {_kind(st.st_mode)}, not a directory; refused")
            else:
                _check_own(st, path)
        except BaseException:
            os.close(fd)
            raise
        return Dir(fd, path)

    def make_dir(self, name: str, mode: int) -> bool:
        """Create the directory ``name`` with ``mode`` (``fchmod`` on the new descriptor, then this directory
        fsynced); True when created, False when something already stood there (not checked here: open it
        with :meth:`child`)."""
        name = self._name(name)
        try:
            os.mkdir(name, mode, dir_fd=self.fd)
        except FileExistsError:
            return False
        sub = self.child(name)
        assert sub is not None
        with sub:
            os.fchmod(sub.fd, mode)
        os.fsync(self.fd)
        return True

    def remove_dir(self, name: str) -> None:
        """``unlinkat(AT_REMOVEDIR)`` of the empty directory ``name``, then fsync this one.

        Raises:
            OSError: ENOTEMPTY, ENOTDIR (never removes a symlink's target), EROFS...
        """
        os.rmdir(self._name(name), dir_fd=self.fd)
        os.fsync(self.fd)

    # -- files -----------------------------------------------------------------------------------------
    def open_own(self, name: str, flags: int, mode: int = 0o600) -> int:
        """Open ``name`` as a file of the agent's (:func:`journal.safefs.open_file`: regular, root's, one
        link, not group/world-writable; never a symlink or FIFO).

        Raises:
            FileNotFoundError, FileExistsError: as ``open(2)`` with ``flags``.
            HostRefusedError: it is not such a file (exit 4).
        """
        try:
            return safefs.open_file(self.fd, self._name(name), flags, self.join(name), mode)
        except JournalRefusedError as exc:
            raise _converted(exc) from None

    def open_regular(self, name: str) -> int:
        """Open ``name`` read-only when it is a regular file whoever owns it (``O_NOFOLLOW | O_NONBLOCK``,
        then ``fstat``): a slot to hash, a unit file to compare, a mirror to compare.

        Raises:
            FileNotFoundError: nothing there.
            HostRefusedError: a symlink, FIFO, device, socket or directory there; never opened (exit 4).
        """
        name = self._name(name)
        st = self.lstat(name)
        if st is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", self.join(name))
        if not stat.S_ISREG(st.st_mode):
            what = f"is {_kind(st.st_mode)}, not a regular file; refused, never opened"
            raise refusal(self.join(name), what)
        fd = os.open(name, os.O_RDONLY | safefs.FILE_FLAGS, dir_fd=self.fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise refusal(self.join(name), "changed into something other than a regular file; refused")
        return fd

    def read(self, name: str, *, limit: int | None = None) -> bytes:
        """The bytes (at most ``limit``) of the regular file ``name``, whoever owns it (see
        :meth:`open_regular`)."""
        fd = self.open_regular(name)
        try:
            return read_fd(fd, limit)
        finally:
            os.close(fd)

    def sha256(self, name: str) -> str:
        """sha256 (64 lowercase hex) of the regular file ``name`` (see :meth:`open_regular`)."""
        fd = self.open_regular(name)
        try:
            return sha256_fd(fd)
        finally:
            os.close(fd)

    def create(self, name: str, mode: int) -> int:
        """Create ``name`` with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and ``mode`` (``fchmod``-ed, so the umask
        does not narrow it); the write descriptor is the caller's.

        Raises:
            FileExistsError: anything already stands there (never opened).
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self._name(name), flags, mode, dir_fd=self.fd)
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def temp_name(self, name: str, kind: str) -> str:
        """A fresh hidden name beside ``name``: ``.NAME.KIND-<16 hex>``."""
        return f".{self._name(name)}.{kind}-{os.urandom(8).hex()}"

    def replace(self, name: str, data: bytes, mode: int) -> bool:
        """Replace the file ``name`` with ``data`` durably (case C12): temp ``O_EXCL`` + write + fsync +
        rename + directory fsync. Identical content with ``mode`` (a regular file) is not rewritten (the file
        and directory are fsynced anyway).

        Returns:
            True when (re)written, False when it already held ``data`` with ``mode``.

        Raises:
            LayoutConflictError: a directory stands at ``name``; nothing written.
            OSError: a write, fsync or rename failed; the temp file is removed, ``name`` as before.
        """
        st = self.lstat(name)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise _conflict(f"{self.join(name)}: a directory stands where a file must be written")
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == len(data) \
                and stat.S_IMODE(st.st_mode) == mode:
            fd = self.open_regular(name)
            try:
                same = os.pread(fd, len(data) + 1, 0) == data
                if same:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if same:
                os.fsync(self.fd)
                return False
        tmp = self.temp_name(name, "tmp")
        fd = self.create(tmp, mode)
        try:
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            self.rename(tmp, name)
        except BaseException:
            self.discard(tmp)
            raise
        os.fsync(self.fd)
        return True

    def symlink(self, target: str, name: str, *, over_file: bool = False) -> bool:
        """Make ``name`` a symlink to ``target`` atomically (case C11): temp link + ``renameat`` + directory
        fsync; a reader sees the old target or the new one, never none. Already naming ``target``: nothing
        changes (the directory is fsynced anyway).

        With ``over_file``, a regular file at ``name`` is replaced too (the caller has checked it is one it
        may replace, e.g. an adopted binary).

        Returns:
            True when created or changed.

        Raises:
            LayoutConflictError: a real file or directory stands at ``name``; nothing changed.
            OSError: creating, renaming or fsyncing failed; ``name`` as before.
        """
        st = self.lstat(name)
        if st is not None and not (over_file and stat.S_ISREG(st.st_mode)):
            if not stat.S_ISLNK(st.st_mode):
                kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
                raise _conflict(f"{self.join(name)}: a real {kind} stands where a symlink must be; refused")
            if self.readlink(name) == target:
                os.fsync(self.fd)
                return False
        tmp = self.temp_name(name, "link")
        os.symlink(target, tmp, dir_fd=self.fd)
        try:
            self.rename(tmp, name)
        except BaseException:
            self.discard(tmp)
            raise
        os.fsync(self.fd)
        return True

    def rename(self, src: str, dst: str, *, into: Dir | None = None) -> None:
        """``renameat(self, src, into or self, dst)``: replaces ``dst`` (never follows either name)."""
        other = into if into is not None else self
        os.rename(self._name(src), self._name(dst), src_dir_fd=self.fd, dst_dir_fd=other.fd)

    def link(self, src: str, dst: str, *, into: Dir | None = None) -> None:
        """``linkat(self, src, into or self, dst)`` without following ``src``."""
        other = into if into is not None else self
        os.link(self._name(src), self._name(dst), src_dir_fd=self.fd, dst_dir_fd=other.fd,
                follow_symlinks=False)

    def remove(self, name: str, *, sync: bool = True) -> bool:
        """``unlinkat`` of the file or symlink ``name`` (decided by ``fstatat``, so a read-only file system's
        EROFS for a missing name is no error, case C14), then fsync this directory when ``sync``.

        Returns:
            True when something was removed, False when nothing was there.

        Raises:
            IsADirectoryError: a directory stands there; nothing removed.
            OSError: EROFS on an existing file, EACCES...
        """
        st = self.lstat(name)
        if st is None:
            return False
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory, not removed", self.join(name))
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        if sync:
            os.fsync(self.fd)
        return True

    def discard(self, name: str) -> None:
        """Remove a temp file of ours if it is there; errors ignored (a clean-up on a failure path)."""
        with contextlib.suppress(OSError):
            os.unlink(self._name(name), dir_fd=self.fd)

    def chmod(self, name: str, mode: int) -> None:
        """``fchmod`` of the regular file ``name`` through an ``O_NOFOLLOW`` descriptor (never a link's
        target)."""
        fd = self.open_regular(name)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def detach(self) -> int:
        """Give up the descriptor to the caller (who closes it); this handle is closed."""
        fd, self.fd = self.fd, -1
        return fd

    def fsync(self) -> None:
        """fsync the directory (creations, renames and removals in it survive a power cut)."""
        os.fsync(self.fd)


def _conflict(message: str) -> Exception:
    from upgrade_core.errors import LayoutConflictError

    return LayoutConflictError(message)


P = ParamSpec("P")
T = TypeVar("T")


def _host_refusals(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` with the walk's :class:`~journal.JournalRefusedError` raised as the agent's
    :class:`~upgrade_core.errors.HostRefusedError` (exit 4), same path, same words."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except JournalRefusedError as exc:
            raise _converted(exc) from None
    return wrapper


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p]


@_host_refusals
def open_dir(
    path: str,
    *,
    owned_from: str | None = None,
    create: int | None = None,
    parents: int = 0o755,
    confined: bool = False,
    made: list[str] | None = None,
    own_link: bool = False,
) -> Dir | None:
    """Walk from ``/`` to the directory ``path`` one component at a time and return it checked.

    Args:
        path: an absolute directory path.
        owned_from: the agent's own directory on the way (``path`` itself or one of its ancestors; default
            ``path``): components above it follow the ancestor rule (root-owned links resolved), it and the
            components below it follow the own-directory rule (links refused). See the module doc.
        create: create ``path`` with this mode when missing (missing directories on the way get
            ``parents``); each is ``fchmod``-ed and its parent fsynced. None: create nothing.
        parents: the mode of created intermediate directories.
        confined: at and below ``owned_from``, accept any owner and mode (a mirror tree of another uid), but
            still only real directories, never a link; nothing is created there.
        made: when given, the directories this walk created are appended to it, outermost first.
        own_link: ``owned_from`` itself may be a root-owned link in a checked directory (a host root adopted
            in place as a link to the legacy root, docs/host.md); what it names follows the own rule.
            Otherwise a link there is refused.

    Returns:
        The :class:`Dir` of ``path``, or None when a component is missing and ``create`` is None.

    Raises:
        HostRefusedError: a component fails its rule (exit 4); nothing was created after it.
        OSError: a directory cannot be opened or created (EACCES, EROFS, ENOSPC).
    """
    path = os.path.normpath(path)
    if not path.startswith("/"):
        raise ValueError(f"{path}: not an absolute path")
    own = os.path.normpath(owned_from) if owned_from is not None else path
    parts = _parts(path)
    own_parts = _parts(own)
    if parts[: len(own_parts)] != own_parts:
        raise ValueError(f"{own}: not {path} or one of its ancestors")
    n_anc = len(own_parts) - 1  # components strictly above the own directory
    walk = safefs.Walk(made)
    try:
        shown = _ROOT
        for part in parts[:n_anc]:
            shown = os.path.join(shown, part)
            want = parents if create is not None else None
            if not walk.ancestor(part, shown, create=want):
                return None
        parent_st: os.stat_result | None = os.fstat(walk.fd)
        # The own directory: with ``own_link`` a root-owned link here is resolved like an ancestor's (a host
        # root adopted in place); what it names follows the own rule.
        if not own_parts:
            _check_own(os.fstat(walk.fd), _ROOT)
            current = Dir(os.dup(walk.fd), _ROOT)
        else:
            shown = own
            name = own_parts[-1]
            st = safefs.lstat_at(walk.fd, name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                if not own_link:
                    raise refusal(shown, "is a symlink, not a directory; refused, never followed")
                walk.follow(name, st, shown)
                parent_st = None  # a link's target: its own check below, placement judged on the link
            else:
                if st is None:
                    if create is None:
                        return None
                    own_mode = create if len(own_parts) == len(parts) else parents
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, own_mode, dir_fd=walk.fd)
                        fd = os.open(name, safefs.DIR_FLAGS, dir_fd=walk.fd)
                        os.fchmod(fd, own_mode)
                        os.close(fd)
                        os.fsync(walk.fd)
                        if made is not None:
                            made.append(own)
                try:
                    fd = os.open(name, safefs.DIR_FLAGS, dir_fd=walk.fd)
                except FileNotFoundError:
                    return None
                except OSError:
                    st = safefs.lstat_at(walk.fd, name)
                    if st is not None and not stat.S_ISDIR(st.st_mode):
                        raise refusal(shown, f"is {_kind(st.st_mode)}, not a directory; refused, never "
                                             "followed") from None
                    raise
                walk.step_into(fd, name)
            if parent_st is not None and _shared(parent_st) and parent_st.st_mode & stat.S_ISVTX:
                raise refusal(shown, f"sits directly in {os.path.dirname(own) or _ROOT}, which every user "
                                     "may write; refused (another user could have made it)")
            own_st = os.fstat(walk.fd)
            if not confined:
                _check_own(own_st, shown)
            elif not stat.S_ISDIR(own_st.st_mode):
                raise refusal(shown, f"is {_kind(own_st.st_mode)}, not a directory; refused")
            current = Dir(os.dup(walk.fd), own)
        for i, part in enumerate(parts[len(own_parts):], start=len(own_parts)):
            mode: int | None = None
            if create is not None and not confined:
                mode = create if i == len(parts) - 1 else parents
            existed = mode is None or current.lstat(part) is not None
            nxt = current.child(part, create=mode, confined=confined)
            current.close()
            if made is not None and nxt is not None and not existed:
                made.append(nxt.path)
            if nxt is None:
                return None
            current = nxt
        return current
    finally:
        walk.close()


def check_ancestors(path: str) -> None:
    """Walk from ``/`` through the existing directories above ``path`` (not ``path`` itself) by the ancestor
    rule (root-owned links resolved as in :func:`open_dir`); stops at the first missing one; creates nothing.

    Raises:
        HostRefusedError: an ancestor fails the rule (exit 4).
        OSError: a directory cannot be opened (EACCES).
    """
    fd = _host_refusals(safefs.walk_to)(os.path.dirname(os.path.normpath(path)))
    if fd is not None:
        os.close(fd)


@_host_refusals
def open_ancestor(path: str) -> Dir | None:
    """The directory ``path`` reached by the ancestor rule all the way (:func:`journal.safefs.walk_to`:
    root's, not writable by others unless sticky and root-owned), for acting on an agent's own top
    directory that lies in it: removing the host root or ``state_dir`` itself. None when it is missing.

    Raises:
        HostRefusedError: a component fails the rule (exit 4).
    """
    fd = safefs.walk_to(path)
    return None if fd is None else Dir(fd, os.path.normpath(path))


def open_parent(path: str, *, owned_from: str | None = None, create: int | None = None) -> Dir | None:
    """The checked :class:`Dir` of ``path``'s directory (``owned_from`` defaults to that directory), for
    acting on the entry ``os.path.basename(path)``; see :func:`open_dir`."""
    parent = os.path.dirname(os.path.normpath(path)) or _ROOT
    return open_dir(parent, owned_from=owned_from if owned_from is not None else parent, create=create)


def iter_entries(d: Dir) -> Iterator[tuple[str, os.stat_result]]:
    """``(name, lstat)`` of each entry of ``d``, sorted by name, skipping entries that vanish meanwhile."""
    for name in d.names():
        st = d.lstat(name)
        if st is not None:
            yield name, st

"""Opening only what is ours (design §10, case C23): directories and files checked through their descriptors.

A root-run tool that follows a symlink, opens a FIFO or writes through a hard link planted by someone else
can be turned against root. So every path of the journal (and, through :mod:`agent.host.ownership`, of
``state_dir``, ``results/`` and the lock) is reached like this:

- a **directory** is opened ``O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK`` and ``fstat``-ed: it must be
  a directory owned by the effective user and not writable by group or others; everything in it is then
  opened *relative to that descriptor* (``dir_fd``), so a directory swapped after the check changes nothing;
- a **file** is first ``lstat``-ed relative to its directory descriptor (it must be a regular file: a
  symlink, FIFO, socket, device or directory is refused without being opened), then opened with
  ``O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`` (a FIFO swapped in between is never waited on), then ``fstat``-ed:
  the same inode, a regular file, owned by the effective user, ``st_nlink == 1`` (a hard link to someone
  else's file is refused), not writable by group or others.

A failed check raises :class:`~journal.errors.JournalRefusedError` naming the path and what is wrong; the
caller has changed nothing. This module imports only the standard library's ``os`` and ``stat`` (the
boot-time no-op recovery reads the live segment through it).
"""

from __future__ import annotations

import os
import stat

from .errors import JournalRefusedError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

_KINDS = (
    (stat.S_ISLNK, "a symlink"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISREG, "a regular file"),
)


def kind(mode: int) -> str:
    """``"a symlink"``, ``"a FIFO"``, ... for an ``st_mode``."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a special file"


def _refuse(path: str, what: str) -> JournalRefusedError:
    return JournalRefusedError(path, what)


def check_owned(st: os.stat_result, path: str, *, directory: bool) -> None:
    """Refuse unless ``st`` is ours: the right type, owned by the effective user, not group/world-writable,
    and (for a file) not a hard link.

    Raises:
        JournalRefusedError: naming ``path`` and the first problem found.
    """
    mode = st.st_mode
    if directory and not stat.S_ISDIR(mode):
        raise _refuse(path, f"is {kind(mode)}, not a directory; refused")
    if not directory and not stat.S_ISREG(mode):
        raise _refuse(path, f"is {kind(mode)}, not a regular file; refused, never opened")
    euid = os.geteuid()
    if st.st_uid != euid:
        raise _refuse(path, f"owned by uid {st.st_uid}, not {euid}")
    if mode & 0o022:
        raise _refuse(path, f"mode {stat.S_IMODE(mode):04o} is writable by group or others")
    if not directory and st.st_nlink != 1:
        raise _refuse(path, f"has {st.st_nlink} hard links; refused (a hard link to another file)")


def check_parent(st: os.stat_result, path: str) -> None:
    """The rule for a directory *above* ours (OpenSSH ``StrictModes``, systemd-tmpfiles' "unsafe path
    transition"): owned by root or the effective user, and not writable by group or others unless it is
    sticky and owned by root (like ``/tmp``), so nobody else can rename what lies below it.

    Raises:
        JournalRefusedError: naming ``path`` and what is wrong.
    """
    mode = st.st_mode
    if not stat.S_ISDIR(mode):
        raise _refuse(path, f"is {kind(mode)}, not a directory; refused")
    euid = os.geteuid()
    if st.st_uid not in (0, euid):
        raise _refuse(path, f"owned by uid {st.st_uid}, not root or {euid}")
    if mode & 0o022 and not (mode & stat.S_ISVTX and st.st_uid == 0):
        raise _refuse(path, f"mode {stat.S_IMODE(mode):04o} is writable by group or others (and not sticky)")


MAX_LINK_HOPS = 40
"""Symlinks an ancestor walk resolves before it refuses (Linux's ``MAXSYMLINKS``, path_resolution(7))."""


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """``fstatat(dir_fd, name, AT_SYMLINK_NOFOLLOW)``, or None when it cannot be read."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


class Walk:
    """One walk from ``/`` by the ancestor rule (:func:`check_parent`), one component at a time with
    ``O_NOFOLLOW | O_DIRECTORY`` relative to the previous descriptor: the descriptor reached so far (``fd``),
    its real path (``real``, no link in it) and the link budget. A symlink on the way is resolved by the walk
    itself, only when it is owned by root (or the effective user) and sits in a directory that passed the
    check (so only root could have made it); its target is walked by the same rule from ``/``, at most
    :data:`MAX_LINK_HOPS` links in all. Directories it creates (``create``) are appended to ``made``.

    Raises (from every method):
        JournalRefusedError: a component fails the rule, or cannot be opened.
    """

    def __init__(self, made: list[str] | None) -> None:
        self.made = made
        self.fd = os.open("/", DIR_FLAGS)
        self.real = "/"
        self.hops = 0
        try:
            check_parent(os.fstat(self.fd), "/")
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        """Close the descriptor reached so far (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def step_into(self, fd: int, name: str) -> None:
        """Make ``fd`` (the checked directory ``name`` under the current one) the current one."""
        os.close(self.fd)
        self.fd = fd
        self.real = os.path.join(self.real, name)

    def restart(self) -> None:
        """Go back to ``/`` (a link's absolute target is walked from there)."""
        fd = os.open("/", DIR_FLAGS)
        os.close(self.fd)
        self.fd = fd
        self.real = "/"

    def ancestor(self, name: str, shown: str, *, create: int | None) -> bool:
        """Step into the ancestor ``name`` (resolving a root-owned link in a checked directory).

        Returns:
            False when it is missing and ``create`` is None.
        """
        for _attempt in range(2):
            try:
                fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
            except FileNotFoundError:
                if create is None:
                    return False
                try:
                    os.mkdir(name, create, dir_fd=self.fd)
                except FileExistsError:
                    continue
                fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
                try:
                    os.fchmod(fd, create)
                    os.fsync(self.fd)
                except BaseException:
                    os.close(fd)
                    raise
                if self.made is not None:
                    self.made.append(shown)
            except OSError as exc:
                st = lstat_at(self.fd, name)
                if st is None or not stat.S_ISLNK(st.st_mode):
                    if st is not None:
                        raise _refuse(shown, f"is {kind(st.st_mode)}, not a directory; refused") from None
                    raise _refuse(shown, f"cannot open: {exc.strerror or exc}") from None
                self.follow(name, st, shown)
                return True
            try:
                check_parent(os.fstat(fd), shown)
            except BaseException:
                os.close(fd)
                raise
            self.step_into(fd, name)
            return True
        raise _refuse(shown, "keeps changing while it is opened")

    def follow(self, name: str, st: os.stat_result, shown: str) -> None:
        """Resolve the ancestor link ``name``: root's (in a directory that passed the check), at most
        :data:`MAX_LINK_HOPS` of them; its target walked from ``/`` by the ancestor rule."""
        euid = os.geteuid()
        if st.st_uid not in (0, euid):
            raise _refuse(shown, f"a symlink owned by uid {st.st_uid}, not root or {euid}")
        self.hops += 1
        if self.hops > MAX_LINK_HOPS:
            raise _refuse(shown, f"more than {MAX_LINK_HOPS} symlinks on the way; refused")
        target = os.readlink(name, dir_fd=self.fd)
        full = os.path.normpath(os.path.join(self.real, target))  # self.real has no links in it
        self.restart()
        for part in [p for p in full.split("/") if p]:
            if not self.ancestor(part, shown, create=None):
                raise _refuse(shown, f"a symlink to {full}, which does not exist")


def walk_to(path: str, *, create: int | None = None) -> int | None:
    """The descriptor of the directory ``path``, reached by a :class:`Walk` (every component, ``path``
    included, by the ancestor rule); missing directories are created with mode ``create`` when given.

    Returns:
        The descriptor (the caller closes it), or None when a component is missing and ``create`` is None.

    Raises:
        JournalRefusedError: a component fails the rule.
        OSError: a directory cannot be created (EROFS, ENOSPC).
    """
    walk = Walk(None)
    try:
        shown = "/"
        for part in [p for p in os.path.normpath(path).split("/") if p]:
            shown = os.path.join(shown, part)
            if not walk.ancestor(part, shown, create=create):
                return None
        fd, walk.fd = walk.fd, -1
        return fd
    finally:
        walk.close()


def _open_error(path: str, exc: OSError, lst: os.stat_result | None) -> JournalRefusedError:
    if lst is not None and not stat.S_ISDIR(lst.st_mode):
        return _refuse(path, f"is {kind(lst.st_mode)}, not a directory; refused, never followed")
    return _refuse(path, f"cannot open: {exc.strerror or exc}")


def open_dir(path: str, *, dir_fd: int | None = None, name: str | None = None) -> int | None:
    """Open a directory of ours and check it (see the module doc).

    Args:
        path: the directory's full path (for messages; opened as is unless ``dir_fd`` is given).
        dir_fd: open ``name`` relative to this checked directory descriptor instead.
        name: the entry name under ``dir_fd``.

    Returns:
        An ``O_RDONLY`` descriptor (the caller closes it), or None when nothing exists at ``path``.

    Raises:
        JournalRefusedError: a symlink, FIFO, file or device there, a foreign owner, a group/world-writable
            mode, or the directory cannot be opened (EACCES).
    """
    target = path if dir_fd is None else name
    assert target is not None
    try:
        fd = os.open(target, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        try:
            lst: os.stat_result | None = os.stat(target, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            lst = None
        raise _open_error(path, exc, lst) from None
    try:
        check_owned(os.fstat(fd), path, directory=True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dir(dir_fd: int, name: str, path: str, mode: int = 0o700) -> int:
    """Open the directory ``name`` under ``dir_fd``, creating it ``mode`` (durably: the parent is fsynced)
    when missing, and check it.

    Returns:
        Its descriptor.

    Raises:
        JournalRefusedError: what :func:`open_dir` refuses.
        OSError: it cannot be created (EROFS, ENOSPC).
    """
    fd = open_dir(path, dir_fd=dir_fd, name=name)
    if fd is not None:
        return fd
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        pass
    else:
        os.chmod(name, mode, dir_fd=dir_fd, follow_symlinks=False)
        os.fsync(dir_fd)
    fd = open_dir(path, dir_fd=dir_fd, name=name)
    if fd is None:
        raise _refuse(path, "vanished right after it was created")
    return fd


def open_file(dir_fd: int, name: str, flags: int, path: str, mode: int = 0o600) -> int:
    """Open a file of ours relative to a checked directory descriptor (see the module doc).

    Args:
        dir_fd: the checked directory.
        name: the entry name (no slash).
        flags: ``O_RDONLY``/``O_WRONLY``/``O_RDWR`` plus ``O_CREAT``/``O_EXCL``; ``O_TRUNC`` is refused (a
            file is checked before it is changed).
        path: the full path, for messages.
        mode: the mode of a created file.

    Returns:
        The descriptor (``O_NONBLOCK`` is harmless on a regular file).

    Raises:
        FileNotFoundError: nothing at ``name`` and no ``O_CREAT``.
        FileExistsError: ``O_CREAT | O_EXCL`` and something is there.
        JournalRefusedError: not a regular file of ours (symlink, FIFO, device, directory, hard link,
            foreign owner, group/world-writable), or EACCES/EPERM.
    """
    assert not flags & os.O_TRUNC, "check before changing: truncate with ftruncate after open_file"
    created_here = False
    if not flags & os.O_EXCL:
        try:
            lst = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
            flags |= os.O_EXCL  # created by us now; if someone else creates it first, check theirs
            created_here = True
        else:
            check_owned(lst, path, directory=False)
    try:
        fd = os.open(name, flags | FILE_FLAGS, mode, dir_fd=dir_fd)
    except FileExistsError:
        if created_here:  # a concurrent creator won the race: open (and check) what it made
            return open_file(dir_fd, name, flags & ~(os.O_CREAT | os.O_EXCL), path, mode)
        raise
    except FileNotFoundError:
        raise
    except OSError as exc:
        try:
            lst2: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            lst2 = None
        if lst2 is not None and not stat.S_ISREG(lst2.st_mode):
            what = f"is {kind(lst2.st_mode)}, not a regular file; refused, never opened"
            raise _refuse(path, what) from None
        raise _refuse(path, f"cannot open: {exc.strerror or exc}") from None
    try:
        check_owned(os.fstat(fd), path, directory=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(dir_fd: int, name: str, path: str) -> bytes:
    """The whole content of a checked regular file under ``dir_fd``.

    Raises:
        FileNotFoundError: nothing there.
        JournalRefusedError: see :func:`open_file`.
    """
    fd = open_file(dir_fd, name, os.O_RDONLY, path)
    try:
        size = os.fstat(fd).st_size
        chunks = []
        while True:
            chunk = os.read(fd, max(size, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_entry(dir_fd: int, name: str, path: str) -> bool:
    """Check an existing entry that is about to be replaced or removed (never opened).

    Returns:
        False when nothing is there.

    Raises:
        JournalRefusedError: it is not a regular file of ours.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    check_owned(st, path, directory=False)
    return True

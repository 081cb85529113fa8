"""Ownership of the agent's state (SPEC 10, case C23): touch only what is ours, and check before touching.

The rules, and where each one is enforced:

- **Ancestors** of ``state_dir`` and of the lock file's directory (every existing directory from ``/``
  down): owned by root or the effective user, and not writable by group or others unless sticky and owned
  by root (like ``/tmp``). This is the rule OpenSSH's ``StrictModes`` applies to ``~/.ssh`` and systemd's
  tmpfiles applies to an "unsafe path transition": nobody but root or us can rename or replace anything on
  the way. A symlink on the way must itself be owned by root or us, and the directories it resolves to
  follow the same rule (:func:`check_ancestors`).
- **Our directories** (``state_dir``, ``state_dir/journal``, ``state_dir/results``): directories, not
  symlinks (opened ``O_NOFOLLOW``), owned by the effective user, not writable by group or others. Created
  0700 when missing (missing parents of ``state_dir`` 0755, SPEC 3) (:func:`open_state_dir`,
  :func:`journal.safefs.make_dir`).
- **Our files** (journal segments, ``journal/owner.json``, ``results/<op>.json``, the lock): opened relative
  to their checked directory's descriptor with ``O_NOFOLLOW | O_NONBLOCK``, then ``fstat``-ed: a regular file
  owned by the effective user, ``st_nlink == 1``, not writable by group or others; created 0600
  (:mod:`journal.safefs`, used by the journal writer and reader, :mod:`agent.results` and
  :mod:`agent.lock`). A symlink, FIFO, device, directory or hard link is refused at once, never followed,
  never waited on, and its target keeps its bytes.
- **The journal's owner** (``journal/owner.json``: agent name and unit) must be this configuration's
  (:func:`check_owner` for readers; the journal writer checks and records it, :mod:`agent.wiring`).

A failed check is :class:`~upgrade_core.errors.HostRefusedError` (exit 4, one line naming the path and what
is wrong, nothing changed); a foreign journal owner is a :class:`~agent.errors.ConfigError` (exit 2, naming
both owners). Readers run the same checks and never create anything.

Standard library only at import time (the errors are imported on use).
"""

from __future__ import annotations

import contextlib
import os
import stat

from journal import JournalOwnerError, JournalRefusedError, safefs

from agent._regular import read_regular_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from agent.config import AgentConfig

__all__ = [
    "check_ancestors",
    "check_owner",
    "check_result",
    "check_state",
    "journal_owner",
    "open_state_dir",
    "owner_error",
    "prepare_state",
    "read_regular",
    "read_state_file",
    "refused",
    "write_checked_file",
    "write_state_file",
]


def refused(exc: JournalRefusedError) -> Exception:
    """The :class:`~upgrade_core.errors.HostRefusedError` (exit 4) of a journal-level refusal."""
    from upgrade_core.errors import HostRefusedError

    return HostRefusedError(exc.path or "?", exc.what)


def _refuse(path: str, what: str) -> Exception:
    from upgrade_core.errors import HostRefusedError

    return HostRefusedError(path, what)


def check_ancestors(path: str) -> None:
    """Check every existing ancestor of ``path`` (not ``path`` itself) by the rule in the module doc.

    Raises:
        HostRefusedError: an ancestor is owned by another user, or writable by others without being a
            sticky root-owned directory, or a symlink owned by another user (exit 4).
    """
    path = os.path.normpath(os.path.abspath(path))
    parts = [p for p in path.split("/") if p][:-1]
    current = "/"
    deepest = "/"
    euid = os.geteuid()
    try:
        for part in ["", *parts]:
            current = os.path.join(current, part) if part else "/"
            try:
                lst = os.lstat(current)
            except FileNotFoundError:
                break
            if stat.S_ISLNK(lst.st_mode):
                if lst.st_uid not in (0, euid):
                    raise _refuse(current, f"a symlink owned by uid {lst.st_uid}, not root or {euid}")
            else:
                safefs.check_parent(lst, current)
            deepest = current
        # A symlink on the way: the directories it leads to follow the same rule.
        real = os.path.realpath(deepest)
        if real != deepest:
            walk = "/"
            for part in ["", *[p for p in real.split("/") if p]]:
                walk = os.path.join(walk, part) if part else "/"
                safefs.check_parent(os.lstat(walk), walk)
    except JournalRefusedError as exc:
        raise refused(exc) from None
    except OSError as exc:
        raise _refuse(current, f"cannot inspect: {exc.strerror or exc}") from None


def open_state_dir(state_dir: str, *, create: bool) -> int | None:
    """Open ``state_dir`` checked (see the module doc), creating it 0700 (missing parents 0755) if asked.

    Returns:
        Its descriptor (the caller closes it), or None when it is missing and ``create`` is False.

    Raises:
        HostRefusedError: an ancestor or ``state_dir`` fails its check, or it cannot be created (EACCES,
            EROFS) (exit 4).
    """
    check_ancestors(state_dir)
    parent = os.path.dirname(state_dir) or "/"
    try:
        if create and not os.path.isdir(parent):
            from agent.durable import make_dirs

            make_dirs(parent, 0o755)
            check_ancestors(state_dir)
        try:
            pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            safefs.check_parent(os.fstat(pfd), parent)
            name = os.path.basename(state_dir)
            if create:
                return safefs.make_dir(pfd, name, state_dir, 0o700)
            return safefs.open_dir(state_dir, dir_fd=pfd, name=name)
        finally:
            os.close(pfd)
    except JournalRefusedError as exc:
        raise refused(exc) from None
    except OSError as exc:
        where = getattr(exc, "filename", None) or state_dir
        raise _refuse(where, f"cannot create: {exc.strerror or exc}") from None


def _check_subdirs(state_fd: int, state_dir: str) -> None:
    for name in ("journal", "results"):
        fd = safefs.open_dir(os.path.join(state_dir, name), dir_fd=state_fd, name=name)
        if fd is not None:
            os.close(fd)


def check_result(cfg: AgentConfig, operation: str) -> None:
    """Check the result file ``results/<operation>.json`` if it exists (never opened): a regular file of
    ours, so that publishing it later cannot be refused half way through an episode.

    Raises:
        HostRefusedError: a symlink, FIFO, directory or hard link there, or a foreign one (exit 4).
    """
    from agent.results import result_path

    try:
        path = result_path(cfg.host.state_dir, operation)
    except Exception:
        return  # a malformed id is the request's error, reported there
    fd = open_state_dir(cfg.host.state_dir, create=False)
    if fd is None:
        return
    try:
        rfd = safefs.open_dir(os.path.dirname(path), dir_fd=fd, name="results")
        if rfd is not None:
            try:
                safefs.check_entry(rfd, os.path.basename(path), path)
            finally:
                os.close(rfd)
    except JournalRefusedError as exc:
        raise refused(exc) from None
    finally:
        os.close(fd)


def journal_owner(cfg: AgentConfig) -> dict[str, str]:
    """The owner record this configuration's journal carries: ``{"agent": NAME, "unit": UNIT}``."""
    return {"agent": cfg.agent.name, "unit": cfg.agent.unit}


def owner_error(exc: JournalOwnerError, cfg: AgentConfig) -> Exception:
    """The :class:`~agent.errors.ConfigError` (exit 2) of a journal that belongs to another configuration,
    naming both (case C25)."""
    from agent.errors import ConfigError

    found, mine = exc.found, journal_owner(cfg)
    return ConfigError(
        f"state_dir {cfg.host.state_dir} holds the journal of agent {found.get('agent', '?')} "
        f"(unit {found.get('unit', '?')}); this configuration is agent {mine['agent']} (unit {mine['unit']})"
    )


def check_owner(cfg: AgentConfig) -> None:
    """Refuse a journal recorded as another configuration's (readers; the writer checks it itself).

    A journal without an owner record (written before owners were recorded) passes: its first writer
    adopts it.

    Raises:
        ConfigError: the journal belongs to another agent name or unit (exit 2, naming both).
        HostRefusedError: ``owner.json`` or its directory is not ours (exit 4).
        JournalUnreadableError: ``owner.json`` is not a JSON object of strings (exit 3).
    """
    from journal import read_owner

    directory = os.path.join(cfg.host.state_dir, "journal")
    try:
        found = read_owner(directory)
    except JournalRefusedError as exc:
        raise refused(exc) from None
    except Exception as exc:
        from agent.wiring import journal_error

        raise journal_error(exc, directory) from None
    if found is not None and found != journal_owner(cfg):
        raise owner_error(JournalOwnerError(directory, found, journal_owner(cfg)), cfg)


def check_state(cfg: AgentConfig, *, owner: bool = True) -> None:
    """Everything a reader (and a writer, before it takes the host lock) checks; creates nothing.

    ``state_dir`` and its ancestors, ``journal/`` and ``results/`` when they exist, the ancestors of the
    lock file, and (``owner``) the journal's owner.

    Raises:
        HostRefusedError: a path fails its check (exit 4).
        ConfigError: the journal belongs to another configuration (exit 2).
    """
    state_dir = cfg.host.state_dir
    fd = open_state_dir(state_dir, create=False)
    if fd is not None:
        try:
            _check_subdirs(fd, state_dir)
        except JournalRefusedError as exc:
            raise refused(exc) from None
        finally:
            os.close(fd)
    check_ancestors(cfg.host.lock_path)
    if owner and fd is not None:
        check_owner(cfg)


def prepare_state(cfg: AgentConfig) -> None:
    """Writer side, under the host lock: create ``state_dir`` (0700; missing parents 0755) or check it.

    Raises:
        HostRefusedError: as :func:`open_state_dir` (exit 4).
    """
    fd = open_state_dir(cfg.host.state_dir, create=True)
    assert fd is not None
    try:
        _check_subdirs(fd, cfg.host.state_dir)
    except JournalRefusedError as exc:
        raise refused(exc) from None
    finally:
        os.close(fd)


STATE_FILE_MODE = 0o600
"""SPEC 10: the mode of every file the agent creates under ``state_dir`` (and of a spool's status files)."""


def read_regular(path: str, *, follow: bool, limit: int | None = None) -> bytes | None:
    """The bytes of ``path`` (at most ``limit``), or None when it is absent, unreadable or not a regular file
    (:func:`agent._regular.read_regular_file`: never a FIFO, device or socket, never blocking)."""
    try:
        return read_regular_file(path, follow=follow, limit=limit)
    except OSError:
        return None


def write_checked_file(dir_fd: int, path: str, data: bytes) -> bool:
    """Replace ``path`` (in the checked directory ``dir_fd``) with ``data``, durably; identical content
    (a regular file of ours, mode 0600) is not rewritten (the file and directory are fsynced anyway).

    Returns:
        True when the file was (re)written, False when it already held exactly ``data``.
    """
    name = os.path.basename(path)
    if safefs.check_entry(dir_fd, name, path):
        fd = safefs.open_file(dir_fd, name, os.O_RDONLY, path)
        try:
            same = (os.pread(fd, len(data) + 1, 0) == data
                    and stat.S_IMODE(os.fstat(fd).st_mode) == STATE_FILE_MODE)
            if same:
                os.fsync(fd)
        finally:
            os.close(fd)
        if same:
            os.fsync(dir_fd)
            return False
    tmp = f".{name}.tmp-{os.urandom(8).hex()}"
    tmp_path = os.path.join(os.path.dirname(path), tmp)
    fd = safefs.open_file(dir_fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, tmp_path, STATE_FILE_MODE)
    try:
        try:
            os.fchmod(fd, STATE_FILE_MODE)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        safefs.check_entry(dir_fd, name, path)  # still nothing foreign at the target
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)
    return True


def write_state_file(state_dir: str, sub: str, name: str, data: bytes) -> bool:
    """Replace ``state_dir/sub/name`` with ``data`` durably, through checked directory handles (SPEC 10): the
    write twin of :func:`read_state_file`. ``state_dir`` and ``sub`` are created 0700 when missing; the
    file is written by :func:`write_checked_file` (temp 0600 + fsync + rename + directory fsync; identical
    content is not rewritten).

    Returns:
        True when the file was (re)written, False when it already held exactly ``data``.

    Raises:
        HostRefusedError: a path on the way or the file is not ours (symlink, FIFO, hard link, foreign owner,
            group/world-writable): refused, never followed, its target untouched (exit 4).
        OSError: the write failed (ENOSPC, EROFS...): the caller names what it was writing.
    """
    path = os.path.join(state_dir, sub, name)
    try:
        state_fd = open_state_dir(state_dir, create=True)
        assert state_fd is not None
        try:
            dir_fd = safefs.make_dir(state_fd, sub, os.path.dirname(path), 0o700)
        finally:
            os.close(state_fd)
        try:
            return write_checked_file(dir_fd, path, data)
        finally:
            os.close(dir_fd)
    except JournalRefusedError as e:
        raise refused(e) from None


def read_state_file(state_dir: str, sub: str, name: str) -> bytes | None:
    """The bytes of ``state_dir/sub/name``, read through checked directory handles (SPEC 10): None when
    ``state_dir``, ``sub`` or the file does not exist; creates nothing.

    Raises:
        HostRefusedError: a path on the way or the file is not ours (symlink, FIFO, hard link, foreign owner,
            group/world-writable): refused, never followed or waited on (exit 4).
        OSError: the file exists but cannot be read.
    """
    from journal import safefs
    from journal.errors import JournalRefusedError

    path = os.path.join(state_dir, sub, name)
    try:
        state_fd = open_state_dir(state_dir, create=False)
        if state_fd is None:
            return None
        try:
            dir_fd = safefs.open_dir(os.path.dirname(path), dir_fd=state_fd, name=sub)
        finally:
            os.close(state_fd)
        if dir_fd is None:
            return None
        try:
            return safefs.read_file(dir_fd, name, path)
        finally:
            os.close(dir_fd)
    except FileNotFoundError:
        return None
    except JournalRefusedError as e:
        raise refused(e) from None


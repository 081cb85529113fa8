"""Ownership of the agent's state (design §10, case C23): touch only what is ours, and check before touching.

The rules, and where each one is enforced:

- **Ancestors** of ``state_dir`` and of the lock file's directory (every existing directory from ``/``
  down): owned by root or the effective user, and not writable by group or others unless sticky and owned
  by root (like ``/tmp``). This is the rule OpenSSH's ``StrictModes`` applies to ``~/.ssh`` and systemd's
  tmpfiles applies to an "unsafe path transition": nobody but root or us can rename or replace anything on
  the way. A symlink on the way must itself be owned by root or us, and the directories it resolves to
  follow the same rule (:func:`agent.fs.statefile.check_ancestors`).
- **Our directories** (``state_dir``, ``state_dir/journal``, ``state_dir/results``): directories, not
  symlinks (opened ``O_NOFOLLOW``), owned by the effective user, not writable by group or others. Created
  0700 when missing (missing parents of ``state_dir`` 0755, design §3)
  (:func:`agent.fs.statefile.open_state_dir`,
  :func:`journal.safefs.make_dir`).
- **Our files** (journal segments, ``journal/owner.json``, ``results/<op>.json``, the lock): opened relative
  to their checked directory's descriptor with ``O_NOFOLLOW | O_NONBLOCK``, then ``fstat``-ed: a regular file
  owned by the effective user, ``st_nlink == 1``, not writable by group or others; created 0600
  (:mod:`journal.safefs`, used by the journal writer and reader, :mod:`agent.host.results` and
  :mod:`agent.host.lock`). A symlink, FIFO, device, directory or hard link is refused at once, never followed,
  never waited on, and its target keeps its bytes.
- **The journal's owner** (``journal/owner.json``: agent name and unit) must be this configuration's
  (:func:`check_owner` for readers; the journal writer checks and records it, :mod:`agent.session.wiring`).

A failed check is :class:`~upgrade_core.errors.HostRefusedError` (exit 4, one line naming the path and what
is wrong, nothing changed); a foreign journal owner is a :class:`~agent.errors.ConfigError` (exit 2, naming
both owners). Readers run the same checks and never create anything.

The primitives that apply these rules to one path are :mod:`agent.fs.statefile`; this module is the
policy: which directories and files are the agent's, and what a journal's owner must be.
"""

from __future__ import annotations

import os
import stat

from agent.config.boot import STATE_SUBDIRS
from agent.errors import ConfigError, journal_error
from agent.fs.statefile import check_ancestors, open_state_dir, refused
from agent.fs.tree import open_dir, open_parent
from agent.host.adapter import AgentHost
from agent.host.results import result_path
from journal import JournalOwnerError, JournalRefusedError, read_owner, safefs
from upgrade_core.errors import HostRefusedError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from agent.config.loader import AgentConfig

__all__ = [
    "check_host_root",
    "check_owner",
    "check_placement",
    "check_result",
    "check_socket_path",
    "check_state",
    "journal_owner",
    "owner_error",
    "prepare_state",
]


def _check_subdirs(state_fd: int, state_dir: str) -> None:
    for name in STATE_SUBDIRS:
        fd = safefs.open_dir(os.path.join(state_dir, name), dir_fd=state_fd, name=name)
        if fd is not None:
            os.close(fd)


def check_result(cfg: AgentConfig, operation: str) -> None:
    """Check the result file ``results/<operation>.json`` if it exists (never opened): a regular file of
    ours, so that publishing it later cannot be refused half way through an episode.

    Raises:
        HostRefusedError: a symlink, FIFO, directory or hard link there, or a foreign one (exit 4).
    """
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
    directory = os.path.join(cfg.host.state_dir, "journal")
    try:
        found = read_owner(directory)
    except JournalRefusedError as exc:
        raise refused(exc) from None
    except Exception as exc:
        raise journal_error(exc, directory) from None
    if found is not None and found != journal_owner(cfg):
        raise owner_error(JournalOwnerError(directory, found, journal_owner(cfg)), cfg)


def check_state(cfg: AgentConfig, *, owner: bool = True) -> None:
    """Everything a reader (and a writer, before it takes the host lock) checks; creates nothing.

    Where the agent's directories are placed (:func:`check_placement`), ``state_dir`` and its ancestors,
    ``journal/`` and ``results/`` when they exist, the ancestors of the lock file, and (``owner``) the
    journal's owner.

    Raises:
        ConfigError: an agent directory sits directly in a world-writable directory, or the journal belongs
            to another configuration (exit 2).
        HostRefusedError: a path fails its check (exit 4).
    """
    check_placement(cfg)
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


def check_placement(cfg: AgentConfig) -> None:
    """Refuse an agent directory (or the lock file) placed directly in a shared world-writable directory.

    In ``/tmp``, ``/var/tmp`` or any sticky directory every user may write, another user can create
    ``host.root``, ``host.state_dir``, the lock file or the spool first; the ownership checks then refuse
    every command forever, the boot recovery included. That is a configuration mistake, named as one before
    anything is touched (a sticky, root-owned directory is still accepted further up, as an ancestor). A
    parent that is world-writable without the sticky bit is the host's fault instead, refused by the
    ancestor rule (exit 4).

    Raises:
        ConfigError: naming the key, the path and its parent (exit 2).
    """
    placed = [("host.root", cfg.host.root), ("host.state_dir", cfg.host.state_dir),
              ("host.lock_path", cfg.host.lock_path)]
    if cfg.operations.spool_dir:
        placed.append(("operations.spool_dir", cfg.operations.spool_dir))
    for key, path in placed:
        parent = os.path.dirname(path) or "/"
        try:
            st = os.stat(parent)
        except OSError:
            continue  # missing: created by the agent (0755) under checked ancestors
        if st.st_mode & 0o002 and st.st_mode & stat.S_ISVTX:  # /tmp's kind; any other is the host's fault
            raise ConfigError(
                f"{key}: {path} sits directly in {parent}, which every user may write, so another user could "
                "create it first; choose a path under a directory only root may write"
            )


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


def check_host_root(host: AgentHost) -> None:
    """Check the host root and the directories the agent keeps under it (``R/lib``, ``R/lib/NAME``,
    ``R/bin``) by the rule for the agent's own directories (docs/host.md, case C30); creates nothing.

    Each is reached by the walk of :func:`agent.fs.tree.open_dir` from ``/``, one component at a time: the
    ancestors of the host root follow the ancestor rule; the host root, when it exists, is a directory owned
    by root (or the effective user) and not writable by group or others; when it is a symlink (a legacy
    layout adopted in place), the link is root's in a checked directory and the directory it names follows
    the same rule. ``R/lib``, ``R/lib/NAME`` and ``R/bin``, when they exist, are real directories by the same
    rule, never links: anything else would let another user swap what systemd runs as root.

    Raises:
        HostRefusedError: naming the path and what is wrong (exit 4); nothing was changed.
    """
    root = host.root
    layout = host.layout
    try:
        for path in (root, layout.lib_dir, layout.agent_dir, layout.bin_dir):
            d = open_dir(path, owned_from=root, own_link=True)
            if d is None:
                if path == root:
                    return  # a bare host: install creates it under checked ancestors
                continue
            d.close()
    except OSError as exc:
        raise HostRefusedError(exc.filename or root, f"cannot inspect: {exc.strerror or exc}") from None


def check_socket_path(cfg: AgentConfig) -> None:
    """Refuse an ``[agent] socket`` unix path whose directory is not root's or that names anything but a
    socket, before ``install`` writes ``NAME.socket``.

    systemd binds that path itself: it creates missing parent directories, and when the bind fails with
    EADDRINUSE it unlinks whatever stands at the path and binds again (``socket_address_listen``); with
    ``RemoveOnStop=`` it unlinks the path when the socket stops (systemd.socket(5)). A path naming a file,
    link or directory of someone else's would be removed on the agent's word, so only a missing path or an
    existing socket is accepted, in a directory that passes the ancestor rule (root's, not writable by
    others unless sticky). A port, address or abstract name (``@name``) touches no path: nothing to check.

    Raises:
        HostRefusedError: the directory or an ancestor fails the rule, or the path exists and is not a
            socket (exit 4); nothing was changed.
    """
    listen = cfg.agent.socket
    if not listen.startswith("/"):
        return
    try:
        directory = open_parent(listen)
        if directory is None:  # missing: systemd creates it, beneath ancestors that must pass the rule
            check_ancestors(listen)
            return
        with directory:
            st = directory.lstat(os.path.basename(listen))
    except OSError as exc:
        raise HostRefusedError(exc.filename or listen, f"cannot inspect: {exc.strerror or exc}") from None
    if st is not None and not stat.S_ISSOCK(st.st_mode):
        raise HostRefusedError(
            listen, "agent.socket names an existing file that is not a socket; systemd would remove it to "
            "bind there"
        )

"""``reset`` (the agent's units) and ``uninstall`` (units, layout, ``state_dir`` files, lock; never the
legacy root or the configuration): only what the install record lists, by the rules of
:mod:`agent.host.install_record`."""

from __future__ import annotations

import argparse
import os
import stat

import anyio

from agent.cli.commands.outcome import Outcome
from agent.host.install_record import Cleanup, Remover
from agent.session.session import Session


def cmd_reset(args: argparse.Namespace) -> Outcome:
    """``reset``: stop, disable and remove the agent's units (those it wrote), daemon-reload."""
    return _cleanup_outcome(anyio.run(Session.load(args.config).reset))


def _cleanup_outcome(out: Cleanup) -> Outcome:
    """``{"removed": [...], "kept": [...], "notes": [...]}``; a removal the host refused is the command's
    error (the first one), the others go with it as ``cleanup_errors``.

    Raises:
        CleanupIncompleteError: a removal failed (exit 3: part was removed, an operator must look);
            ``cleanup_errors`` on it lists the rest.
    """
    from upgrade_core.errors import CleanupIncompleteError

    if out.errors:
        error = CleanupIncompleteError(out.errors[0])
        error.cleanup_errors = out.errors[1:]  # type: ignore[attr-defined]
        raise error
    lines = [f"removed {p}" for p in out.removed] + out.kept + out.notes
    payload = {"removed": out.removed, "kept": out.kept, "notes": out.notes}
    return Outcome(payload, "\n".join(lines) or "nothing to remove")


def _refuse_read_only(*paths: str) -> None:
    """Refuse, before stopping anything, to uninstall from a read-only mount (C14 rescue views).

    Raises:
        HostRefusedError: the nearest existing ancestor of one of ``paths`` is on a read-only mount (exit 4).
    """
    from upgrade_core.errors import HostRefusedError

    for path in paths:
        probe = path
        while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        if os.statvfs(probe).f_flag & os.ST_RDONLY:
            raise HostRefusedError(path, "on a read-only mount; nothing was stopped or removed")


def cmd_uninstall(args: argparse.Namespace) -> Outcome:
    """``uninstall``: reset, then what the install record lists (or, with no record, only the layout files
    carrying the agent's marker), the files the agent wrote in ``state_dir``, and the lock. Never the legacy
    root, the configuration, a mount point, a non-empty directory, or anything else in ``state_dir``."""
    from agent.fs import durable
    from agent.host.install_record import remove_state_files
    from agent.host.lock import HostLock

    session = Session.load(args.config)
    cfg, host = session.config, session.host
    _refuse_read_only(host.layout.agent_dir, cfg.host.state_dir)
    with HostLock(cfg.host.lock_path):
        record = session.install_record()  # refused (a symlink, another agent's) before anything changes
        out = anyio.run(session.remove_units, record)
        remover = Remover(host.layout, cfg.host.unit_dir, host.legacy_root)
        out.extend(remover.remove(record.entries) if record.exists else remover.remove_marked_layout())
        if record.exists:
            try:
                record.forget([e.path for e in record.entries if not os.path.lexists(e.path)])
            except OSError as e:
                out.errors.append(f"{record.path}: cannot update the install record: {e.strerror}")
        out.extend(remove_state_files(cfg.host.state_dir, keep_record=bool(record.entries)))
    try:
        st = os.lstat(cfg.host.lock_path)
        if stat.S_ISREG(st.st_mode) and durable.remove_if_present(cfg.host.lock_path):
            out.removed.append(cfg.host.lock_path)
    except FileNotFoundError:
        pass
    except OSError as e:
        out.errors.append(f"{cfg.host.lock_path}: cannot remove: {e.strerror}")
    return _cleanup_outcome(out)

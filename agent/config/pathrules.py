"""The cross-key path rules of the configuration (design §10), standard library only: shared by the full
loader (:mod:`agent.config.loader`) and the boot path's quick reader (:mod:`agent.config.boot`), which
must never accept what the full loader refuses.

The agent creates, checks and (``uninstall``) removes ``host.root``, ``host.state_dir`` and the lock, so:

- none of them may be ``/`` or a system directory itself (:data:`SYSTEM_DIRS`), after normalisation;
- ``host.root`` and ``host.state_dir`` must not overlap (equal, or one inside the other);
- the lock file must not lie inside ``host.root``, nor be ``host.state_dir`` itself.
"""

from __future__ import annotations

import os

from agent.systemd.searchpath import SYSTEM_UNIT_DIRS

__all__ = ["SYSTEM_DIRS", "path_problem", "spool_problem"]

SYSTEM_DIRS = frozenset(
    {"/", "/etc", "/var", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/run", "/tmp", "/home", "/boot", "/dev",
     "/proc", "/sys"}
)
"""Directories that ``host.root``, ``host.state_dir`` and ``host.lock_path`` may never be."""


def _inside(path: str, directory: str) -> bool:
    """True when ``path`` is ``directory`` or lies below it (both normalised and absolute)."""
    return os.path.commonpath([path, directory]) == directory


def path_problem(root: str, state_dir: str, lock_path: str) -> tuple[str, str] | None:
    """The first broken rule as ``(dotted key, message)``, or None (paths absolute and normalised).

    Example: ``("host.state_dir", 'must not be "/var" itself (a system directory)')``.
    """
    for key, value in (("host.root", root), ("host.state_dir", state_dir), ("host.lock_path", lock_path)):
        if value in SYSTEM_DIRS:
            return key, f'must not be "{value}" itself (a system directory)'
    if _inside(state_dir, root):
        return "host.state_dir", f'"{state_dir}" lies inside host.root "{root}"; they must not overlap'
    if _inside(root, state_dir):
        return "host.root", f'"{root}" lies inside host.state_dir "{state_dir}"; they must not overlap'
    if _inside(lock_path, root):
        return "host.lock_path", f'"{lock_path}" lies inside host.root "{root}"'
    if lock_path == state_dir:
        return "host.lock_path", f'"{lock_path}" is host.state_dir itself'
    return None


def spool_problem(
    spool_dir: str, root: str, state_dir: str, *, unit_dir: str, lock_path: str, config_dir: str | None
) -> tuple[str, str] | None:
    """``[operations] spool_dir`` against the host paths (docs/configuration.md, cross-key path rules): the
    spool is the control plane's directory, never a system directory, and it neither lies inside nor holds
    a directory the agent writes or systemd reads units from: ``host.root``, ``host.state_dir``,
    ``host.unit_dir``, the lock's directory, any directory of
    :data:`agent.systemd.searchpath.SYSTEM_UNIT_DIRS` (a drop-in directory there is read too); nor is it, or
    does it hold, the configuration's directory. Whoever may write operations must not reach the agent's own
    files, units or configuration through it. ``(dotted key, message)`` or None; all
    paths absolute and normalised.
    """
    key = "operations.spool_dir"
    if spool_dir in SYSTEM_DIRS:
        return key, f'must not be "{spool_dir}" itself (a system directory)'
    others = [("host.root", root), ("host.state_dir", state_dir), ("host.unit_dir", unit_dir),
              ("the directory of host.lock_path", os.path.dirname(lock_path))]
    others += [("the systemd unit directory", d) for d in SYSTEM_UNIT_DIRS]
    for other_key, other in others:
        if _inside(spool_dir, other) or _inside(other, spool_dir):
            return key, f'"{spool_dir}" and {other_key} "{other}" must not overlap'
    # configurations are discovered as CONFIG_DIR/*.toml, not below it: a spool in a subdirectory is apart
    if config_dir is not None and _inside(config_dir, spool_dir):
        return key, f'"{spool_dir}" must not be or hold the configuration\'s directory "{config_dir}"'
    return None

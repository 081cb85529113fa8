"""SELinux labels of what the agent creates or replaces under the host root (docs/host.md, "SELinux labels").

A file or directory takes its parent's label when it is created, not the one the policy's file contexts give
its path: under ``/opt`` that is ``usr_t`` where the policy wants ``bin_t`` for executables, and on an
enforcing host systemd may then be refused to execute the slot. The seeds ran ``restorecon -R`` after
creating the slot directories; the agent runs ``restorecon`` after it creates or replaces slot files and
directories (the staged candidate renamed onto its slot, the layout directories ``install`` makes, the tree a
``host move`` copies), before anything switches to them.

- **Enabled** is read from the kernel, as libselinux's ``is_selinux_enabled`` reads it: a ``selinuxfs``
  mounted (``/proc/self/mountinfo``, proc(5)) whose ``enforce`` file can be read (it exists once a policy is
  loaded; ``0`` permissive, ``1`` enforcing: labels matter in both, a permissive host may enforce tomorrow).
  No selinuxfs, or no readable ``enforce``: disabled, nothing runs.
- **restorecon** is looked up on the agent's ``PATH``, as ``systemctl`` and ``systemd-run`` are, and run only
  when it and every directory on the way to it (links resolved: ``/usr/sbin/restorecon`` is often a link to
  ``setfiles``) pass the ancestor rule of docs/host.md: owned by root, not writable by group or others
  (:func:`find_restorecon`). One found elsewhere is refused (exit 4) and never run: a root-run tool that
  executes a program another user can replace runs that user's program as root. None on ``PATH``: nothing
  runs (a host without the policy tools has nothing to restore).
- It runs bounded as every child of the agent (:func:`agent.process.run_bounded`: its own process group,
  killed at the end; :data:`RESTORECON_TIMEOUT_S`), with systemd's default ``PATH`` as its whole environment.
  A failure is one :class:`~upgrade_core.errors.HostError` naming the path: the caller stops before any
  switch to it.

A real SELinux kernel is not available on the test machines: the tests present "SELinux enabled" through the
documented test-only variable :data:`MOUNTINFO_TEST_ENV`, which names a file read instead of
``/proc/self/mountinfo`` (a ``selinuxfs`` line naming a directory with an ``enforce`` file), and put a
``restorecon`` on ``PATH`` that records its arguments (``tests/agent_host/test_selinux.py``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from typing import Final

from agent.fs.mounts import MOUNTINFO, read_mounts
from agent.fs.regular import read_text
from agent.fs.tree import check_ancestors, refusal
from agent.process import BoundedRunTimeout, run_bounded
from agent.sanitize import clean_text
from upgrade_core.errors import HostError, HostRefusedError

__all__ = [
    "MOUNTINFO_TEST_ENV",
    "RESTORECON_TIMEOUT_S",
    "find_restorecon",
    "restore_labels",
    "selinux_enabled",
    "selinuxfs_mount",
]

MOUNTINFO_TEST_ENV: Final = "UPGRADE_AGENT_TEST_MOUNTINFO"
"""Test-only: a file read instead of ``/proc/self/mountinfo`` (no SELinux kernel on the test machines)."""

RESTORECON_TIMEOUT_S: Final = 120.0
"""Seconds one ``restorecon`` may take (a slot file, or the few entries of a layout: milliseconds)."""

_TOOL_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def selinuxfs_mount(mountinfo: str | None = None) -> str | None:
    """Where a ``selinuxfs`` is mounted, per the mount table (proc(5) ``mountinfo``: the mount point is the
    fifth field, the file system type the first after the ``-`` separator), or None.

    Args:
        mountinfo: the table to read; None: ``$UPGRADE_AGENT_TEST_MOUNTINFO`` when set (tests), else
            ``/proc/self/mountinfo``.
    """
    path = mountinfo or os.environ.get(MOUNTINFO_TEST_ENV) or MOUNTINFO
    return next((m.point for m in read_mounts(path) if m.fs_type == "selinuxfs"), None)


def selinux_enabled(mountinfo: str | None = None) -> bool:
    """True when the kernel has SELinux enabled: a ``selinuxfs`` is mounted and its ``enforce`` file reads
    ``0`` or ``1`` (a policy is loaded). Never guessed from a configuration file or a command's presence."""
    mount = selinuxfs_mount(mountinfo)
    if mount is None:
        return False
    enforce = read_text(os.path.join(mount, "enforce"), follow=False, limit=16)
    return enforce is not None and enforce.strip() in ("0", "1")


def find_restorecon(search_path: str | None = None) -> str | None:
    """The ``restorecon`` the agent may run: the first on ``search_path`` (default: this process's
    ``PATH``, as ``systemctl`` is found), checked (see the module doc); None when there is none.

    Raises:
        HostRefusedError: the first ``restorecon`` found, or a directory on the way to its resolved file, is
            not root's or is writable by group or others; or it is not a regular executable file (exit 4).
    """
    search = os.environ.get("PATH", os.defpath) if search_path is None else search_path
    for directory in search.split(os.pathsep):
        if not os.path.isabs(directory):
            continue  # a relative PATH entry names the caller's working directory: never searched
        found = os.path.join(directory, "restorecon")
        if not os.path.lexists(found):
            continue
        real = os.path.realpath(found)
        for path in (found, real):
            parent = os.path.dirname(path)
            st_dir = os.stat(parent)
            if st_dir.st_uid != 0 or st_dir.st_mode & 0o022:  # sticky or not: others could plant one here
                raise refusal(parent, "holds restorecon but is not root's or is writable by group or others; "
                                      "restorecon was not run")
            try:
                check_ancestors(parent)
            except HostRefusedError as e:
                raise HostError(f"{str(e).removesuffix('; nothing was changed')}; restorecon was not run"
                                ) from None
        st = os.stat(real)
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
            raise refusal(found, "is not an executable regular file; restorecon was not run")
        if st.st_uid != 0 or st.st_mode & 0o022:
            mode = stat.S_IMODE(st.st_mode)
            raise refusal(real, f"owned by uid {st.st_uid} with mode {mode:04o}: it must be root's and not "
                                "writable by group or others; restorecon was not run")
        return found
    return None


async def restore_labels(paths: Sequence[str], *, recursive: bool = False) -> str | None:
    """Run ``restorecon [-R] -- PATHS`` when SELinux is enabled and a trusted ``restorecon`` is on ``PATH``.

    Args:
        paths: absolute paths the agent just created or replaced (slot files, layout directories).
        recursive: ``-R``: the directories' contents too.

    Returns:
        The ``restorecon`` run, or None when nothing ran (SELinux disabled, no ``restorecon``, no paths).

    Raises:
        HostRefusedError: the ``restorecon`` found is not one the agent may run (exit 4, see
            :func:`find_restorecon`); nothing ran.
        HostError: it could not be started, ran past :data:`RESTORECON_TIMEOUT_S` (its process group
            killed) or exited non-zero: one line naming the first path and what ``restorecon`` said.

    Cancellation: its process group is killed; labels may be partly restored (run again: idempotent).
    """
    if not paths or not selinux_enabled():
        return None
    exe = find_restorecon()
    if exe is None:
        return None
    argv = [exe, *(["-R"] if recursive else []), "--", *paths]
    try:
        done = await run_bounded(argv, timeout_s=RESTORECON_TIMEOUT_S, max_output_bytes=8192,
                                 env={"PATH": _TOOL_PATH})
    except BoundedRunTimeout:
        raise HostError(f"{paths[0]}: {exe} did not finish within {RESTORECON_TIMEOUT_S:g} s; "
                        "labels not restored") from None
    except OSError as e:
        raise HostError(f"{paths[0]}: cannot run {exe}: {e.strerror or e}; labels not restored") from None
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines() or [""]
        raise HostError(f"{paths[0]}: {exe} exited {done.returncode}: {clean_text(said[-1], 200)}; "
                        "labels not restored")
    return exe

"""Stable paths for the executables the units name: ``install`` refuses to write units that would
run ``recover-agent-upgrade`` (or ``upgrade-agent``) from a temporary or per-user place.

Why: the recovery units run the tool by absolute path at boot and on failure. A path under ``/tmp``, a home
directory or a git checkout's ``.venv`` works while installing and breaks recovery silently once that
directory is cleaned, unmounted or moved. A stable install is ``make install PREFIX=/opt/upgrade-core`` or
the self-contained runtime unpacked under the host root (docs/install.md).

Override: ``install --allow-unstable-paths``, or ``UPGRADE_AGENT_ALLOW_UNSTABLE_PATHS=1`` in the environment
(the test harness, the demo and the benchmarks set it: they install agents from a checkout's venv into
throw-away private systemds on purpose).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Final

from agent.errors import UsageError
from agent.fs.statefile import read_regular

ALLOW_ENV: Final = "UPGRADE_AGENT_ALLOW_UNSTABLE_PATHS"
"""Environment variable that, set to ``1``, has the same effect as ``install --allow-unstable-paths``."""

_TEMPORARY: Final = ("/tmp", "/var/tmp", "/dev/shm", "/run/user")
_PER_USER: Final = ("/home", "/root", "/var/home")


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _checkout(path: str) -> str | None:
    """The nearest ancestor directory of ``path`` that holds a ``.git`` entry (a checkout), or None."""
    parent = os.path.dirname(path)
    while True:
        if os.path.lexists(os.path.join(parent, ".git")):
            return parent
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up


def unstable_reason(path: str) -> str | None:
    """Why ``path`` (an absolute executable path) is no place for a unit's ``ExecStart=``, or None.

    Both the path as given and with symlinks resolved are checked: temporary trees (``/tmp``, ``/var/tmp``,
    ``/dev/shm``, ``/run/user``, ``$TMPDIR``), home directories (``/home``, ``/root``, ``/var/home``) and
    anything inside a git checkout. A ``#!`` script's interpreter (a venv's entry script names its
    ``python``) is checked the same way. Reads at most the first 256 bytes of ``path``; never raises for a
    missing or unreadable file (that is checked when the unit runs).
    """
    temporary = [*_TEMPORARY]
    # TMPDIR as tempfile.gettempdir() would pick it, without its probe (it writes a test file).
    tmpdir = os.path.realpath(os.environ.get("TMPDIR") or "/tmp")
    if tmpdir != "/":
        temporary.append(tmpdir)
    for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        for top in temporary:
            if _under(candidate, top):
                return f"it is under the temporary directory {top}"
        for top in _PER_USER:
            if _under(candidate, top):
                return f"it is under the per-user directory {top}"
        checkout = _checkout(candidate)
        if checkout is not None:
            return f"it is inside the git checkout {checkout}"
    interpreter = _interpreter(path)
    if interpreter is not None and interpreter != path:
        why = unstable_reason(interpreter)
        if why is not None:
            return f"its interpreter {interpreter} is unstable: {why}"
    return None


def _interpreter(path: str) -> str | None:
    """The absolute interpreter of a ``#!`` script, or None (not a regular file, not a script, unreadable,
    ``#!/usr/bin/env``).

    Reads at most 256 bytes. A link is followed (the unit will run what it names, so that is what is judged);
    only a regular file is read (:func:`agent.fs.statefile.read_regular`).
    """
    head = read_regular(path, follow=True, limit=256)
    if head is None or not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    if not words or not words[0].startswith(b"/") or os.path.basename(words[0]) == b"env":
        return None
    return os.fsdecode(words[0])


def check_stable_executables(paths: Iterable[str], *, allow: bool) -> None:
    """Refuse unit executables in temporary or per-user places, unless ``allow`` or ``$ALLOW_ENV`` is ``1``.

    Args:
        paths: absolute paths of the executables the rendered units name.
        allow: ``install --allow-unstable-paths``.

    Raises:
        UsageError: the first unstable path, with why and how to fix it (exit 2); nothing was written.
    """
    if allow or os.environ.get(ALLOW_ENV) == "1":
        return
    for path in paths:
        why = unstable_reason(path)
        if why is not None:
            raise UsageError(
                f"{path}: refusing to write units that run it ({why}); install the tool at a stable path "
                "(make install PREFIX=/opt/upgrade-core, or the runtime bundle under the host root) and run "
                f"that copy, or pass --allow-unstable-paths (or set {ALLOW_ENV}=1)"
            )

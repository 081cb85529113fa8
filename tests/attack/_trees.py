"""The components an attack may replace, and the replacements: what another user could leave at one path.

A component is a path under the copy's ``host/`` (``""`` is ``host/`` itself, the parent every agent
directory shares), with the type the agent leaves there (``dir``, ``file``, ``link``) or ``absent`` (a name
the command creates: an attacker plants something there first). A hostile replacement is one of:

- ``symlink``: a symlink owned by uid 65534 to a canary outside: a directory holding a copy of what the
  component held (so a command that follows it finds files it would take for its own), or a file holding a
  copy of its bytes (a program: one that leaves a mark outside when run);
- ``fifo``: a FIFO (a command that opens it for reading or writing would wait for ever);
- ``hardlink``: a second name of a canary file outside (regular files and absent names only);
- ``foreign``: owned by uid 65534 (``lchown``; symlinks too);
- ``writable``: group- and/or world-writable (directories and regular files).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import attrs

from ._hosts import NAME, NOBODY, OPERATION, canary_program

KINDS = ("symlink", "fifo", "hardlink", "foreign", "writable")
LIVE_SEGMENT = "state/journal/LIVE"  # the live segment's name depends on the journal: found when attacked


@attrs.frozen
class Component:
    """One attackable path: ``rel`` under ``host/``, ``kind`` what the agent leaves there."""

    rel: str
    kind: str  # "dir" | "file" | "link" | "absent-file" | "absent-dir" | "parent"

    def replacements(self) -> tuple[str, ...]:
        """The hostile replacements that make sense here."""
        return {
            "parent": ("foreign", "writable"),
            "dir": ("symlink", "fifo", "foreign", "writable"),
            "file": KINDS,
            "link": ("symlink", "fifo", "foreign"),
            "absent-file": ("symlink", "fifo", "hardlink"),
            "absent-dir": ("symlink", "fifo"),
        }[self.kind]


def _c(rel: str, kind: str) -> Component:
    return Component(rel, kind)


HOST_PARENT = _c("", "parent")
ROOT_DIRS = tuple(_c(r, "dir") for r in ("root", "root/lib", f"root/lib/{NAME}", "root/bin"))
ROOT_FILES = (
    _c(f"root/lib/{NAME}/{NAME}-blue", "file"), _c(f"root/lib/{NAME}/{NAME}-green", "file"),
    _c(f"root/lib/{NAME}/{NAME}-current", "link"), _c(f"root/lib/{NAME}/{NAME}-last-good", "link"),
    _c(f"root/bin/{NAME}", "link"),
)
STATE_DIRS = (_c("state", "dir"), _c("state/journal", "dir"), _c("state/results", "dir"))
JOURNAL_FILES = (_c(LIVE_SEGMENT, "file"), _c("state/journal/owner.json", "file"))
RESULT_FILES = (_c("state/results/tpl-upgrade.json", "file"),)
RECORD = _c("state/install.json", "file")
TRUST = (_c("state/trust", "dir"), _c("state/trust/keyring.json", "file"))
LOCK = (_c("run", "dir"), _c(f"run/{NAME}.lock", "file"))
SPOOL = (_c("spool", "dir"), _c(f"spool/{OPERATION}.json", "file"),
         _c(f"spool/{OPERATION}.status.json", "absent-file"))
MIRROR = (_c("mirror", "dir"), _c("mirror/bin", "dir"), _c(f"mirror/bin/{NAME}", "file"))
UNITS = (_c("units", "dir"), _c(f"units/{NAME}.service", "file"))
BARE = (
    HOST_PARENT, _c("root", "dir"), _c("root/lib", "dir"), _c("root/bin", "dir"), _c("units", "dir"),
    _c(f"root/lib/{NAME}", "absent-dir"), _c("state", "absent-dir"), _c("run", "absent-dir"),
    _c(f"root/bin/{NAME}", "absent-file"), _c("mirror", "absent-dir"),
)

_ROOT = (*ROOT_DIRS, *ROOT_FILES)
_STATE = (*STATE_DIRS, *JOURNAL_FILES, *RESULT_FILES, RECORD)
TOUCHES: dict[str, tuple[Component, ...]] = {
    "install": BARE,
    "upgrade": (HOST_PARENT, *_ROOT, *_STATE, *TRUST, *LOCK, *MIRROR, *UNITS),
    "rollback": (HOST_PARENT, *_ROOT, *_STATE, *LOCK, *MIRROR, *UNITS),
    "recover": (HOST_PARENT, *_ROOT, *_STATE, *LOCK),
    "reset": (HOST_PARENT, *ROOT_DIRS, *_STATE, *LOCK, *UNITS),
    "uninstall": (HOST_PARENT, *_ROOT, *_STATE, *TRUST, *LOCK, *UNITS),
    "status": (HOST_PARENT, *_ROOT, *_STATE, *LOCK, *UNITS),
    "journal verify": (HOST_PARENT, *ROOT_DIRS, *STATE_DIRS, *JOURNAL_FILES, *LOCK),
    "journal dump": (HOST_PARENT, *ROOT_DIRS, *STATE_DIRS, *JOURNAL_FILES, *LOCK),
    "operator spool pass": (HOST_PARENT, *STATE_DIRS, *LOCK, *SPOOL),
}
"""Each command and the components it reads, writes, removes or runs (or, for ``install``, creates)."""

_ALL = ("install", "upgrade", "rollback", "recover", "reset", "uninstall", "status", "journal verify",
        "journal dump", "operator spool pass")
# docs/host.md: every command that acts on the host root checks it; `recover` only when it finds an open
# episode (the templates have none), so a `recover` with nothing to do may leave a hostile R unread
_ROOT_CHECKERS = ("install", "upgrade", "rollback", "reset", "uninstall", "status", "journal verify",
                  "journal dump")
MUST_REFUSE: dict[str, tuple[str, ...]] = {
    "": _ALL,
    **{c.rel: _ROOT_CHECKERS for c in ROOT_DIRS},
    **{c.rel: _ALL for c in STATE_DIRS},
    "run": _ALL,
    "state/trust": ("upgrade",),
    "spool": ("operator spool pass",),
}
"""Directories of the agent's own (and their shared parent) whose hostile state each listed command must
refuse outright (exit 4, or 2 for a placement the configuration could have avoided), naming the path: a
foreign owner or a group/world-writable mode lets another user swap what lies below, and a symlink or FIFO
is not the agent's directory at all (docs/host.md#ownership, design §10)."""


def pairs(command: str) -> list[tuple[Component, str]]:
    """Every (component, replacement) an attack on ``command`` draws from."""
    return [(c, k) for c in TOUCHES[command] for k in c.replacements()]


def resolve(host: Path, component: Component) -> Path:
    """The component's path in this copy (the live segment found by listing ``journal/``)."""
    if component.rel == LIVE_SEGMENT:
        live = sorted(n for n in os.listdir(host / "state" / "journal") if n.endswith(".jnl"))
        return host / "state" / "journal" / live[-1]
    return host / component.rel if component.rel else host


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _canary_file(outside: Path, path: Path) -> Path:
    """A canary file outside holding ``path``'s bytes (a program that marks its run, for an executable)."""
    canary = outside / "canary-file"
    try:
        st = os.stat(path)  # follows a link such as ``current`` to the slot it names
        data, mode = Path(path).read_bytes(), stat.S_IMODE(st.st_mode)
    except (FileNotFoundError, IsADirectoryError):
        data, mode = b"canary: root's own bytes\n", 0o644
    if mode & 0o111 or path.name.startswith(f"{NAME}-") or path.parent.name == "bin":
        data, mode = canary_program(outside, data or b"#!/bin/sh\necho 1.0.0\n"), 0o755
    canary.write_bytes(data)
    canary.chmod(mode)
    return canary


def apply(host: Path, outside: Path, component: Component, replacement: str, *, relative: bool,
          bits: int) -> Path:
    """Leave ``replacement`` at ``component`` in the copy under ``host``; the canaries go to ``outside``.

    Args:
        relative: a symlink's target is relative (else absolute).
        bits: the mode bits ``writable`` adds (``0o020``, ``0o002`` or both).

    Returns:
        The attacked path.
    """
    path = resolve(host, component)
    if replacement == "foreign":
        os.lchown(path, NOBODY, NOBODY)
    elif replacement == "writable":
        os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | bits)
    elif replacement == "fifo":
        _remove(path)
        os.mkfifo(path, 0o600)
    elif replacement == "hardlink":
        canary = _canary_file(outside, path)
        _remove(path)
        os.link(canary, path)
    else:  # symlink
        if component.kind in ("dir", "absent-dir"):
            target = outside / "canary-dir"
            if os.path.isdir(path):
                shutil.copytree(path, target, symlinks=True)
            else:
                target.mkdir(mode=0o755)
        else:
            target = _canary_file(outside, path)
        _remove(path)
        os.symlink(os.path.relpath(target, path.parent) if relative else target, path)
        os.lchown(path, NOBODY, NOBODY)
    return path

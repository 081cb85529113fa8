"""The mount table of this process's mount namespace, read one way for every caller.

proc(5) ``/proc/[pid]/mountinfo``: one line per mount, space-separated; field 5 is the mount point
(relative to the process's root), then optional fields, a lone ``-`` separator, the file-system type and
the source. Paths have space, tab, newline and backslash written as octal escapes (``\\040``, ``\\011``,
``\\012``, ``\\134``), which are decoded here. The file is read through the checked reader with a size
bound of 4 MiB (about 150 bytes a line: tens of thousands of mounts).
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from agent.fs.regular import read_text

__all__ = ["MOUNTINFO", "Mount", "fs_type_of", "parse_mountinfo", "read_mounts"]

MOUNTINFO: Final = "/proc/self/mountinfo"
_MAX_BYTES: Final = 4 << 20
_ESCAPE: Final = re.compile(r"\\([0-7]{3})")


class Mount(NamedTuple):
    """One mountinfo line: ``point`` (decoded, absolute) and ``fs_type`` (``ext4``, ``selinuxfs``...)."""

    point: str
    fs_type: str


def _unescape(field: str) -> str:
    """A mountinfo path field with its octal escapes decoded."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field) if "\\" in field else field


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a mountinfo table, in its order; lines without the ``-`` separator or a type are skipped
    (a table cut short by the size bound ends in one)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if sep + 1 < len(fields):
            mounts.append(Mount(_unescape(fields[4]), fields[sep + 1]))
    return mounts


def read_mounts(path: str = MOUNTINFO) -> list[Mount]:
    """The mounts listed in ``path`` (default this process's table); an empty list when it cannot be read."""
    text = read_text(path, limit=_MAX_BYTES)
    return parse_mountinfo(text) if text is not None else []


def fs_type_of(target: str, mounts: list[Mount]) -> str:
    """The type of the mount holding the resolved absolute path ``target``: the longest mount point that is
    ``target`` or one of its ancestors (a later mount over the same point wins, as the kernel stacks them);
    "unknown" when none does."""
    best, kind = -1, "unknown"
    for mount in mounts:
        point = mount.point
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, kind = len(point), mount.fs_type
    return kind

"""``agent/fs`` is the only code of ``agent/`` that opens, creates, renames, links, chmods or removes a path
on the host (docs/architecture.md, design §10): every other module asks it for a checked directory handle or
a checked read. Looking (``stat``, ``lstat``, ``readlink``, ``realpath``) is allowed anywhere: it changes
nothing and opens nothing.

The check reads the source (``ast``), so a call moved into a function or behind an alias is still found;
it is also run against a small tree that breaks the rule, so it is shown to fail where it must.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The package that may touch paths: the checked walk, the durable writes, the state files, regular reads.
PATH_LAYER = "agent/fs/"
# The test-support package builds sample hosts, releases and a private systemd for the demo and the tests;
# it runs as the tests' own user on directories it made itself, never on a host the agent manages.
ALLOWED = {
    "agent/testing/": "test support: builds the sample hosts, releases and sandboxes it then hands to tests",
}

# os functions that open, create, rename, link, change or remove a path.
OS_CALLS = frozenset({
    "open", "mkdir", "makedirs", "rename", "renames", "replace", "link", "symlink", "unlink", "remove",
    "rmdir", "removedirs", "chmod", "lchmod", "chown", "lchown", "mkfifo", "mknod", "truncate", "utime",
    "listdir", "scandir", "walk", "fwalk", "chdir", "chroot",
})
# pathlib methods that do the same (names no str/bytes method shares).
PATH_METHODS = frozenset({
    "write_text", "write_bytes", "read_text", "read_bytes", "mkdir", "unlink", "rmdir", "symlink_to",
    "hardlink_to", "touch", "iterdir", "glob", "rglob", "chmod", "lchmod",
})
# shutil copies, moves and removes trees; ``which`` only looks along PATH.
SHUTIL_LOOKS = frozenset({"which"})


def violations(source: str, filename: str) -> list[str]:
    """Each forbidden call or import in ``source`` as ``file:line: what``."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil", "tempfile"):
            for alias in node.names:
                if node.module == "tempfile" or (node.module == "os" and alias.name in OS_CALLS) or (
                        node.module == "shutil" and alias.name not in SHUTIL_LOOKS):
                    out.append(f"{where}: from {node.module} import {alias.name}")
        if isinstance(node, ast.Import):
            out += [f"{where}: import tempfile" for a in node.names if a.name == "tempfile"]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            out.append(f"{where}: open()")
        elif isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if owner == "os" and func.attr in OS_CALLS:
                out.append(f"{where}: os.{func.attr}()")
            elif owner == "shutil" and func.attr not in SHUTIL_LOOKS:
                out.append(f"{where}: shutil.{func.attr}()")
            elif owner == "io" and func.attr == "open":
                out.append(f"{where}: io.open()")
            elif func.attr in PATH_METHODS and owner not in ("os", "shutil"):
                out.append(f"{where}: .{func.attr}()")
    return out


def test_only_agent_fs_touches_paths() -> None:
    found = []
    for path in sorted((ROOT / "agent").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(PATH_LAYER) or any(rel.startswith(prefix) for prefix in ALLOWED):
            continue
        found += violations(path.read_text(encoding="utf-8"), rel)
    assert found == [], "path calls outside agent/fs:\n" + "\n".join(found)


def test_the_rule_catches_each_kind() -> None:
    bad = (
        "import os, shutil\nfrom os import unlink\nfrom pathlib import Path\n"
        "def f(p):\n"
        "    open(p)\n    os.rename(p, p)\n    os.listdir(p)\n    shutil.rmtree(p)\n"
        "    Path(p).write_text('x')\n    p.unlink()\n    shutil.which('x')\n    os.lstat(p)\n"
    )
    found = [v.split(": ", 1)[1] for v in violations(bad, "bad.py")]
    assert found == ["from os import unlink", "open()", "os.rename()", "os.listdir()", "shutil.rmtree()",
                     ".write_text()", ".unlink()"]

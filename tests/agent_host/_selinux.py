"""A host presented to the agent as "SELinux enabled", and a ``restorecon`` that records its arguments.

No SELinux kernel is available on the test machines, so the kernel's side is presented through the
documented test-only variable ``UPGRADE_AGENT_TEST_MOUNTINFO``
(:data:`agent.host.selinux.MOUNTINFO_TEST_ENV`): a mount table whose ``selinuxfs`` line names a directory
holding an ``enforce`` file, read by the same code
that reads ``/proc/self/mountinfo`` on a real host. The ``restorecon`` is a real program on ``PATH`` (a
shell script in a root-owned 0755 directory) that appends one line per run to a record file.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from agent.host.selinux import MOUNTINFO_TEST_ENV


@attrs.frozen
class FakeSelinux:
    """What a test needs to present SELinux and read what ``restorecon`` was asked.

    Attributes:
        env: the variables to set for the agent (the mount table, and ``PATH`` with the fake tool first).
        record: the file each ``restorecon`` run appends its arguments to (tab-separated, one run a line).
        tool_dir: the directory holding the fake ``restorecon``.
    """

    env: dict[str, str]
    record: Path
    tool_dir: Path

    def runs(self) -> list[list[str]]:
        """The argument lists of every ``restorecon`` run so far, in order."""
        if not self.record.exists():
            return []
        return [line.split("\t")[:-1] for line in self.record.read_text().splitlines()]


def fake_selinux(
    base: Path, *, enabled: bool = True, exit_code: int = 0, with_tool: bool = True
) -> FakeSelinux:
    """Lay out a selinuxfs stand-in and a recording ``restorecon`` under ``base``.

    Args:
        enabled: write ``enforce`` (``1``); False leaves the selinuxfs line out of the mount table.
        exit_code: what the fake ``restorecon`` exits with (non-zero: it says why on stderr).
        with_tool: put the fake ``restorecon`` on ``PATH`` at all.
    """
    base.mkdir(parents=True, exist_ok=True)
    fs = base / "selinuxfs"
    fs.mkdir(exist_ok=True)
    (fs / "enforce").write_text("1")
    table = base / "mountinfo"
    lines = ["22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"]
    if enabled:
        lines.append(f"29 22 0:26 / {fs} rw,relatime shared:7 - selinuxfs selinuxfs rw\n")
    table.write_text("".join(lines))
    tools = base / "sbin"
    tools.mkdir(exist_ok=True)
    os.chmod(tools, 0o755)
    record = base / "restorecon.calls"
    if with_tool:
        script = tools / "restorecon"
        said = "echo 'restorecon: could not set context: Operation not permitted' >&2" if exit_code else ""
        script.write_text(
            f"#!/bin/sh\nprintf '%s\\t' \"$@\" >> {record}\necho >> {record}\n{said}\nexit {exit_code}\n"
        )
        os.chmod(script, 0o755)
    env = {MOUNTINFO_TEST_ENV: str(table), "PATH": f"{tools}:{os.environ.get('PATH', os.defpath)}"}
    return FakeSelinux(env, record, tools)

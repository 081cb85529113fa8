"""SELinux labels of slot files and directories (docs/host.md, "SELinux labels").

A real SELinux kernel is not available on the test machines: "enabled" is presented through the test-only
mount table variable and a recording ``restorecon`` (see ``_selinux.py``); what runs is the agent's real code
reading that table and running that program.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.host.selinux import find_restorecon, restore_labels, selinux_enabled, selinuxfs_mount
from upgrade_core.errors import HostError, HostRefusedError
from upgrade_core.ports import StagedCandidate

from ._helpers import GREEN_BYTES, installed_host
from ._selinux import fake_selinux
from .test_host import stage

pytestmark = pytest.mark.anyio


def _present(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_enabled_is_read_from_the_mount_table_and_the_enforce_file(tmp_path: Path) -> None:
    fake = fake_selinux(tmp_path / "se")
    table = fake.env["UPGRADE_AGENT_TEST_MOUNTINFO"]
    assert selinuxfs_mount(table) == str(tmp_path / "se" / "selinuxfs")
    assert selinux_enabled(table)
    (tmp_path / "se" / "selinuxfs" / "enforce").unlink()  # selinuxfs mounted, no policy loaded
    assert not selinux_enabled(table)
    off = fake_selinux(tmp_path / "off", enabled=False)
    assert selinuxfs_mount(off.env["UPGRADE_AGENT_TEST_MOUNTINFO"]) is None


def test_this_machine_reads_as_the_kernel_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UPGRADE_AGENT_TEST_MOUNTINFO", raising=False)
    mounted = "selinuxfs" in Path("/proc/self/mountinfo").read_text()
    kernel_says = mounted and os.path.exists("/sys/fs/selinux/enforce")
    assert selinux_enabled() == kernel_says


def test_a_mount_point_with_a_space_is_unescaped(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text("29 22 0:26 / /sys/fs/se\\040linux rw - selinuxfs selinuxfs rw\n")
    assert selinuxfs_mount(str(table)) == "/sys/fs/se linux"


async def test_restorecon_runs_on_the_slot_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_selinux(tmp_path / "se")
    _present(monkeypatch, fake.env)
    host = installed_host(tmp_path / "R")
    staged = stage(host, await host.prepare_staging("green"), GREEN_BYTES)
    await host.install_staged(staged)
    assert fake.runs() == [["--", host.slot_path("green")]]
    assert Path(host.slot_path("green")).read_bytes() == GREEN_BYTES


async def test_disabled_or_absent_is_a_no_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    off = fake_selinux(tmp_path / "off", enabled=False)
    _present(monkeypatch, off.env)
    host = installed_host(tmp_path / "R")
    await host.install_staged(stage(host, await host.prepare_staging("green"), GREEN_BYTES))
    assert off.runs() == []
    none = fake_selinux(tmp_path / "none", with_tool=False)
    monkeypatch.setenv("UPGRADE_AGENT_TEST_MOUNTINFO", none.env["UPGRADE_AGENT_TEST_MOUNTINFO"])
    monkeypatch.setenv("PATH", str(none.tool_dir))  # enabled, and no restorecon anywhere on PATH
    assert await restore_labels([host.slot_path("green")]) is None


async def test_a_failing_restorecon_is_one_line_naming_the_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_selinux(tmp_path / "se", exit_code=1)
    _present(monkeypatch, fake.env)
    host = installed_host(tmp_path / "R")
    staged = stage(host, await host.prepare_staging("green"), GREEN_BYTES)
    with pytest.raises(HostError) as caught:
        await host.install_staged(staged)
    message = str(caught.value)
    assert message.startswith(f"{host.slot_path('green')}: ") and "\n" not in message
    assert "exited 1: restorecon: could not set context" in message
    assert os.readlink(host.layout.current_link) == "demo-agent-blue"  # nothing switched


@pytest.mark.parametrize("where", ["dir-writable", "file-writable", "file-not-roots"])
def test_a_restorecon_others_could_replace_is_refused_and_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    fake = fake_selinux(tmp_path / "se")
    tool = fake.tool_dir / "restorecon"
    if where == "dir-writable":
        os.chmod(fake.tool_dir, 0o777)
    elif where == "file-writable":
        os.chmod(tool, 0o775)
    else:
        os.chown(tool, 1000, 1000)
    with pytest.raises(HostRefusedError, match="restorecon was not run"):
        find_restorecon(str(fake.tool_dir))
    assert fake.runs() == []


def test_the_lookup_follows_path_order_and_resolves_a_link(tmp_path: Path) -> None:
    fake = fake_selinux(tmp_path / "se")
    sbin = tmp_path / "usr-sbin"
    sbin.mkdir()
    os.symlink(fake.tool_dir / "restorecon", sbin / "restorecon")  # restorecon -> setfiles, as on Fedora
    assert find_restorecon(f"relative/dir:{sbin}:{fake.tool_dir}") == str(sbin / "restorecon")
    assert find_restorecon(str(tmp_path / "nothing-here")) is None


async def test_restorecon_gets_the_staged_slot_only_after_the_bytes_are_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_selinux(tmp_path / "se")
    _present(monkeypatch, fake.env)
    host = installed_host(tmp_path / "R")
    path = await host.prepare_staging("green")
    Path(path).write_bytes(GREEN_BYTES)
    with pytest.raises(HostError):  # a truncated staging file is refused before anything is labelled
        await host.install_staged(StagedCandidate("green", path, "0" * 64, 1, "0" * 64, 1))
    assert fake.runs() == []

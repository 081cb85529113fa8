"""agent.host.adapter: the Host port on a real layout in tmp_path (design §3, 6; cases C05, C09, C12)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from agent.fs import durable
from agent.host.adapter import AgentHost, ProtectedPathError, SlotInUseError
from agent.host.install_record import Entry, Remover
from agent.host.mirrors import Mirror
from agent.host.provision import Adoption, Provisioner
from upgrade_core.errors import HostError, LayoutConflictError, NoSpaceError
from upgrade_core.ports import LinkState, StagedCandidate

from ._helpers import BLUE_BYTES, GREEN_BYTES, NAME, installed_host, snapshot, syscall_spy

pytestmark = pytest.mark.anyio


def stage(host: AgentHost, path: str, data: bytes) -> StagedCandidate:
    """What the archive source leaves behind: an fsynced staging file (0700 here: install makes it 0755)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    sha = hashlib.sha256(data).hexdigest()
    return StagedCandidate("green", path, sha, len(data), sha, len(data))


async def test_layout_paths_and_links(tmp_path: Path) -> None:
    host = installed_host(tmp_path / "R")
    agent_dir = tmp_path / "R" / "lib" / NAME
    assert host.slot_path("blue") == str(agent_dir / f"{NAME}-blue")
    assert host.current_link_path() == str(agent_dir / f"{NAME}-current")
    assert host.links() == LinkState(current="blue", last_good="blue")
    assert os.readlink(tmp_path / "R" / "bin" / NAME) == f"../lib/{NAME}/{NAME}-current"
    assert (tmp_path / "R" / "bin" / NAME).read_bytes() == BLUE_BYTES
    for d in (tmp_path / "R", tmp_path / "R" / "lib", agent_dir, tmp_path / "R" / "bin"):
        assert d.stat().st_mode & 0o777 == 0o755
    assert host.is_installed()
    assert AgentHost(str(tmp_path / "bare"), NAME).links() == LinkState(None, None)


@pytest.mark.parametrize("what", ["dir", "file", "foreign-target", "absolute-target"])
async def test_link_conflicts_are_refused_before_anything_changes(tmp_path: Path, what: str) -> None:
    host = installed_host(tmp_path / "R")
    durable.atomic_write_bytes(host.slot_path("green"), GREEN_BYTES, 0o755)
    link = Path(host.current_link_path())
    link.unlink()
    if what == "dir":
        link.mkdir()
    elif what == "file":
        link.write_bytes(BLUE_BYTES)
    elif what == "foreign-target":
        link.symlink_to("../../etc/passwd")
    else:
        link.symlink_to(host.slot_path("blue"))
    before = snapshot(tmp_path)
    with pytest.raises(LayoutConflictError, match=str(link)):
        host.links()
    if what in ("dir", "file"):
        with pytest.raises(LayoutConflictError, match="a real"):
            await host.point_current("green")
    assert snapshot(tmp_path) == before


async def test_slot_sha256_missing_empty_and_present(tmp_path: Path) -> None:
    host = installed_host(tmp_path / "R")
    assert await host.slot_sha256("blue") == hashlib.sha256(BLUE_BYTES).hexdigest()
    assert await host.slot_sha256("green") is None
    Path(host.slot_path("green")).write_bytes(b"")  # a crash's zero-length leftover (C12)
    assert await host.slot_sha256("green") is None
    assert await AgentHost(str(tmp_path / "bare"), NAME).slot_sha256("blue") is None


async def test_install_staged_durability_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = installed_host(tmp_path / "R")
    path = await host.prepare_staging("green")
    assert not os.path.lexists(path)
    assert os.path.basename(path).startswith(f".{NAME}-green.stage-")
    staged = stage(host, path, GREEN_BYTES)
    with syscall_spy(monkeypatch) as calls:
        await host.install_staged(staged)
    agent_dir = host.layout.agent_dir
    assert calls == [("fsync", path), ("rename", path, host.slot_path("green")), ("fsync", agent_dir)]
    assert await host.slot_sha256("green") == staged.sha256
    assert os.stat(host.slot_path("green")).st_mode & 0o777 == 0o755
    assert not os.path.lexists(path)


async def test_point_current_durability_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = installed_host(tmp_path / "R")
    durable.atomic_write_bytes(host.slot_path("green"), GREEN_BYTES, 0o755)
    with syscall_spy(monkeypatch) as calls:
        await host.point_current("green")
    assert [c[0] for c in calls] == ["symlink", "rename", "fsync"]
    assert calls[1][2] == host.current_link_path() and calls[2][1] == host.layout.agent_dir
    assert host.links() == LinkState(current="green", last_good="blue")
    await host.point_last_good("green")
    assert host.links() == LinkState(current="green", last_good="green")
    assert os.readlink(host.current_link_path()) == f"{NAME}-green"  # bare, relative


async def test_links_are_never_pointed_at_a_missing_or_empty_slot(tmp_path: Path) -> None:
    host = installed_host(tmp_path / "R")
    before = snapshot(tmp_path)
    with pytest.raises(HostError, match="missing or empty"):
        await host.point_current("green")
    Path(host.slot_path("green")).write_bytes(b"")
    before = snapshot(tmp_path)
    with pytest.raises(HostError, match="missing or empty"):
        await host.point_last_good("green")
    assert snapshot(tmp_path) == before


async def test_candidate_never_replaces_the_current_or_last_good_slot(tmp_path: Path) -> None:
    host = installed_host(tmp_path / "R")
    path = host.layout.new_staging_path("blue")
    data = GREEN_BYTES
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o755)
    os.write(fd, data)
    os.close(fd)
    sha = hashlib.sha256(data).hexdigest()
    before = snapshot(tmp_path)
    with pytest.raises(SlotInUseError, match="current names this slot"):
        await host.install_staged(StagedCandidate("blue", path, sha, len(data), sha, len(data)))
    assert snapshot(tmp_path) == before


async def test_install_staged_refuses_a_truncated_staging_file(tmp_path: Path) -> None:
    host = installed_host(tmp_path / "R")
    path = host.layout.new_staging_path("green")
    staged = stage(host, path, GREEN_BYTES)
    Path(path).write_bytes(GREEN_BYTES[:5])
    before = snapshot(tmp_path)
    with pytest.raises(HostError, match="expected"):
        await host.install_staged(staged)
    assert snapshot(tmp_path) == before


async def test_sweep_removes_only_staging_leftovers(tmp_path: Path) -> None:
    host = installed_host(tmp_path / "R")
    durable.atomic_write_bytes(host.slot_path("green"), GREEN_BYTES, 0o755)
    agent_dir = Path(host.layout.agent_dir)
    leftovers = [agent_dir / f".{NAME}-green.stage-0123abcd", agent_dir / f".{NAME}-blue.stage-ff"]
    for p in leftovers:
        p.write_bytes(b"partial")
    keep = [
        agent_dir / f".{NAME}-green.stage-XYZ",  # not hex
        agent_dir / ".other-green.stage-00",  # another agent's
        agent_dir / f"{NAME}-green.stage-00",  # no leading dot
        agent_dir / f".{NAME}-current.stage-00",  # not a slot
        agent_dir / "notes",
    ]
    for p in keep:
        p.write_bytes(b"keep")
    stage_dir = agent_dir / f".{NAME}-blue.stage-aa"
    stage_dir.mkdir()
    # A (hand-made) link whose target has the staging pattern: its target is never swept.
    target_named = agent_dir / f".{NAME}-blue.stage-beef"
    target_named.write_bytes(BLUE_BYTES)
    (tmp_path / "R" / "lib" / NAME / f"{NAME}-last-good").unlink()
    (tmp_path / "R" / "lib" / NAME / f"{NAME}-last-good").symlink_to(target_named.name)
    removed = await host.sweep_staging()
    assert removed == sorted(str(p) for p in leftovers)
    for p in [*keep, stage_dir, target_named]:
        assert p.exists(), p
    assert Path(host.slot_path("blue")).read_bytes() == BLUE_BYTES
    assert Path(host.slot_path("green")).read_bytes() == GREEN_BYTES
    assert await host.sweep_staging() == []


async def test_prepare_staging_refuses_when_member_limit_exceeds_free_space(tmp_path: Path) -> None:
    host = installed_host(tmp_path / "R", max_member_bytes=1 << 62)
    before = snapshot(tmp_path)
    with pytest.raises(NoSpaceError, match=r"limits\.max_member_bytes"):
        await host.prepare_staging("green")
    assert snapshot(tmp_path) == before


async def test_discard_staging(tmp_path: Path) -> None:
    host = installed_host(tmp_path / "R")
    path = host.layout.new_staging_path("green")
    Path(path).write_bytes(b"x")
    await host.discard_staging(path)
    assert not os.path.lexists(path)
    await host.discard_staging(path)  # absent: fine
    with pytest.raises(RuntimeError):
        await host.discard_staging(host.slot_path("blue"))
    assert Path(host.slot_path("blue")).exists()


async def test_sync_mirrors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m1").mkdir()
    (tmp_path / "m2").mkdir()
    mirrors = [str(tmp_path / "m1" / NAME), str(tmp_path / "m2" / NAME)]
    Path(mirrors[1]).write_bytes(b"old running binary")
    old_inode = os.stat(mirrors[1]).st_ino
    host = installed_host(tmp_path / "R", mirrors=mirrors)
    sha = hashlib.sha256(BLUE_BYTES).hexdigest()
    with syscall_spy(monkeypatch) as calls:
        assert await host.sync_mirrors("blue", sha) == tuple(mirrors)
    renames = [c for c in calls if c[0] == "rename"]
    assert [r[2] for r in renames] == mirrors
    for m in mirrors:
        assert Path(m).read_bytes() == BLUE_BYTES and os.stat(m).st_mode & 0o777 == 0o755
    assert os.stat(mirrors[1]).st_ino != old_inode  # replaced by rename, never written in place (C09)
    before = snapshot(tmp_path)
    assert await host.sync_mirrors("blue", sha) == tuple(mirrors)
    assert snapshot(tmp_path) == before
    with pytest.raises(HostError, match="differs"):
        await host.sync_mirrors("blue", "0" * 64)
    bad = AgentHost(str(tmp_path / "R"), NAME, mirrors=[str(tmp_path / "nodir" / NAME)])
    with pytest.raises(HostError, match="does not exist"):
        await bad.sync_mirrors("blue", sha)
    assert not (tmp_path / "nodir").exists()


async def test_protected_prefix_is_never_written(tmp_path: Path) -> None:
    usr = tmp_path / "usr"
    (usr / "lib").mkdir(parents=True)
    host = AgentHost(str(usr / "lib" / "ua"), NAME, protected_prefix=str(usr))
    with pytest.raises(ProtectedPathError):
        Provisioner(host).create_layout_dirs()
    assert os.listdir(usr / "lib") == []
    local = AgentHost(str(usr / "local" / "ua"), NAME, protected_prefix=str(usr))
    assert Provisioner(local).create_layout_dirs()


# -- adoption and removal ----------------------------------------------------------------------------
def plain_binary(path: Path, data: bytes = BLUE_BYTES) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o755)


async def test_adopt_plain_binary_at_r_bin(tmp_path: Path) -> None:
    R = tmp_path / "opt" / "ua"
    plain_binary(R / "bin" / NAME)
    host = AgentHost(str(R), NAME)
    assert Provisioner(host).find_adoptable() is not None
    found = Provisioner(host).adopt()
    assert found is not None and found.kind == "binary" and found.source == str(R / "bin" / NAME)
    assert found.sha256 == hashlib.sha256(BLUE_BYTES).hexdigest()
    assert Path(host.slot_path("blue")).read_bytes() == BLUE_BYTES
    before = snapshot(tmp_path)
    assert Provisioner(host).adopt() == found  # idempotent
    assert snapshot(tmp_path) == before
    await host.point_current("blue")
    await host.point_last_good("blue")
    assert Provisioner(host).ensure_compat_link() is True  # the adopted file is replaced by the link
    assert os.readlink(R / "bin" / NAME) == f"../lib/{NAME}/{NAME}-current"
    assert Provisioner(host).adopt() is None and Provisioner(host).find_adoptable() is None


async def test_adopt_plain_binary_at_legacy_bin(tmp_path: Path) -> None:
    legacy = tmp_path / "usr" / "local"
    plain_binary(legacy / "bin" / NAME)
    legacy_before = snapshot(legacy)
    host = AgentHost(str(tmp_path / "opt" / "ua"), NAME, legacy_root=str(legacy))
    found = Provisioner(host).adopt()
    assert found is not None and found.source == str(legacy / "bin" / NAME)
    assert Path(host.slot_path("blue")).read_bytes() == BLUE_BYTES
    assert Provisioner(host).adopt() == found
    assert snapshot(legacy) == legacy_before


async def test_not_executable_or_nothing_is_not_adopted(tmp_path: Path) -> None:
    R = tmp_path / "R"
    (R / "bin").mkdir(parents=True)
    (R / "bin" / NAME).write_bytes(b"data")  # 0644
    host = AgentHost(str(R), NAME)
    before = snapshot(tmp_path)
    assert Provisioner(host).adopt() is None
    assert snapshot(tmp_path) == before
    with pytest.raises(LayoutConflictError, match="a real file stands where a symlink must be"):
        Provisioner(host).ensure_compat_link()
    assert snapshot(tmp_path) == before
    (R / "bin" / NAME).chmod(0o755)  # executable, but blue does not hold it: not ours to replace
    with pytest.raises(LayoutConflictError, match="not the adopted binary"):
        Provisioner(host).ensure_compat_link()


def _remover(host: AgentHost) -> Remover:
    return Remover(host.layout, "/nonexistent-unit-dir", host.legacy_root)


def _entries_of(host: AgentHost) -> list[Entry]:
    """What ``install`` records for ``installed_host``, in creation order (intent before effect)."""
    lay = host.layout
    return [
        Entry("dir", lay.root), Entry("dir", lay.lib_dir), Entry("dir", lay.bin_dir),
        Entry("dir", lay.agent_dir),
        Entry("file", host.slot_path("blue")), Entry("link", lay.current_link),
        Entry("link", lay.last_good_link), Entry("link", lay.bin_link),
    ]


def legacy_layout(legacy: Path) -> None:
    d = legacy / "lib" / NAME
    plain_binary(d / f"{NAME}-blue")
    plain_binary(d / f"{NAME}-green", GREEN_BYTES)
    (d / f"{NAME}-current").symlink_to(f"{NAME}-green")
    (d / f"{NAME}-last-good").symlink_to(f"{NAME}-blue")
    (legacy / "bin").mkdir()
    (legacy / "bin" / NAME).symlink_to(f"../lib/{NAME}/{NAME}-current")


async def test_adopt_legacy_layout_links_r_and_uninstall_removes_only_the_link(tmp_path: Path) -> None:
    legacy = tmp_path / "usr" / "local"
    legacy_layout(legacy)
    legacy_before = snapshot(legacy)
    R = tmp_path / "opt" / "upgrade-agent"
    host = AgentHost(str(R), NAME, legacy_root=str(legacy))
    assert Provisioner(host).host_root() == str(legacy.resolve())
    assert not R.parent.exists()  # host_root changed nothing
    found = Provisioner(host).adopt()
    assert found is not None and found.kind == "legacy_layout"
    assert os.readlink(R) == "../usr/local"  # relative
    assert host.links() == LinkState(current="green", last_good="blue")
    assert host.is_installed()
    assert Provisioner(host).adopt() is None
    assert Provisioner(host).host_root() == str(legacy.resolve())
    removed = _remover(host).remove([Entry("link", str(R))]).removed  # what the install record lists
    assert removed == [str(R)]
    assert snapshot(legacy) == legacy_before
    assert (tmp_path / "opt").is_dir()  # R's parent existed after adoption; not ours to judge: kept


async def test_uninstall_removes_exactly_what_install_created(tmp_path: Path) -> None:
    other = tmp_path / "opt" / "other-file"
    other.parent.mkdir(parents=True)
    other.write_text("not ours")
    before = snapshot(tmp_path)
    R = tmp_path / "opt" / "ua"
    host = installed_host(R)
    durable.atomic_write_bytes(host.slot_path("green"), GREEN_BYTES, 0o755)
    Path(host.layout.new_staging_path("green")).write_bytes(b"leftover")
    cleanup = _remover(host).remove(_entries_of(host))
    assert set(cleanup.removed) >= {host.layout.agent_dir, host.layout.bin_link, host.layout.lib_dir,
                                    host.layout.bin_dir, str(R)}
    assert cleanup.errors == [] and cleanup.kept == []
    assert snapshot(tmp_path) == before
    assert _remover(host).remove(_entries_of(host)).removed == []


async def test_uninstall_keeps_non_empty_dirs_and_foreign_files(tmp_path: Path) -> None:
    R = tmp_path / "R"
    host = installed_host(R)
    (R / "lib" / "other-agent").mkdir()
    cleanup = _remover(host).remove(_entries_of(host))
    assert any(k.startswith(f"{R / 'lib'}: kept") for k in cleanup.kept), cleanup
    assert (R / "lib" / "other-agent").is_dir()
    assert not (R / "bin").exists()
    assert not (R / "lib" / NAME).exists()


async def test_host_root_resolution_changes_nothing(tmp_path: Path) -> None:
    R = tmp_path / "R"
    host = AgentHost(str(R), NAME)
    assert Provisioner(host).host_root() == str(R)
    assert not R.exists()
    real = tmp_path / "data"
    real.mkdir()
    R.symlink_to("data")
    assert Provisioner(host).host_root() == str(real)


def test_from_config(tmp_path: Path) -> None:
    from agent.config.loader import parse_config

    cfg = parse_config(
        {"agent": {"name": NAME}, "host": {"root": str(tmp_path / "R"), "legacy_root": "/usr/local"},
         "limits": {"max_member_bytes": 7}, "mirrors": [{"path": "/m/{name}"}]},
        "/c.toml",
    )
    host = AgentHost.from_config(cfg)
    assert host.slot_path("green") == str(tmp_path / "R" / "lib" / NAME / f"{NAME}-green")
    assert host._mirrors == (Mirror(f"/m/{NAME}"),)
    assert host._max_member_bytes == 7


NOBODY = 65534


def _canary(tmp_path: Path) -> tuple[Path, tuple[int, bytes, int]]:
    """A root-only directory outside every tree, holding a file the attacks aim at."""
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    canary = outside / NAME
    canary.write_bytes(b"root's own file")
    return canary, (canary.stat().st_ino, canary.read_bytes(), len(os.listdir(outside)))


def _unchanged(canary: Path, before: tuple[int, bytes, int]) -> bool:
    return (canary.stat().st_ino, canary.read_bytes(), len(os.listdir(canary.parent))) == before


async def test_a_mirror_tree_of_another_uid_is_written_inside_it_only(tmp_path: Path) -> None:
    # A container's root owned by its user-namespaced uid: the copy lands in it, by rename, owned by root.
    tree = tmp_path / "machines" / "c1"
    (tree / "usr" / "bin").mkdir(parents=True)
    for d in (tree, tree / "usr", tree / "usr" / "bin"):
        os.chown(d, NOBODY, NOBODY)
    mirror = tree / "usr" / "bin" / NAME
    host = installed_host(tmp_path / "R", mirrors=[(str(mirror), str(tree))])
    sha = hashlib.sha256(BLUE_BYTES).hexdigest()
    host.check_mirrors()
    assert await host.sync_mirrors("blue", sha) == (str(mirror),)
    assert mirror.read_bytes() == BLUE_BYTES and mirror.stat().st_uid == 0


@pytest.mark.parametrize("where", ["usr", "usr/bin"])
async def test_a_symlink_planted_in_a_mirror_tree_is_refused_before_and_at_the_sync(
    tmp_path: Path, where: str
) -> None:
    # The tree's owner swaps a directory of it for a link to a root-only directory: nothing is followed.
    from upgrade_core.errors import HostRefusedError

    canary, before = _canary(tmp_path)
    tree = tmp_path / "machines" / "c1"
    (tree / "usr" / "bin").mkdir(parents=True)
    for d in (tree, tree / "usr", tree / "usr" / "bin"):
        os.chown(d, NOBODY, NOBODY)
    mirror = tree / "usr" / "bin" / NAME
    host = installed_host(tmp_path / "R", mirrors=[(str(mirror), str(tree))])
    planted = tree / where
    os.rename(planted, tree / "moved-away")
    os.symlink(canary.parent if where == "usr/bin" else tmp_path / "outside-usr", planted)
    if where == "usr":
        (tmp_path / "outside-usr").mkdir()
        os.symlink(canary.parent, tmp_path / "outside-usr" / "bin")
    os.lchown(planted, NOBODY, NOBODY)
    with pytest.raises(HostRefusedError, match="symlink"):
        host.check_mirrors()
    with pytest.raises(HostRefusedError, match="symlink"):
        await host.sync_mirrors("blue", hashlib.sha256(BLUE_BYTES).hexdigest())
    assert _unchanged(canary, before)


async def test_a_mirror_root_whose_ancestor_another_user_owns_is_refused(tmp_path: Path) -> None:
    from upgrade_core.errors import HostRefusedError

    shared = tmp_path / "shared"
    (shared / "tree").mkdir(parents=True)
    os.chown(shared, NOBODY, NOBODY)  # above the tree's root: the ancestor rule holds there
    mirror = shared / "tree" / NAME
    host = installed_host(tmp_path / "R", mirrors=[(str(mirror), str(shared / "tree"))])
    with pytest.raises(HostRefusedError, match=f"owned by uid {NOBODY}"):
        host.check_mirrors()
    assert not mirror.exists()


def test_a_layout_without_its_links_is_adoptable_from_its_slots(tmp_path: Path) -> None:
    """The seeds' EnsureDaemonBinaryLinks as install's adoption (docs/host.md): blue first, green only when
    blue holds no executable; the check of a bare host lets the two slots stand, and nothing else."""
    host = installed_host(tmp_path / "R")
    durable.atomic_write_bytes(host.slot_path("green"), GREEN_BYTES, 0o755)
    os.unlink(host.layout.current_link)
    os.unlink(host.layout.last_good_link)
    provision = Provisioner(host)
    assert provision.find_adoptable() == Adoption("slot", host.slot_path("blue"))
    Path(host.slot_path("blue")).write_bytes(b"")  # a crash's zero-length leftover (C12)
    assert provision.find_adoptable() == Adoption("slot", host.slot_path("green"))
    provision.check_bare(adopting_slot=True)
    with pytest.raises(LayoutConflictError, match="refusing to install over a partial layout"):
        provision.check_bare()
    Path(host.layout.agent_dir, "notes.txt").write_text("not ours")
    with pytest.raises(LayoutConflictError, match=r"notes\.txt"):
        provision.check_bare(adopting_slot=True)

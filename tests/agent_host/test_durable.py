"""agent.fs.durable: the C12 durability order, idempotent rewrites, EROFS-safe removal, conflicts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.fs import durable
from upgrade_core.errors import LayoutConflictError

from ._helpers import snapshot, syscall_spy


def test_atomic_write_order_is_write_fsync_rename_dirfsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.json"
    with syscall_spy(monkeypatch) as calls:
        assert durable.atomic_write_bytes(str(target), b"hello", 0o640) is True
    kinds = [c[0] for c in calls]
    assert kinds == ["write", "fsync", "rename", "fsync"], calls
    tmp = calls[0][1]
    assert os.path.dirname(tmp) == str(tmp_path) and os.path.basename(tmp).startswith(".f.json.tmp-")
    assert calls[1] == ("fsync", tmp)
    assert calls[2] == ("rename", tmp, str(target))
    assert calls[3] == ("fsync", str(tmp_path))
    assert target.read_bytes() == b"hello"
    assert oct(target.stat().st_mode & 0o777) == oct(0o640)
    assert sorted(os.listdir(tmp_path)) == ["f.json"]


def test_identical_rewrite_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    durable.atomic_write_bytes(str(target), b"same", 0o644)
    before = snapshot(tmp_path)
    with syscall_spy(monkeypatch) as calls:
        assert durable.atomic_write_bytes(str(target), b"same", 0o644) is False
    assert snapshot(tmp_path) == before  # same inode: not replaced
    assert not any(c[0] in ("write", "rename") for c in calls)
    assert durable.atomic_write_bytes(str(target), b"other", 0o644) is True
    assert target.read_bytes() == b"other"
    assert durable.atomic_write_bytes(str(target), b"other", 0o600) is True  # a mode change is a change


def test_atomic_write_refuses_a_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(LayoutConflictError, match="directory"):
        durable.atomic_write_bytes(str(tmp_path / "d"), b"x")
    assert snapshot(tmp_path) == before


def test_atomic_symlink_order_and_idempotence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    link = tmp_path / "a-current"
    with syscall_spy(monkeypatch) as calls:
        assert durable.atomic_symlink("a-blue", str(link)) is True
    assert [c[0] for c in calls] == ["symlink", "rename", "fsync"]
    assert calls[1] == ("rename", calls[0][1], str(link))
    assert calls[2] == ("fsync", str(tmp_path))
    assert os.readlink(link) == "a-blue"
    with syscall_spy(monkeypatch) as calls:
        assert durable.atomic_symlink("a-blue", str(link)) is False
    assert [c[0] for c in calls] == ["fsync"]
    assert durable.atomic_symlink("a-green", str(link)) is True
    assert os.readlink(link) == "a-green"
    assert sorted(os.listdir(tmp_path)) == ["a-current"]


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_atomic_symlink_refuses_a_real_file_or_directory(tmp_path: Path, kind: str) -> None:
    link = tmp_path / "a-current"
    if kind == "dir":
        link.mkdir()
        (link / "inside").write_text("keep")
    else:
        link.write_bytes(b"binary")
    before = snapshot(tmp_path)
    with pytest.raises(LayoutConflictError, match=f"a real {'directory' if kind == 'dir' else 'file'}"):
        durable.atomic_symlink("a-blue", str(link))
    assert snapshot(tmp_path) == before


def test_remove_if_present(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    assert durable.remove_if_present(str(f)) is True
    assert not f.exists()
    assert durable.remove_if_present(str(f)) is False
    assert durable.remove_if_present(str(tmp_path / "no" / "such")) is False
    dangling = tmp_path / "l"
    dangling.symlink_to("nowhere")
    assert durable.remove_if_present(str(dangling)) is True
    assert not os.path.lexists(dangling)
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError):
        durable.remove_if_present(str(tmp_path / "d"))
    assert (tmp_path / "d").is_dir()


def test_copy_file_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"\x7fELF" + os.urandom(3 << 20))
    import hashlib

    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    with syscall_spy(monkeypatch) as calls:
        assert durable.copy_file_durable(str(src), str(dst), 0o755, expected_sha256=sha) is True
    kinds = [c[0] for c in calls]
    assert kinds[-3:] == ["fsync", "rename", "fsync"] and set(kinds[:-3]) == {"write"}
    assert dst.read_bytes() == src.read_bytes() and dst.stat().st_mode & 0o777 == 0o755
    before = snapshot(tmp_path)
    assert durable.copy_file_durable(str(src), str(dst), 0o755) is False
    assert snapshot(tmp_path) == before
    with pytest.raises(ValueError, match="differs from the expected"):
        durable.copy_file_durable(str(src), str(tmp_path / "other"), 0o755, expected_sha256="0" * 64)
    assert not (tmp_path / "other").exists()
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]


def test_make_dirs_modes(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        created = durable.make_dirs(str(tmp_path / "a" / "b" / "state"), 0o755, leaf_mode=0o700)
    finally:
        os.umask(old)
    assert created == [str(tmp_path / "a"), str(tmp_path / "a" / "b"), str(tmp_path / "a" / "b" / "state")]
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "a" / "b" / "state").stat().st_mode & 0o777 == 0o700
    assert durable.make_dirs(str(tmp_path / "a" / "b" / "state")) == []

"""Shared helpers of the host-side tests: a real layout in tmp_path, tree snapshots, a syscall-order spy."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.fs import durable
from agent.host.adapter import AgentHost
from agent.host.provision import Provisioner

NAME = "demo-agent"
BLUE_BYTES = b"#!/bin/sh\necho demo-agent v1.0.0\n"
GREEN_BYTES = b"#!/bin/sh\necho demo-agent v2.0.0\n"


def installed_host(root: Path, **kwargs: Any) -> AgentHost:
    """A host root with blue installed and ``current``/``last-good`` naming blue, built with our own API."""
    host = AgentHost(str(root), NAME, **kwargs)
    Provisioner(host).create_layout_dirs()
    durable.atomic_write_bytes(host.slot_path("blue"), BLUE_BYTES, 0o755)
    durable.atomic_symlink(f"{NAME}-blue", host.layout.current_link)
    durable.atomic_symlink(f"{NAME}-blue", host.layout.last_good_link)
    Provisioner(host).ensure_compat_link()
    return host


def snapshot(root: Path) -> dict[str, tuple[str, Any]]:
    """Every path under ``root`` (not following links) -> (kind, content/target/mode)."""
    out: dict[str, tuple[str, Any]] = {}
    if not os.path.lexists(root):
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", (stat.S_IMODE(st.st_mode), Path(p).read_bytes(), st.st_ino))
    return out


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@contextmanager
def syscall_spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, ...]]]:
    """Record write/fsync/rename/symlink calls (paths, not fds) while still calling the real functions."""
    calls: list[tuple[str, ...]] = []
    real_fsync, real_rename, real_symlink, real_write = os.fsync, os.rename, os.symlink, os.write

    def fsync(fd: int) -> None:
        calls.append(("fsync", _fd_path(fd)))
        real_fsync(fd)

    def rename(src: str, dst: str, *a: Any, **k: Any) -> None:
        # Relative to a directory descriptor (design §10: files under state_dir are reached through one).
        def at(p: str, fd: int | None) -> str:
            return os.fspath(p) if fd is None else os.path.join(_fd_path(fd), os.fspath(p))

        calls.append(("rename", at(src, k.get("src_dir_fd")), at(dst, k.get("dst_dir_fd"))))
        real_rename(src, dst, *a, **k)

    def symlink(target: str, path: str, *a: Any, **k: Any) -> None:
        fd = k.get("dir_fd")
        where = os.fspath(path) if fd is None else os.path.join(_fd_path(fd), os.fspath(path))
        calls.append(("symlink", where))
        real_symlink(target, path, *a, **k)

    def write(fd: int, data: Any) -> int:
        calls.append(("write", _fd_path(fd)))
        return real_write(fd, data)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "symlink", symlink)
    monkeypatch.setattr(os, "write", write)
    try:
        yield calls
    finally:
        monkeypatch.undo()

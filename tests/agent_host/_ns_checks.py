"""Checks that need real mounts, run by test_mounts.py in a child re-exec'd under ``unshare -m``.

Usage: ``unshare -m --propagation private python -m tests.agent_host._ns_checks CHECK DIR``. Every mount
made here dies with the child's private mount namespace, so nothing leaks into the host's mount table.
Each check prints one JSON object of observations; the assertions live in test_mounts.py.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from agent.fs import durable
from agent.host.adapter import AgentHost
from agent.host.install_record import Entry, Remover
from agent.host.provision import Provisioner
from upgrade_core.errors import UpgradeError

from ._helpers import NAME, installed_host


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def outcome(fn: Callable[[], Any]) -> Any:
    try:
        return {"ok": fn()}
    except UpgradeError as e:
        return {"error": type(e).__name__, "message": str(e)}
    except OSError as e:
        return {"oserror": errno.errorcode.get(e.errno or 0, str(e.errno))}


def check_ro_rescue_view(d: Path) -> dict[str, Any]:
    """The host root seen read-only somewhere else (a rescue view): links resolve, removals are safe."""
    view = d / "rescue" / "opt" / "ua"
    view.mkdir(parents=True)
    sh("mount", "--bind", str(d / "R"), str(view))
    sh("mount", "-o", "remount,bind,ro", str(view))
    host = AgentHost(str(view), NAME)
    missing = str(view / "lib" / NAME / "no-such-file")
    raw_unlink = outcome(lambda: os.unlink(missing))
    stage_leftover = str(view / "lib" / NAME / f".{NAME}-green.stage-00")
    return {
        "raw_unlink_of_missing": raw_unlink,
        "links": outcome(lambda: str(host.links())),
        "current_resolves_to": os.path.realpath(host.current_link_path()),
        "bin_resolves_to": os.path.realpath(view / "bin" / NAME),
        "remove_missing": outcome(lambda: durable.remove_if_present(missing)),
        "remove_existing": outcome(lambda: durable.remove_if_present(host.slot_path("blue"))),
        "discard_missing_staging": outcome(lambda: anyio.run(host.discard_staging, stage_leftover)),
        "sweep": outcome(lambda: anyio.run(host.sweep_staging)),
        "sha": outcome(lambda: anyio.run(host.slot_sha256, "blue")),
        "prepare_staging": outcome(lambda: anyio.run(host.prepare_staging, "green")),
    }


def check_ro_usr(d: Path) -> dict[str, Any]:
    """A read-only fake ``/usr`` holding a legacy layout under ``usr/local``: adopted through an R link."""
    usr = d / "usr"
    sh("mount", "--bind", str(usr), str(usr))
    sh("mount", "-o", "remount,bind,ro", str(usr))
    host = AgentHost(str(d / "opt" / "ua"), NAME, legacy_root=str(usr / "local"), protected_prefix=str(usr))
    adopted = outcome(lambda: str(Provisioner(host).adopt()))
    binary_host = AgentHost(str(d / "opt2" / "ua"), NAME, legacy_root=str(d / "usr2" / "local"),
                            protected_prefix=str(usr))
    return {
        "adopt": adopted,
        "r_link": os.readlink(d / "opt" / "ua"),
        "links": outcome(lambda: str(host.links())),
        "prepare_staging": outcome(lambda: anyio.run(host.prepare_staging, "blue")),
        "point_current": outcome(lambda: anyio.run(host.point_current, "blue")),
        "remove_layout": outcome(lambda: Remover(host.layout, "/nonexistent", host.legacy_root).remove(
            [Entry("link", str(d / "opt" / "ua"))]).removed),
        "r_exists_after": os.path.lexists(d / "opt" / "ua"),
        "binary_adopt": outcome(lambda: str(Provisioner(binary_host).adopt())),
    }


def check_small_tmpfs(d: Path) -> dict[str, Any]:
    """A 1 MiB tmpfs as host root: the member limit exceeds free space -> NoSpaceError before any write."""
    root = d / "R"
    root.mkdir()
    sh("mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(root))
    installed_host(root)
    agent_dir = root / "lib" / NAME
    leftover = agent_dir / f".{NAME}-green.stage-1f"
    leftover.write_bytes(b"\0" * 4096)
    before = sorted(os.listdir(agent_dir))
    big = AgentHost(str(root), NAME, max_member_bytes=2 << 20)
    refused = outcome(lambda: anyio.run(big.prepare_staging, "green"))
    after_refusal = sorted(os.listdir(agent_dir))
    swept = outcome(lambda: anyio.run(big.sweep_staging))
    small = AgentHost(str(root), NAME, max_member_bytes=64 << 10)
    fits = outcome(lambda: anyio.run(small.prepare_staging, "green"))
    return {
        "refused": refused,
        "unchanged_by_refusal": before == after_refusal,
        "swept": swept,
        "after_sweep": sorted(os.listdir(agent_dir)),
        "fits": fits,
        "fits_created": os.path.lexists(fits.get("ok", "/nonexistent")),
    }


def check_noexec(d: Path) -> dict[str, Any]:
    """A host root on a ``noexec`` mount is refused before staging."""
    root = d / "R"
    root.mkdir()
    sh("mount", "-t", "tmpfs", "-o", "size=4m,noexec,mode=0755", "tmpfs", str(root))
    installed_host(root)
    host = AgentHost(str(root), NAME, max_member_bytes=1024)
    return {"prepare_staging": outcome(lambda: anyio.run(host.prepare_staging, "green"))}


CHECKS = {
    "ro_rescue_view": check_ro_rescue_view,
    "ro_usr": check_ro_usr,
    "small_tmpfs": check_small_tmpfs,
    "noexec": check_noexec,
}

if __name__ == "__main__":
    print(json.dumps(CHECKS[sys.argv[1]](Path(sys.argv[2]))))

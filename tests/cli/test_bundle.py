"""The self-contained runtime (docs/install.md): it runs where no Python is installed, from wherever it
is unpacked.

"No Python": each run is in a private mount namespace (``unshare -m``) where every Python on this machine is
made unreachable (the distribution's ``/usr/lib/python3*`` and ``libpython``, ``/usr/bin/python3*``,
``/usr/local``'s, pyenv's tree and this checkout's ``.venv`` covered by empty read-only tmpfs or
``/dev/null``), with an empty environment (``env -i PATH=``): no ``PYTHONHOME``, no ``PYTHONPATH``, no
``PATH``. The namespace first proves that ``python3`` no longer starts. Root only (``unshare``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bundle import REPO

RUN_TIMEOUT_S = 60.0

_HIDE = r"""
set -eu
for d in /usr/lib/python3* /usr/local/lib/python3* /root/.pyenv "$VENV" "$BASE_PREFIX"; do
    if [ -d "$d" ]; then mount -t tmpfs -o ro,size=4k tmpfs "$d"; fi
done
for f in /usr/bin/python3* /usr/local/bin/python3* /usr/lib/*-linux-gnu/libpython3*; do
    if [ -f "$f" ]; then mount --bind /dev/null "$f"; fi
done
if /usr/bin/python3 -c pass 2>/dev/null || "$VENV/bin/python" -c pass 2>/dev/null; then
    echo "python is still reachable" >&2
    exit 99
fi
exec env -i PATH= "$@"
"""


def _without_python(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` where no Python is reachable (see the module docstring)."""
    if os.geteuid() != 0:
        pytest.skip("hiding Python needs a mount namespace (root)")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "VENV": sys.prefix,
           "BASE_PREFIX": sys.base_prefix}
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", _HIDE, "hide-python", *argv], cwd=cwd,
        env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )


def _config(tmp_path: Path, name: str = "bundle-agent") -> Path:
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f'[agent]\nname = "{name}"\n[host]\nroot = "{tmp_path}/root"\nstate_dir = "{tmp_path}/state"\n'
        f'lock_path = "{tmp_path}/run/{name}.lock"\nunit_dir = "{tmp_path}/units"\n'
    )
    return config


def test_version_and_a_noop_boot_recovery_without_any_python(runtime_bundle: Path, tmp_path: Path) -> None:
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    done = _without_python([str(runtime_bundle / "upgrade-agent"), "--version", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"version": version}

    config = _config(tmp_path)
    recover = str(runtime_bundle / "recover-agent-upgrade")
    done = _without_python([recover, "--config", str(config), "--json", "--trigger", "boot"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"operation": None, "result": "noop", "from_version": None,
                                       "to_version": None, "slot": None, "reason": None}
    # the units it would write name the bundle's own recover-agent-upgrade (it sits beside the program)
    tool = str(runtime_bundle / "upgrade-agent")
    done = _without_python([tool, "--config", str(config), "--json", "units"], tmp_path)
    assert done.returncode == 0, done.stderr
    text = json.loads(done.stdout)["units"]["bundle-agent-recover-boot.service"]
    assert f"ExecStart={recover} --config {config} --trigger boot" in text


def test_a_bad_config_is_one_line_and_exit_2_without_python(runtime_bundle: Path, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[agent]\nname = "Bad Name"\n')
    tool = str(runtime_bundle / "upgrade-agent")
    done = _without_python([tool, "--config", str(config), "status"], tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "agent.name" in done.stderr


def test_it_runs_after_being_moved_and_references_nothing_of_the_build(
    runtime_bundle: Path, tmp_path: Path
) -> None:
    moved = tmp_path / "elsewhere" / "runtime"
    shutil.copytree(runtime_bundle, moved, symlinks=True)
    done = _without_python([str(moved / "agent-upgrade"), "--help"], tmp_path)
    assert done.returncode == 0 and "--archive" in done.stdout, done.stderr
    # no shared object is looked up in the build's Python, the venv or the checkout, and none is missing
    forbidden = (str(REPO), "/root/.pyenv", sys.base_prefix + "/", "/usr/lib/python3")
    elves = [moved / "upgrade-agent", *(p for p in (moved / "_internal").rglob("*.so*") if p.is_file())]
    for elf in elves:
        ldd = subprocess.run(["ldd", str(elf)], capture_output=True, text=True, timeout=30, check=False)
        out = ldd.stdout
        assert "not found" not in out, (elf, out)
        for line in out.splitlines():
            target = line.split("=>", 1)[1] if "=>" in line else ""
            assert not any(bad in target for bad in forbidden), (elf, line)
    assert not any(p.is_symlink() and os.path.isabs(os.readlink(p)) for p in moved.rglob("*"))


def test_the_archive_comes_with_its_sha256_and_ships_the_man_page(runtime_bundle: Path) -> None:
    """``make bundle`` writes ``<archive>.sha256`` (what ``ignition --runtime-sha256`` takes) and prints it;
    the bundle carries the man page and completions generated from the parser."""
    import hashlib

    from tests.bundle import runtime_archive

    archive = runtime_archive()  # the session's build, from the cache
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    assert archive.with_name(archive.name + ".sha256").read_text() == f"{digest}  {archive.name}\n"
    for shipped in ("share/man/man1/upgrade-agent.1", "share/bash-completion/completions/upgrade-agent",
                    "share/zsh/site-functions/_upgrade-agent"):
        assert (runtime_bundle / shipped).is_file(), shipped


UNUSED_AT_RUN_TIME = ("multiprocessing", "pkgutil", "click", "pygments", "markdown_it", "h2", "urllib3",
                      "trio", "_pytest", "pytest", "setuptools", "kubernetes_asyncio")
"""Packages nothing in the runtime uses (scripts/build_bundle.py says why each is left out)."""


def test_a_start_runs_only_the_needed_runtime_hooks_and_no_unused_package_is_archived(
    runtime_bundle: Path
) -> None:
    """Start-up cost (design §9 ``recover.noop.bundle``): the frozen program runs every runtime hook its
    archive holds and reads the table of contents of every archived module at each start; a bundled
    ``multiprocessing`` or ``pkgutil`` brings a hook that imports it. Read with PyInstaller's own archive
    reader."""
    from PyInstaller.archive.readers import pkg_archive_contents

    contents = pkg_archive_contents(str(runtime_bundle / "upgrade-agent"))
    assert sorted(n for n in contents if n.startswith("pyi_rth_")) == [
        "pyi_rth_cryptography_openssl", "pyi_rth_inspect"]
    assert sorted({n.split(".")[0] for n in contents} & set(UNUSED_AT_RUN_TIME)) == []
    assert {"agent.cli.frozen", "httpx", "rich.progress", "cryptography"} <= set(contents)

"""The real ``ignition`` binary (docs/ignition.md; Debian's 2.14, ``-platform file``, driven by
``tests/ignition.py``) applies what ``upgrade-agent ignition`` rendered to a sysroot in the test's own
directory, fetching the runtime and the release from a loopback server and verifying their sha256. What the
sysroot then does when it boots is ``tests/systemd/test_first_boot.py``.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

from agent.session.ignition import all_paths
from agent.testing.releases import ReleaseServer, build_release, sha256_file

from ..ignition import Ignition, assert_only_relabel_failed
from ._rig import run_cli, snapshot

SYSTEMCTL_TIMEOUT_S = 30
NAME = "demo-agent"
TOML = f'[agent]\nname = "{NAME}"\nexec_args = ["serve"]\n'


def _runtime_archive(path: Path) -> Path:
    """A tar.gz shaped as ``make bundle`` builds the runtime: the two entry points in one top directory."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for exe in ("upgrade-agent", "recover-agent-upgrade"):
            data = f"#!/bin/sh\necho {exe}\n".encode()
            member = tarfile.TarInfo(f"upgrade-core-runtime/{exe}")
            member.size, member.mode, member.mtime = len(data), 0o755, 1_700_000_000
            tar.addfile(member, io.BytesIO(data))
    path.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
    return path


class _Rig:
    """A sysroot with a ``/usr`` of its own, a served directory, and the Ignition that provisions it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.sysroot = base / "sysroot"
        for rel, text in (("usr/bin/true-ish", "#!/bin/sh\n"), ("usr/lib/os-release", "ID=flatcar\n")):
            (self.sysroot / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.sysroot / rel).write_text(text)
        (self.sysroot / "etc").mkdir()
        self.served = base / "srv"
        self.release = build_release(self.served, "1.0.0", name=NAME)
        self.runtime = _runtime_archive(self.served / "upgrade-agent-runtime.tar.gz")
        self.config_file = base / "etc" / f"{NAME}.toml"
        self.config_file.parent.mkdir()
        self.config_file.write_text(TOML)
        self.ign = base / "config.ign"
        self.ignition = Ignition(base, self.sysroot, self.ign)

    def render(self, server: ReleaseServer, runtime_sha256: str | None = None) -> dict:
        run = run_cli(["--config", str(self.config_file), "ignition",
                       "--archive", server.url(self.release), "--sha256", sha256_file(self.release),
                       "--runtime", server.url(self.runtime),
                       "--runtime-sha256", runtime_sha256 or sha256_file(self.runtime)])
        assert run.code == 0, run.stderr
        self.ign.write_text(run.stdout)
        return json.loads(run.stdout)

    def at(self, path: str) -> Path:
        return self.sysroot / path.lstrip("/")


def test_ignition_writes_the_config_into_a_sysroot_and_nothing_under_usr(tmp_path: Path) -> None:
    rig = _Rig(tmp_path)
    usr_before = snapshot(rig.sysroot / "usr")
    before = set(snapshot(rig.sysroot))
    server = ReleaseServer.start(rig.served)
    try:
        config = rig.render(server)
        files = rig.ignition.apply()
    finally:
        server.close()
    assert_only_relabel_failed(files)
    assert sorted(server.requests) == sorted(["/" + rig.release.name, "/" + rig.runtime.name])

    # the files, with their bytes and modes
    expected = {
        f"/etc/upgrade-agent/{NAME}.toml": (TOML.encode(), 0o600),  # it may hold credentials
        "/opt/upgrade-agent/bootstrap/runtime.tar.gz": (rig.runtime.read_bytes(), 0o600),
        "/opt/upgrade-agent/bootstrap/release.archive": (rig.release.read_bytes(), 0o600),
    }
    for path, (data, mode) in expected.items():
        st = rig.at(path).lstat()
        assert rig.at(path).read_bytes() == data, path
        assert (st.st_mode & 0o7777) == mode, (path, oct(st.st_mode))
    assert (rig.at("/opt/upgrade-agent/runtime").lstat().st_mode & 0o7777) == 0o755
    # the units, as rendered, in the sysroot's /etc/systemd/system; enablement as presets
    unit_dir = rig.at("/etc/systemd/system")
    for unit in config["systemd"]["units"]:
        assert (unit_dir / unit["name"]).read_text() == unit["contents"]
    preset = rig.at("/etc/systemd/system-preset/20-ignition.preset").read_text().splitlines()
    assert sorted(preset) == sorted(
        f"{'enable' if u['enabled'] else 'disable'} {u['name']}" for u in config["systemd"]["units"]
    )
    # what systemd does with those presets on the first boot, run by the real systemctl on the sysroot only
    done = subprocess.run(["systemctl", f"--root={rig.sysroot}", "preset-all"], capture_output=True,
                          text=True, timeout=SYSTEMCTL_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    links = {str(p.relative_to(unit_dir)): os.readlink(p) for p in unit_dir.rglob("*") if p.is_symlink()}
    assert links == {f"multi-user.target.wants/{NAME}-bootstrap.service":
                     f"/etc/systemd/system/{NAME}-bootstrap.service"}
    # nothing under /usr: the config names no such path, and the sysroot's /usr is unchanged
    assert not [p for p in all_paths(config) if p == "/usr" or p.startswith("/usr/")]
    assert snapshot(rig.sysroot / "usr") == usr_before
    new = set(snapshot(rig.sysroot)) - before
    assert new and not [p for p in new if p == "usr" or p.startswith("usr/")]


def test_a_runtime_whose_digest_does_not_match_is_not_written(tmp_path: Path) -> None:
    rig = _Rig(tmp_path)
    server = ReleaseServer.start(rig.served)
    try:
        rig.render(server, runtime_sha256="0" * 64)
        files = rig.ignition.apply()
    finally:
        server.close()
    assert files.returncode == 1, files.stdout
    assert "hash verification failed" in files.stdout, files.stdout
    assert not rig.at("/opt/upgrade-agent/bootstrap/runtime.tar.gz").exists()
    assert not rig.at(f"/etc/systemd/system/{NAME}-bootstrap.service").exists()

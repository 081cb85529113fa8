"""Debian's real ``ignition`` (2.14, ``-platform file``) applied to a sysroot in a test's own directory: the
shared steps of ``tests/cli/test_ignition_apply.py`` and ``tests/systemd/test_first_boot.py``.

Everything Ignition would put in ``/run`` (config cache, state file, neednet flag) and its system config
directory are redirected into the caller's directory by flags and ``IGNITION_SYSTEM_CONFIG_DIR``; ``-root`` is
the sysroot, so nothing outside it is written. Every stage has a timeout.

Debian builds Ignition with SELinux relabeling on, so the ``files`` stage's very last step (after every file,
unit, preset and its result file are written) fails on a sysroot without ``/etc/selinux/config``;
:func:`assert_only_relabel_failed` checks that this is the one and only failure, rather than installing
SELinux tools on this machine (``policycoreutils`` would add boot-time units to the host itself).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

IGNITION = "/usr/lib/dracut/modules.d/30ignition/ignition"
STAGE_TIMEOUT_S = 60
RELABEL_FAILURE = (
    "CRITICAL : Ignition failed: failed to handle relabeling: failed to open /etc/selinux/config: "
)


class Ignition:
    """One provisioning of ``sysroot`` from the config file ``config`` (Ignition's own state in ``base``).

    Raises (at construction):
        pytest.fail: the ``ignition`` binary is missing (``scripts/bootstrap.sh`` installs it).
    """

    def __init__(self, base: Path, sysroot: Path, config: Path) -> None:
        if not os.access(IGNITION, os.X_OK):
            pytest.fail(f"{IGNITION} missing: run scripts/bootstrap.sh (apt-get install ignition)")
        self.base, self.sysroot, self.config = base, sysroot, config
        self.run_dir = base / "ignition-run"
        self.run_dir.mkdir()
        self.system_config = base / "ignition-system-config"  # Ignition's base configs: none
        self.system_config.mkdir()

    def stage(self, stage: str) -> subprocess.CompletedProcess[str]:
        """Run one stage (``fetch-offline``, ``fetch``, ``files``...); its completed process."""
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "IGNITION_CONFIG_FILE": str(self.config),
               "IGNITION_SYSTEM_CONFIG_DIR": str(self.system_config)}
        return subprocess.run(
            [IGNITION, "-platform", "file", "-stage", stage, "-root", str(self.sysroot),
             "-config-cache", str(self.run_dir / "ignition.json"), "-state-file", str(self.run_dir / "state"),
             "-neednet", str(self.run_dir / "neednet"), "-fetch-timeout", "10s", "-log-to-stdout"],
            env=env, capture_output=True, text=True, timeout=STAGE_TIMEOUT_S, check=False, cwd=self.base,
        )

    def apply(self) -> subprocess.CompletedProcess[str]:
        """``fetch-offline`` (which must ask for the network: the archives are remote), ``fetch``, then
        ``files``; the ``files`` stage's completed process (see :func:`assert_only_relabel_failed`)."""
        offline = self.stage("fetch-offline")
        assert offline.returncode == 0, offline.stdout + offline.stderr
        assert (self.run_dir / "neednet").exists()
        fetch = self.stage("fetch")
        assert fetch.returncode == 0, fetch.stdout + fetch.stderr
        return self.stage("files")


def assert_only_relabel_failed(files: subprocess.CompletedProcess[str]) -> None:
    """The ``files`` stage wrote everything and failed only at its SELinux relabeling (module docstring)."""
    critical = [line for line in files.stdout.splitlines() if line.startswith("CRITICAL")]
    assert files.returncode == 1 and len(critical) == 1, files.stdout + files.stderr
    assert critical[0].startswith(RELABEL_FAILURE), critical

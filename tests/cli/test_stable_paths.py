"""``install`` refuses to write units that run the tool from a temporary or per-user place (docs/install.md,
:mod:`agent.systemd.stable_paths`): exit 2, one line naming the path and the fix, the host byte-identical;
the flag ``--allow-unstable-paths`` (or the environment variable the suite sets, ``tests/conftest.py``)
lets it by. The rule is the session's, so an embedding program gets it too.

Here the CLI runs from this checkout's ``.venv``, whose ``recover-agent-upgrade`` is inside a git checkout:
exactly the installation the refusal is for.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from agent.errors import UsageError
from agent.session.session import Session
from agent.systemd.stable_paths import ALLOW_ENV, _interpreter, unstable_reason

from ._rig import REPO, SUBPROCESS_TIMEOUT_S, Rig, snapshot, version_script


def _install(rig: Rig, binary: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (ALLOW_ENV, "UPGRADE_AGENT_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", "--config", str(rig.config), "install", "--archive", str(binary),
         *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=False,
    )


def test_install_from_a_checkout_venv_is_refused_with_one_line(rig: Rig, tmp_path: Path) -> None:
    binary = tmp_path / "plain-binary"
    binary.write_bytes(version_script("1.0.0"))
    binary.chmod(0o755)
    before = snapshot(tmp_path)
    done = _install(rig, binary)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    exe = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "recover-agent-upgrade")
    assert exe in lines[0]
    assert "--allow-unstable-paths" in lines[0] and "make install" in lines[0]
    assert snapshot(tmp_path) == before  # no lock file, no state dir, no unit


def test_the_flag_lets_it_by(rig: Rig, tmp_path: Path) -> None:
    """With the flag the refusal is gone: the install goes on to the host (and here fails later, on
    systemctl_prefix = /bin/false, with the ordinary clean-up), never the stable-path line."""
    binary = tmp_path / "plain-binary"
    binary.write_bytes(version_script("1.0.0"))
    binary.chmod(0o755)
    done = _install(rig, binary, "--allow-unstable-paths")
    assert "refusing to write units" not in done.stderr
    assert (rig.state_dir / "journal").is_dir()  # it got past the check and journaled an episode


def test_paths_that_are_and_are_not_stable(tmp_path: Path) -> None:
    assert unstable_reason("/opt/upgrade-core/bin/recover-agent-upgrade") is None
    assert unstable_reason("/opt/upgrade-agent/upgrade-core-runtime/recover-agent-upgrade") is None
    for path, word in (
        ("/tmp/x/bin/recover-agent-upgrade", "/tmp"),
        ("/var/tmp/recover-agent-upgrade", "/var/tmp"),
        ("/dev/shm/recover-agent-upgrade", "/dev/shm"),
        ("/run/user/1000/recover-agent-upgrade", "/run/user"),
        ("/home/alice/.local/bin/recover-agent-upgrade", "/home"),
        ("/root/venv/bin/recover-agent-upgrade", "/root"),
    ):
        why = unstable_reason(path)
        assert why is not None and word in why, (path, why)
    # This checkout's own .venv: inside a git checkout; a checkout that itself lies under /tmp or a home
    # directory (a CI clone, a developer's clone) is named by that rule, which comes first.
    repo_exe = str(REPO / ".venv" / "bin" / "recover-agent-upgrade")
    why = unstable_reason(repo_exe)
    assert why is not None, repo_exe
    assert "git checkout" in why or any(p in why for p in ("/tmp", "/var/tmp", "/home", "/root")), why
    # "/tmpfoo" is not under /tmp
    assert unstable_reason("/tmpfoo/bin/recover-agent-upgrade") is None


def test_a_script_names_its_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "recover-agent-upgrade"
    script.write_text(f"#!{REPO}/.venv/bin/python3 -I\nprint('x')\n")
    assert _interpreter(str(script)) == f"{REPO}/.venv/bin/python3"
    (tmp_path / "env").write_text("#!/usr/bin/env python3\n")
    assert _interpreter(str(tmp_path / "env")) is None
    (tmp_path / "elf").write_bytes(b"\x7fELF\x02\x01")
    assert _interpreter(str(tmp_path / "elf")) is None


def test_a_fifo_or_device_in_the_executable_place_is_never_read_or_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "recover-agent-upgrade"
    os.mkfifo(fifo)  # no writer: a blocking open would hang the install here
    assert _interpreter(str(fifo)) is None
    assert _interpreter("/dev/zero") is None
    (tmp_path / "link").symlink_to(fifo)
    assert _interpreter(str(tmp_path / "link")) is None


def test_an_embedder_gets_the_same_refusal(rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule is the session's, not the command's: ``Session.install`` from an embedding program refuses
    the same way (UsageError, exit 2), before the lock and before anything is written."""
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    binary = tmp_path / "plain-binary"
    binary.write_bytes(version_script("1.0.0"))
    binary.chmod(0o755)
    before = snapshot(tmp_path)
    session = Session.load(str(rig.config))
    request = session.request(str(binary))
    with pytest.raises(UsageError, match="--allow-unstable-paths") as refused:
        anyio.run(lambda: session.install(request))
    assert refused.value.exit_code == 2
    assert snapshot(tmp_path) == before

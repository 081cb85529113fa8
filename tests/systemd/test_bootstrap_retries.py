"""The first-boot install unit (``NAME-bootstrap.service``, docs/ignition.md) retries within the boot.

The unit is the one :func:`agent.systemd.units.render_bootstrap_unit` renders, run by the private systemd:
it unpacks a runtime archive (here a launcher of this checkout's ``upgrade-agent``, instead of the
``make bundle`` runtime that ``tests/systemd/test_first_boot.py`` boots) and installs a signed release from
the local archive. The configuration trusts a root key whose keyring is served over loopback HTTP, and that
server does not answer at first (nothing listens on its port): each install fails, and systemd runs the
unit again (``Restart=on-failure``, no start limit). Once the server answers, the next run installs, writes
the marker and disables the unit, all within the one boot. The test shortens ``RestartSec=`` with a drop-in
(systemd configuration, as an administrator would); every wait is bounded.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import shutil
import sys
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.systemd.units import bootstrap_unit_name, render_bootstrap_unit
from agent.testing.releases import sha256_file
from agent.testing.sandbox import free_port
from tests.cli.test_signed_releases import keypair, publish_keyring, sign

from . import agent_env
from .agent_env import WORKTREE, AgentEnv, poll

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server

LAUNCHER = f"""#!/bin/sh
export PYTHONPATH={WORKTREE} UPGRADE_AGENT_ALLOW_UNSTABLE_PATHS=1
exec {sys.executable} -m agent.cli.main "$@"
"""


def runtime_archive(path: Path) -> Path:
    """A runtime tar.gz shaped as ``make bundle`` builds it: one top directory holding ``upgrade-agent``."""
    data = LAUNCHER.encode()
    member = tarfile.TarInfo("upgrade-core-runtime/upgrade-agent")
    member.size, member.mode = len(data), 0o755
    top = tarfile.TarInfo("upgrade-core-runtime")
    top.type, top.mode = tarfile.DIRTYPE, 0o755
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        tar.addfile(top)
        tar.addfile(member, io.BytesIO(data))
    path.write_bytes(gzip.compress(raw.getvalue()))
    return path


def test_the_first_boot_unit_retries_until_the_release_server_answers(
    make_env: Callable[..., AgentEnv], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    served = tmp_path / "served"
    keys.mkdir()
    served.mkdir()
    root_sec, root_pub = keypair(keys, "root")
    sec, pub = keypair(keys, "publisher")
    port = free_port()  # nothing listens here until the server starts
    # one download attempt per run: the retries under test are systemd's (the unit's Restart=), not the
    # download's own ([download] retry_deadline_s, which would otherwise wait out the refused port itself)
    trust = (f'[trust]\nroot_keys = ["{root_pub}"]\n'
             f'keyring = "http://127.0.0.1:{port}/keyring.json"\n\n[download]\nretry_deadline_s = 0\n')
    env = make_env(inside=True, extra_config=trust)
    rel = env.release("1.0.0")
    sign(sec, rel.path, f"name={env.name} version=1.0.0 security_version=1")
    ring = publish_keyring(keys, root_sec, 1, [(pub, "2099-01-01T00:00:00Z")], [])
    shutil.copy(ring, served / "keyring.json")
    shutil.copy(f"{ring}.minisig", served / "keyring.json.minisig")

    boot = tmp_path / "bootstrap"
    boot.mkdir()
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir()
    marker = boot / "done"
    unit = bootstrap_unit_name(env.name)
    text = render_bootstrap_unit(
        name=env.name, runtime_archive=str(runtime_archive(boot / "runtime.tar.gz")),
        runtime_dir=str(runtime_dir), upgrade_exe=str(runtime_dir / "upgrade-agent"),
        config_path=str(env.config), release_archive=str(rel.path), sha256=sha256_file(rel.path),
        signature=f"{rel.path}.minisig", marker=str(marker),
    )
    unit_dir = env.sandbox.unit_dir
    (unit_dir / unit).write_text(text)
    drop_in = unit_dir / f"{unit}.d"
    drop_in.mkdir()
    (drop_in / "fast.conf").write_text("[Service]\nRestartSec=200ms\n")
    server: http.server.ThreadingHTTPServer | None = None
    try:
        env.sandbox.run("systemctl", "daemon-reload")
        env.sandbox.run("systemctl", "enable", "--quiet", unit)
        env.sandbox.run("systemctl", "start", "--no-block", unit)

        def restarts() -> int:
            return int(env.show(unit, "NRestarts")["NRestarts"] or 0)

        poll(lambda: restarts() >= 2, 60.0, "two failed first-boot runs restarted by systemd")
        assert not marker.exists() and not env.lib.exists()
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

        poll(marker.exists, 90.0, "the first-boot install to succeed once the server answers")
        # (NRestarts is not read again: the unit's own last step, `systemctl disable`, reloads the manager,
        # which may reset the counter; the two failed runs above are the retries' evidence)
        poll(lambda: env.show(unit, "ActiveState")["ActiveState"] == "inactive", 30.0, "the unit to finish")
        state = env.show(unit, "Result", "NRestarts")
        assert state["Result"] == "success", state
        enabled = env.sandbox.run("systemctl", "is-enabled", unit, check=False).stdout.strip()
        assert enabled == "disabled", enabled  # its last step
        assert env.link("current") == env.link("last-good") == f"{env.name}-blue"
        env.assert_running("blue", rel)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        env.sandbox.run("systemctl", "stop", unit, check=False)
        env.sandbox.run("systemctl", "disable", "--quiet", unit, check=False)
        shutil.rmtree(drop_in, ignore_errors=True)
        (unit_dir / unit).unlink(missing_ok=True)
        env.sandbox.run("systemctl", "daemon-reload", check=False)

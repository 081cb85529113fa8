"""``make demo``: the main job end to end on its embedded default, in a private systemd (design §7 ``demo``).

What it does, each step explained in one line as it runs:

1. boots a private, real systemd (PID 1 of its own namespaces; the host's services are never touched);
2. builds releases 1.0.0, 1.1.0, a bad 1.2.0 (passes its version check, then dies) and 1.3.0 of the sample
   agent (``agent/testing/sample_agent.py``) and serves them over loopback HTTP with their sha256;
3. installs 1.0.0, upgrades to 1.1.0 (committed), upgrades to 1.2.0 (rolled back to 1.1.0);
4. kills an upgrade to 1.3.0 with SIGKILL right after its switch was journaled, then runs
   ``recover-agent-upgrade``, which finds the switch durable, health-checks 1.3.0 and commits it;
5. shows ``status`` and ``history``; uninstalls, stops the private systemd and removes every file it made.

Everything runs the real CLI (``upgrade-agent``) as a subprocess, as an operator would. Needs root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from agent.config.boot import machine_arch
from agent.systemd.stable_paths import ALLOW_ENV
from agent.testing.releases import ReleaseServer, build_release, sha256_file

NAME = "demo-agent"


def run(out: TextIO | None = None) -> int:
    """Run the demo; returns its exit code (0 when every step behaved as announced).

    Args:
        out: where the narrative and the CLI runs' stdout go (default stdout); ``demo --json`` passes stderr,
            so that its stdout holds only its one JSON object (design §7).
    """
    out = out or sys.stdout

    def tell(*parts: object, file: TextIO | None = None, flush: bool = True) -> None:
        print(*parts, file=file or out, flush=flush)

    def _say(text: str) -> None:
        tell(f"\n\033[1m==> {text}\033[0m" if out.isatty() else f"\n==> {text}")

    if os.geteuid() != 0:
        tell(
            "make demo needs root: it boots a private systemd (unshare, mount, cgroup2) to install and "
            "upgrade a sample agent without touching this machine's services. Run it as root.",
            file=sys.stderr,
        )
        return 2
    from agent.testing.sandbox import PrivateSystemd, agent_config_toml, free_port

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="upgrade-core-demo-", dir="/var/tmp"))
    server = None
    sandbox = None
    failures: list[str] = []
    try:
        _say("Booting a private systemd (its own PID 1; this machine's services are not touched)")
        sandbox = PrivateSystemd.start(work / "systemd")
        tell(f"private systemd is PID {sandbox.pid} on the host, booted in {sandbox.boot_seconds:.2f} s")

        _say("Building releases 1.0.0, 1.1.0, a bad 1.2.0 (dies 0.3 s after start) and 1.3.0; serving them")
        releases = work / "releases"
        arch = machine_arch() or "amd64"
        files = {
            v: build_release(releases, v, behaviour, name=NAME, arch=arch)
            for v, behaviour in (
                ("1.0.0", "good"),
                ("1.1.0", "good"),
                ("1.2.0", "exit-after:0.3"),
                ("1.3.0", "good"),
            )
        }
        server = ReleaseServer(releases)
        base = server.base
        for f in files.values():
            tell(f"{base}/{f.name}  sha256 {sha256_file(f)}")

        port = free_port()
        config = work / f"{NAME}.toml"
        config.write_text(
            agent_config_toml(
                name=NAME,
                root=work / "root",
                state_dir=work / "state",
                lock_path=work / "run" / f"{NAME}.lock",
                unit_dir=sandbox.unit_dir,
                systemctl_prefix=[str(sandbox.write_prefix_script(work / "in-sandbox"))],
                port=port,
                stability_s=1.0,
                timeout_s=10.0,
                max_attempts=2,
            )
        )
        tell(f"configuration: {config}")
        cli = [sys.executable, "-m", "agent.cli.main", "--config", str(config)]

        def step(title: str, argv: list[str], expect: int, env: dict[str, str] | None = None) -> None:
            _say(title)
            tell("$ upgrade-agent " + " ".join(argv), flush=True)
            # installs from this checkout's venv into a throw-away systemd, on purpose (docs/install.md)
            run_env = {**os.environ, ALLOW_ENV: "1", **(env or {})}
            done = subprocess.run([*cli, *argv], env=run_env, check=False, stdout=out)
            if done.returncode != expect:
                failures.append(f"{title}: exit {done.returncode}, expected {expect}")
                tell(f"!! exit {done.returncode}, expected {expect}", flush=True)
            else:
                tell(f"(exit {done.returncode}, as expected)", flush=True)

        def archive(v: str) -> list[str]:
            return ["--archive", f"{base}/{files[v].name}", "--sha256", sha256_file(files[v])]

        step("Installing 1.0.0 into the blue slot; the agent unit starts and must stay healthy",
             ["install", *archive("1.0.0"), "--expect-version", "1.0.0"], 0)
        step("Upgrading to 1.1.0: staged in green, verified, switched, restarted, health-checked, committed",
             ["upgrade", *archive("1.1.0"), "--operation", "to-1.1.0"], 0)
        step("Upgrading to the bad 1.2.0: it passes its version check, dies after start, and is rolled back",
             ["upgrade", *archive("1.2.0"), "--operation", "to-1.2.0"], 1)
        step("Upgrading to 1.3.0, but the upgrader is SIGKILLed right after the switch is journaled",
             ["upgrade", *archive("1.3.0"), "--operation", "to-1.3.0"], -9,
             env={"UPGRADE_AGENT_TEST_KILL_AFTER": "SwitchCommitted"})
        _say("Recovering: the journal says the switch is durable, so 1.3.0 gets its health check and commits")
        tell("$ recover-agent-upgrade --trigger manual", flush=True)
        done = subprocess.run([*cli, "recover", "--trigger", "manual"], check=False, stdout=out)
        if done.returncode != 0:
            failures.append(f"recover: exit {done.returncode}")
        step("Status: slots, links, the running service (from the journal and the links only)", ["status"], 0)
        step("History: every episode, newest first", ["history"], 0)
        step("Uninstalling: units, slots, links, journal and lock are removed", ["uninstall"], 0)
    finally:
        _say("Tearing down the private systemd and every file the demo made")
        if server is not None:
            server.close()
        if sandbox is not None:
            sandbox.stop()
        shutil.rmtree(work, ignore_errors=True)
        tell("nothing left behind" if not work.exists() else f"left behind: {work}")
    elapsed = time.monotonic() - started
    if failures:
        tell(f"\ndemo finished in {elapsed:.1f} s with {len(failures)} unexpected outcome(s):")
        for failure in failures:
            tell(f"- {failure}")
        return 1
    tell(f"\ndemo finished in {elapsed:.1f} s: committed, rolled back, recovered, all as announced")
    return 0

"""Only what it made, under the real private systemd (docs/host.md, cases C24/C25).

The cases of ``tests/cli/test_only_what_it_made.py`` that need a service manager, run with the real CLI
(:class:`~tests.systemd.agent_env.AgentEnv`, ``host.systemctl_prefix`` = the sandbox's ``nsenter`` prefix,
``host.unit_dir`` = the sandbox's ``/etc/systemd/system``). Every outcome is read from the sandbox and the
host: ``systemctl show`` in the sandbox (MainPID, InvocationID, ActiveState, LoadState, UnitFileState), the
unit directory's files and ``[Install]`` links, file digests, the mount table. Expected outcomes are written
in each test's docstring.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable

import pytest

from . import agent_env
from .agent_env import CLI_TIMEOUT_S, WORKTREE, AgentEnv, poll, tree

pytestmark = pytest.mark.systemd

# the shared fixtures, visible to this module's tests
make_env = agent_env.make_env
release_server = agent_env.release_server

MakeEnv = Callable[..., AgentEnv]

WRONG_SHA = "0" * 64
SETTLE_S = 10.0  # bound on every wait for a unit state the sandbox reaches asynchronously
SHOWN = ("LoadState", "ActiveState", "SubState", "MainPID", "InvocationID", "UnitFileState")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def rendered(env: AgentEnv) -> dict[str, str]:
    """What ``upgrade-agent units`` prints for this configuration: file name -> text."""
    out = env.cli("units")
    assert out.code == 0 and out.json is not None, out
    units: dict[str, str] = out.json["units"]
    return units


def assert_units_gone(env: AgentEnv, names: list[str]) -> None:
    """No file or ``[Install]`` link of this agent in the sandbox's unit dir; systemd knows none of
    ``names`` (not-found, inactive, no process)."""
    assert env.units_present() == [], env.units_present()
    for unit in names:
        state = env.show(unit, *SHOWN)
        assert (state["LoadState"], state["ActiveState"]) == ("not-found", "inactive"), (unit, state)
        assert state.get("MainPID", "0") == "0", (unit, state)  # a timer has no MainPID


def assert_sandbox_acted_on(env: AgentEnv, unit: str) -> None:
    """The sandbox's systemd logged something about ``unit`` (its console log, PID 1's own output): the
    unit existed there and changed state, so a later "gone" is not vacuous. Names are unique per test."""
    def logged() -> bool:
        text = env.sandbox.console_log.read_text(errors="replace")
        return any(f"{unit}:" in line or f" {unit} " in f"{line} " for line in text.splitlines())

    poll(logged, SETTLE_S, f"the sandbox's console log to name {unit}")


def start_foreign_unit(env: AgentEnv) -> tuple[bytes, dict[str, str]]:
    """Somebody else's service under the agent's unit name (no upgrade-agent header line): written into
    the sandbox's unit dir, enabled and started there. Returns its bytes and its ``systemctl show``."""
    foreign = env.sandbox.unit_dir / env.unit
    foreign.write_text(
        "[Unit]\nDescription=somebody else's service\n"
        "[Service]\nExecStart=/bin/sleep infinity\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    env.sandbox.run("systemctl", "daemon-reload")
    env.sandbox.run("systemctl", "enable", "--quiet", env.unit)
    env.sandbox.run("systemctl", "start", "--no-block", env.unit)
    poll(lambda: env.show(env.unit, *SHOWN)["SubState"] == "running", SETTLE_S, f"{env.unit} running")
    state = env.show(env.unit, *SHOWN)
    assert (state["LoadState"], state["ActiveState"], state["UnitFileState"]) == (
        "loaded", "active", "enabled"), state
    assert int(state["MainPID"]) > 0 and state["InvocationID"], state
    return foreign.read_bytes(), state


# -- uninstall / reset on a host holding things the agent did not make (C24) -----------------------------
@pytest.mark.parametrize("command", ["uninstall", "reset"])
def test_a_foreign_unit_with_the_agent_unit_name_is_never_stopped_or_removed(
    make_env: MakeEnv, command: str
) -> None:
    """A foreign unit (no upgrade-agent header) named like the agent's unit is enabled and running in the
    sandbox. Expected: exit 0; the unit file survives byte-identical; the unit was never stopped, restarted
    or disabled (the same MainPID and InvocationID, still active/running, still enabled, its ``[Install]``
    link in place); the result lists it under ``kept`` with the reason (no upgrade-agent header) and
    removes nothing but, for ``uninstall``, the lock it took itself."""
    env = make_env()
    foreign = env.sandbox.unit_dir / env.unit
    wants = env.sandbox.unit_dir / "multi-user.target.wants" / env.unit
    text, before = start_foreign_unit(env)
    assert wants.is_symlink(), sorted(tree(env.sandbox.unit_dir))
    link_before = os.readlink(wants)

    run = env.cli(command)
    assert run.code == 0, run
    doc = run.json
    assert doc is not None
    assert sha(foreign.read_bytes()) == sha(text)
    assert env.show(env.unit, *SHOWN) == before
    assert os.readlink(wants) == link_before
    assert doc["removed"] in ([], [str(env.lock_path)])  # uninstall removes the lock it took itself
    assert [k for k in doc["kept"] if k.startswith(f"{foreign}: kept: no upgrade-agent header")], doc
    assert "Traceback" not in run.stderr, run.stderr


# -- a failed install removes what its record lists, and keeps its first error ----------------------------
def test_failed_install_removes_what_it_made_and_keeps_the_digest_mismatch(make_env: MakeEnv) -> None:
    """A digest mismatch after the layout and units were made (written, enabled, the recovery timer
    started: ``install`` does all that before it fetches). Expected: exit 1, ``aborted`` with the digest
    reason; no ``cleanup_errors``; the layout directories are gone and the tree outside ``state_dir`` and
    the lock's directory is as before (a pre-existing R with a canary stays); no unit file or ``[Install]``
    link of the agent is left in the sandbox's unit dir and systemd reports every rendered unit not-found
    and inactive; the install record is gone with its entries."""
    env = make_env()
    names = list(rendered(env))
    rel = env.release("1.0.0")
    env.root.mkdir()
    canary = env.root / "keep.txt"
    canary.write_text("pre-existing\n")

    # state_dir (journal) and the lock are the agent's own state, not part of what install lays out
    def layout_view() -> dict[str, str]:
        return {k: v for k, v in tree(env.work).items() if not k.startswith(("var", "run"))}

    before = layout_view()
    assert_units_gone(env, names)
    run = env.cli("install", "--archive", rel.url, "--sha256", WRONG_SHA)
    assert run.code == 1, run
    doc = run.json
    assert doc is not None and doc["result"] == "aborted" and "sha256" in (doc["reason"] or ""), doc
    assert "cleanup_errors" not in doc, doc
    assert layout_view() == before
    assert sha(canary.read_bytes()) == sha(b"pre-existing\n")
    assert not (env.state_dir / "install.json").exists()
    assert_sandbox_acted_on(env, names[3])  # the recovery timer install started, then the clean-up stopped
    assert_units_gone(env, names)
    assert "Traceback" not in run.stderr, run.stderr


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare for a private mount namespace")
def test_failed_install_on_a_mount_point_root_keeps_its_reason_and_uninstall_works(make_env: MakeEnv) -> None:
    """R is a mount point (a tmpfs mounted in a private mount namespace, where the CLI runs; it reaches the
    sandbox through the ``nsenter`` prefix as from the host), a digest mismatch fails the install.
    Expected: exit 1, ``aborted`` with the digest reason (never EBUSY); R is not listed, so the clean-up
    never tries to remove it and ``cleanup_errors`` is absent; R and a canary in it survive; no unit of the
    agent is left in the sandbox; ``uninstall`` afterwards exits 0 and leaves R mounted with the canary."""
    env = make_env()
    names = list(rendered(env))
    rel = env.release("1.0.0")
    env.root.mkdir()
    cli, inside = " ".join(env.argv()), " ".join(env.sandbox.prefix)
    timer = names[3]
    # between the two commands: how many files of the agent the unit dir holds, and what systemd knows of
    # the recovery timer install started (read in the sandbox while R is still mounted)
    script = (
        # mode=0755: a tmpfs is 1777 by default, which the host-root rule refuses (docs/host.md)
        f"mount -t tmpfs -o mode=0755 tmpfs {env.root} && echo canary > {env.root}/keep.txt && "
        f"{cli} install --archive {rel.url} --sha256 {WRONG_SHA}; echo \"exit=$?\"; "
        f"echo \"units=$(find {env.sandbox.unit_dir} -name '{env.name}*' | wc -l)\"; "
        f"{inside} systemctl show -p LoadState,ActiveState --value {timer} | paste -sd,; "
        f"{cli} uninstall; echo \"exit=$?\"; "
        f"mountpoint -q {env.root} && echo mounted; sha256sum {env.root}/keep.txt"
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        # LIBMOUNT_UTAB: mount(8) records nothing in the host's /run/mount/utab for a namespace-private mount
        cwd=WORKTREE, env=env.env({"LIBMOUNT_UTAB": str(env.work / "utab")}), capture_output=True, text=True,
        timeout=2 * CLI_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 8, (done.stdout, done.stderr)
    install, uninstall = json.loads(lines[0]), json.loads(lines[4])
    assert lines[1] == "exit=1" and install["result"] == "aborted", install
    assert "sha256" in install["reason"] and "Device or resource busy" not in json.dumps(install), install
    assert "cleanup_errors" not in install, install
    assert lines[2:4] == ["units=0", "not-found,inactive"], (lines, done.stderr)  # gone after the failure
    assert lines[5] == "exit=0", (uninstall, done.stderr)
    assert str(env.root) not in uninstall["removed"], uninstall
    assert lines[6] == "mounted"
    assert lines[7].split()[0] == sha(b"canary\n")
    assert "Traceback" not in done.stderr
    assert_sandbox_acted_on(env, timer)  # the recovery timer install started, then the clean-up stopped
    assert_units_gone(env, names)
    assert not os.path.ismount(env.root)  # the tmpfs never left the private namespace


# -- install on an installed host repairs missing units and links (docs/host.md) ----------------------------
def test_install_repairs_missing_units_and_the_compat_link(make_env: MakeEnv) -> None:
    """An installed agent, then (in the sandbox) the agent stopped, its units disabled and the recovery
    timer stopped; a unit file deleted, one drifted, ``R/bin/NAME`` deleted. Expected: ``install`` (no
    archive) exits 0, ``noop``, ``repaired`` lists exactly those three paths; the unit files are again what
    ``units`` renders, the link is back; systemd reports the agent unit, the boot-time recovery unit and
    the timer enabled again, the timer active and the agent running the blue slot under a new MainPID; the
    slots and links are untouched. A second ``install`` repairs nothing."""
    env = make_env()
    rel = env.release("1.0.0")
    env.install(rel)
    old_pid = env.assert_running("blue", rel)
    units = rendered(env)
    names = list(units)
    agent, recover, boot, timer = names[0], names[1], names[2], names[3]
    assert (agent, recover) == (env.unit, f"{env.name}-recover.service"), names
    assert (boot, timer) == (f"{env.name}-recover-boot.service", f"{env.name}-recover.timer"), names
    enabled = (agent, boot, timer)
    env.sandbox.run("systemctl", "stop", agent, timer)
    env.sandbox.run("systemctl", "disable", "--quiet", *enabled)
    for unit in enabled:
        state = env.show(unit, *SHOWN)
        assert (state["ActiveState"], state["UnitFileState"]) == ("inactive", "disabled"), (unit, state)
    unit_dir = env.sandbox.unit_dir
    missing, drifted = unit_dir / recover, unit_dir / agent
    missing.unlink()
    drifted.write_text(units[agent] + "# local edit\n")
    bin_link = env.root / "bin" / env.name
    bin_link.unlink()
    slots = tree(env.lib)

    run = env.cli("install")
    assert run.code == 0, run
    doc = run.json
    assert doc is not None and doc["result"] == "noop", doc
    assert sorted(doc["repaired"]) == sorted([str(missing), str(drifted), str(bin_link)]), doc
    assert {n: (unit_dir / n).read_text() for n in names} == units
    assert os.readlink(bin_link) == f"../lib/{env.name}/{env.name}-current"
    assert tree(env.lib) == slots
    for unit in enabled:
        assert env.show(unit, "UnitFileState")["UnitFileState"] == "enabled", unit
    poll(lambda: env.show(timer)["ActiveState"] == "active", SETTLE_S, f"{timer} active")
    poll(lambda: env.show(agent)["SubState"] == "running", SETTLE_S, f"{agent} running")
    assert env.assert_running("blue", rel) != old_pid

    again = env.cli("install")
    assert again.code == 0 and again.json is not None and again.json["repaired"] == [], again

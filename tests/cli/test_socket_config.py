"""``[agent] socket`` (design §11, docs/configuration.md) through the CLI, without systemd.

- A bad value (a host name, a port out of range, a ``%`` specifier, a space, a path not normalised or
  longer than ``sun_path`` holds, a wrong type) is exit 2 with exactly one line naming the file and
  ``agent.socket``, no traceback or Python repr, on every path: ``units``, ``status``, ``install`` and the
  boot-time ``recover --trigger boot`` (its quick reader hands the file to the full loader, which names the
  key); nothing is created.
- A unix socket path that names an existing non-socket (a file, a link, a directory), or lies in a directory
  that is not root's, is refused by ``install`` before anything is written (exit 4): systemd would unlink
  it to bind there.
- A good value keeps the boot-time no-op on the lean path (the full loader is not imported, the lock is
  not created), and ``units`` prints ``NAME.socket`` with the ``ListenStream=`` value.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ._rig import Rig, snapshot
from .test_clean_input import IMPORT_TIME, imported
from .test_signed_releases import release

BAD = [
    ('"localhost:8080"', '"localhost:8080" is not a ListenStream= stream address'),
    ('"127.0.0.1:70000"', "port 70000 is out of range (1 to 65535)"),
    ('"/run/%n.sock"', "holds '%'"),
    ('"127.0.0.1: 80"', "holds a space"),
    ('"/run/x/../y.sock"', "must be normalised"),
    (f'"/run/{"s" * 110}"', "1 to 107 bytes"),
    ("8080", "must be a string, got an integer"),
]

COMMANDS = {
    "units": ("units",),
    "status": ("status",),
    "install": ("install", "--archive", "/nonexistent.tar.gz"),
    "recover-boot": ("recover", "--trigger", "boot"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("value", "expected"), BAD, ids=[b[0].strip('"')[:16] for b in BAD])
def test_a_bad_socket_is_one_line_naming_the_key_exit_2(
    rig: Rig, value: str, expected: str, command: str
) -> None:
    rig.write_config(agent_extra=f"socket = {value}")
    before = snapshot(rig.base)
    run = rig.cli(*COMMANDS[command])  # --json: the one line on stderr and the error object on stdout
    assert run.code == 2, run
    run.assert_clean_stderr()
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"upgrade-agent: {rig.config}: agent.socket: "), line
    assert expected in line, line
    assert "None" not in line and "\\x" not in line, line
    assert run.error_payload(2)["error"] == line.removeprefix("upgrade-agent: ")
    assert snapshot(rig.base) == before


def test_a_socket_host_stays_on_the_boot_fast_path_and_units_prints_the_socket(rig: Rig) -> None:
    rig.write_config(agent_extra='socket = "127.0.0.1:8080"')
    run = rig.cli("recover", "--trigger", "boot", env=IMPORT_TIME)
    assert run.code == 0 and run.payload()["result"] == "noop", run
    assert not rig.lock_path.exists()
    assert "agent.config.loader" not in imported(run)

    units = rig.cli("units")
    assert units.code == 0, units
    rendered = json.loads(units.stdout)["units"]
    assert list(rendered)[:2] == [f"{rig.name}.socket", f"{rig.name}.service"]
    assert "ListenStream=127.0.0.1:8080\n" in rendered[f"{rig.name}.socket"]
    assert f"Sockets={rig.name}.socket\n" in rendered[f"{rig.name}.service"]


@pytest.mark.parametrize("kind", ["file", "link", "directory"])
def test_a_socket_path_naming_anything_but_a_socket_is_refused_before_install_touches_the_host(
    rig: Rig, tmp_path: Path, kind: str
) -> None:
    # systemd unlinks whatever stands at a ListenStream= path when the bind says EADDRINUSE (and again
    # with RemoveOnStop=): install must not hand it a path that names someone else's file
    victim = rig.base / "keep.txt"
    victim.write_text("not the agent's\n")
    path = rig.base / "agent.sock"
    if kind == "file":
        path = victim
    elif kind == "link":
        path.symlink_to(victim)
    else:
        path.mkdir()
    rig.write_config(agent_extra=f'socket = "{path}"')
    archive = release(rig, tmp_path, "1.0.0")
    before = snapshot(rig.base)
    run = rig.cli("install", "--archive", str(archive))
    assert run.code == 4, run
    run.assert_clean_stderr()
    (line,) = run.stderr.splitlines()
    assert line == (f"upgrade-agent: {path}: agent.socket names an existing file that is not a socket; "
                    "systemd would remove it to bind there; nothing was changed"), line
    assert snapshot(rig.base) == before  # no unit written, no slot, no state
    assert victim.read_text() == "not the agent's\n"


def test_a_socket_path_in_a_directory_another_user_may_write_is_refused(rig: Rig, tmp_path: Path) -> None:
    shared = rig.base / "shared"
    shared.mkdir()
    os.chown(shared, 65534, 65534)  # nobody's: nobody could put a file where systemd will bind
    rig.write_config(agent_extra=f'socket = "{shared}/agent.sock"')
    run = rig.cli("install", "--archive", str(release(rig, tmp_path, "1.0.0")))
    assert run.code == 4, run
    run.assert_clean_stderr()
    assert str(shared) in run.stderr and not (rig.agent_dir / f"{rig.name}-blue").exists(), run

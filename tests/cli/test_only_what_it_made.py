"""Only what it made (issue 10 item 3, case C24/C25): the install record, and what clean-up, ``reset`` and
``uninstall`` may remove; unit names; ``install`` repairing missing units and links (item 4).

systemd is a fake here (``fake_systemctl``): a script that answers ``show`` with an inactive unit, exits 0
for everything else, and logs every call, so a test can prove what was (not) stopped, disabled or started.
Expected outcomes are written in each test's docstring.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from agent.config_fast import machine_arch

from ._rig import REPO, Rig, cli_env, snapshot

WRONG_SHA = "0" * 64


def fake_systemctl(rig: Rig) -> Path:
    """Write the fake ``systemctl_prefix`` script and point the config at it; returns its call log."""
    log = rig.base / "systemctl.log"
    script = rig.base / "fake-systemctl"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{log}"\n'
        'if [ "$2" = show ]; then\n'
        "  printf 'ActiveState=inactive\\nSubState=dead\\nLoadState=loaded\\nJob=\\nMainPID=0\\n"
        "Result=success\\n'\n"
        "fi\n"
        "exit 0\n"
    )
    script.chmod(0o755)
    rig.write_config(systemctl_prefix=(str(script),))
    return log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def archive_of(rig: Rig, data: bytes, path: Path) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo(f"{rig.name}-linux-{machine_arch()}")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(raw.getvalue()))
    return path


# -- uninstall / reset on a host holding things the agent did not make (C24) -----------------------------
def test_uninstall_where_nothing_was_installed_keeps_an_unrelated_file_in_state_dir(rig: Rig) -> None:
    """Expected: exit 0; ``state_dir`` and the unrelated file in it survive byte-identical; the result says
    there was no install record and that ``state_dir`` was kept because it is not empty."""
    rig.state_dir.mkdir()
    canary = rig.state_dir / "operator-notes.txt"
    canary.write_text("not the agent's\n")
    before = sha(canary)
    run = rig.cli("uninstall")
    assert run.code == 0, run
    doc = run.payload()
    assert canary.exists() and sha(canary) == before
    assert str(rig.state_dir) not in doc["removed"]
    assert any(line.startswith(f"{rig.state_dir}: kept: not empty") for line in doc["kept"]), doc
    assert any("no install record" in n for n in doc["notes"]), doc
    run.assert_clean_stderr()


@pytest.mark.parametrize("command", ["uninstall", "reset"])
def test_a_foreign_unit_with_the_agent_unit_name_is_never_stopped_or_removed(rig: Rig, command: str) -> None:
    """Expected: exit 0; the foreign unit file survives byte-identical; systemctl is never asked to stop
    or disable it; the result lists it under ``kept`` with the reason (no upgrade-agent header)."""
    log = fake_systemctl(rig)
    rig.unit_dir.mkdir()
    foreign = rig.unit_dir / f"{rig.name}.service"
    foreign.write_text("[Unit]\nDescription=somebody else's service\n[Service]\nExecStart=/bin/true\n")
    before = sha(foreign)
    run = rig.cli(command)
    assert run.code == 0, run
    doc = run.payload()
    assert foreign.exists() and sha(foreign) == before
    assert doc["removed"] in ([], [str(rig.lock_path)])  # uninstall removes the lock it took itself
    assert [k for k in doc["kept"] if k.startswith(f"{foreign}: kept: no upgrade-agent header")], doc
    assert not [c for c in calls(log) if rig.name in c], calls(log)


def test_install_refuses_to_overwrite_a_foreign_unit(rig: Rig, tmp_path: Path) -> None:
    """Expected: exit 2 naming ``agent.unit`` and the file; nothing created (the tree is unchanged)."""
    rig.unit_dir.mkdir()
    foreign = rig.unit_dir / f"{rig.name}.service"
    foreign.write_text("[Service]\nExecStart=/bin/true\n")
    archive = archive_of(rig, b"#!/bin/sh\necho 1.0.0\n", tmp_path / "a.tar.gz")
    before = snapshot(tmp_path)
    err = rig.cli("install", "--archive", str(archive)).error_payload(2)
    assert err["error"].startswith("agent.unit: ") and str(foreign) in err["error"], err
    assert snapshot(tmp_path) == before


def test_two_configurations_naming_the_same_unit_the_second_install_is_refused(tmp_path: Path) -> None:
    """Configuration A is installed (its units carry A's header); B names A's unit as its ``agent.unit``.
    Expected: B's install exits 2 naming ``agent.unit`` and the owner it found (A); A's unit is
    byte-identical and B created nothing."""
    a = Rig(tmp_path / "a", "owner-a")
    a.install_by_hand()
    b = Rig(tmp_path / "b", "second-b")
    b.unit_dir = a.unit_dir
    b.write_config(agent_extra=f'unit = "{a.name}.service"')
    text = b.config.read_text().replace(str(b.base / "units"), str(a.unit_dir))
    b.config.write_text(text)
    unit = a.unit_dir / f"{a.name}.service"
    before = sha(unit)
    archive = archive_of(b, b"#!/bin/sh\necho 1.0.0\n", tmp_path / "b.tar.gz")
    tree = snapshot(tmp_path)
    err = b.cli("install", "--archive", str(archive)).error_payload(2)
    assert err["error"].startswith("agent.unit: ") and "for owner-a" in err["error"], err
    assert sha(unit) == before and snapshot(tmp_path) == tree


@pytest.mark.parametrize("unit", ["{name}-recover.service", "{name}-recover-boot.service", "x.socket",
                                  "x@.service", "x@y.service", "x.timer"])
def test_unit_names_that_are_not_a_plain_foreign_service_are_refused(rig: Rig, unit: str) -> None:
    """Expected: exit 2, one line naming ``agent.unit``; nothing created."""
    rig.write_config(agent_extra=f'unit = "{unit}"')
    before = snapshot(rig.base)
    err = rig.cli("install", "--archive", str(rig.config)).error_payload(2)
    assert "agent.unit: " in err["error"], err
    assert "'" not in err["error"].split("agent.unit: ", 1)[1]  # no Python repr
    assert snapshot(rig.base) == before


# -- a failed install removes what its record lists, and keeps its first error ----------------------------
def test_failed_install_removes_what_it_made_and_keeps_the_digest_mismatch(rig: Rig, tmp_path: Path) -> None:
    """A digest mismatch after the layout and units were made. Expected: exit 1, ``aborted`` with the
    digest reason; no ``cleanup_errors``; the layout directories and unit files are gone, the tree outside
    ``state_dir`` is as before (a pre-existing R with a canary stays); the record is gone with its entries.
    """
    fake_systemctl(rig)
    rig.unit_dir.mkdir()
    rig.root.mkdir()
    canary = rig.root / "keep.txt"
    canary.write_text("pre-existing\n")
    archive = archive_of(rig, b"#!/bin/sh\necho 1.0.0\n", tmp_path / "a.tar.gz")
    # state_dir (journal) and the lock are the agent's own state, not part of what install lays out
    def layout_view() -> dict[str, tuple[str, int, str]]:
        return {k: v for k, v in snapshot(tmp_path).items()
                if not k.startswith(("state", "run", "systemctl.log"))}

    before = layout_view()
    run = rig.cli("install", "--archive", str(archive), "--sha256", WRONG_SHA)
    assert run.code == 1, run
    doc = run.payload()
    assert doc["result"] == "aborted" and "sha256" in (doc["reason"] or ""), doc
    assert "cleanup_errors" not in doc, doc
    assert layout_view() == before
    assert sha(canary) == hashlib.sha256(b"pre-existing\n").hexdigest()
    assert not (rig.state_dir / "install.json").exists()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root for a tmpfs mount"
)
def test_failed_install_on_a_mount_point_root_keeps_its_reason_and_uninstall_works(
    rig: Rig, tmp_path: Path
) -> None:
    """R is a mount point (a tmpfs in a private mount namespace), a digest mismatch fails the install.
    Expected: exit 1, ``aborted`` with the digest reason (never EBUSY); R is not listed, so the clean-up
    never tries to remove it and ``cleanup_errors`` is absent; R and a canary in it survive; ``uninstall``
    afterwards exits 0 and leaves R mounted with the canary."""
    fake_systemctl(rig)
    rig.unit_dir.mkdir()
    rig.root.mkdir()
    archive = archive_of(rig, b"#!/bin/sh\necho 1.0.0\n", tmp_path / "a.tar.gz")
    cli = f"{sys.executable} -m agent.cli --config {rig.config} --json"
    script = (
        f"mount -t tmpfs tmpfs {rig.root} && echo canary > {rig.root}/keep.txt && "
        f"{cli} install --archive {archive} --sha256 {WRONG_SHA}; echo \"exit=$?\"; "
        f"{cli} uninstall; echo \"exit=$?\"; "
        f"mountpoint -q {rig.root} && echo mounted; sha256sum {rig.root}/keep.txt"
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=120, check=False,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 6, (done.stdout, done.stderr)
    install, uninstall = json.loads(lines[0]), json.loads(lines[2])
    assert lines[1] == "exit=1" and install["result"] == "aborted", install
    assert "sha256" in install["reason"] and "Device or resource busy" not in json.dumps(install), install
    assert "cleanup_errors" not in install, install
    assert lines[3] == "exit=0", (uninstall, done.stderr)
    assert str(rig.root) not in uninstall["removed"], uninstall
    assert lines[4] == "mounted"
    assert lines[5].split()[0] == hashlib.sha256(b"canary\n").hexdigest()
    assert "Traceback" not in done.stderr


# -- install on an installed host repairs missing units and links (item 4) --------------------------------
def test_install_repairs_missing_units_and_the_compat_link(installed_rig: Rig, tmp_path: Path) -> None:
    """A unit file deleted, one drifted, ``R/bin/NAME`` deleted. Expected: ``install`` (no archive) exits 0,
    ``noop``, ``repaired`` lists exactly those three paths; the unit files are again what ``units``
    renders, the link is back, the units were re-enabled and the agent started; the slots are untouched.
    """
    rig = installed_rig
    log = fake_systemctl(rig)
    rendered = rig.rendered_units()
    names = list(rendered)
    missing, drifted = rig.unit_dir / names[1], rig.unit_dir / names[0]
    missing.unlink()
    drifted.write_text(rendered[names[0]] + "# local edit\n")
    bin_link = rig.root / "bin" / rig.name
    bin_link.unlink()
    slots = snapshot(rig.agent_dir)
    run = rig.cli("install")
    assert run.code == 0, run
    doc = run.payload()
    assert doc["result"] == "noop"
    assert sorted(doc["repaired"]) == sorted([str(missing), str(drifted), str(bin_link)]), doc
    assert {n: (rig.unit_dir / n).read_text() for n in names} == rendered
    assert os.readlink(bin_link) == f"../lib/{rig.name}/{rig.name}-current"
    assert snapshot(rig.agent_dir) == slots
    seen = calls(log)
    assert any(" enable " in f" {c} " and f"{rig.name}.service" in c for c in seen), seen
    assert any(c.startswith("systemctl start --no-block") for c in seen), seen
    again = rig.cli("install")
    assert again.code == 0 and again.payload()["repaired"] == [], again

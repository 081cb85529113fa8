"""Only what it made (docs/host.md, case C24/C25), without systemd: what ``uninstall`` keeps on a host
holding things the agent did not make; what ``install`` refuses (a foreign unit file, another
configuration's unit, unit names that are not a plain service).

``host.systemctl_prefix`` is ``/bin/false`` (``tests/cli/_rig.py``): none of these cases reaches a service
manager, and any systemctl call would fail loudly. The cases that need one (a foreign unit running under
the agent's unit name through ``reset``/``uninstall``, a failed install removing its units, also with R a
mount point, ``install`` repairing missing units) run against the real private systemd in
``tests/systemd/test_only_what_it_made.py``. Expected outcomes are written in each test's docstring.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from agent.config.boot import machine_arch

from ._rig import Rig, snapshot

VENDOR_DIRS = ("/usr/lib/systemd/system", "/lib/systemd/system")


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


def test_install_refuses_a_unit_name_systemd_already_loads_from_another_directory(
    rig: Rig, tmp_path: Path
) -> None:
    """A vendor unit of the same name (here the one systemd itself ships for its journal) would be silently
    overridden by the file install writes in ``host.unit_dir``. Expected: exit 2 naming ``agent.unit`` and
    the vendor file; nothing created."""
    vendor = next(path for path in (Path(d) / "systemd-journald.service" for d in VENDOR_DIRS)
                  if path.exists())
    rig.write_config(agent_extra='unit = "systemd-journald.service"')
    archive = archive_of(rig, b"#!/bin/sh\necho 1.0.0\n", tmp_path / "a.tar.gz")
    before = snapshot(tmp_path)
    err = rig.cli("install", "--archive", str(archive)).error_payload(2)
    assert err["error"].startswith("agent.unit: ") and str(vendor) in err["error"], err
    assert "would override it" in err["error"], err
    assert snapshot(tmp_path) == before

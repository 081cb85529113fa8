"""``agent.host_root_args`` through the whole CLI (docs/candidate.md, "A runtime that checks its host
root"): a candidate answering another host root is refused before the switch, one line naming both; one
answering this host's root stages as usual."""

from __future__ import annotations

import os
from pathlib import Path

from tests.agent_fetch._archives import Entry, compress, tar_bytes

from ._rig import Rig
from .test_signed_releases import ARCH


def _release(rig: Rig, d: Path, answer: str) -> Path:
    body = (f'#!/bin/sh\nif [ "$1" = version ]; then echo 2.0.0; exit 0; fi\n'
            f'if [ "$1" = host-root ]; then echo {answer}; exit 0; fi\nexec sleep 3600\n').encode()
    path = d / f"{rig.name}-{answer.strip('/').replace('/', '-')}.tar.gz"
    path.write_bytes(compress(tar_bytes([Entry(f"{rig.name}-linux-{ARCH}", data=body)]), "gzip"))
    return path


def test_a_candidate_for_another_host_root_is_refused_before_the_switch(
    installed_rig: Rig, tmp_path: Path
) -> None:
    rig = installed_rig
    rig.write_config(agent_extra='host_root_args = ["host-root"]')
    before = rig.host_facts()
    run = rig.cli("upgrade", "--archive", str(_release(rig, tmp_path, "/usr/local")), "--operation", "hr")
    assert run.code == 1, run
    run.assert_clean_stderr()
    out = run.payload()
    assert out["result"] == "aborted", out
    assert out["reason"].endswith(f"answers host root /usr/local; this host's root is {rig.root}"), out
    assert rig.host_facts() == before
    assert rig.cli("status").payload()["known_bad"] == []  # the wrong host's release, not a bad one


def test_a_candidate_for_this_host_root_stages(installed_rig: Rig, tmp_path: Path) -> None:
    rig = installed_rig
    rig.write_config(agent_extra='host_root_args = ["host-root"]')
    run = rig.cli("upgrade", "--stage", "--archive", str(_release(rig, tmp_path, str(rig.root))))
    assert run.code == 0, run
    assert run.payload()["result"] == "staged"
    assert os.readlink(rig.agent_dir / f"{rig.name}-current") == f"{rig.name}-blue"

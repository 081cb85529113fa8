"""Hypothesis-generated hostile trees against every command, through the real CLI.

Each example copies a template host (``_hosts.make_templates``: made by the real agent), picks one component
the command touches (``_trees.TOUCHES``) and one replacement another user could have left there
(``_trees.KINDS``: a symlink of uid 65534 to a canary outside, a FIFO, a hard link to a canary file, owner
uid 65534, a group/world-writable mode), then runs the command once.

Expected, every example: no traceback; an exit code of design §7; nothing outside changed (every canary
keeps its bytes, inode, mode, owner and mtime, nothing appears or goes, even for a while, no canary program
ran). When the command refuses (exit 2 or 4) it prints one line naming the attacked path (``PATH: what is
wrong``) and the host is exactly as before (the lock file's pid aside). For the agent's own directories
(``_trees.MUST_REFUSE``: the host root and its ``lib``, ``lib/NAME`` and ``bin``, ``state_dir``,
``journal``, ``results``, the trust cache, the lock's and the spool's directories and their common parent)
the command must refuse (``operator --once``: exit 3, its documented answer to a source it cannot read; the
trust cache: also an ``aborted`` episode naming it, as docs/trust.md says for every release check). For a
mirror directory that is a symlink or a FIFO, ``upgrade`` and ``rollback`` must stop with an error naming it
before the switch (a mirror may belong to another uid by design, docs/configuration.md, so its owner alone
is no reason).

Sizes: ``ATTACK_SETTINGS`` (20 drawn examples per command, 200 with ``UPGRADE_CORE_LONG=1``), plus the
explicit examples of ``_FOUND``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.cli._rig import Run, snapshot

from ._hosts import (
    ATTACK_SETTINGS,
    NAME,
    Template,
    argv_of,
    assert_outside_untouched,
    cli,
    copy_template,
    is_refusal_naming,
    make_base,
    outside_facts,
)
from ._trees import MUST_REFUSE, TOUCHES, Component, apply, pairs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as uid 65534: needs root")

_MIRROR_DIRS = ("mirror", "mirror/bin")
_TRUST_DIR = "state/trust"

# Escapes earlier runs found, kept as explicit examples so that every run repeats them (hypothesis draws
# only 20 of the 30 to 150 (component, replacement) pairs per command in `make test`).
_FOUND: dict[str, list[tuple[str, str]]] = {
    "install": [("units", "symlink"), ("root", "fifo")],
    "recover": [("", "foreign")],
    "reset": [("units", "symlink")],
    "rollback": [("mirror", "symlink"), (f"root/lib/{NAME}/{NAME}-green", "hardlink")],
    "uninstall": [("units", "symlink")],
    "upgrade": [("mirror/bin", "symlink")],
}


def _host_view(host: Path) -> dict[str, tuple[str, int, str]]:
    """:func:`snapshot` of the host, the lock file's bytes left out (taking the lock writes the holder's
    pid into it: not a change to the host)."""
    view = snapshot(host)
    lock = f"run/{NAME}.lock"
    if lock in view:
        view[lock] = (view[lock][0], view[lock][1], "")
    return view


def _aborted_naming(run: Run, path: str) -> bool:
    """Exit 1, result ``aborted`` with a reason naming ``path``: the release checks run inside the episode,
    before the switch (docs/trust.md: a keyring problem aborts the episode)."""
    if run.code != 1 or "Traceback" in run.stderr + run.stdout:
        return False
    out = run.payload()
    return out.get("result") == "aborted" and f"{path}: " in str(out.get("reason"))


def _judge(command: str, component: Component, replacement: str, attacked: str, run: Run,
           host_before: object, host_after: object) -> None:
    assert "Traceback" not in run.stderr + run.stdout, run
    assert run.code in (0, 1, 2, 3, 4), run
    must_refuse = command in MUST_REFUSE.get(component.rel, ()) and replacement != "hardlink"
    # `operator --once`: a source it cannot read is its result, exit 3 (docs/cli.md)
    codes = (2, 3, 4) if command == "operator spool pass" else (2, 4)
    if must_refuse:
        assert is_refusal_naming(run, attacked, codes) or (
            component.rel == _TRUST_DIR and _aborted_naming(run, attacked)
        ), f"{command}: not refused, {replacement} at {attacked}: {run}"
    if run.code in (2, 4):
        if run.code == 4 or must_refuse:
            assert is_refusal_naming(run, attacked), f"{command}: a refusal not naming {attacked}: {run}"
        assert host_after == host_before, f"{command}: refused, yet the host changed: {run}"
    mirror_unwalkable = component.rel in _MIRROR_DIRS and replacement in ("symlink", "fifo")
    if mirror_unwalkable and command in ("upgrade", "rollback"):
        assert run.code in (1, 2, 4) and attacked in run.stdout + run.stderr, (
            f"{command}: a mirror directory that is a {replacement}, not an error before the switch: {run}")
        if run.code == 1:
            assert run.payload()["result"] == "aborted", run


@pytest.mark.parametrize("command", sorted(TOUCHES), ids=lambda command: command.replace(" ", "-"))
def test_a_hostile_component_is_refused_or_left_alone(templates: dict[str, Template], command: str) -> None:
    template = templates["bare" if command == "install" else "installed"]

    components = {c.rel: c for c in TOUCHES[command]}

    @ATTACK_SETTINGS
    @given(pair=st.sampled_from(pairs(command)), relative=st.booleans(),
           bits=st.sampled_from([0o020, 0o002, 0o022]))
    def attack(pair: tuple[Component, str], relative: bool, bits: int) -> None:
        component, replacement = pair
        base = make_base(f"ua-attack-{NAME}-")
        try:
            rig = copy_template(template, base / "t")
            outside = base / "t" / "outside"
            attacked = str(apply(rig.base, outside, component, replacement, relative=relative, bits=bits))
            before, host_before = outside_facts(outside), _host_view(rig.base)
            run = cli(rig, *argv_of(command, template.archive))
            assert_outside_untouched(outside, before, run)
            _judge(command, component, replacement, attacked, run, host_before, _host_view(rig.base))
        finally:
            shutil.rmtree(base, ignore_errors=True)

    for rel, replacement in _FOUND.get(command, []):
        attack = example(pair=(components[rel], replacement), relative=False, bits=0o022)(attack)
    attack()

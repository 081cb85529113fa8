"""Races: a component flips between the agent's directory and a symlink to a canary outside while the real
CLI runs, :data:`~._hosts.RACE_ITERATIONS` runs per test (20 in ``make test``, 200 with
``UPGRADE_CORE_LONG=1``).

The flip is ``renameat2(RENAME_EXCHANGE)`` of the directory and a prepared sibling symlink (uid 65534's),
both in the same parent, by ``_flipper.py`` in a process of its own: at any instant the name is either the
real directory or the symlink, so a check made by path and a later use of the same path can see two
different things. It swaps the symlink in as soon as the command touches the real directory (inotify), and
otherwise after random short dwells. The symlink's target is a copy of the directory's contents outside
(files the command would take for its own). Where the attacker is another user by design (a mirror tree,
owned by a container's root) the flipper drops to uid 65534 and holds only a descriptor of its own
directory; elsewhere it stays root (what a swap by path could do, whoever does it).

Expected, every run: no traceback, and nothing outside changed (every canary keeps its bytes, inode, mode
and owner; nothing appears there). Refusing (exit 4 naming the path) when the check happens to see the
symlink is fine; so is any ordinary outcome. The flipper must have swapped at least once during each run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cli._rig import Rig

from ._hosts import (
    NAME,
    NOBODY,
    RACE_ITERATIONS,
    Template,
    argv_of,
    assert_outside_untouched,
    cli,
    copy_template,
    make_base,
    outside_facts,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="flips paths as uid 65534: needs root")

SWAP = ".swap"
FLIPPER = Path(__file__).with_name("_flipper.py")


def _prepare(directory: Path, outside: Path, *, owner: int = NOBODY) -> Path:
    """Copy ``directory``'s contents to ``outside/canary-dir`` and put a symlink to it (owned by ``owner``)
    beside ``directory`` as ``<name>.swap``; returns the symlink."""
    canary = outside / "canary-dir"
    if directory.is_dir():
        shutil.copytree(directory, canary, symlinks=True)
    else:
        canary.mkdir(mode=0o755)
    link = directory.with_name(directory.name + SWAP)
    link.symlink_to(canary)
    os.lchown(link, owner, owner)
    return link


@contextmanager
def _flipping(directory: Path, uid: int | None = None) -> Iterator[Callable[[], int]]:
    """Run ``_flipper.py`` on ``directory`` (and ``<directory>.swap``) for the block, as ``uid`` when given;
    yields a function that stops it and returns how many swaps it made."""
    fd = os.open(directory.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        as_uid = [str(uid)] if uid is not None else []
        argv = [sys.executable, str(FLIPPER), str(fd), directory.name, *as_uid]
        child = subprocess.Popen(argv, pass_fds=(fd,), stdout=subprocess.PIPE, text=True)
    finally:
        os.close(fd)
    swaps: list[int] = []

    def stop() -> int:
        if not swaps:
            child.send_signal(signal.SIGTERM)
            out, _ = child.communicate(timeout=30)
            swaps.append(int(out.split()[-1]))
        return swaps[0]

    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        yield stop
    finally:
        if child.poll() is None and not swaps:
            child.kill()
            child.wait(timeout=30)


def _race(templates: dict[str, Template], kind: str, target: str, command: str,
          setup: Callable[[Rig], None] | None = None, *, unprivileged: bool = False) -> None:
    """Run ``command`` :data:`RACE_ITERATIONS` times on fresh copies while ``host/target`` flips; assert no
    escape after each run."""
    template = templates[kind]
    for i in range(RACE_ITERATIONS):
        base = make_base(f"ua-race-{NAME}-")
        try:
            rig = copy_template(template, base / "t")
            outside = base / "t" / "outside"
            if setup is not None:
                setup(rig)
            directory = rig.base / target
            _prepare(directory, outside)
            before = outside_facts(outside)
            with _flipping(directory, NOBODY if unprivileged else None) as stop:
                run = cli(rig, *argv_of(command, template.archive))
                assert stop() > 0, "the flipper never swapped"
            assert "Traceback" not in run.stderr + run.stdout, run
            assert_outside_untouched(outside, before, run)
            assert run.code in (0, 1, 2, 3, 4), (i, run)
        finally:
            shutil.rmtree(base, ignore_errors=True)


def test_results_swapped_for_a_symlink_while_uninstall_removes_them(templates: dict[str, Template]) -> None:
    """``uninstall`` lists ``state_dir/results`` and removes ``<operation>.json`` in it; the directory
    flips with a symlink to a copy outside. A removal by path after the check deletes the copy."""
    _race(templates, "installed", "state/results", "uninstall")


def test_the_agent_directory_swapped_while_upgrade_stages(templates: dict[str, Template]) -> None:
    """``upgrade`` stages the candidate in ``R/lib/NAME`` and renames it onto the inactive slot, then flips
    ``current``; ``R/lib/NAME`` flips with a symlink to a copy outside. A write by path puts the
    candidate (or a link) outside."""
    _race(templates, "installed", f"root/lib/{NAME}", "upgrade")


def _empty_state_dir(rig: Rig) -> None:
    rig.state_dir.mkdir(mode=0o700)


def test_state_dir_swapped_while_install_writes_its_record(templates: dict[str, Template]) -> None:
    """``install`` writes ``state_dir/install.json`` before each thing it creates; ``state_dir`` (made by
    root, empty) flips with a symlink to a directory outside. A write by path puts the record outside."""
    _race(templates, "bare", "state", "install", _empty_state_dir)


def _mirror_of_nobody(rig: Rig) -> None:
    for path in (rig.base / "mirror", rig.base / "mirror" / "bin", rig.base / "mirror" / "bin" / NAME):
        os.chown(path, NOBODY, NOBODY)


def test_a_mirror_directory_its_owner_swaps_during_mirror_sync(templates: dict[str, Template]) -> None:
    """The mirror tree belongs to uid 65534 (a container's root, allowed by design); that user flips
    ``mirror/bin`` with its own symlink to a root-only copy outside while ``upgrade`` syncs the mirror
    (after the switch, and back again on the way out). A copy by path writes root's file outside."""
    _race(templates, "installed", "mirror/bin", "upgrade", _mirror_of_nobody, unprivileged=True)


def test_the_spool_directory_swapped_during_a_spool_pass(templates: dict[str, Template]) -> None:
    """``operator --once`` reads ``spool/op-1.json`` and writes ``op-1.status.json`` beside it; the spool
    directory flips with a symlink to a copy outside. A write by path puts the status outside."""
    _race(templates, "installed", "spool", "operator spool pass")

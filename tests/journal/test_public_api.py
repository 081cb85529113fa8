"""The public surface of ``journal`` (trio's test_exports): every name in ``__all__`` resolves, errors
share one base, and the package imports nothing from upgrade_core or agent (design §2)."""

from __future__ import annotations

import ast
from pathlib import Path

import journal
from journal import errors

PACKAGE = Path(journal.__file__).parent


def test_every_exported_name_resolves() -> None:
    for name in journal.__all__:
        assert getattr(journal, name) is not None, name


def test_errors_share_one_base() -> None:
    for name in journal.__all__:
        obj = getattr(journal, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, errors.JournalStoreError), name


def test_journal_imports_neither_upgrade_core_nor_agent() -> None:
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in {"upgrade_core", "agent"}, (path.name, name)


def test_no_package_imports_another_packages_private_module_or_name() -> None:
    """The rule of ``check_private_imports``: upgrade_core, journal and agent use each other's public
    surface only (no ``pkg._module``, no ``_name`` imported across packages; within a package is fine)."""
    root = PACKAGE.parent
    packages = ("upgrade_core", "journal", "agent")
    bad = []
    for package in packages:
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules, names = [node.module], [a.name for a in node.names]
                elif isinstance(node, ast.Import):
                    modules, names = [a.name for a in node.names], []
                else:
                    continue
                for module in modules:
                    parts = module.split(".")
                    if parts[0] not in packages or parts[0] == package:
                        continue
                    if any(p.startswith("_") for p in parts[1:]) or any(n.startswith("_") for n in names):
                        bad.append(f"{path.relative_to(root)}: {module} {names}")
    assert not bad, bad


def test_live_tail_reads_the_newest_episode_record(tmp_path: Path) -> None:
    assert journal.live_tail(tmp_path / "none") is None
    from journal._reader import segment_name

    (tmp_path / segment_name(1, False)).write_bytes(b"not a segment header")
    assert journal.live_tail(tmp_path) == journal.UNSURE  # only a full replay (and its repair) can tell


def test_live_tail_is_unsure_when_the_callers_test_says_so_of_the_live_segment(tmp_path: Path) -> None:
    """A caller-given test over the intact live segment's bytes, not only the newest record, can leave the
    answer to the full replay (the boot reader's way to keep a candidate an activate left stopped in view,
    design §4.7)."""
    from ._support import Closed, Noted, Opened, build_journal

    build_journal(str(tmp_path), [("e1", Opened("e1")), ("e1", Noted(1, "switched_stopped")),
                                  ("e1", Closed()), ("e2", Opened("e2")), ("e2", Closed())])
    newest = journal.live_tail(tmp_path)
    assert isinstance(newest, bytes) and newest.startswith(b"C")  # e2's close
    assert journal.live_tail(tmp_path, lambda segment: b"switched_stopped" in segment) == journal.UNSURE
    assert journal.live_tail(tmp_path, lambda segment: b"not there" in segment) == newest

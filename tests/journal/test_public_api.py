"""The public surface of ``journal`` (trio's test_exports): every name in ``__all__`` resolves, errors
share one base, and the package imports nothing from upgrade_core or agent (SPEC 2)."""

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
            assert issubclass(obj, errors.JournalError), name


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

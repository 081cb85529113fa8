"""The public surface of upgrade_core (trio's test_exports idea): complete, importable, documented."""

from __future__ import annotations

import inspect

import upgrade_core


def test_all_names_resolve_and_are_documented() -> None:
    for name in upgrade_core.__all__:
        obj = getattr(upgrade_core, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"upgrade_core.{name} has no docstring"


def test_flows_are_coroutine_functions() -> None:
    for fn in (upgrade_core.run_upgrade, upgrade_core.run_install, upgrade_core.self_upgrade_prepare,
               upgrade_core.resume_self_upgrade, upgrade_core.recover):
        assert inspect.iscoroutinefunction(fn)
    for fn in (upgrade_core.fold, upgrade_core.decide, upgrade_core.advance, upgrade_core.next_state):
        assert not inspect.iscoroutinefunction(fn)


def test_core_imports_neither_journal_nor_agent() -> None:
    import pathlib

    pkg = pathlib.Path(upgrade_core.__file__).parent
    for path in pkg.glob("*.py"):
        text = path.read_text()
        assert "import journal" not in text and "from journal" not in text, path
        assert "import agent" not in text and "from agent" not in text, path

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


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    """Any module of the three packages can be the first one imported (a lazy package ``__getattr__`` once
    loaded the whole API for ``from . import _events`` inside ``_fold``'s own import: ImportError)."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(upgrade_core.__file__).parents[1]
    modules = sorted(
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for package in ("upgrade_core", "journal", "agent")
        for path in (root / package).rglob("*.py")
    )
    failed = []
    for module in modules:
        run = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=root, capture_output=True,
                             text=True, timeout=60)
        if run.returncode:
            failed.append(f"{module}: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    assert len(modules) > 50
    assert failed == []

"""The import structure of ``agent/``, ``journal/`` and ``upgrade_core/`` (docs/architecture.md): no cycle,
imports only downward in the layer order, and a command line that only parses, asks the session and prints.

Function-level imports count like any other: an import moved into a function to get past a cycle still ties
the two modules together. Each rule is also run against a small tree with a deliberate back-edge, so the
checker is shown to fail where it must.
"""

from __future__ import annotations

from pathlib import Path

from .imports import Import, cycles, imports, upward

# What agent/cli may not import: the session owns the host, releases, systemd, configuration, files and the
# journal; a command reaches them through it.
CLI_FORBIDDEN = ("agent.host", "agent.release", "agent.systemd", "agent.config", "agent.fs", "journal")
# Imports of the project's own modules placed inside functions, at most. Most of them keep the boot path
# (recover-agent-upgrade with nothing to do) and `--help` light; the rest are being hoisted. Only shrinks.
FUNCTION_LEVEL_IMPORTS_AT_MOST = 82


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in ("agent", "journal", "upgrade_core"):
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    return root


def _cli_rows(edges: list[Import]) -> set[tuple[str, str]]:
    return {(e.importer, e.imported) for e in edges if e.importer.startswith("agent.cli")
            and any(e.imported == p or e.imported.startswith(p + ".") for p in CLI_FORBIDDEN)}


def test_no_import_cycle() -> None:
    assert cycles(list(imports())) == []


def test_imports_run_only_down_the_layers() -> None:
    assert [f"{e.path}:{e.line}: {e.importer} -> {e.imported}" for e in upward(list(imports()))] == []


def test_the_command_line_reaches_the_host_only_through_the_session() -> None:
    assert _cli_rows(list(imports())) == set(), "a command imports below the session"


def test_function_level_imports_do_not_grow() -> None:
    local = [e for e in imports() if e.local]
    assert len(local) <= FUNCTION_LEVEL_IMPORTS_AT_MOST, len(local)


def test_the_checker_finds_a_function_level_cycle_and_a_back_edge(tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "agent/host/__init__.py": "",
        "agent/host/lock.py": "def f():\n    from agent.session import wiring\n",
        "agent/session/__init__.py": "",
        "agent/session/wiring.py": "from agent.host import lock\n",
        "agent/cli/__init__.py": "",
        "agent/cli/main.py": "def g():\n    import agent.fs.durable\n",
        "agent/fs/__init__.py": "",
        "agent/fs/durable.py": "",
    })
    edges = list(imports(root))
    assert cycles(edges) == [["agent.host.lock", "agent.session.wiring"]]
    assert [(e.importer, e.imported, e.local) for e in upward(edges)] == [
        ("agent.host.lock", "agent.session.wiring", True)]
    assert _cli_rows(edges) == {("agent.cli.main", "agent.fs.durable")}

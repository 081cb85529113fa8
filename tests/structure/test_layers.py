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
# The modules that import one of the project's modules inside a function, each with the reason. Anywhere
# else an import stands at the top of the module, so that the structure above is what a reader sees.
FUNCTION_LEVEL_IMPORTS = {
    "agent/cli/main.py": "the boot path: recover-agent-upgrade with nothing to do loads only the standard "
                         "library; the parser, the commands and the error mapping load once there is work",
    "agent/cli/fastpath.py": "the boot path: the session's no-op answer loads only for a plain recover",
    "agent/cli/frozen.py": "the bundle's one executable picks its entry point from argv[0] before loading it",
    "agent/cli/commands/common.py": "rich's progress display and the signal rules load only for writing runs",
    "agent/cli/commands/operator.py": "the operator (and its Kubernetes client) loads only for `operator`",
    "agent/cli/commands/demo.py": "the private-systemd harness loads only for `demo`",
    "agent/config/boot.py": "the boot path: errors and the path rules load only when a file needs them",
    "agent/config/loader.py": "the release and signature code load only for the keys that name them",
    "agent/host/lock.py": "the full recover path takes the lock before it loads the core; errors on use",
    "agent/fs/durable.py": "the lock and the recover path use it before the core is loaded; errors on use",
    "agent/fs/tree.py": "the lock and the boot-time recovery walk with it before the core loads; errors "
                        "on use",
    "agent/session/wiring.py": "each real port loads only when a configuration uses it (httpx and the "
                               "extraction pipeline to fetch, cryptography for [trust], the probes)",
    "agent/session/request.py": "the version helper (agent.release.verify) loads when a request is checked",
    "agent/session/session.py": "the fetch code loads before an upgrade's episode opens, not at start-up; "
                                "the verifier only for quarantine",
    "agent/session/ignition.py": "the release and unit code load only when a config is rendered",
    "agent/release/source.py": "signature checking (cryptography) loads only with a [trust] section",
    "agent/operations/operator.py": "one source loads, the configured one (the Kubernetes client is heavy)",
    "agent/testing/demo.py": "the sandbox loads only when the demo runs",
    "journal/_reader.py": "the boot path reads the live segment's tail without loading attrs",
    "journal/_writer.py": "the reader's segment type loads when a writer opens, not at package import",
}


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


def test_function_level_imports_stand_only_where_a_reason_is_listed() -> None:
    where = {e.path for e in imports() if e.local}
    assert sorted(where - set(FUNCTION_LEVEL_IMPORTS)) == [], "hoist these imports, or list the reason"
    assert sorted(set(FUNCTION_LEVEL_IMPORTS) - where) == [], "no function-level import left: drop the row"


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

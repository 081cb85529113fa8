"""Every import among the project's own packages, read from the source (function-level and type-only ones
included, since an import placed inside a function still ties two modules together)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "journal", "upgrade_core")


@attrs.frozen
class Import:
    """One import statement's edge: ``importer`` -> ``imported`` (module names), where it stands, and
    whether it sits inside a function."""

    importer: str
    imported: str
    path: str
    line: int
    local: bool


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under the project's packages."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(root: Path = ROOT) -> Iterator[Import]:
    """Every edge between two of the project's modules."""
    known = modules(root)
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        local_lines: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        local_lines.add(inner.lineno)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
            for target in targets:
                resolved = _resolve(target, known)
                if resolved is not None and resolved != module:
                    rel = str(path.relative_to(root))
                    yield Import(module, resolved, rel, node.lineno, node.lineno in local_lines)


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
        graph.setdefault(edge.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


LAYERS = (
    "agent.cli",
    "agent.testing",
    "agent.operations",
    "agent.session",
    "agent.host",
    "agent.config",
    "agent.release",
    "agent.systemd",
    "agent.fs",
    "agent",
    "journal",
    "upgrade_core",
)
"""The layer order, top first (docs/architecture.md): a module may import its own layer and the ones below it.
``agent`` stands for the foundation modules directly in the package (errors, redact, logline, process,
groups, https). ``agent.testing`` sits under the command line only because ``upgrade-agent demo`` runs it."""


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of the longest layer name that ``module`` is in."""
    best = -1
    for i, name in enumerate(LAYERS):
        if (module == name or module.startswith(name + ".")) and (best < 0 or len(name) > len(LAYERS[best])):
            best = i
    if best < 0:
        raise ValueError(f"{module} is in no layer")
    return best


def upward(edges: list[Import]) -> list[Import]:
    """The imports that run against the layer order (from a lower layer to a higher one)."""
    return [e for e in edges if layer(e.imported) < layer(e.importer)]

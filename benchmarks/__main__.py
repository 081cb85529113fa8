"""``python -m benchmarks [--json] [NAME...]``: run benchmarks, each in its own child process (design §9).

Discovery: every module ``benchmarks/bench_*.py`` exposes ``BENCHMARKS: dict[str, Callable[[], dict]]``
(name -> function returning a row made with :func:`benchmarks._harness.row`, or
:func:`benchmarks._harness.skipped` with the reason when it cannot run here). Without ``--json`` a rich
table is printed; with it, one JSON object per line. Exit status 0 even when a target is missed (the row
says ``met: false``) or a row is skipped; 2 for an unknown name.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from collections.abc import Callable
from typing import Any

from . import _harness


def discover() -> dict[str, Callable[[], dict[str, Any]]]:
    """Every benchmark of every ``benchmarks/bench_*.py`` module, by name, in module order."""
    found: dict[str, Callable[[], dict[str, Any]]] = {}
    package = importlib.import_module("benchmarks")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("bench_"):
            module = importlib.import_module(f"benchmarks.{info.name}")
            found.update(module.BENCHMARKS)
    return found


def _table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="upgrade-core benchmarks (ratio = ours / baseline, lower is better)")
    for column in ("name", "ours", "baseline", "ratio", "target", "met", "peak RSS MiB"):
        table.add_column(column, no_wrap=True)
    table.add_column("baseline is / extras")
    for r in rows:
        if r.get("skipped"):
            table.add_row(r["name"], "-", "-", "-", "-", "skipped", "-", r["reason"])
            continue
        extra = {k: v for k, v in r.items() if k not in _KEYS}
        table.add_row(
            r["name"],
            f"{r['value']:.4g} {r['unit']}",
            f"{r['baseline_value']:.4g} {r['unit']}",
            f"{r['ratio']:.2f}",
            f"<= {r['target']}",
            "yes" if r["met"] else "[red]no[/red]",
            f"{r['peak_rss_mib']}",
            "\n".join([r["baseline"], *(f"{k}={v}" for k, v in extra.items())]),
        )
    # Off a terminal rich would squeeze the table into 80 columns.
    Console(width=None if sys.stdout.isatty() else 160).print(table)


_KEYS = {"name", "value", "unit", "baseline", "baseline_value", "ratio", "target", "met", "peak_rss_mib"}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--child", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="*", metavar="NAME", help="benchmarks to run (default: all)")
    args = parser.parse_args(argv)
    benchmarks = discover()
    if args.child:
        print(json.dumps(benchmarks[args.child]()), flush=True)
        return 0
    unknown = [n for n in args.names if n not in benchmarks]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(benchmarks)}", file=sys.stderr)
        return 2
    rows = []
    for name in args.names or list(benchmarks):
        r = _harness.run_in_child(name)
        rows.append(r)
        if args.json:
            print(json.dumps(r), flush=True)
    if not args.json:
        _table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The fetch path does not load httpx's command-line client (``agent/__init__.py``; design §9, the
``fetch.extract`` rows): ``rich.console``, ``click`` and ``pygments`` stay out of a process that stages a
release, while httpx itself works; a process that imported httpx before the agent keeps httpx as it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI_MODULES = ["click", "httpx._main", "pygments", "rich.console", "rich.progress"]

PROBE = """
import json, sys
first = sys.argv[1]
if first == "httpx":
    import httpx
import agent.release.source
import httpx
print(json.dumps({
    "loaded": sorted(m for m in json.loads(sys.argv[2]) if sys.modules.get(m) is not None),
    "client": httpx.AsyncClient.__name__,
}))
"""


def _loaded(first: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, first, json.dumps(CLI_MODULES)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_agent_fetch_path_leaves_httpx_cli_unloaded() -> None:
    assert _loaded("agent") == {"loaded": [], "client": "AsyncClient"}


def test_httpx_imported_first_is_left_whole() -> None:
    loaded = _loaded("httpx")["loaded"]
    assert isinstance(loaded, list)
    # whatever httpx loads for its CLI here (the extras may be absent), the agent did not take it away
    import importlib.util

    if all(importlib.util.find_spec(m) is not None for m in ("click", "rich", "pygments")):
        assert "httpx._main" in loaded

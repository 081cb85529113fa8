"""The README's embedding example (docs/embedding.md), run as written against a real agent under the
private systemd.

The ```python block under the README's "Embedding" heading is extracted and executed unchanged; the test
then reads the outcome from the host itself: the links, the slot's bytes, the unit's MainPID running the
current link, and the version the agent serves.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from . import agent_env
from .agent_env import AgentEnv

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    """The first ```python block after the ``## Embedding`` heading."""
    text = README.read_text()
    section = text.split("\n## Embedding", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "README: no python block under ## Embedding"
    return match.group(1)


def test_readme_embedding_example_upgrades_a_real_agent(make_env: Callable[..., AgentEnv]) -> None:
    env = make_env()
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    old_pid = env.assert_running("blue", v1)

    namespace: dict[str, Any] = {}
    exec(compile(readme_example(), str(README), "exec"), namespace)
    result = anyio.run(namespace["upgrade"], str(env.config), v2.url, v2.sha256)

    assert (result.result, result.from_version, result.to_version, result.slot) == (
        "committed", "1.0.0", "1.1.0", "green",
    )
    assert env.assert_running("green", v2) != old_pid
    assert env.link("last-good") == f"{env.name}-blue"
    status = env.cli("status")
    assert status.json is not None and status.json["current"]["version"] == "1.1.0"
    assert status.json["episode"] is None

"""Suite-wide fixtures: every ``@pytest.mark.anyio`` test runs on both anyio backends (asyncio, trio).

The suite installs agents from this checkout's ``.venv`` into private systemds and temporary host roots on
purpose, so it sets ``UPGRADE_AGENT_ALLOW_UNSTABLE_PATHS=1`` for every process it starts (the same as
``install --allow-unstable-paths``, :mod:`agent.systemd.stable_paths`). ``tests/cli/test_stable_paths.py``
removes it to prove the refusal.
"""

from __future__ import annotations

import os

import pytest

from agent.systemd.stable_paths import ALLOW_ENV

os.environ[ALLOW_ENV] = "1"

pytest_plugins = ["tests.bundle"]  # the session's runtime bundle fixture, ``runtime_bundle``


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each anyio test once per backend; ``upgrade_core`` and ``journal`` must work on both."""
    return str(request.param)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the private systemd (the ``sandbox`` fixture) carries the ``systemd`` marker."""
    for item in items:
        if "sandbox" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.systemd)

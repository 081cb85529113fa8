"""Suite-wide fixtures: every ``@pytest.mark.anyio`` test runs on both anyio backends (asyncio, trio)."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each anyio test once per backend; ``upgrade_core`` and ``journal`` must work on both."""
    return str(request.param)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the private systemd (the ``sandbox`` fixture) carries the ``systemd`` marker."""
    for item in items:
        if "sandbox" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.systemd)

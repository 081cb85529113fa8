"""Suite-wide fixtures: every ``@pytest.mark.anyio`` test runs on both anyio backends (asyncio, trio).

The suite installs agents from this checkout's ``.venv`` into private systemds and temporary host roots on
purpose, so it sets ``UPGRADE_AGENT_ALLOW_UNSTABLE_PATHS=1`` for every process it starts (the same as
``install --allow-unstable-paths``, :mod:`agent.systemd.stable_paths`). ``tests/cli/test_stable_paths.py``
removes it to prove the refusal.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import Phase, settings

from agent.systemd.stable_paths import ALLOW_ENV

os.environ[ALLOW_ENV] = "1"

# `make mutation` (docs/mutation.md) runs with --hypothesis-profile=mutation: every mutant meets the same
# examples, no example database carries one mutant's counterexample over to the next, and a failing example
# is not shrunk (the verdict is the same; shrinking a mutant's counterexample costs minutes)
settings.register_profile("mutation", derandomize=True, database=None,
                          phases=(Phase.explicit, Phase.reuse, Phase.generate))

# the session's runtime bundle (``runtime_bundle``) and real Kubernetes API server (``real_kube``)
pytest_plugins = ["tests.bundle", "tests.kube.backends"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each anyio test once per backend; ``upgrade_core`` and ``journal`` must work on both."""
    return str(request.param)


# `make mutation` runs each mutant's tests with -x: the files that take longest run last, so that a mutant one
# of the quick golden tests kills costs a fraction of a second (the order changes no verdict, only its cost)
_MUTATION_LAST = {
    "test_rule_pairs.py": 1, "test_prefix_recovery.py": 1, "test_sealing.py": 1, "test_codec_fast.py": 1,
    "test_writer_thread.py": 1, "test_replay_properties.py": 2,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the private systemd (the ``sandbox`` fixture) carries the ``systemd`` marker."""
    for item in items:
        if "sandbox" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.systemd)
    if os.environ.get("UPGRADE_CORE_MUTATION") == "1":  # set by scripts/mutation.py
        items.sort(key=lambda item: _MUTATION_LAST.get(item.path.name, 0))

"""The self-contained runtime (``make bundle``, ``scripts/build_bundle.py``), built once per test session.

:func:`runtime_bundle` builds the archive (or takes it from ``.cache/bundle/<digest of the sources>``, so an
unchanged tree costs one hash), unpacks it with ``tar`` into the session's temporary directory as an operator
would, and returns the unpacked ``upgrade-core-runtime`` directory. Registered for the whole suite by
``tests/conftest.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 900.0  # a cold PyInstaller build takes ~30 s on 2 cores; this is a net against a hang


def runtime_archive() -> Path:
    """Build (or find in the cache) the runtime archive; its path."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_bundle.py")], cwd=REPO, capture_output=True,
        text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return Path(done.stdout.strip())


@pytest.fixture(scope="session")
def runtime_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runtime unpacked into a fresh temporary directory: ``.../upgrade-core-runtime``."""
    archive = runtime_archive()
    where = tmp_path_factory.mktemp("runtime")
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(where)], check=True, timeout=120)
    return where / "upgrade-core-runtime"

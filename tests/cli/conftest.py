"""Fixtures of the CLI tests: one agent per test on a temp host (``tests/cli/_rig.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ._rig import Rig


def _name(request: pytest.FixtureRequest) -> str:
    """A unique, valid agent name per test (design §3: ``[a-z0-9][a-z0-9._-]{0,62}``)."""
    return "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]


@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest) -> Rig:
    """A bare host: the config only."""
    return Rig(tmp_path, _name(request))


@pytest.fixture
def installed_rig(tmp_path: Path, request: pytest.FixtureRequest) -> Rig:
    """A host with the design §3 layout made by hand (``Rig.install_by_hand``)."""
    r = Rig(tmp_path, _name(request))
    r.install_by_hand()
    return r

"""Fixtures of the attack tests: the templates, made once per session by the real CLI
(:func:`tests.attack._hosts.make_templates`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from ._hosts import Template, make_base, make_templates


@pytest.fixture(scope="session")
def templates() -> Iterator[dict[str, Template]]:
    """``{"installed": ..., "bare": ...}`` (see :func:`make_templates`); removed at the end."""
    if os.geteuid() != 0:
        pytest.skip("the attacks plant files as uid 65534: needs root")
    base = make_base("ua-attack-")
    try:
        yield make_templates(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)

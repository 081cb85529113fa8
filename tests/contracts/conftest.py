"""Fixtures of the contract suites: the private systemd is the session fixture of ``tests/systemd``."""

from __future__ import annotations

from tests.systemd.conftest import sandbox

__all__ = ["sandbox"]

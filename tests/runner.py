"""``make test``: run the whole suite and report how many real-systemd tests ran.

As root, a run in which no test marked ``systemd`` passed is a failure (design §8): the private systemd
harness must boot, never silently skip. Extra arguments are passed to pytest.
"""

from __future__ import annotations

import os
import sys

import pytest


class _SystemdCounter:
    """Counts passed, failed and skipped tests that carry the ``systemd`` marker (not the directory name)."""

    def __init__(self) -> None:
        self.marked: set[str] = set()
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.marked = {item.nodeid for item in items if item.get_closest_marker("systemd") is not None}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid not in self.marked:
            return
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed:
            self.failed += 1
        elif report.skipped:
            self.skipped += 1


def main(argv: list[str]) -> int:
    counter = _SystemdCounter()
    rc = pytest.main(["-p", "no:cacheprovider", *argv], plugins=[counter])
    print(
        f"systemd tests: {counter.passed} passed, {counter.failed} failed, {counter.skipped} skipped",
        flush=True,
    )
    if os.geteuid() == 0 and counter.passed == 0 and not argv:
        print("make test: as root, zero systemd tests ran; the private systemd harness must work", flush=True)
        return 1
    return int(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

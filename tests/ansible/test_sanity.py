"""``ansible-test sanity`` for the collection under ``ansible/`` (``scripts/ansible_sanity.py``: what it needs
and how it runs without ansible-test's download host) passes every test, with only the ignores
``tests/sanity/ignore-2.19.txt`` lists (the collection's Apache-2.0 licence instead of GPLv3)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SANITY_TIMEOUT_S = 1800.0  # the first run creates a virtual environment per sanity test


def test_ansible_test_sanity_passes() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "ansible_sanity.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=SANITY_TIMEOUT_S, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    ran = re.findall(r'^Running sanity test "([a-z0-9-]+)"', out, flags=re.M)
    for expected in ("validate-modules", "pylint", "no-assert", "ansible-doc", "import", "pep8", "yamllint"):
        assert expected in ran, ran
    assert not re.search(r"^(ERROR|FATAL):", out, flags=re.M), out[-6000:]

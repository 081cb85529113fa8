"""``make ansible-sanity``: ``ansible-test sanity`` for the collection under ``ansible/``, runnable where
ansible-test's own download host is not reachable.

What ansible-test needs: the ``ansible-core`` of the test extra (``ansible-test`` comes with it), Python's
``venv`` and ``ensurepip`` (the bootstrap checks both), and the package index, from which each sanity test
installs its pinned tools (pylint, yamllint, voluptuous, ...) into a virtual environment of its own. The one
thing it downloads from elsewhere is ``get-pip.py``, which it uses to put pip into those empty environments;
this script writes a stand-in there first (under ``.cache/ansible-test``, used as ansible-test's ``HOME``, so
nothing lands in the real home directory): Python's own ``ensurepip``, then ``pip install`` of what
ansible-test asks for (its pinned pip) from the index.

Usage: ``python scripts/ansible_sanity.py [ansible-test sanity options]``; exit status is ansible-test's. The
first run creates the environments (a few minutes); later runs reuse them. Its results go to the collection's
``tests/output/`` (git-ignored). ``tests/ansible/test_sanity.py`` runs it in ``make test``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTION = ROOT / "ansible" / "ansible_collections" / "upgrade_core" / "fleet"
HOME = ROOT / ".cache" / "ansible-test"

_STAND_IN = '''\
"""Stands in for get-pip.py (written by upgrade-core's scripts/ansible_sanity.py): pip from Python's own
ensurepip, then the packages ansible-test asks for, from the configured package index."""
import runpy
import subprocess
import sys

subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
sys.argv = ["pip", "install", *[a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]]
runpy.run_module("pip", run_name="__main__", alter_sys=True)
'''


def pip_version() -> str:
    """The pip version ansible-test bootstraps into its environments for this Python."""
    from ansible_test._internal.python_requirements import get_venv_packages

    python = types.SimpleNamespace(version=f"{sys.version_info.major}.{sys.version_info.minor}")
    return get_venv_packages(python)["pip"]  # type: ignore[arg-type]


def main(argv: list[str]) -> int:
    cache = HOME / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"get_pip_{pip_version().replace('.', '_')}.py").write_text(_STAND_IN)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    ansible_test = Path(sys.executable).with_name("ansible-test")
    env = {**os.environ, "HOME": str(HOME)}
    command = [str(ansible_test), "sanity", "--python", python, "--color", "no", *argv]
    return subprocess.run(command, cwd=COLLECTION, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

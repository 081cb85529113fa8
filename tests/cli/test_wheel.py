"""``upgrade-agent demo`` works from an installed wheel: the harness (private systemd, release builder,
loopback server, sample agent) is packaged under ``agent.testing`` and nothing is imported from
``examples/`` or ``tests/`` at run time.

The wheel is built offline from a copy of the package sources (so the checkout gets no ``build/``), installed
with ``pip install --no-deps --target``, and imported by a child interpreter whose ``sys.path`` is that
directory plus the project venv's site-packages (for the dependencies) and never the checkout; the editable
install's import hook is removed in the child so it cannot resolve ``agent`` to the checkout either.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
stdlib = [p for p in sys.path if "site-packages" not in p and not p.startswith(CHECKOUT)]
sys.path[:] = [TARGET, *stdlib, SITE]
# (the project venv, and so SITE, lives inside the checkout: only its site-packages is allowed)
import tempfile
from pathlib import Path

import agent.testing.demo
import agent.testing.sandbox
from agent.testing.releases import SAMPLE_AGENT, build_release, sha256_file

assert agent.testing.demo.__file__.startswith(TARGET), agent.testing.demo.__file__
assert SAMPLE_AGENT.is_file() and str(SAMPLE_AGENT).startswith(TARGET), SAMPLE_AGENT
with tempfile.TemporaryDirectory() as out:
    archive = build_release(Path(out), "1.2.3")
    assert len(sha256_file(archive)) == 64
import agent.cli.main
import agent.cli.commands
assert "demo" in agent.cli.commands.COMMANDS
leaked = sorted(
    name for name, module in list(sys.modules.items())
    if name.split(".")[0] in ("examples", "tests")
    or ((getattr(module, "__file__", None) or "").startswith(CHECKOUT)
        and not (getattr(module, "__file__", None) or "").startswith(SITE))
)
assert not leaked, leaked
print("ok")
"""


def test_the_installed_wheel_builds_a_release_without_the_checkout(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in ("upgrade_core", "journal", "agent"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist), str(src)]
    subprocess.run(build, check=True, capture_output=True, timeout=120)
    (wheel,) = dist.glob("upgrade_core-*.whl")
    target = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=120)
    assert not (target / "examples").exists() and not (target / "tests").exists()
    code = (f"TARGET = {str(target)!r}\nSITE = {sysconfig.get_paths()['purelib']!r}\n"
            f"CHECKOUT = {str(ROOT) + '/'!r}\n" + CHILD)
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd="/tmp", capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"

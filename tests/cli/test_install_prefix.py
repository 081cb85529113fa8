"""``make install PREFIX=...`` (docs/install.md, classic host): the wheel built from this
checkout lands in a venv at the prefix, runs without the checkout, and the units it renders name the prefix's
``recover-agent-upgrade``. The prefix here is a temporary directory, so ``install`` itself refuses it unless
told otherwise (:mod:`agent.systemd.stable_paths`), which is checked too. Bad prefixes: exit 2, one line.

The dependencies come from the package index the machine's pip is configured with (or its cache).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agent.systemd.stable_paths import ALLOW_ENV

from ._rig import REPO, Rig

INSTALL_TIMEOUT_S = 300.0


def _clean_env() -> dict[str, str]:
    """No PYTHONPATH, no config, no override: what an operator's shell would have."""
    drop = ("PYTHONPATH", "PYTHONHOME", "UPGRADE_AGENT_CONFIG", ALLOW_ENV, "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(argv: list[str], cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=60,
                          check=check)


def _make_install(prefix: str) -> subprocess.CompletedProcess[str]:
    # -o: never re-run the bootstrap from a test (the stamp is taken as up to date)
    return subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.stamp", "install", f"PREFIX={prefix}"],
        cwd=REPO, env=_clean_env(), capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False,
    )


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``make install`` into a fresh temporary prefix for the module."""
    where = tmp_path_factory.mktemp("prefix") / "upgrade-core"
    done = _make_install(str(where))
    assert done.returncode == 0, done.stderr[-3000:]
    return where


def test_the_prefix_holds_the_three_commands_and_runs_off_the_checkout(prefix: Path, tmp_path: Path) -> None:
    for name in ("upgrade-agent", "recover-agent-upgrade", "agent-upgrade"):
        assert os.access(prefix / "bin" / name, os.X_OK), name
    done = _run([str(prefix / "bin" / "upgrade-agent"), "--version", "--json"], cwd=tmp_path)
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert json.loads(done.stdout) == {"version": version}
    where = _run([str(prefix / "bin" / "python"), "-c", "import agent; print(agent.__file__)"], cwd=tmp_path)
    assert where.stdout.strip().startswith(str(prefix) + "/"), where.stdout
    # the Kubernetes client is an optional extra (EXTRAS=kubernetes): a plain install does not carry it
    probe = "import importlib.util; print(importlib.util.find_spec('kubernetes_asyncio'))"
    assert _run([str(prefix / "bin" / "python"), "-c", probe], cwd=tmp_path).stdout == "None\n"
    # the venv's interpreter is the one PYTHON named (default /usr/bin/python3), not the checkout's
    assert not os.path.realpath(prefix / "bin" / "python").startswith(str(REPO))


def test_units_name_the_prefix_and_install_refuses_a_temporary_prefix(prefix: Path, tmp_path: Path) -> None:
    rig = Rig(tmp_path, "prefix-agent")
    exe = str(prefix / "bin" / "recover-agent-upgrade")
    tool = str(prefix / "bin" / "upgrade-agent")
    units = _run([tool, "--config", str(rig.config), "--json", "units"])
    recover = json.loads(units.stdout)["units"]["prefix-agent-recover.service"]
    assert f"ExecStart={exe} --config {rig.config} --trigger on-failure" in recover
    noop = _run([exe, "--config", str(rig.config), "--json", "--trigger", "boot"], check=False)
    assert noop.returncode == 0 and json.loads(noop.stdout)["result"] == "noop", noop.stderr
    # the boot-time no-op loads neither re (pip's entry scripts did, to strip ".exe") nor json, typing,
    # tomllib: the installed layout's own budget (design §9 recover.noop)
    python = str(prefix / "bin" / "python")
    traced = _run([python, "-X", "importtime", exe, "--config", str(rig.config), "--trigger", "boot"])
    loaded = {line.rsplit("|", 1)[-1].strip() for line in traced.stderr.splitlines() if "|" in line}
    assert traced.stdout == "nothing to recover: no open episode\n"
    assert not loaded & {"re", "json", "typing", "tomllib", "enum"}, sorted(loaded)
    assert Path(exe).read_text().splitlines()[0] == f"#!{python}"
    binary = tmp_path / "agent-binary"
    binary.write_text("#!/bin/sh\necho 1.0.0\n")
    binary.chmod(0o755)
    refused = _run([tool, "--config", str(rig.config), "install", "--archive", str(binary)], check=False)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and exe in refused.stderr and "temporary" in refused.stderr
    assert not rig.state_dir.exists() and not rig.unit_dir.exists()


@pytest.mark.parametrize(("prefix_arg", "words"), [
    ("", "PREFIX is required"),
    ("relative/dir", "must be an absolute path"),
    ("/usr/local/upgrade-core", "is under /usr"),
])
def test_bad_prefixes_are_refused_with_one_line(prefix_arg: str, words: str) -> None:
    done = _make_install(prefix_arg)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if not line.startswith("make")]
    assert len(lines) == 1 and words in lines[0], done.stderr
    assert not Path("/usr/local/upgrade-core").exists()

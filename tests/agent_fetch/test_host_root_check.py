"""The candidate's host-root check (docs/candidate.md, "A runtime that checks its host root"; the seeds'
``<candidate> host-root``): with ``agent.host_root_args`` the candidate is run once more, by the version
command's rules (its own process group, killed at the end or at ``verify.timeout_s``), and an answer other
than this host's root refuses it, naming both. Real processes; the real runtime's own ``host-root`` answer
is checked through the CLI of this worktree.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio
import pytest

from agent.release.verify import VerifierImpl
from tests._proc import wait_dead
from upgrade_core.errors import HostRootMismatchError, VerifyError, VerifyTimeoutError

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 20.0


def _candidate(tmp_path: Path, answer: str) -> str:
    """A candidate whose ``version`` prints 1.2.3 and whose ``host-root`` runs ``answer`` (shell)."""
    path = tmp_path / "candidate"
    path.write_text(f'#!/bin/sh\nif [ "$1" = version ]; then echo 1.2.3; exit 0; fi\n'
                    f'if [ "$1" = host-root ]; then {answer}\nfi\nexit 64\n')
    path.chmod(0o755)
    return str(path)


async def test_the_same_root_passes_as_a_path_or_as_json(tmp_path: Path) -> None:
    verifier = VerifierImpl(host_root_args=("host-root",), host_root="/opt/upgrade-agent")
    plain = _candidate(tmp_path, "echo /opt/upgrade-agent; exit 0")
    assert await verifier.verify(plain, "1.2.3") == "1.2.3"
    (tmp_path / "j").mkdir()
    as_json = _candidate(tmp_path / "j", "echo '{\"host_root\": \"/opt/upgrade-agent/\"}'; exit 0")
    assert await verifier.verify(as_json, None) == "1.2.3"


async def test_another_root_is_refused_naming_both(tmp_path: Path) -> None:
    path = _candidate(tmp_path, "echo /usr/local; exit 0")
    verifier = VerifierImpl(host_root_args=("host-root",), host_root="/opt/upgrade-agent")
    with pytest.raises(HostRootMismatchError) as caught:
        await verifier.verify(path, None)
    want = f"{path}: answers host root /usr/local; this host's root is /opt/upgrade-agent"
    assert str(caught.value) == want
    assert not caught.value.condemns_release


@pytest.mark.parametrize(("answer", "words"), [
    ("exit 3", "host-root command host-root exited with status 3"),
    ("exit 0", "host-root command printed no host root"),
    ("echo relative/root; exit 0", 'printed no host root: "relative/root"'),
    ("echo '{\"root\": 1}'; exit 0", "printed no host root"),
])
async def test_no_usable_answer_is_refused(tmp_path: Path, answer: str, words: str) -> None:
    path = _candidate(tmp_path, answer)
    with pytest.raises(VerifyError, match=words):
        await VerifierImpl(host_root_args=("host-root",), host_root="/opt/x").verify(path, None)


async def test_a_hanging_answer_is_bounded_and_its_group_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    path = _candidate(tmp_path, f"sleep 1000 &\necho $! > {pids}\nsleep 1000")
    started = time.monotonic()
    with anyio.fail_after(0.5 + HANG_GUARD_S), pytest.raises(VerifyTimeoutError, match="host-root command"):
        await VerifierImpl(timeout_s=0.5, host_root_args=("host-root",), host_root="/x").verify(path, None)
    assert time.monotonic() - started >= 0.5
    assert wait_dead(int(pids.read_text().split()[0]))


async def test_without_host_root_args_it_is_never_asked(tmp_path: Path) -> None:
    asked = tmp_path / "asked"
    path = _candidate(tmp_path, f"touch {asked}; echo /elsewhere; exit 0")
    assert await VerifierImpl().verify(path, None) == "1.2.3"
    assert not asked.exists()


@pytest.mark.parametrize("same", [True, False])
async def test_the_runtime_answers_host_root_as_today(tmp_path: Path, same: bool) -> None:
    """The real ``upgrade-agent --config CFG host-root`` (this worktree's CLI, in a wrapper standing in for
    the runtime's executable) is what the check reads; a configuration naming another root is refused."""
    root = tmp_path / "R"
    config = tmp_path / "cand.toml"
    answered = root if same else tmp_path / "other"
    config.write_text(f'[agent]\nname = "demo-agent"\n\n[host]\nroot = "{answered}"\n'
                      f'state_dir = "{tmp_path / "state"}"\nlock_path = "{tmp_path / "run" / "x.lock"}"\n')
    runtime = tmp_path / "upgrade-agent"
    runtime.write_text(f'#!/bin/sh\nif [ "$1" = version ]; then echo upgrade-agent 9.9.9; exit 0; fi\n'
                       f'PYTHONPATH={REPO} exec {sys.executable} -m agent.cli.main "$@"\n')
    runtime.chmod(0o755)
    verifier = VerifierImpl(host_root_args=("--config", str(config), "host-root"), host_root=str(root),
                            timeout_s=60)
    if same:
        assert await verifier.verify(str(runtime), None) == "9.9.9"
    else:
        words = f"answers host root {answered}; this host's root is {root}"
        with pytest.raises(HostRootMismatchError, match=words):
            await verifier.verify(str(runtime), None)

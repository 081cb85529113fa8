"""design §4.3 step 10 through the real CLI: a signal (SIGINT, SIGTERM, SIGHUP) before ``switch intended``
aborts (exit 1), the host untouched; the second signal exits 130 at once, leaving the episode to ``recover``.

The upgrade is held inside its download by a loopback server that sends the headers and a first chunk,
then stalls, so the signal provably lands before any switch.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.agent_fetch import _servers as servers

from ._rig import PYTHON, REPO, Rig, cli_env


@pytest.fixture
def rig(installed_rig: Rig) -> Rig:
    """Every case here starts from an installed host."""
    return installed_rig


@pytest.fixture
def stalling() -> Iterator[servers.LoopbackServer]:
    with servers.stalling() as server:
        yield server


def _start_upgrade(rig: Rig, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PYTHON, "-m", "agent.cli.main", "--config", str(rig.config), "--json", "upgrade", "--archive", url,
         "--operation", "sig-op"],
        cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_for_download(proc: subprocess.Popen[str], rig: Rig, server: servers.LoopbackServer) -> None:
    """Poll until the episode is durable (the journal file holds it) and the server has the archive's
    request: the fetch has begun and is stalled there, whatever the machine's load."""
    deadline = time.monotonic() + 20
    journal = rig.state_dir / "journal"
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        opened = journal.is_dir() and any(p.stat().st_size > 64 for p in journal.iterdir())
        if opened and server.requests:
            return
        time.sleep(0.05)
    pytest.fail("the upgrade never opened its episode or never asked for the archive")


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_one_signal_before_the_switch_aborts_with_exit_1(
    rig: Rig, stalling: servers.LoopbackServer, signum: signal.Signals
) -> None:
    """SIGHUP (an operator's ssh session dropping, case C26) is handled like SIGTERM and SIGINT."""
    server = stalling
    before = rig.host_facts()
    proc = _start_upgrade(rig, server.url("/a.tar.gz"))
    _wait_for_download(proc, rig, server)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, (out, err)
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    payload = json.loads(lines[0])
    assert payload["result"] == "aborted" and payload["operation"] == "sig-op", payload
    assert "interrupted" in payload["reason"], payload
    assert [p for p, _h in server.requests] == ["/a.tar.gz"]  # the signal landed inside the download
    assert "Traceback" not in err
    assert rig.host_facts() == before
    assert rig.staging_leftovers() == []
    result_file = json.loads((rig.state_dir / "results" / "sig-op.json").read_text())
    assert result_file["result"] == "aborted"
    # The episode is closed: a recover has nothing to do.
    again = rig.cli("recover")
    assert again.code == 0 and again.payload()["result"] == "noop"


def test_a_second_signal_exits_130_at_once(
    rig: Rig, stalling: servers.LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = stalling
    proc = _start_upgrade(rig, server.url("/a.tar.gz"))
    _wait_for_download(proc, rig, server)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    # Either the second signal arrived while the abort was still running (130, episode left to recover),
    # or after the abort finished (1); both leave no switch, and a recover closes anything left open.
    assert proc.returncode in (1, 130), (proc.returncode, out, err)
    assert len(out.strip().splitlines()) == 1, out
    assert "Traceback" not in err
    if proc.returncode == 130:
        assert json.loads(out)["exit_code"] == 130
    done = rig.cli("recover")
    assert done.code == 0
    assert rig.staging_leftovers() == []

"""``upgrade-agent operator`` through the real CLI, without systemd: configuration errors, SIGTERM while idle
and during an operation's download (design §4.3 step 10 applied to the operator), and the status it leaves.

The operation's download is held by a loopback server that sends the headers and a first chunk, then
stalls, so the signal provably lands before any switch.

The last tests run the operator in process (the real session, spool and journal) to place a stop exactly
where a signal can land between two of its scopes: while the spool is being read, and while the InProgress
status is being written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import pytest

from agent.operations import operator as operator_module
from agent.operations.model import Operation, SourceError
from agent.session.session import Session
from tests.agent_fetch import _servers as servers
from upgrade_core import OperationStatus

from ._rig import PYTHON, REPO, Rig, cli_env

SHA = "0" * 64


@pytest.fixture
def stalling() -> Iterator[servers.LoopbackServer]:
    with servers.stalling() as server:
        yield server


def with_spool(rig: Rig, *, create: bool = True) -> Path:
    spool = rig.base / "spool"
    rig.write_config(
        f'[operations]\nsource = "spool"\nspool_dir = "{spool}"\nnode_name = "n1"\npoll_s = 0.1\n')
    if create:
        spool.mkdir(mode=0o700)
    return spool


def put(spool: Path, op: str, doc: object) -> None:
    tmp = spool / f".{op}.tmp"
    tmp.write_text(json.dumps(doc))
    tmp.chmod(0o600)
    os.rename(tmp, spool / f"{op}.json")


def start(rig: Rig) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PYTHON, "-m", "agent.cli.main", "--config", str(rig.config), "--json", "operator"],
        cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_until(proc: subprocess.Popen[str], done: object, what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if callable(done) and done():
            return
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"{what}: {proc.communicate()}")


def test_without_operations_configured_it_is_exit_2_naming_the_key(installed_rig: Rig) -> None:
    out = installed_rig.cli("operator")
    assert out.code == 2
    assert out.stderr.count("\n") == 1 and "operations.source: not configured" in out.stderr
    assert "Traceback" not in out.stderr


def test_sigterm_while_idle_exits_0_at_once(installed_rig: Rig) -> None:
    spool = with_spool(installed_rig, create=False)
    proc = start(installed_rig)
    wait_until(proc, spool.is_dir, "the operator's first look at the spool (it creates the directory)")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert json.loads(out) == {"stopped": True}
    assert "SIGTERM: stopping" in err and "Traceback" not in err


def test_sigterm_during_a_download_aborts_reports_failed_and_exits_0(
    installed_rig: Rig, stalling: servers.LoopbackServer
) -> None:
    rig = installed_rig
    spool = with_spool(rig)
    before = rig.host_facts()
    put(spool, "op-stall", {"agent": rig.name, "nodeName": "n1",
                            "archive": {"url": stalling.url("/a.tar.gz"), "sha256": SHA}})
    proc = start(rig)
    in_progress = spool / "op-stall.status.json"
    wait_until(proc, lambda: in_progress.exists() and json.loads(in_progress.read_text())["phase"]
               == "InProgress" and bool(stalling.requests), "the download to begin")
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    status = json.loads(in_progress.read_text())
    assert (status["phase"], status["result"]) == ("Failed", "aborted"), status
    assert "interrupted" in status["message"]
    assert isinstance(status["journal_seq"], int)
    assert rig.host_facts() == before
    assert rig.staging_leftovers() == []
    assert rig.cli("recover").payload()["result"] == "noop"  # nothing left open
    assert "Traceback" not in err


def test_a_release_the_trust_rules_refuse_is_failed_and_the_host_untouched(installed_rig: Rig) -> None:
    import hashlib
    import io
    import tarfile

    from agent.config.boot import machine_arch

    rig = installed_rig
    keys = rig.base / "keys"
    keys.mkdir()
    subprocess.run(["minisign", "-G", "-W", "-p", str(keys / "root.pub"), "-s", str(keys / "root.key")],
                   check=True, capture_output=True)
    root_key = (keys / "root.pub").read_text().splitlines()[1]
    archive = rig.base / "release.tar.gz"
    data = b"#!/bin/sh\necho 2.0.0\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(f"{rig.name}-linux-{machine_arch()}")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    archive.write_bytes(buf.getvalue())
    spool = rig.base / "spool"
    spool.mkdir(mode=0o700)
    rig.write_config(f'[trust]\nroot_keys = ["{root_key}"]\n\n[operations]\nsource = "spool"\n'
                     f'spool_dir = "{spool}"\nnode_name = "n1"\n')
    before = rig.host_facts()
    put(spool, "unsigned", {"agent": rig.name, "archive": {
        "url": str(archive), "sha256": hashlib.sha256(archive.read_bytes()).hexdigest()}})
    out = rig.cli("operator", "--once")
    assert out.code == 0, out.stderr
    status = json.loads((spool / "unsigned.status.json").read_text())
    assert (status["phase"], status["result"]) == ("Failed", "aborted"), status
    assert "no signature" in status["message"], status["message"]
    assert rig.host_facts() == before


def test_an_operation_whose_status_cannot_be_written_blocks_nothing_behind_it(installed_rig: Rig) -> None:
    rig = installed_rig
    spool = with_spool(rig)
    victim = rig.base / "victim"
    victim.write_text("not the operator's")
    elsewhere = {"agent": rig.name, "nodeName": "elsewhere", "archive": {"url": "x", "sha256": SHA}}
    put(spool, "a-stuck", elsewhere)
    os.utime(spool / "a-stuck.json", (1_000, 1_000))  # the oldest: taken first
    os.symlink(victim, spool / "a-stuck.status.json")
    put(spool, "b-next", elsewhere)
    out = rig.cli("operator", "--once")
    assert out.code == 0, out.stderr
    assert victim.read_text() == "not the operator's"
    assert (spool / "a-stuck.status.json").is_symlink()
    status = json.loads((spool / "b-next.status.json").read_text())
    assert status["phase"] == "Failed" and "addressed to node elsewhere" in status["message"]
    assert out.stderr.count("a-stuck.json: cannot publish Failed") == 1, out.stderr


def test_once_with_a_spool_that_is_not_ours_is_exit_3_in_one_line(installed_rig: Rig) -> None:
    spool = with_spool(installed_rig)
    spool.chmod(0o777)
    out = installed_rig.cli("operator", "--once")
    assert out.code == 3, out
    assert out.stderr.count("\n") == 2, out.stderr  # the operator's start line, then the error
    assert "writable by group or others" in out.stderr and "Traceback" not in out.stderr


# -- a stop landing between two of the operator's scopes (in process: the real session, spool and journal) --
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("failing", [False, True], ids=["before-the-idle-wait", "before-the-back-off"])
async def test_a_stop_during_the_look_at_the_spool_ends_the_loop(
    installed_rig: Rig, monkeypatch: pytest.MonkeyPatch, failing: bool
) -> None:
    """The operator's first look at the spool asks it to stop (as the CLI's SIGTERM handler does) while the
    look is still running, then returns (or, ``failing``, raises SourceError). The loop must end at once:
    neither the idle wait nor the back-off may start."""
    rig = installed_rig
    with_spool(rig)
    monkeypatch.setattr(operator_module, "BACKOFF_S", (3600.0,))  # a back-off that began outlasts the test
    session = Session.load(str(rig.config))
    source = await operator_module.open_source(session)
    operator = operator_module.Operator(session, source)
    real_snapshot = source.snapshot

    async def look_then_stop() -> Sequence[Operation]:
        ops = await real_snapshot()
        operator.request_stop("SIGTERM")  # no idle scope is in place yet: nothing to cancel
        if failing:
            raise SourceError(f"{source.label}: unreadable")
        return ops

    monkeypatch.setattr(source, "snapshot", look_then_stop)
    try:
        with anyio.fail_after(20):  # the spool's idle wait is 60 s (its rescan), the back-off 3600 s
            await operator.run()
    finally:
        await source.aclose()
    assert operator.stopping


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_stop_while_in_progress_is_published_aborts_the_operation_before_its_download(
    installed_rig: Rig, stalling: servers.LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop lands while the InProgress status is being written (no operation scope in place yet): the
    operation is aborted at once, as a stop during its download is, instead of running to its end."""
    rig = installed_rig
    spool = with_spool(rig)
    before = rig.host_facts()
    put(spool, "op-stall", {"agent": rig.name, "nodeName": "n1",
                            "archive": {"url": stalling.url("/a.tar.gz"), "sha256": SHA}})
    session = Session.load(str(rig.config))
    source = await operator_module.open_source(session)
    operator = operator_module.Operator(session, source)
    real_publish = source.publish

    async def publish_then_stop(op: Operation, status: OperationStatus) -> bool:
        wrote = await real_publish(op, status)
        if status.phase == "InProgress":
            operator.request_stop("SIGTERM")
        return wrote

    monkeypatch.setattr(source, "publish", publish_then_stop)
    try:
        with anyio.fail_after(20):  # the stalling server never finishes a download that began
            await operator.run()
    finally:
        await source.aclose()
    status = json.loads((spool / "op-stall.status.json").read_text())
    assert (status["phase"], status["result"], status["message"]) == (
        "Failed", "aborted", "interrupted before the switch"), status
    assert stalling.requests == []
    assert rig.host_facts() == before
    assert rig.staging_leftovers() == []
    assert rig.cli("recover").payload()["result"] == "noop"

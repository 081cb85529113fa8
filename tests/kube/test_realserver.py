"""``scripts/kube-real``: start and stop are safe to run twice, every failure is one line within a bounded
time, and ``stop`` never ends a process it did not start (docs/managed.md, "The API servers the tests run
against").

Each test runs the real command (the cached binaries; ``make test`` builds them first) in a directory of its
own, and reads the outcome from the host: the processes in ``/proc``, the files in the directory, the port.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kube import realserver

SCRIPT = realserver.ROOT / "scripts" / "kube-real"
TIMEOUT_S = 180.0


def kube_real(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=env, check=False)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process kube-real did not start."""
    p = subprocess.Popen(["sleep", "300"])
    try:
        yield p
    finally:
        p.kill()
        p.wait(10)


def test_start_twice_then_stop_twice(tmp_path: Path) -> None:
    where = tmp_path / "cluster"
    first = kube_real("start", str(where))
    assert first.returncode == 0, first.stderr
    state = json.loads((where / "kube-real.json").read_text())
    pids = {p["name"]: p["pid"] for p in state["processes"]}
    assert set(pids) == {"etcd", "kube-apiserver"} and all(alive(pid) for pid in pids.values())
    for name in ("admin.kubeconfig", "operator.kubeconfig"):
        assert (where / name).stat().st_mode & 0o777 == 0o600
    cluster = realserver._load(where)
    assert cluster is not None
    with cluster.admin() as client:
        assert client.get("/version").json()["gitVersion"] == realserver.kubernetes_version()
    operator = json.loads((where / "operator.kubeconfig").read_text())
    token = operator["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cafile=cluster.ca)
    with httpx.Client(base_url=cluster.url, verify=ctx, headers={"Authorization": f"Bearer {token}"},
                      trust_env=False, timeout=30) as sa:  # the ServiceAccount: its Role, nothing more
        base = f"/apis/upgrades.upgrade-core.io/v1alpha1/namespaces/{cluster.namespace}/upgradeoperations"
        assert sa.get(base).status_code == 200
        assert sa.get(f"/api/v1/namespaces/{cluster.namespace}/secrets").status_code == 403

    again = kube_real("start", str(where))
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stderr
    again_state = json.loads((where / "kube-real.json").read_text())
    assert {p["name"]: p["pid"] for p in again_state["processes"]} == pids

    stopped = kube_real("stop", str(where))
    assert stopped.returncode == 0, stopped.stderr
    assert not any(alive(pid) for pid in pids.values())
    assert not where.exists()  # start made the directory: stop removes it with everything in it
    assert stopped.stderr.splitlines() == [
        f"kube-real: stopped etcd (pid {pids['etcd']}) and kube-apiserver (pid {pids['kube-apiserver']}); "
        f"removed what start made in {where}"], stopped.stderr
    twice = kube_real("stop", str(where))
    assert (twice.returncode, twice.stderr.strip()) == (0, f"kube-real: nothing to stop in {where}")


def test_a_port_in_use_is_one_line_and_nothing_is_made(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        where = tmp_path / "cluster"
        for option, what in (("--apiserver-port", "kube-apiserver"), ("--etcd-port", "etcd")):
            out = kube_real("start", str(where), option, str(port))
            assert out.returncode == 1
            assert out.stderr.splitlines() == [
                f"kube-real: {what}: port 127.0.0.1:{port} is not free (Address already in use); "
                f"name another with {option} or leave it out"], out.stderr
            assert not where.exists()


def test_stop_never_ends_a_process_it_did_not_start(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    # A state file naming a pid that is not (or no longer) the server kube-real started: the same pid with
    # another start time (a reused pid), and the same start time with another executable.
    where = tmp_path / "cluster"
    where.mkdir(mode=0o700)
    started = realserver._start_time(sleeper.pid)
    assert started is not None
    binaries = realserver.ensure_binaries()
    procs = [
        {"name": "etcd", "pid": sleeper.pid, "exe": str(binaries.etcd), "started": started, "log": "x"},
        {"name": "kube-apiserver", "pid": sleeper.pid, "exe": shutil.which("sleep"), "started": started - 1,
         "log": "x"},
    ]
    state = {"dir": str(where), "url": "https://127.0.0.1:1", "etcd_url": "http://127.0.0.1:2",
             "namespace": "upgrade-core", "service_account": "upgrade-agent", "processes": procs,
             "made": [str(where / "kube-real.json")]}
    (where / "kube-real.json").write_text(json.dumps(state))
    out = kube_real("stop", str(where))
    assert out.returncode == 0, out.stderr
    assert alive(sleeper.pid)
    assert out.stderr.splitlines() == [
        f"kube-real: pid {sleeper.pid} is no longer the kube-apiserver kube-real started; left alone",
        f"kube-real: pid {sleeper.pid} is no longer the etcd kube-real started; left alone"], out.stderr


def test_a_server_that_dies_while_starting_is_one_line_naming_it(tmp_path: Path) -> None:
    # etcd reads ETCD_* variables as its flags: one it cannot parse ends it at once
    where = tmp_path / "cluster"
    began = time.monotonic()
    out = kube_real("start", str(where), env=dict(os.environ, ETCD_QUOTA_BACKEND_BYTES="lots"))
    assert out.returncode == 1
    (line,) = out.stderr.splitlines()
    assert line.startswith("kube-real: etcd on 127.0.0.1:") and "exited during start-up" in line, line
    assert "ETCD_QUOTA_BACKEND_BYTES" in line or "lots" in line, line
    assert line.endswith(f"(log: {where / 'etcd.log'})"), line
    assert time.monotonic() - began < realserver.START_TIMEOUT_S
    assert not where.exists()  # start made the directory and everything in it: all gone again


def test_start_refuses_a_directory_holding_what_it_would_make(tmp_path: Path) -> None:
    (tmp_path / "etcd-data").mkdir()
    (tmp_path / "etcd-data" / "keep").write_text("someone's")
    out = kube_real("start", str(tmp_path))
    assert (out.returncode, out.stderr.splitlines()) == (1, [
        f"kube-real: {tmp_path}: already holds etcd-data, which kube-real did not make; name an empty or new "
        "directory"]), out.stderr
    assert (tmp_path / "etcd-data" / "keep").read_text() == "someone's"


def test_a_build_that_fails_is_one_line_naming_the_package(tmp_path: Path) -> None:
    module = tmp_path / "servers"
    shutil.copytree(realserver.SERVERS, module)
    (module / "etcd" / "main.go").write_text("package main\n\nfunc main() { undefined() }\n")
    with pytest.raises(realserver.KubeRealError) as caught:
        realserver.ensure_binaries(servers=module)
    text = str(caught.value)
    assert text.startswith("build: go build ./etcd failed (exit 1): ") and "undefined" in text, text
    assert "\n" not in text
    assert not list(realserver.CACHE.glob(f".{realserver.build_key(shutil.which('go') or 'go', module)}-*"))


def test_no_go_is_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin")
    if any(Path(d, "go").exists() for d in env["PATH"].split(":")):
        env["PATH"] = str(tmp_path)  # the machine's go is in /usr/bin: a PATH without it
    out = subprocess.run([sys.executable, "-m", "tests.kube.realserver", "build"], capture_output=True,
                         text=True, env=env, cwd=realserver.ROOT, timeout=TIMEOUT_S, check=False)
    assert (out.returncode, out.stderr.splitlines()) == (
        1, ["kube-real: build: the go command is not on PATH (Go 1.26 builds the test servers)"]), out.stderr


def test_stop_ends_a_server_that_ignores_sigterm_within_the_bound(tmp_path: Path) -> None:
    where = tmp_path / "cluster"
    assert kube_real("start", str(where)).returncode == 0
    cluster = realserver._load(where)
    assert cluster is not None
    os.kill(cluster.pid("etcd"), signal.SIGSTOP)  # a stopped process does not act on SIGTERM
    began = time.monotonic()
    out = kube_real("stop", str(where))
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - began < 2 * realserver.STOP_TIMEOUT_S + 10
    assert not any(alive(p.pid) for p in cluster.processes)

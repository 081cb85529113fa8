"""Zero-downtime switches by socket activation (design §11, docs/candidate.md "Socket activation").

With ``[agent] socket = "127.0.0.1:PORT"`` ``install`` writes ``NAME.socket`` and the agent unit takes its
listening socket from systemd. A loopback client makes back-to-back requests (a new connection each, as the
sample agent's HTTP/1.0 server answers) through:

(a) a committed upgrade 1.0.0 -> 1.1.0 (blue -> green);
(c) an operator ``rollback`` to blue (1.0.0);
(b) an upgrade to a 2.0.0 whose ``/healthz`` answers 503, rolled back to blue after its health attempts.

In that order because after (b) ``last-good`` names the slot ``current`` names, and ``rollback`` would have
nothing to roll back to. Every request must be answered (a 503 of the unhealthy candidate is an answer: the
connection was accepted and served); after each step the version served, the links, MainPID's command line
(an interpreted agent: its exe is the interpreter, its argv names the ``current`` link) and the slot's
bytes are the expected ones; the socket unit never restarted (its ``InvocationID`` and
``ActiveEnterTimestampMonotonic`` unchanged) and every agent process held the same kernel socket as fd 3
(``/proc/PID/fd/3`` names one ``socket:[INODE]`` throughout).

Also: ``install`` run again with the key added turns the socket on (a repair) and ``uninstall`` removes the
socket unit and closes the port; a candidate crash-looping into the start limit, the one case that takes
the socket down, is rolled back by the ``OnFailure=`` recovery, which starts the socket again.

The daemons' side of the contract is checked without systemd too: the sample agent and the native daemon
(``native_agent.c``) serve on an inherited fd 3 only when ``LISTEN_PID`` is their own pid, and on SIGTERM
finish what they accepted while connections they did not accept wait in the socket for the next process.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from agent.testing.releases import agent_script

from . import agent_env
from .agent_env import AgentEnv, poll

make_env = agent_env.make_env
release_server = agent_env.release_server

MakeEnv = Callable[..., AgentEnv]
REQUEST_TIMEOUT_S = 20.0  # one request may wait out a whole restart in the socket's queue
NATIVE_SOURCE = Path(__file__).with_name("native_agent.c")
CC_TIMEOUT_S = 60
PROCESS_TIMEOUT_S = 10.0


@attrs.define
class Answer:
    """One request of the load: when it was sent and finished (monotonic seconds), the HTTP status and
    body, or the error (``status`` 0)."""

    sent: float
    done: float
    status: int
    body: str


class Load:
    """A client thread making back-to-back ``GET /healthz`` requests to ``127.0.0.1:port`` (a new connection
    each) until stopped; every answer is kept."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
                try:
                    conn.request("GET", "/healthz")
                    resp = conn.getresponse()
                    status, body = resp.status, resp.read().decode(errors="replace")
                finally:
                    conn.close()
            except OSError as exc:
                status, body = 0, f"{type(exc).__name__}: {exc}"
            self.answers.append(Answer(sent, time.monotonic(), status, body))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT_S + 5)
        assert not self._thread.is_alive(), "the load thread did not stop"

    def since(self, start: int) -> list[Answer]:
        """The answers from index ``start`` on."""
        return self.answers[start:]

    def wait_for_answers(self, count: int, timeout_s: float = 10.0) -> None:
        """Until ``count`` more answers have come in than now (the load is flowing), bounded."""
        goal = len(self.answers) + count
        poll(lambda: len(self.answers) >= goal, timeout_s, f"{count} answers of the load")


def failed(answers: list[Answer]) -> list[Answer]:
    """The requests that got no HTTP answer."""
    return [a for a in answers if a.status == 0]


def served_version(answers: list[Answer]) -> str:
    """The version in the last answer's body (``ok 1.0.0`` / ``unhealthy 2.0.0``)."""
    assert answers, "no answer at all"
    return answers[-1].body.split()[-1]


def socket_identity(env: AgentEnv) -> dict[str, str]:
    """What changes when ``NAME.socket`` is stopped or restarted: state, invocation, activation time."""
    props = env.show(f"{env.name}.socket", "ActiveState", "SubState", "InvocationID",
                     "ActiveEnterTimestampMonotonic", "Listen")
    assert props["ActiveState"] == "active" and props["InvocationID"], props
    return props


def fd3(env: AgentEnv) -> str:
    """``/proc/MAINPID/fd/3`` of the agent (``socket:[INODE]``), read in the sandbox's pid namespace."""
    pid, _, _ = env.main_process()
    return env.sandbox.run("readlink", f"/proc/{pid}/fd/3").stdout.strip()


def test_the_listening_socket_outlives_upgrade_rollback_and_operator_rollback(make_env: MakeEnv) -> None:
    env = make_env(socket=True, stability_s=0.5, timeout_s=6.0, max_attempts=2)
    v1, v11, bad = env.release("1.0.0"), env.release("1.1.0"), env.release("2.0.0", "unhealthy")
    env.install(v1)
    units = sorted(p.name for p in env.sandbox.unit_dir.iterdir() if p.name.startswith(env.name))
    assert f"{env.name}.socket" in units, units
    assert env.sandbox.run("systemctl", "is-enabled", f"{env.name}.socket").stdout.strip() == "enabled"
    sock = socket_identity(env)
    assert sock["Listen"] == f"127.0.0.1:{env.port} (Stream)", sock
    assert env.show(None, "Requires")["Requires"].split().count(f"{env.name}.socket") == 1
    env.assert_running("blue", v1)
    inode = fd3(env)
    assert inode.startswith("socket:["), inode

    steps = []
    with Load(env.port) as load:
        load.wait_for_answers(50)

        def step(what: str, run: Callable[[], object], slot: str, rel: agent_env.Release) -> None:
            start = len(load.answers)
            started = time.monotonic()
            run()
            load.wait_for_answers(20)  # answers from the process the step left running
            answers = load.since(start)
            assert failed(answers) == [], f"{what}: requests without an answer: {failed(answers)[:5]}"
            assert served_version(answers) == rel.version, (what, answers[-1])
            env.assert_running(slot, rel)  # links, MainPID's argv names current, slot bytes, /healthz
            assert fd3(env) == inode, f"{what}: the agent holds another socket"
            assert socket_identity(env) == sock, f"{what}: NAME.socket was restarted"
            elapsed = time.monotonic() - started
            steps.append(f"{what}: {len(answers)} answers in {elapsed:.1f} s, longest wait "
                         f"{max(a.done - a.sent for a in answers) * 1e3:.0f} ms")

        def committed() -> None:
            up = env.upgrade(v11, "sock-up")
            assert up.code == 0 and up.json is not None and up.json["result"] == "committed", up

        def operator_rollback() -> None:
            back = env.cli("rollback", "--operation", "sock-rb")
            assert back.code == 0 and back.json is not None, back
            assert (back.json["result"], back.json["slot"]) == ("committed", "blue"), back.json

        def rolled_back() -> None:
            up = env.upgrade(bad, "sock-bad")
            assert up.code == 1 and up.json is not None and up.json["result"] == "rolled_back", up
            versions = {a.body.split()[-1] for a in load.since(start_bad)}
            assert "2.0.0" in versions, "the unhealthy candidate never answered: it was not switched to"

        step("(a) committed upgrade", committed, "green", v11)
        step("(c) operator rollback", operator_rollback, "blue", v1)
        start_bad = len(load.answers)
        step("(b) rolled-back upgrade", rolled_back, "blue", v1)
    total = load.answers
    elapsed = total[-1].done - total[0].sent
    print(f"{len(total)} requests in {elapsed:.1f} s ({len(total) / elapsed:.0f}/s), none failed; "
          + "; ".join(steps))
    assert failed(total) == []


def test_install_turns_the_socket_on_and_off_and_uninstall_removes_it(make_env: MakeEnv) -> None:
    """An agent installed without ``[agent] socket``; the key is added and ``install`` run again (a repair):
    it writes ``NAME.socket`` and the new agent unit, and the agent runs with the socket (fd 3, the unit's
    socket). The key removed, ``install`` removes the socket unit (listed in the install record, this
    agent's header) and the agent binds the port itself. Added again, then ``uninstall``: the socket unit
    is stopped and removed with the others, the port is closed and no unit file of the agent is left."""
    env = make_env()
    v1 = env.release("1.0.0")
    env.install(v1)
    pid = env.assert_running("blue", v1)
    plain = env.config.read_text()
    with_socket = plain.replace("[agent]\n", f'[agent]\nsocket = "127.0.0.1:{env.port}"\n', 1)
    sock_file = env.sandbox.unit_dir / f"{env.name}.socket"

    def repair(text: str) -> str:
        env.config.write_text(text)
        repaired = env.cli("install")
        assert repaired.code == 0 and repaired.json is not None, repaired
        assert repaired.json["result"] == "noop", repaired.json
        assert str(sock_file) in (repaired.json["reason"] or ""), repaired.json
        return str(repaired.json["reason"])

    def answers() -> bool:
        try:
            socket.create_connection(("127.0.0.1", env.port), timeout=PROCESS_TIMEOUT_S).close()
        except ConnectionRefusedError:
            return False
        return True

    for text in (with_socket, plain, with_socket):
        repair(text)
        poll(answers, PROCESS_TIMEOUT_S, "the agent to listen")  # without the socket it binds after its start
        before, pid = pid, env.assert_running("blue", v1)
        assert pid != before  # restarted to take the socket, or to bind its address itself
        if text is plain:
            assert not sock_file.exists()
            assert env.show(f"{env.name}.socket", "LoadState")["LoadState"] == "not-found"
            assert f"{env.name}.socket" not in env.show(None, "Requires")["Requires"].split()
        else:
            assert "ListenStream=" + f"127.0.0.1:{env.port}\n" in sock_file.read_text()
            socket_identity(env)
            assert fd3(env).startswith("socket:[")

    gone = env.cli("uninstall")
    assert gone.code == 0 and gone.json is not None, gone
    assert str(sock_file) in gone.json["removed"], gone.json
    assert env.show(f"{env.name}.socket", "LoadState")["LoadState"] == "not-found"
    assert env.units_present() == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", env.port), timeout=PROCESS_TIMEOUT_S).close()


def test_a_crash_loop_into_the_start_limit_takes_the_socket_down_and_recovery_brings_both_back(
    make_env: MakeEnv,
) -> None:
    """The one case that closes the socket (docs/configuration.md, "Agent socket"): a candidate that
    crash-loops until the agent unit's start limit. systemd fails the socket with it
    (``service-start-limit-hit``); ``OnFailure=`` recovery rolls back to last-good, whose start starts the
    socket again (``Requires=``): a new invocation, listening on the same address, serving 1.0.0. The upgrader
    is SIGKILLed after it saw the candidate running, as in ``test_cli_scenarios``, so that only systemd's
    machinery acts; the CLI runs inside the sandbox so the units systemd starts read a valid configuration."""
    env = make_env(inside=True, socket=True)
    v1, bad = env.release("1.0.0"), env.release("2.0.0", "exit-after:0.3")
    env.install(v1)
    before = socket_identity(env)
    op = "sock-loop"
    killed = env.upgrade(bad, op, env={"UPGRADE_AGENT_TEST_KILL_AFTER": "RestartObserved"})
    assert killed.code in (-9, 137), killed.stderr
    poll(lambda: env.result_file(op) is not None, 60.0, "the OnFailure= recovery to publish a result")
    result = env.result_file(op)
    assert result is not None and result["result"] == "rolled_back", result
    poll(lambda: env.events(op)[-1:] == ["EpisodeClosed"], 10.0, "the episode to close")
    env.assert_running("blue", v1)
    after = socket_identity(env)
    assert after["InvocationID"] != before["InvocationID"] and after["Listen"] == before["Listen"], after
    console = env.sandbox.console_log.read_text(errors="replace")
    assert f"{env.name}.socket: Failed with result 'service-start-limit-hit'." in console, "\n".join(
        [ln for ln in console.splitlines() if env.name in ln][-40:])
    assert fd3(env).startswith("socket:[")


# -- the daemons' side, without systemd --------------------------------------------------------------------
@pytest.fixture(scope="module")
def native_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``native_agent.c`` compiled as version 2.0.0."""
    out = tmp_path_factory.mktemp("native") / "demo-agent"
    compiler = shutil.which("cc") or pytest.fail("cc missing: run scripts/bootstrap.sh (apt-get install gcc)")
    argv = [compiler, "-O2", "-Wall", '-DVERSION="2.0.0"', '-DBEHAVIOUR="good"', "-o", str(out),
            str(NATIVE_SOURCE)]
    cc = subprocess.run(argv, capture_output=True, text=True, timeout=CC_TIMEOUT_S, check=False)
    assert cc.returncode == 0 and not cc.stderr, cc.stderr
    return out


def _python_agent(directory: Path, version: str) -> Path:
    path = directory / f"demo-agent-{version}"
    path.write_bytes(agent_script(version).replace(b"#!/usr/bin/env python3", f"#!{sys.executable}".encode()))
    path.chmod(0o755)
    return path


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening TCP socket on 127.0.0.1 (what systemd would hold), closed afterwards."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=64)
    try:
        yield sock
    finally:
        sock.close()


def start(
    program: Path, listener: socket.socket | None, port: int, listen_pid: str = "self"
) -> subprocess.Popen[str]:
    """``program serve --port PORT`` with ``listener`` as fd 3 and ``LISTEN_FDS=1``, ``LISTEN_PID`` its own
    pid (``self``, as systemd sets it) or the given one; waits for its "serving" line (bounded)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    shell = f'exec "$0" serve --port {port}'
    if listener is not None:
        env["LISTEN_FDS"] = "1"
        pid = "$$" if listen_pid == "self" else listen_pid
        shell = f'LISTEN_PID={pid} exec "$0" serve --port {port}'
    fd = listener.fileno() if listener is not None else -1

    def as_fd3() -> None:
        if fd >= 0:
            os.dup2(fd, 3)  # not close-on-exec: the daemon inherits it as systemd's fd 3

    proc = subprocess.Popen(["sh", "-c", shell, str(program)], env=env, stdout=subprocess.PIPE, text=True,
                            preexec_fn=as_fd3, close_fds=False)
    assert proc.stdout is not None
    line = _readline(proc, PROCESS_TIMEOUT_S)
    assert "serving on" in line, line
    return proc


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str:
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline() if proc.stdout else ""),
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not got:
        proc.kill()
        pytest.fail(f"no line from the daemon within {timeout_s} s")
    return got[0]


def get(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROCESS_TIMEOUT_S)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(PROCESS_TIMEOUT_S)
        pytest.fail(f"the daemon did not exit within {PROCESS_TIMEOUT_S} s of SIGTERM")


@pytest.fixture(params=["python", "native"])
def daemon(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    """(version 1.0.0, version 2.0.0) of the sample agent or of the native daemon (only 2.0.0 is native)."""
    old = _python_agent(tmp_path, "1.0.0")
    new = _python_agent(tmp_path, "2.0.0") if request.param == "python" else request.getfixturevalue(
        "native_binary")
    return old, new


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_daemon_serves_on_the_socket_systemd_passes_and_ignores_its_port(
    daemon: tuple[Path, Path], listener: socket.socket
) -> None:
    own_port = _free_port()
    proc = start(daemon[1], listener, own_port)
    try:
        assert get(listener.getsockname()[1]) == "ok 2.0.0\n"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", own_port), timeout=PROCESS_TIMEOUT_S).close()
    finally:
        assert _stop(proc) == 0


def test_a_daemon_whose_listen_pid_is_another_process_binds_itself(
    daemon: tuple[Path, Path], listener: socket.socket
) -> None:
    own_port = _free_port()
    proc = start(daemon[1], listener, own_port, listen_pid="1")
    try:
        assert get(own_port) == "ok 2.0.0\n"
    finally:
        assert _stop(proc) == 0


def test_sigterm_finishes_the_accepted_request_and_the_next_process_takes_the_queue(
    daemon: tuple[Path, Path], listener: socket.socket
) -> None:
    """The old process (1.0.0, the sample agent) has accepted a request whose headers are still arriving
    when SIGTERM comes: it answers that request in full and exits 0. A connection made after SIGTERM waits in
    the listening socket (held here, as systemd holds it) and is answered by the next process."""
    port = listener.getsockname()[1]
    old = start(daemon[0], listener, _free_port())
    slow = socket.create_connection(("127.0.0.1", port), timeout=PROCESS_TIMEOUT_S)
    try:
        slow.sendall(b"GET /healthz HTTP/1.0\r\n")  # the request line; headers not finished yet
        # Accepted by the old process once it answers a complete request sent after it (one at a time in
        # arrival order on one listening socket: the slow one was queued first).
        assert get(port) == "ok 1.0.0\n"
        old.send_signal(signal.SIGTERM)
        queued: list[str] = []
        waiter = threading.Thread(target=lambda: queued.append(get(port)), daemon=True)
        waiter.start()
        slow.sendall(b"Host: 127.0.0.1\r\n\r\n")
        reply = b""
        while chunk := slow.recv(4096):
            reply += chunk
        assert reply.startswith(b"HTTP/1.0 200 ") and reply.endswith(b"ok 1.0.0\n"), reply
        assert old.wait(PROCESS_TIMEOUT_S) == 0
        new = start(daemon[1], listener, _free_port())
        try:
            waiter.join(PROCESS_TIMEOUT_S)
            assert queued and queued[0] in ("ok 1.0.0\n", "ok 2.0.0\n"), queued
            assert get(port) == "ok 2.0.0\n"
        finally:
            assert _stop(new) == 0
    finally:
        slow.close()
        if old.poll() is None:
            old.kill()
            old.wait(PROCESS_TIMEOUT_S)

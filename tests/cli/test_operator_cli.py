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


IDLE_HEAVY = ("httpx", "httpcore", "truststore", "rich", "cryptography", "zstandard", "isal",
              "kubernetes_asyncio", "aiohttp", "yaml")
"""What an idle spool operator must not load (design §9 ``operator.idle``: its resident memory): the download
and TLS stack, the archive codecs, release signatures, the Kubernetes client; each loads with the first
operation that needs it."""


def test_an_idle_spool_operator_loads_no_download_stack_and_no_kubernetes_client(installed_rig: Rig) -> None:
    """``operator --once`` over a spool whose one operation the journal has never seen and whose terminal
    status is already there (acknowledged: nothing to run), then the modules the process holds."""
    spool = with_spool(installed_rig)
    put(spool, "done-1", {"agent": installed_rig.name, "archive": {}})
    status = spool / "done-1.status.json"
    status.write_text(json.dumps({"operation": "done-1", "phase": "Succeeded", "result": "committed"}))
    status.chmod(0o600)
    code = (
        "import sys\n"
        "from agent.cli.main import main\n"
        f"code = main(['--config', {str(installed_rig.config)!r}, 'operator', '--once'])\n"
        f"print(code, sorted(m for m in {IDLE_HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run([PYTHON, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.splitlines()[-1:] == ["0 []"], done
    assert json.loads(status.read_text())["result"] == "committed"  # acknowledged: left as it was


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
                     f'spool_dir = "{spool}"\nnode_name = "n1"\nallow_local_sources = true\n')
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


# -- a control plane is trusted less than root (docs/managed.md, "A control plane is not root") -----------
def _statuses(spool: Path) -> dict[str, dict[str, object]]:
    return {p.name[: -len(".status.json")]: json.loads(p.read_text()) for p in spool.glob("*.status.json")}


def test_a_local_source_from_the_spool_is_refused_naming_the_field_and_never_read(installed_rig: Rig) -> None:
    """A spool writer names a root-only file as the archive (a path, a file:// URL) or as the signature: each
    is refused before the lock with a status naming the field, nothing is journaled, and the file's sha256
    appears nowhere (the old operator read it, and a digest mismatch published the digest)."""
    import hashlib

    rig = installed_rig
    spool = with_spool(rig)
    secret = rig.base / "root-only"
    secret.write_bytes(b"root's eyes only\n")
    secret.chmod(0o600)
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    before, state = rig.host_facts(), rig.state_bytes()
    remote = "https://127.0.0.1:9/a.tar.gz"
    cases = {
        "by-path": ({"url": str(secret), "sha256": SHA}, "spec.archive.url", str(secret)),
        "by-file-url": ({"url": f"file://{secret}", "sha256": SHA}, "spec.archive.url", f"file://{secret}"),
        "signature": ({"url": remote, "sha256": SHA, "signatureURL": str(secret)},
                      "spec.archive.signatureURL", str(secret)),
    }
    for op, (archive, _key, _shown) in cases.items():
        put(spool, op, {"agent": rig.name, "nodeName": "n1", "archive": archive})
    out = rig.cli("operator", "--once")
    assert out.code == 0, out.stderr
    statuses = _statuses(spool)
    for op, (_archive, key, shown) in cases.items():
        status = statuses[op]
        assert (status["phase"], status["result"], status["journal_seq"]) == ("Failed", None, None), status
        assert status["message"] == (
            f"{key}: {shown}: not an http(s) URL; a control plane may name a local file only with "
            "[operations] allow_local_sources = true"), status
    assert digest not in out.stderr and digest not in json.dumps(statuses)
    assert rig.host_facts() == before and rig.state_bytes() == state  # not even a journal record


def test_an_allowed_local_source_never_puts_its_digest_in_a_status_log_or_journal(installed_rig: Rig) -> None:
    """With ``allow_local_sources = true`` a local file is read, and a wrong digest is refused without
    naming the digest the file has: in the status, the operator's log and ``journal dump``."""
    import hashlib

    rig = installed_rig
    spool = rig.base / "spool"
    spool.mkdir(mode=0o700)
    rig.write_config(f'[operations]\nsource = "spool"\nspool_dir = "{spool}"\nnode_name = "n1"\n'
                     "allow_local_sources = true\n", agent_extra='member_policy = "none"\n')
    secret = rig.base / "root-only"
    secret.write_bytes(b"root's eyes only\n")
    secret.chmod(0o600)
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    before = rig.host_facts()
    put(spool, "op-local", {"agent": rig.name, "archive": {"url": str(secret), "sha256": SHA}})
    out = rig.cli("operator", "--once")
    assert out.code == 0, out.stderr
    status = _statuses(spool)["op-local"]
    assert (status["phase"], status["result"]) == ("Failed", "aborted"), status
    assert status["message"] == f"{secret}: the archive's sha256 is not the expected {SHA}", status
    dump = rig.cli("journal", "dump", json_out=False)
    assert dump.code == 0 and "op-local" in rig.cli("journal", "dump").stdout, dump
    for text in (out.stderr, json.dumps(status), dump.stdout):
        assert digest not in text
    assert rig.host_facts() == before


FORGED = "upgrade-agent: operator: all good\x1b[2K\r"


def test_control_characters_in_a_spec_come_out_escaped_in_log_lines_and_the_status(
    installed_rig: Rig,
) -> None:
    """A newline, ESC (an ANSI sequence), a carriage return, a C1 CSI and a right-to-left override in spec
    strings: every log line stays one line (no forged ``upgrade-agent:`` line reaches journald) and the status
    shows them escaped."""
    rig = installed_rig
    spool = with_spool(rig)
    put(spool, "forged", {"agent": rig.name, "nodeName": f"elsewhere\n{FORGED}\u009b31m\u202egnp.exe",
                          "archive": {"url": "https://127.0.0.1:9/a.tar.gz", "sha256": SHA}})
    put(spool, "forged-key", {"agent": rig.name, "nodeName": "n1", f"x\n{FORGED}": 1,
                              "archive": {"url": "https://127.0.0.1:9/a.tar.gz", "sha256": SHA}})
    out = rig.cli("operator", "--once")
    assert out.code == 0, out.stderr
    escaped = "upgrade-agent: operator: all good\\x1b[2K\\r"
    statuses = _statuses(spool)
    assert statuses["forged"]["message"] == (
        f"spec.nodeName: addressed to node elsewhere\\n{escaped}\\x9b31m\\u202egnp.exe, this is n1")
    assert statuses["forged-key"]["message"] == f"spec: unknown key x\\n{escaped}"
    lines = out.stderr.splitlines()
    assert not [line for line in lines if line.startswith("upgrade-agent: operator: all good")], lines
    assert not set("\x1b\r\u009b\u202e") & set(out.stderr), out.stderr
    assert sum(statuses["forged"]["message"] in line for line in lines) == 1, lines


def test_a_60_kb_string_is_bounded_in_the_log_and_the_status_which_the_operator_reads_back(
    installed_rig: Rig,
) -> None:
    """A 60 KB agent name: the refusal's log line and status are bounded, and the status file stays within
    what the operator reads (64 KiB): a second run takes it as acknowledged and writes nothing. (Before, the
    status held the 60 KB string twice and the operator refused its own status file.)"""
    from agent.operations.spool import MAX_OPERATION_BYTES

    rig = installed_rig
    spool = with_spool(rig)
    put(spool, "huge", {"agent": "a" * 60_000, "nodeName": "n1",
                        "archive": {"url": "https://127.0.0.1:9/a.tar.gz", "sha256": SHA}})
    out = rig.cli("operator", "--once")
    assert out.code == 0, out.stderr
    longest = max(len(line) for line in out.stderr.splitlines())
    assert longest <= len("upgrade-agent: ") + 4096, out.stderr[:300]
    path = spool / "huge.status.json"
    data = path.read_bytes()
    assert len(data) < MAX_OPERATION_BYTES
    status = json.loads(data)
    message = status["message"]
    assert status["phase"] == "Failed" and len(message) < 400, message  # the value quoted: 256 at most
    assert message.startswith("spec.agent: addressed to agent aaa")
    assert message.endswith(f" more characters], this is {rig.name}"), message[-120:]
    again = rig.cli("operator", "--once")
    assert again.code == 0 and "huge" not in again.stderr, again.stderr[:500]
    assert path.read_bytes() == data


def test_a_spool_id_that_collides_with_a_status_file_name_is_refused_visibly(installed_rig: Rig) -> None:
    """``coll.status.json`` holding an operation (id ``coll.status``) is refused with its own status; one
    holding a status whose operation file is gone stays a record; and an operation whose status file holds
    someone's operation is not run, its file not replaced, one log line saying why."""
    rig = installed_rig
    spool = with_spool(rig)
    spec = {"agent": rig.name, "nodeName": "elsewhere",
            "archive": {"url": "https://127.0.0.1:9/a.tar.gz", "sha256": SHA}}
    put(spool, "coll.status", spec)
    orphan = {"operation": "gone", "phase": "Succeeded", "result": "committed"}
    put(spool, "gone.status", orphan)
    put(spool, "both.status", spec)
    put(spool, "both", spec)
    out = rig.cli("operator", "--once")
    assert out.code == 0, out.stderr
    statuses = _statuses(spool)
    refused = statuses["coll.status"]
    assert refused["operation"] == "coll.status" and refused["phase"] == "Failed", refused
    assert refused["message"] == (
        f"{spool}/coll.status.json: refused: the operation id coll.status ends in .status, which makes its "
        "file the status file of operation coll; give the operation another id")
    assert f"operator: {spool}/coll.status.json: Failed: {refused['message']}" in out.stderr
    assert statuses["gone"] == orphan and "gone.status.status.json" not in os.listdir(spool)
    assert statuses["both"] == spec  # not replaced
    assert out.stderr.count(f"{spool}/both.status.json: holds no status of operation both") == 1, out.stderr


def test_a_kubeconfig_or_token_file_others_may_read_is_refused_exit_4(installed_rig: Rig) -> None:
    from tests.kube.apiserver import kubeconfig_for

    rig = installed_rig
    kubeconfig = Path(kubeconfig_for("http://127.0.0.1:9", str(rig.base / "kubeconfig")))
    rig.write_config(f'[operations]\nsource = "kubernetes"\nnamespace = "default"\nnode_name = "n1"\n'
                     f'kubeconfig = "{kubeconfig}"\n')
    for mode in (0o640, 0o604, 0o620):
        kubeconfig.chmod(mode)
        out = rig.cli("operator", "--once", json_out=False)
        assert out.code == 4, out
        assert out.stderr == (
            f"upgrade-agent: {kubeconfig}: [operations] kubeconfig is readable or writable by group or "
            f"others (mode {mode:04o}); a credential file must be mode 0600 or stricter (chmod 600); "
            "nothing was changed\n"), out.stderr
    token = rig.base / "token"
    token.write_text("s3cret-token\n")
    token.chmod(0o644)
    doc = json.loads(kubeconfig.read_text())
    doc["users"][0]["user"] = {"tokenFile": "token"}  # relative: beside the kubeconfig
    kubeconfig.write_text(json.dumps(doc))
    kubeconfig.chmod(0o600)
    out = rig.cli("operator", "--once", json_out=False)
    assert out.code == 4 and out.stderr.count("\n") == 1, out
    assert out.stderr.startswith(f"upgrade-agent: {token}: the kubeconfig's tokenFile is readable"), (
        out.stderr)
    assert "s3cret" not in out.stderr


def test_kubernetes_another_agents_object_is_never_written_and_foreign_strings_are_escaped(
    installed_rig: Rig,
) -> None:
    """On the mock API server: an object for another agent on this node is left alone (read back: no status
    was ever written; before, the operator wrote ``Failed`` there, which that agent's operator then took as
    acknowledged). This agent's objects naming a local archive, or carrying control characters, get a
    ``Failed`` status naming the field, escaped, that the CRD's schema accepts."""
    from tests.kube.apiserver import kubeconfig_for, threaded
    from tests.kube.test_manifests import SAMPLE, errors

    rig = installed_rig
    ns = "default"
    with threaded() as kube:
        kubeconfig = kubeconfig_for(kube.url, str(rig.base / "kubeconfig"))
        rig.write_config(f'[operations]\nsource = "kubernetes"\nnamespace = "{ns}"\nnode_name = "n1"\n'
                         f'kubeconfig = "{kubeconfig}"\n')
        remote = {"url": "https://127.0.0.1:9/a.tar.gz", "sha256": "ab" * 32}
        specs = {
            "for-another-agent": {"nodeName": "n1", "agent": "someone-else", "archive": remote},
            "local-archive": {"nodeName": "n1", "agent": rig.name,
                              "archive": {"url": "/etc/shadow", "sha256": "ab" * 32}},
            # an API server prunes an unknown key before the operator sees it: the forged text rides in a
            # field the schema keeps
            "forged": {"nodeName": "n1", "agent": rig.name,
                       "archive": {"url": f"https://127.0.0.1:9/x\n{FORGED}\u202e", "sha256": "ab" * 32}},
        }
        for name, spec in specs.items():
            kube.call(lambda api, n=name, s=spec: api.put_object(
                ns, {"metadata": {"name": n}, "spec": s}))
        out = rig.cli("operator", "--once")
        assert out.code == 0, out.stderr
        foreign = kube.call(lambda api: api.stored(ns, "for-another-agent"))
        writes = kube.call(lambda api: api.status_writes(ns, "for-another-agent"))
        assert "status" not in foreign and writes == 0
        local = kube.call(lambda api: api.stored(ns, "local-archive"))["status"]
        forged = kube.call(lambda api: api.stored(ns, "forged"))["status"]
    assert local["phase"] == "Failed" and local["message"] == (
        "spec.archive.url: /etc/shadow: not an http(s) URL; a control plane may name a local file only with "
        "[operations] allow_local_sources = true"), local
    assert forged["phase"] == "Failed" and forged["message"] == (
        "spec.archive.url: https://127.0.0.1:9/x\\nupgrade-agent: operator: all good\\x1b[2K\\r\\u202e: "
        "contains control or invisible characters"), forged
    for status in (local, forged):
        assert errors(dict(SAMPLE, status=status)) == []
    assert "for-another-agent" not in out.stderr
    assert not [line for line in out.stderr.splitlines() if line.startswith("upgrade-agent: operator: all")]

"""Field failure cases K1-K5 (shared/cases/README.md) through the whole CLI ``upgrade`` (design §7, 4.3).

Each case runs ``upgrade-agent upgrade --json`` as a real subprocess against a host installed by hand
(design §3 layout: two slots, bare relative links, ``R/bin/NAME``, a unit file) and must end before any
restart: exit 1 with an ``aborted`` result and a reason (the documented outcome of a bad candidate), one
JSON object on stdout, no traceback, and an unchanged host: ``current``, ``last-good``, both slot files,
``R/bin`` and the unit dir identical, no staging leftovers. ``host.systemctl_prefix`` is ``/bin/false``:
a run that wrongly reached a restart would fail loudly, never touch this machine's services.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import os
import signal
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config.boot import machine_arch
from agent.testing.releases import build_release
from tests.agent_fetch import _servers as servers
from tests.agent_fetch._archives import Entry, compress, tar_bytes, tar_header

from ._rig import Rig, Run

ARCH = machine_arch() or "amd64"


@pytest.fixture
def rig(installed_rig: Rig) -> Rig:
    """Every case here starts from an installed host."""
    return installed_rig


@pytest.fixture
def server() -> Iterator[servers.LoopbackServer]:
    with servers.serve() as s:
        yield s


def member_name(rig: Rig) -> str:
    return f"{rig.name}-linux-{ARCH}"


def targz(entries: list[Entry]) -> bytes:
    return compress(tar_bytes(entries), "gzip")


def good_member() -> bytes:
    return b"#!/bin/sh\necho 2.0.0\n"


def refused(
    rig: Rig, *argv: str, op: str = "op-bad", env: dict[str, str] | None = None
) -> tuple[Run, dict[str, Any]]:
    """Run ``upgrade ARGV --operation OP`` and check everything every refused candidate must satisfy."""
    facts = rig.host_facts()
    run = rig.cli("upgrade", *argv, "--operation", op, env=env)
    run.assert_clean_stderr()
    assert run.code == 1, run
    out = run.payload()
    assert out["operation"] == op and out["result"] == "aborted", out
    assert isinstance(out["reason"], str) and out["reason"].strip(), out
    assert out["slot"] == "blue", out
    assert rig.host_facts() == facts
    assert rig.staging_leftovers() == []
    result_file = rig.state_dir / "results" / f"{op}.json"
    assert result_file.is_file(), "the aborted result is published (design §4.3 step 9)"
    # A closed episode: the next command finds nothing to recover.
    again = rig.cli("recover")
    assert again.code == 0 and again.payload()["result"] == "noop", again
    return run, out


# -- K1: archive members that escape or mislead (C01-C03) --------------------------------------------
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "dotdot-inside"])
def test_k1_escaping_member_names(rig: Rig, tmp_path: Path, kind: str) -> None:
    name = {
        "dotdot": "../../../escaped",  # from R/lib/NAME: lands in tmp_path if followed
        "absolute": str(tmp_path / "escaped"),
        "dotdot-inside": f"x/../{member_name(rig)}",
    }[kind]
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(targz([Entry(name, data=good_member())]))
    refused(rig, "--archive", str(archive))
    assert not (tmp_path / "escaped").exists()


@pytest.mark.parametrize(
    "entry",
    [
        Entry("{m}", kind="lnk", linkname="../../../usr/bin/sudo"),
        Entry("{m}", kind="sym", linkname="/bin/sh"),
        Entry("{m}", kind="chr"),
        Entry("{m}", kind="fifo"),
    ],
    ids=["hardlink", "symlink", "chardev", "fifo"],
)
def test_k1_member_that_is_not_a_regular_file(rig: Rig, tmp_path: Path, entry: Entry) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(targz([Entry(member_name(rig), entry.kind, b"", entry.linkname)]))
    _run, out = refused(rig, "--archive", str(archive))
    assert member_name(rig) in out["reason"], out


# -- K2: resource exhaustion (C04) --------------------------------------------------------------------
SMALL_LIMITS = (
    "[limits]\nmax_archive_bytes = 1048576\nmax_member_bytes = 1048576\nmax_total_bytes = 2097152\n"
    "max_entries = 50\n"
)


def zero_bomb(member: str, size: int) -> bytes:
    """A tar.gz whose one member is ``size`` zero bytes, compressed in a stream (a few KiB per 10 MiB)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [z.compress(tar_header(member, size))]
    block = bytes(1 << 20)
    for _ in range(size >> 20):
        parts.append(z.compress(block))
    parts.append(z.compress(bytes(1024)))  # end-of-archive blocks
    parts.append(z.flush())
    return b"".join(parts)


def test_k2_gzip_bomb_against_small_limits(rig: Rig, tmp_path: Path) -> None:
    rig.write_config(SMALL_LIMITS)
    archive = tmp_path / "bomb.tar.gz"
    archive.write_bytes(zero_bomb(member_name(rig), 64 << 20))
    assert archive.stat().st_size < 128 << 10
    _run, out = refused(rig, "--archive", str(archive))
    assert "max_member_bytes" in out["reason"] and member_name(rig) in out["reason"], out


def test_k2_too_many_entries(rig: Rig, tmp_path: Path) -> None:
    # "select" passes other entries over, so only limits.max_entries stops 500 padding entries (C04).
    rig.write_config(SMALL_LIMITS, agent_extra='member_policy = "select"\n')
    entries = [Entry(f"pad/{i:05d}") for i in range(500)] + [Entry(member_name(rig), data=good_member())]
    archive = tmp_path / "many.tar.gz"
    archive.write_bytes(targz(entries))
    _run, out = refused(rig, "--archive", str(archive))
    assert "max_entries" in out["reason"], out


def test_k2_total_decompressed_bytes_bounded(rig: Rig, tmp_path: Path) -> None:
    # Every entry is under max_member_bytes; together they pass max_total_bytes (C04).
    rig.write_config(SMALL_LIMITS, agent_extra='member_policy = "select"\n')
    pads = [Entry(f"pad/{i}", data=bytes(900_000)) for i in range(4)]
    archive = tmp_path / "wide.tar.gz"
    archive.write_bytes(targz([*pads, Entry(member_name(rig), data=good_member())]))
    assert archive.stat().st_size < 64 << 10
    _run, out = refused(rig, "--archive", str(archive))
    assert "max_total_bytes" in out["reason"], out


def test_k2_archive_larger_than_the_limit(rig: Rig, tmp_path: Path, server: servers.LoopbackServer) -> None:
    rig.write_config(SMALL_LIMITS)
    data = targz([Entry(member_name(rig), data=os.urandom(1_500_000))])
    server.routes["/big.tar.gz"] = servers.body(data)
    _run, out = refused(rig, "--archive", server.url("/big.tar.gz"))
    assert "max_archive_bytes" in out["reason"], out


# -- K3: truncated input taken as complete (C06, C07) -------------------------------------------------
@pytest.fixture
def big_release(rig: Rig) -> bytes:
    """A valid tar.gz over 1 MiB (random, so it does not compress)."""
    return targz([Entry(member_name(rig), data=good_member() + os.urandom(1_400_000))])


def test_k3_http_body_shorter_than_its_content_length(
    rig: Rig, server: servers.LoopbackServer, big_release: bytes
) -> None:
    server.routes["/a.tar.gz"] = servers.short_body(len(big_release), big_release[: 1 << 20])
    _run, out = refused(rig, "--archive", server.url("/a.tar.gz"))
    assert server.url("/a.tar.gz") in out["reason"] and "ended early" in out["reason"], out


def test_k3_close_delimited_body_cut_early(
    rig: Rig, server: servers.LoopbackServer, big_release: bytes
) -> None:
    server.routes["/a.tar.gz"] = servers.body(big_release[: len(big_release) // 2], length=False)
    _run, out = refused(rig, "--archive", server.url("/a.tar.gz"))
    assert "truncat" in out["reason"].lower(), out


@pytest.mark.parametrize("cut", ["inside-member", "before-gzip-trailer"])
def test_k3_truncated_gzip_served_whole(rig: Rig, server: servers.LoopbackServer, cut: str) -> None:
    data = gzip.compress(
        tar_bytes([Entry(member_name(rig), data=good_member() + os.urandom(200_000))]), mtime=0
    )
    short = data[: len(data) // 2] if cut == "inside-member" else data[:-8]
    server.routes["/a.tar.gz"] = servers.body(short)  # an honest Content-Length for the cut bytes
    _run, out = refused(rig, "--archive", server.url("/a.tar.gz"))
    assert "truncat" in out["reason"].lower(), out


def test_k3_truncated_local_file(rig: Rig, tmp_path: Path) -> None:
    data = targz([Entry(member_name(rig), data=good_member() + os.urandom(100_000))])
    archive = tmp_path / "cut.tar.gz"
    archive.write_bytes(data[: len(data) - 100])
    _run, out = refused(rig, "--archive", str(archive))
    assert "truncat" in out["reason"].lower() and str(archive) in out["reason"], out


@pytest.mark.parametrize("how", ["wrong-digest", "digest-of-the-member"])
def test_k3_sha256_mismatch(rig: Rig, tmp_path: Path, how: str) -> None:
    import hashlib

    member = good_member()
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(targz([Entry(member_name(rig), data=member)]))
    # The digest is over the compressed archive (design §6), so the member's own digest must not pass.
    digest = "0" * 64 if how == "wrong-digest" else hashlib.sha256(member).hexdigest()
    _run, out = refused(rig, "--archive", str(archive), "--sha256", digest)
    assert "sha256" in out["reason"].lower() and str(archive) in out["reason"], out


# -- K4: download trust and secrets (C08) -------------------------------------------------------------
def test_k4_redirect_from_http_to_file_is_refused(
    rig: Rig, tmp_path: Path, server: servers.LoopbackServer
) -> None:
    # The file the redirect names is a perfectly good release: only the scheme rule stops it.
    good = tmp_path / "good.tar.gz"
    good.write_bytes(targz([Entry(member_name(rig), data=good_member())]))
    server.routes["/a.tar.gz"] = servers.redirect(f"file://{good}")
    _run, out = refused(rig, "--archive", server.url("/a.tar.gz"))
    assert "redirect" in out["reason"] and "file" in out["reason"], out


def _assert_secret_free(rig: Rig, run: Run, secrets: list[str]) -> None:
    state = rig.state_bytes()
    assert state, "the journal and the result were written"
    result = (rig.state_dir / "results" / "op-secret.json").read_bytes()
    for s in secrets:
        assert s not in run.stdout and s not in run.stderr, (s, run)
        assert s.encode() not in state, s
        assert s.encode() not in result, s


def test_k4_credentials_and_query_token_never_leak_on_404(rig: Rig, server: servers.LoopbackServer) -> None:
    port = server.server_address[1]
    source = f"http://user:SECRET@127.0.0.1:{port}/missing.tar.gz?sig=TOKEN"
    run, out = refused(rig, "--archive", source, op="op-secret")
    assert "404" in out["reason"] and f"127.0.0.1:{port}/missing.tar.gz" in out["reason"], out
    # The credentials did reach their own origin (so their absence below is not vacuous).
    basic = "Basic " + base64.b64encode(b"user:SECRET").decode()
    assert [h.get("authorization") for _p, h in server.requests] == [basic]
    assert server.requests[0][0] == "/missing.tar.gz?sig=TOKEN"
    _assert_secret_free(rig, run, ["SECRET", "TOKEN", base64.b64encode(b"user:SECRET").decode()])


def test_k4_credentials_are_not_sent_to_another_host(rig: Rig, server: servers.LoopbackServer) -> None:
    with servers.serve() as other:
        # 127.0.0.1 -> localhost on another port: a different origin (RFC 6454).
        other_url = f"http://localhost:{other.server_address[1]}/stolen.tar.gz"
        server.routes["/a.tar.gz"] = servers.redirect(other_url)
        source = f"http://user:SECRET@127.0.0.1:{server.server_address[1]}/a.tar.gz"
        run, _out = refused(rig, "--archive", source, op="op-secret")
        assert server.requests and server.requests[0][1].get("authorization", "").startswith("Basic ")
        assert [p for p, _h in other.requests] == ["/stolen.tar.gz"]
        assert "authorization" not in other.requests[0][1], other.requests
    _assert_secret_free(rig, run, ["SECRET"])


# -- K5: probing the candidate (C10) ------------------------------------------------------------------
def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan waits for its reaper, dead all the same)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat_line.rpartition(")")[2].split()[0] != "Z"


def _pids_gone(pids: list[int], deadline_s: float = 10.0) -> bool:
    """Poll until none of ``pids`` runs, or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not any(_running(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def test_k5_version_command_that_hangs_is_bounded_and_killed(rig: Rig, tmp_path: Path) -> None:
    rig.write_config("[verify]\ntimeout_s = 2.0\n")
    pidfile = tmp_path / "pids"
    script = f"#!/bin/sh\necho $$ > {pidfile}\nsleep 600 &\necho $! >> {pidfile}\nwait\n".encode()
    archive = tmp_path / "hang.tar.gz"
    archive.write_bytes(targz([Entry(member_name(rig), data=script)]))
    _run, out = refused(rig, "--archive", str(archive))
    assert "verify.timeout_s" in out["reason"], out
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    try:
        assert _pids_gone(pids), f"the version command's process group survived: {pids}"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_k5_wrong_version_with_expect_version(rig: Rig, tmp_path: Path) -> None:
    archive = build_release(tmp_path / "rel", "2.0.0", name=rig.name, arch=ARCH, interpreter=sys.executable)
    _run, out = refused(rig, "--archive", str(archive), "--expect-version", "3.0.0")
    assert "2.0.0" in out["reason"] and "3.0.0" in out["reason"], out


def test_k5_version_command_that_prints_nothing(rig: Rig, tmp_path: Path) -> None:
    archive = tmp_path / "mute.tar.gz"
    archive.write_bytes(targz([Entry(member_name(rig), data=b"#!/bin/sh\nexit 0\n")]))
    refused(rig, "--archive", str(archive))


def test_control_a_good_archive_gets_past_every_check(rig: Rig, tmp_path: Path) -> None:
    """Control: the same rig with a good candidate passes stage and verify and reaches the switch and the
    restart, which ``/bin/false`` as systemctl makes fail. Proves the refusals above come from the inputs."""
    archive = build_release(tmp_path / "rel", "2.0.0", name=rig.name, arch=ARCH, interpreter=sys.executable)
    run = rig.cli("upgrade", "--archive", str(archive), "--expect-version", "2.0.0", "--operation", "op-good")
    run.assert_clean_stderr()
    dump = rig.cli("journal", "dump").payload()["records"]
    tags = [r["event"]["_type"] for r in dump if r["episode"] == "op-good"]
    assert "CandidateVerified" in tags and "SwitchIntended" in tags, (tags, run)

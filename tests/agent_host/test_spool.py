"""agent.operations: the spool source on a real file system, the spec checks and the status documents."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

import agent.operations.spool as spool_module
from agent.operations.model import (
    Operation,
    OperationRefused,
    SourceError,
    check_spec,
    held_terminal,
    k8s_status,
    spool_status,
)
from agent.operations.spool import MAX_OPERATION_BYTES, SpoolSource, encode_status
from upgrade_core import OperationStatus

pytestmark = pytest.mark.anyio

SHA = "a" * 64
SPEC = {"nodeName": "node-1", "agent": "demo-agent",
        "archive": {"url": "https://releases.example/a.tar.gz", "sha256": SHA}, "expectVersion": "1.1.0"}
DONE = OperationStatus("op1", "Succeeded", "committed", "1.0.0", "1.1.0", None, 7, "boot", 1.0e9, 1.0e9 + 5)


def spool(tmp_path: Path) -> Path:
    d = tmp_path / "spool"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def put(d: Path, name: str, data: bytes | str) -> Path:
    tmp = d / f".{name}.tmp"
    tmp.write_bytes(data if isinstance(data, bytes) else data.encode())
    tmp.chmod(0o600)
    os.rename(tmp, d / name)
    return d / name


async def snapshot(d: Path) -> list[Operation]:
    return list(await SpoolSource(str(d), 0.05).snapshot())


async def test_operations_are_read_oldest_first_and_other_names_ignored(tmp_path: Path) -> None:
    d = spool(tmp_path)
    put(d, "b-op.json", json.dumps(SPEC))
    os.utime(d / "b-op.json", (1_000, 1_000))
    put(d, "a-op.json", json.dumps(SPEC))
    put(d, ".hidden.json", "{}")
    put(d, "notes.txt", "x")
    put(d, "bad name!.json", "{}")
    put(d, "a-op.status.json", json.dumps({"operation": "a-op", "phase": "Succeeded"}))
    ops = await snapshot(d)
    assert [o.operation for o in ops] == ["b-op", "a-op"]
    assert ops[0].spec == SPEC and ops[0].problem is None and ops[0].status is None
    assert ops[1].status == {"operation": "a-op", "phase": "Succeeded"} and held_terminal(ops[1])


async def test_files_that_are_not_ours_are_refused_never_opened(tmp_path: Path) -> None:
    d = spool(tmp_path)
    os.mkfifo(d / "fifo.json", 0o600)
    (tmp_path / "target.json").write_text(json.dumps(SPEC))
    os.symlink(tmp_path / "target.json", d / "link.json")
    os.link(put(d, "hard.json", json.dumps(SPEC)), tmp_path / "second-name")
    put(d, "wide.json", json.dumps(SPEC)).chmod(0o666)
    put(d, "big.json", b" " * (MAX_OPERATION_BYTES + 1))
    put(d, "garbage.json", b"\xff\xfe{")
    with anyio.fail_after(10):  # a FIFO must never be waited on
        problems = {o.operation: o.problem for o in await snapshot(d)}
    assert "FIFO" in (problems["fifo"] or "")
    assert "symlink" in (problems["link"] or "")
    assert "hard links" in (problems["hard"] or "")
    assert "writable by group or others" in (problems["wide"] or "")
    assert "more than" in (problems["big"] or "")
    assert "not a JSON document" in (problems["garbage"] or "")
    assert json.loads((tmp_path / "target.json").read_text()) == SPEC


async def test_a_spool_directory_that_is_not_ours_is_a_source_error(tmp_path: Path) -> None:
    d = spool(tmp_path)
    d.chmod(0o777)
    with pytest.raises(SourceError, match="writable by group or others"):
        await snapshot(d)
    (tmp_path / "real").mkdir()
    real = spool(tmp_path / "real")
    os.symlink(real, tmp_path / "linked")
    with pytest.raises(SourceError, match="symlink"):
        await snapshot(tmp_path / "linked")


async def test_a_missing_spool_is_created_0700(tmp_path: Path) -> None:
    d = tmp_path / "new-spool"
    assert await snapshot(d) == []
    assert (d.stat().st_mode & 0o777) == 0o700


async def test_publish_is_atomic_and_idempotent(tmp_path: Path) -> None:
    d = spool(tmp_path)
    put(d, "op1.json", json.dumps(SPEC))
    source = SpoolSource(str(d), 0.05)
    (op,) = await source.snapshot()
    assert await source.publish(op, DONE) is True
    path = d / "op1.status.json"
    first = (path.stat().st_ino, path.read_bytes())
    assert (path.stat().st_mode & 0o777) == 0o600
    assert json.loads(first[1]) == spool_status(DONE)
    assert await source.publish(op, DONE) is False
    assert (path.stat().st_ino, path.read_bytes()) == first
    (op,) = await source.snapshot()  # our own rename is seen at once
    assert held_terminal(op)
    assert sorted(p.name for p in d.iterdir()) == ["op1.json", "op1.status.json"]  # no temp file left


async def test_publish_never_writes_through_a_foreign_status_file(tmp_path: Path) -> None:
    d = spool(tmp_path)
    put(d, "op1.json", json.dumps(SPEC))
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, d / "op1.status.json")
    source = SpoolSource(str(d), 0.05)
    (op,) = await source.snapshot()
    assert op.problem is not None and "symlink" in op.problem
    with pytest.raises(SourceError, match="symlink"):
        await source.publish(op, DONE)
    assert victim.read_text() == "keep me"


async def test_a_new_operation_is_seen_after_it_is_renamed_in(tmp_path: Path) -> None:
    d = spool(tmp_path)
    source = SpoolSource(str(d), 0.05)
    assert list(await source.snapshot()) == []
    put(d, "later.json", json.dumps(SPEC))
    assert [o.operation for o in await source.snapshot()] == ["later"]


async def test_a_spool_directory_swapped_for_another_is_read_at_once(tmp_path: Path) -> None:
    d = spool(tmp_path)
    put(d, "old.json", json.dumps(SPEC))
    source = SpoolSource(str(d), 0.05)
    assert [o.operation for o in await source.snapshot()] == ["old"]
    os.rename(d, tmp_path / "spool.old")
    fresh = spool(tmp_path)
    put(fresh, "new.json", json.dumps(SPEC))
    old = os.stat(tmp_path / "spool.old")
    os.utime(fresh, ns=(old.st_atime_ns, old.st_mtime_ns))  # the same mtime: only the inode tells them apart
    assert [o.operation for o in await source.snapshot()] == ["new"]


async def test_a_spool_directory_made_writable_by_others_is_refused_at_the_next_poll(tmp_path: Path) -> None:
    d = spool(tmp_path)
    put(d, "op1.json", json.dumps(SPEC))
    source = SpoolSource(str(d), 0.05)
    assert [o.operation for o in await source.snapshot()] == ["op1"]
    d.chmod(0o777)  # changes the directory's ctime, not its mtime
    with pytest.raises(SourceError, match="writable"):
        await source.snapshot()


async def test_an_idle_poll_opens_nothing_until_the_directory_changes_or_the_rescan_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real_open = spool_module.open_state_dir

    def counting_open(state_dir: str, *, create: bool) -> int | None:
        opened.append(state_dir)
        return real_open(state_dir, create=create)

    monkeypatch.setattr(spool_module, "open_state_dir", counting_open)
    d = spool(tmp_path)
    put(d, "op1.json", json.dumps(SPEC))
    source = SpoolSource(str(d), 0.05)
    first = await source.snapshot()
    for _ in range(3):
        assert await source.snapshot() == first
    assert len(opened) == 1
    put(d, "op2.json", json.dumps(SPEC))
    assert [o.operation for o in await source.snapshot()] == ["op1", "op2"]
    assert len(opened) == 2
    monkeypatch.setattr(spool_module, "RESCAN_S", 0.0)  # an edit in place shows only at the periodic rescan
    await source.snapshot()
    assert len(opened) == 3


def _watching() -> bool:
    """True while some thread of this process is inside the spool's idle watch."""
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == "_watch":
                return True
            frame = frame.f_back  # type: ignore[assignment]
    return False


async def test_the_idle_wait_returns_when_an_operation_is_renamed_in_not_before(tmp_path: Path) -> None:
    d = spool(tmp_path)
    source = SpoolSource(str(d), 0.05)
    await source.snapshot()
    renamed_at: list[float] = []

    async def rename_in_later() -> None:
        await anyio.sleep(0.5)
        put(d, "op1.json", json.dumps(SPEC))
        renamed_at.append(anyio.current_time())

    async with anyio.create_task_group() as tg:
        tg.start_soon(rename_in_later)
        with anyio.fail_after(5):  # one poll_s (0.05 s) after the rename, not the 60 s timeout
            await source.wait_for_change(60.0)
        returned_at = anyio.current_time()
    assert renamed_at and returned_at >= renamed_at[0]
    assert [o.operation for o in await source.snapshot()] == ["op1"]


async def test_the_idle_wait_ends_at_its_timeout_and_at_once_when_cancelled(tmp_path: Path) -> None:
    d = spool(tmp_path)
    source = SpoolSource(str(d), 0.05)
    await source.snapshot()
    started = anyio.current_time()
    with anyio.fail_after(5):
        await source.wait_for_change(0.3)  # nothing changed: returns after 0.3 s, not after one poll
    assert anyio.current_time() - started >= 0.3
    slow = SpoolSource(str(d), 30.0)
    await slow.snapshot()
    with anyio.fail_after(5):
        with anyio.move_on_after(0.2):
            await slow.wait_for_change(60.0)  # a 30 s poll, cancelled after 0.2 s
        while _watching():  # the thread sees its stop flag and ends
            await anyio.sleep(0.01)


async def _idle_checks(source: SpoolSource, monkeypatch: pytest.MonkeyPatch, seconds: float) -> int:
    """How many times the idle wait looked at the directory during ``seconds`` with nothing changing."""
    calls = [0]
    real = source._unchanged

    def counting(now: float) -> bool:
        calls[0] += 1
        return real(now)

    monkeypatch.setattr(source, "_unchanged", counting)
    with anyio.fail_after(5):
        await source.wait_for_change(seconds)
    return calls[0]


async def test_the_idle_wait_on_a_local_disk_never_wakes_until_something_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inotify: one look when the wait starts and one at its end, however short poll_s is (the former
    poll looked 50 times in 0.5 s at poll_s = 0.01)."""
    d = spool(tmp_path)
    source = SpoolSource(str(d), 0.01)
    await source.snapshot()
    assert await _idle_checks(source, monkeypatch, 0.5) <= 2


async def test_where_inotify_cannot_see_every_writer_the_idle_wait_polls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a network file system another machine's rename sends no event: the wait polls every poll_s."""
    import agent.fs.watch as watch_module

    monkeypatch.setattr(watch_module, "fs_type", lambda path: "nfs4")
    d = spool(tmp_path)
    source = SpoolSource(str(d), 0.01)
    await source.snapshot()
    assert await _idle_checks(source, monkeypatch, 0.5) >= 10
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.wait_for_change, 60.0)
            await anyio.sleep(0.1)
            put(d, "op1.json", json.dumps(SPEC))
    assert [o.operation for o in await source.snapshot()] == ["op1"]


async def test_an_operation_edited_in_place_wakes_the_idle_wait(tmp_path: Path) -> None:
    """Rewriting a file in place leaves the directory's mtime alone; inotify reports it at once, where the
    poll saw it only at the 60 s rescan."""
    d = spool(tmp_path)
    path = put(d, "op1.json", json.dumps(SPEC))
    source = SpoolSource(str(d), 30.0)
    await source.snapshot()

    async def edit_later() -> None:
        while not _watching():  # the watch is armed (a write before it would be the rescan's to find)
            await anyio.sleep(0.01)
        with open(path, "r+b") as f:
            f.write(b"!")  # no longer JSON

    with anyio.fail_after(5):  # not the 30 s poll nor the 60 s rescan
        async with anyio.create_task_group() as tg:
            tg.start_soon(edit_later)
            await source.wait_for_change(60.0)
    [op] = await source.snapshot()
    assert op.problem is not None and "not a JSON document" in op.problem


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"nodeName": "node-2"}, "spec.nodeName: addressed to node node-2, this is node-1"),
        ({"agent": "other"}, "spec.agent: addressed to agent other, this is demo-agent"),
        ({"agent": None}, "spec.agent: required"),
        ({"archive": {"url": "https://x/a"}}, "spec.archive.sha256: required"),
        ({"archive": {"url": "https://x/a", "sha256": SHA, "sig": "x"}}, "spec.archive: unknown key sig"),
        ({"archive": "https://x/a"}, "spec.archive: required, an object"),
        ({"expectVersion": 3}, "spec.expectVersion: must be a non-empty string"),
        ({"extra": 1}, "spec: unknown key extra"),
        ({"delta": "https://x/d.zst"},
         "spec.delta: must be an object with url and sha256 (and memberSHA256)"),
        ({"delta": {"url": "https://x/d.zst"}}, "spec.delta.sha256: required"),
        ({"delta": {"url": "https://x/d", "sha256": SHA, "memberSHA256": SHA, "base": "x"}},
         "spec.delta: unknown key base"),
        ({"delta": {"url": "/tmp/d.zst", "sha256": SHA, "memberSHA256": SHA}},
         "spec.delta.url: /tmp/d.zst: not an http(s) URL"),
    ],
)
def test_spec_checks_name_the_key(change: dict[str, Any], fragment: str) -> None:
    doc = {**SPEC, **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    with pytest.raises(OperationRefused) as info:
        check_spec(doc, agent="demo-agent", node_name="node-1", node_required=True)
    assert str(info.value) == fragment or fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_a_delta_beside_the_archive_is_carried_to_the_request() -> None:
    doc = {**SPEC, "delta": {"url": "https://x/d.zst", "sha256": SHA, "memberSHA256": "b" * 64}}
    checked = check_spec(doc, agent="demo-agent", node_name="node-1", node_required=True)
    assert (checked.delta_url, checked.delta_sha256, checked.delta_member_sha256) == (
        "https://x/d.zst", SHA, "b" * 64)
    assert (checked.url, checked.sha256) == (SPEC["archive"]["url"], SHA)  # type: ignore[index]
    bare = check_spec({**SPEC, "delta": {"url": "https://x/d.zst", "sha256": SHA}}, agent="demo-agent",
                      node_name="node-1", node_required=True)  # the section 11 shape: no member digest
    assert (bare.delta_url, bare.delta_sha256, bare.delta_member_sha256) == ("https://x/d.zst", SHA, None)
    plain = check_spec(SPEC, agent="demo-agent", node_name="node-1", node_required=True)
    assert (plain.delta_url, plain.delta_sha256, plain.delta_member_sha256) == (None, None, None)


def test_node_name_is_optional_in_a_spool_file_and_required_in_kubernetes() -> None:
    doc = {k: v for k, v in SPEC.items() if k != "nodeName"}
    assert check_spec(doc, agent="demo-agent", node_name="n", node_required=False).url.startswith("https")
    with pytest.raises(OperationRefused, match=r"spec\.nodeName: required"):
        check_spec(doc, agent="demo-agent", node_name="n", node_required=True)
    with pytest.raises(OperationRefused, match="spec: must be an object"):
        check_spec([], agent="demo-agent", node_name="n", node_required=False)


def test_status_documents_are_deterministic_and_carry_the_spec_fields() -> None:
    assert encode_status(DONE) == encode_status(DONE)
    k8s = k8s_status(DONE, 3)
    assert k8s == {
        "observedGeneration": 3, "phase": "Succeeded", "operation": "op1", "fromVersion": "1.0.0",
        "toVersion": "1.1.0", "journalSeq": 7, "bootID": "boot", "startedAt": "2001-09-09T01:46:40Z",
        "finishedAt": "2001-09-09T01:46:45Z",
        "conditions": [{"type": "Complete", "status": "True", "reason": "Succeeded", "message": "",
                        "observedGeneration": 3, "lastTransitionTime": "2001-09-09T01:46:45Z"}],
    }
    snake = spool_status(DONE)
    assert set(snake) == {"operation", "phase", "result", "from_version", "to_version", "message",
                          "journal_seq", "boot_id", "started_at", "finished_at", "observed_generation",
                          "step", "attempt", "bytes_fetched", "conditions"}
    assert (snake["step"], snake["attempt"], snake["bytes_fetched"]) == (None, None, None)  # null, present
    running = OperationStatus("x", "InProgress", step="HealthChecking", attempt=2, bytes_fetched=4096)
    assert {k: v for k, v in k8s_status(running, 1).items() if k in ("step", "attempt", "bytesFetched")} == {
        "step": "HealthChecking", "attempt": 2, "bytesFetched": 4096}
    assert (spool_status(running)["step"], spool_status(running)["attempt"],
            spool_status(running)["bytes_fetched"]) == ("HealthChecking", 2, 4096)
    failed = k8s_status(OperationStatus("x", "RolledBack", "rolled_back", message="unhealthy"), 1)
    assert failed["conditions"][0]["type"] == "Failed" and failed["conditions"][0]["reason"] == "RolledBack"
    assert "journalSeq" not in failed and "bootID" not in failed  # never null in the status subresource


# -- a control plane is trusted less than root ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("archive", "message"),
    [
        ({"url": "/etc/shadow", "sha256": SHA},
         "spec.archive.url: /etc/shadow: not an http(s) URL; a control plane may name a local file only with "
         "[operations] allow_local_sources = true"),
        ({"url": "file:///etc/shadow", "sha256": SHA},
         "spec.archive.url: file:///etc/shadow: not an http(s)"),
        ({"url": "../../etc/shadow", "sha256": SHA}, "spec.archive.url: ../../etc/shadow: not an http(s)"),
        ({"url": "FILE://localhost/etc/shadow", "sha256": SHA}, "spec.archive.url: file://localhost/etc/shadow"),
        ({"url": "https://x/a", "sha256": SHA, "signatureURL": "/root/.ssh/id_ed25519"},
         "spec.archive.signatureURL: /root/.ssh/id_ed25519: not an http(s) URL"),
        ({"url": "https://u:pw@x/a\n\x1b[31m", "sha256": SHA},
         "spec.archive.url: https://x/a\\n\\x1b[31m: contains control or invisible characters"),
        ({"url": "https://x/\u202egnp.exe", "sha256": SHA},
         "spec.archive.url: https://x/\\u202egnp.exe: contains control or invisible characters"),
        ({"url": "https://x/" + "a" * 5000, "sha256": SHA},
         "spec.archive.url: 5010 characters, more than 4096"),
    ],
)
def test_a_control_plane_names_only_http_sources(archive: dict[str, str], message: str) -> None:
    doc = {**SPEC, "archive": archive}
    with pytest.raises(OperationRefused) as info:
        check_spec(doc, agent="demo-agent", node_name="node-1", node_required=True)
    assert str(info.value).startswith(message), str(info.value)
    assert "pw" not in str(info.value)


def test_local_sources_pass_where_the_host_allows_them() -> None:
    doc = {**SPEC, "archive": {"url": "/srv/a.tar.gz", "sha256": SHA, "signatureURL": "file:///srv/a.minisig"}}
    checked = check_spec(doc, agent="demo-agent", node_name="node-1", node_required=True,
                         allow_local_sources=True)
    assert (checked.url, checked.signature_url) == ("/srv/a.tar.gz", "file:///srv/a.minisig")
    with pytest.raises(OperationRefused, match="contains control"):  # still one printable line
        check_spec({**SPEC, "archive": {"url": "/srv/a\n.tar.gz", "sha256": SHA}}, agent="demo-agent",
                   node_name="node-1", node_required=True, allow_local_sources=True)


async def test_a_status_with_control_characters_and_60_kb_is_escaped_bounded_and_read_back(
    tmp_path: Path,
) -> None:
    """A message quoting what a control plane sent (a newline that would forge a log line, ANSI, a bidi
    override, 60 KB of characters JSON writes as 12 bytes each): the status file holds it escaped and
    bounded, within what the spool's reader accepts, so the operator reads its own status back."""
    d = spool(tmp_path)
    put(d, "op1.json", json.dumps(SPEC))
    source = SpoolSource(str(d), 0.05)
    (op,) = await source.snapshot()
    message = "refused: x\nupgrade-agent: forged\x1b[31m\u202e" + "\U0001f600" * 60_000
    loud = OperationStatus("op1", "Failed", "aborted", "1.0.0\n", "9" * 200, message, 7, "b" * 100, 1.0e9,
                           1.0e9 + 5)
    assert await source.publish(op, loud) is True
    data = (d / "op1.status.json").read_bytes()
    assert len(data) < MAX_OPERATION_BYTES
    status = json.loads(data)
    assert status["message"].startswith("refused: x\\nupgrade-agent: forged\\x1b[31m\\u202e\U0001f600")
    assert status["message"].endswith(" more characters]") and len(status["message"]) <= 2048
    assert status["conditions"][0]["message"] == status["message"]
    assert status["from_version"] == "1.0.0\\n" and len(status["to_version"]) <= 128
    assert len(status["boot_id"]) <= 64
    (op,) = await source.snapshot()
    assert op.problem is None and held_terminal(op)
    assert await source.publish(op, loud) is False  # the same bytes: not written again


def test_the_sanitiser_escapes_what_a_terminal_or_journald_would_interpret() -> None:
    from agent.sanitize import clean_text

    assert clean_text("a\nb\r\tc\x00\x1b[2J\x7f\u0085\u009b\u2028\u202e\u2066\u200b\ufeff\ud800") == (
        "a\\nb\\r\\tc\\x00\\x1b[2J\\x7f\\x85\\x9b\\u2028\\u202e\\u2066\\u200b\\ufeff\\ud800")
    kept = "na\u00efve \u65e5\u672c \U0001f600 back\\slash"  # other scripts, emoji and backslashes pass
    assert clean_text(kept) == kept
    once = clean_text("x\x1b" * 1000, 100)
    assert clean_text(once, 100) == once and len(once) <= 100
    assert once == "x\\x1b" * 14 + "x ...[1971 more characters]"  # never half an escape
    assert len(clean_text("a" * 60_000, 4096)) == 4096
    with pytest.raises(ValueError):
        clean_text("x", 10)

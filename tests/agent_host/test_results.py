"""agent.host.results: the default result sink (design §4.3 step 9, design §7 JSON) and its durability
(C12)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.host.results import FileResultSink, read_result
from upgrade_core import UpgradeResult
from upgrade_core.errors import HostError

from ._helpers import snapshot, syscall_spy

pytestmark = pytest.mark.anyio

RESULT = UpgradeResult("op-1.a_b", "rolled_back", "1.0.0", "2.0.0", "blue", "health: exited 1")


async def test_publish_writes_spec_json_with_modes(tmp_path: Path) -> None:
    state = tmp_path / "var" / "lib" / "ua" / "demo"
    await FileResultSink(str(state)).publish(RESULT)
    path = state / "results" / "op-1.a_b.json"
    assert json.loads(path.read_text()) == {
        "operation": "op-1.a_b", "result": "rolled_back", "from_version": "1.0.0", "to_version": "2.0.0",
        "slot": "blue", "reason": "health: exited 1",
    }
    assert list(json.loads(path.read_text())) == [
        "operation", "result", "from_version", "to_version", "slot", "reason"]
    assert state.stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "var").stat().st_mode & 0o777 == 0o755
    assert read_result(str(state), "op-1.a_b") == RESULT
    assert read_result(str(state), "other") is None


async def test_publish_is_idempotent_and_durable_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "s"
    sink = FileResultSink(str(state))
    with syscall_spy(monkeypatch) as calls:
        await sink.publish(RESULT)
    results_dir = str(state / "results")
    final = os.path.join(results_dir, "op-1.a_b.json")
    tail = calls[-4:]
    assert [c[0] for c in tail] == ["write", "fsync", "rename", "fsync"]
    assert tail[1][1] == tail[0][1]
    assert tail[2] == ("rename", tail[0][1], final)
    assert tail[3] == ("fsync", results_dir)
    before = snapshot(tmp_path)
    with syscall_spy(monkeypatch) as calls:
        await sink.publish(RESULT)
    assert snapshot(tmp_path) == before
    assert not any(c[0] in ("write", "rename") for c in calls)
    committed = UpgradeResult("op-1.a_b", "committed", "1.0.0", "2.0.0", "green")
    await sink.publish(committed)
    assert read_result(str(state), "op-1.a_b") == committed
    assert os.listdir(results_dir) == ["op-1.a_b.json"]


async def test_result_without_operation_is_not_stored(tmp_path: Path) -> None:
    await FileResultSink(str(tmp_path / "s")).publish(UpgradeResult(None, "noop"))
    assert not (tmp_path / "s").exists()


async def test_bad_operation_id_and_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="not an operation id"):
        await FileResultSink(str(tmp_path)).publish(UpgradeResult("../escape", "noop"))
    assert os.listdir(tmp_path) == []
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.json").write_text('{"result": "maybe"}')
    with pytest.raises(HostError, match=r"x\.json: unreadable result"):
        read_result(str(tmp_path), "x")
    (tmp_path / "results" / "y.json").write_text("{")
    with pytest.raises(HostError, match=r"y\.json: unreadable result"):
        read_result(str(tmp_path), "y")


def test_read_result_creates_nothing(tmp_path: Path) -> None:
    assert read_result(str(tmp_path / "nope"), "op") is None
    assert os.listdir(tmp_path) == []

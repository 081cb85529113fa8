"""``KubernetesSource`` against the mock API server: list and cache, watch resume, relist on 410, status
writes once (idempotent, 409 re-read and retry), deleted objects, configuration errors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.config.loader import OperationsSection
from agent.errors import ConfigError
from agent.operations import kubernetes as kmod
from agent.operations.kubernetes import KubernetesSource
from agent.operations.model import SourceError, k8s_status
from agent.testing.sandbox import free_port
from tests.kube.apiserver import UpgradeOperationsAPI, kubeconfig_for, serve
from tests.kube.conftest import spec
from upgrade_core import OperationStatus

pytestmark = pytest.mark.anyio
NS = "default"
Mock = UpgradeOperationsAPI
Source = KubernetesSource


@pytest.fixture
async def mock() -> AsyncIterator[UpgradeOperationsAPI]:
    async with serve() as api:
        yield api


async def source_for(mock: UpgradeOperationsAPI, tmp_path: Path, node: str = "node-a") -> KubernetesSource:
    path = kubeconfig_for(mock.base_url, str(tmp_path / "kubeconfig"), token="s3cret-token")
    section = OperationsSection(source="kubernetes", kubeconfig=path, node_name=node, namespace=NS)
    with anyio.fail_after(10):
        return await KubernetesSource.create(section, agent="demo-agent")


@pytest.fixture
async def src(mock: UpgradeOperationsAPI, tmp_path: Path) -> AsyncIterator[KubernetesSource]:
    """A source for ``node-a`` on the mock (nothing contacted until its first call)."""
    source = await source_for(mock, tmp_path)
    try:
        yield source
    finally:
        await source.aclose()


def put(mock: UpgradeOperationsAPI, name: str, node: str = "node-a") -> dict[str, Any]:
    return mock.put_object(NS, {"metadata": {"name": name}, "spec": spec(node)})


def requests(mock: UpgradeOperationsAPI, *, watch: bool | None = None, method: str = "GET",
             subresource: str | None = None) -> list[Any]:
    """The recorded requests on upgradeoperations, filtered."""
    out = []
    for r in mock._requests:
        if r.resource is None or r.resource.plural != "upgradeoperations" or r.method.value != method:
            continue
        if subresource is not None and r.subresource != subresource:
            continue
        if watch is not None and (r.params.get("watch") == "True") != watch:
            continue
        out.append(r)
    return out


def done(op_id: str, seq: int = 7) -> OperationStatus:
    return OperationStatus(op_id, "Succeeded", result="committed", from_version="1.0.0", to_version="1.1.0",
                           journal_seq=seq, boot_id="b" * 32, started_at=1_796_000_000.0,
                           finished_at=1_796_000_060.0)


async def test_snapshot_lists_once_with_field_selector(mock: Mock, src: Source) -> None:
    a = put(mock, "a")
    put(mock, "b", node="node-b")
    ops = await src.snapshot()
    assert [op.name for op in ops] == ["default/a"]
    op = ops[0]
    assert op.operation == a["metadata"]["uid"] and op.generation == 1 and op.status is None
    assert op.spec == a["spec"] and op.problem is None and op.order[1] == "default/a"
    assert op.order[0] > 1_700_000_000
    assert await src.snapshot() == ops  # from the cache
    lists = requests(mock, watch=False)
    assert len(lists) == 1
    assert lists[0].params["fieldSelector"] == "spec.nodeName=node-a"
    assert lists[0].headers["Authorization"] == "Bearer s3cret-token"


async def test_foreign_objects_are_dropped_client_side(mock: Mock, src: Source) -> None:
    await src.snapshot()
    foreign = put(mock, "x", node="node-b")
    src._apply("ADDED", foreign)  # as if the server had ignored the field selector
    assert await src.snapshot() == []


async def test_another_agents_object_on_this_node_is_never_taken_nor_written(mock: Mock, src: Source) -> None:
    """Same node, another ``spec.agent``: not in the snapshot, whether listed or watched, and a status
    publication aimed at it (an operation taken from it earlier) writes nothing: that agent's operator runs
    and reports it."""
    ours = put(mock, "ours")
    theirs = mock.put_object(NS, {"metadata": {"name": "theirs"}, "spec": {**spec(), "agent": "other-agent"}})
    assert [op.name for op in await src.snapshot()] == ["default/ours"]
    mock.put_object(NS, {"metadata": {"name": "theirs-later"}, "spec": {**spec(), "agent": "other-agent"}})
    with anyio.fail_after(10):
        await src.wait_for_change(5)
    assert [op.name for op in await src.snapshot()] == ["default/ours"]
    stale = (await src.snapshot())[0]
    aimed = type(stale)(operation=theirs["metadata"]["uid"], name="default/theirs", spec=theirs["spec"])
    assert await src.publish(aimed, done(aimed.operation)) is False
    assert mock.status_writes(NS, "theirs") == 0 and "status" not in (mock.stored(NS, "theirs") or {})
    assert await src.publish(stale, done(ours["metadata"]["uid"])) is True


async def test_a_token_file_or_client_key_others_may_read_is_refused_exit_4(
    mock: Mock, tmp_path: Path
) -> None:
    from upgrade_core.errors import HostRefusedError

    path = Path(kubeconfig_for(mock.base_url, str(tmp_path / "kubeconfig")))
    section = OperationsSection(source="kubernetes", kubeconfig=str(path), node_name="node-a", namespace=NS)
    secret = tmp_path / "credential"
    secret.write_text("s3cret\n")
    for key in ("tokenFile", "client-key"):
        doc = json.loads(path.read_text())
        doc["users"][0]["user"] = {key: str(secret)}
        path.write_text(json.dumps(doc))
        secret.chmod(0o640)
        with anyio.fail_after(10), pytest.raises(HostRefusedError) as caught:
            await KubernetesSource.create(section, agent="demo-agent")
        assert str(caught.value) == (
            f"{secret}: the kubeconfig's {key} is readable or writable by group or others (mode 0640); a "
            "credential file must be mode 0600 or stricter (chmod 600); nothing was changed")
        assert caught.value.exit_code == 4
    assert requests(mock) == []  # refused before anything was contacted


async def test_watch_resumes_from_last_resource_version(mock: Mock, src: Source) -> None:
    put(mock, "a")
    await src.snapshot()
    listed_rv = str(mock.resource_version)
    c = put(mock, "c")  # before the watch: the watch replays it from the history, no race
    with anyio.fail_after(10):
        await src.wait_for_change(5)
    assert [op.name for op in await src.snapshot()] == ["default/a", "default/c"]
    mock.remove(NS, "a")
    with anyio.fail_after(10):
        await src.wait_for_change(5)
    assert [op.name for op in await src.snapshot()] == ["default/c"]
    watches = requests(mock, watch=True)
    assert [w.params["resourceVersion"] for w in watches] == [listed_rv, c["metadata"]["resourceVersion"]]
    assert all(w.params["fieldSelector"] == "spec.nodeName=node-a" for w in watches)
    assert len(requests(mock, watch=False)) == 1  # never listed again


async def test_wait_for_change_returns_after_the_timeout(mock: Mock, src: Source) -> None:
    await src.snapshot()
    with anyio.fail_after(30):
        start = anyio.current_time()
        await src.wait_for_change(0.3)
        assert anyio.current_time() - start < 15  # the server side ends it after 1 s
    assert requests(mock, watch=True)[0].params["timeoutSeconds"] == "1"


async def test_410_gone_relists(mock: Mock, src: Source) -> None:
    put(mock, "a")
    await src.snapshot()
    put(mock, "b")
    mock.expire_history()
    with anyio.fail_after(10):
        await src.wait_for_change(5)
    assert len(requests(mock, watch=False)) == 1
    assert [op.name for op in await src.snapshot()] == ["default/a", "default/b"]
    assert len(requests(mock, watch=False)) == 2  # relisted
    put(mock, "c")
    with anyio.fail_after(10):
        await src.wait_for_change(5)
    assert [op.name for op in await src.snapshot()] == ["default/a", "default/b", "default/c"]


async def test_410_as_http_status_relists(tmp_path: Path) -> None:
    async with serve(expired_as_http=True) as mock:
        put(mock, "a")
        src = await source_for(mock, tmp_path)
        try:
            await src.snapshot()
            put(mock, "b")
            mock.expire_history()
            with anyio.fail_after(10):
                await src.wait_for_change(5)
            assert [op.name for op in await src.snapshot()] == ["default/a", "default/b"]
            assert len(requests(mock, watch=False)) == 2
        finally:
            await src.aclose()


async def test_a_watch_the_server_never_ends_is_bounded(tmp_path: Path) -> None:
    async with serve(honour_watch_timeout=False) as mock:
        src = await source_for(mock, tmp_path)
        try:
            await src.snapshot()
            with anyio.fail_after(30):
                start = anyio.current_time()
                await src.wait_for_change(1.5)
                assert anyio.current_time() - start < 15  # the mock would hold it open 60 s
        finally:
            await src.aclose()


async def test_publish_writes_once_and_is_idempotent(mock: Mock, src: Source) -> None:
    put(mock, "a")
    (op,) = await src.snapshot()
    with anyio.fail_after(10):
        assert await src.publish(op, done(op.operation)) is True
        assert await src.publish(op, done(op.operation)) is False
    stored = mock.stored(NS, "a")
    assert stored is not None and stored["status"] == k8s_status(done(op.operation), 1)
    assert mock.status_writes(NS, "a") == 1
    assert len(requests(mock, method="PUT", subresource="status")) == 1
    (cached,) = await src.snapshot()
    assert cached.status == stored["status"]


async def test_publish_conflict_rereads_and_retries(mock: Mock, src: Source) -> None:
    put(mock, "a")
    (op,) = await src.snapshot()
    mock.after_next_get(NS, "a", lambda: mock.mutate(NS, "a", lambda o: o["metadata"].update(
        labels={"someone": "else"})))
    with anyio.fail_after(10):
        assert await src.publish(op, done(op.operation)) is True
    puts = requests(mock, method="PUT", subresource="status")
    assert len(puts) == 2  # the first one 409
    assert len([r for r in requests(mock) if r.name == "a"]) == 2  # re-read once
    assert mock.status_writes(NS, "a") == 1
    stored = mock.stored(NS, "a")
    assert stored is not None
    assert stored["metadata"]["labels"] == {"someone": "else"}  # the other writer's change is kept
    assert stored["status"]["journalSeq"] == 7


async def test_publish_gives_up_after_bounded_conflicts(mock: Mock, src: Source) -> None:
    put(mock, "a")
    (op,) = await src.snapshot()
    for i in range(kmod.CONFLICT_RETRIES + 1):
        mock.after_next_get(NS, "a", lambda i=i: mock.mutate(NS, "a", lambda o: o["metadata"].update(
            labels={"n": str(i)})))
    with anyio.fail_after(10), pytest.raises(SourceError, match="409"):
        await src.publish(op, done(op.operation))
    assert mock.status_writes(NS, "a") == 0


async def test_publish_to_a_deleted_object_is_false(mock: Mock, src: Source) -> None:
    put(mock, "a")
    (op,) = await src.snapshot()
    mock.remove(NS, "a")
    with anyio.fail_after(10):
        assert await src.publish(op, done(op.operation)) is False
    put(mock, "a")  # the same name again: another uid, another operation
    with anyio.fail_after(10):
        assert await src.publish(op, done(op.operation)) is False
    assert mock.status_writes(NS, "a") == 0


async def test_status_with_another_journal_seq_is_written(mock: Mock, src: Source) -> None:
    put(mock, "a")
    (op,) = await src.snapshot()
    with anyio.fail_after(10):
        assert await src.publish(op, done(op.operation, seq=7))
        assert await src.publish(op, done(op.operation, seq=8))
    assert mock.status_writes(NS, "a") == 2


@pytest.mark.parametrize("content", [None, b"", b"{not yaml: [", b"apiVersion: v1\nkind: Config\n"])
async def test_bad_kubeconfig_is_a_config_error(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_bytes(content)
        path.chmod(0o600)
    section = OperationsSection(source="kubernetes", kubeconfig=str(path), node_name="n")
    with anyio.fail_after(10), pytest.raises(ConfigError) as caught:
        await KubernetesSource.create(section, agent="demo-agent")
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    assert caught.value.exit_code == 2


async def test_no_in_cluster_environment_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with anyio.fail_after(10), pytest.raises(ConfigError) as caught:
        await KubernetesSource.create(OperationsSection(source="kubernetes", node_name="n"),
                                      agent="demo-agent")
    assert "\n" not in str(caught.value) and "serviceaccount/token" in str(caught.value)


async def test_namespace_defaults_to_the_service_account_file(tmp_path: Path, mock: UpgradeOperationsAPI,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = kubeconfig_for(mock.base_url, str(tmp_path / "kubeconfig"))
    section = OperationsSection(source="kubernetes", kubeconfig=path, node_name="n")
    monkeypatch.setattr(kmod, "SERVICE_ACCOUNT_DIR", str(tmp_path / "absent"))
    src = await KubernetesSource.create(section, agent="demo-agent")
    assert src.namespace == "default"
    await src.aclose()
    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "namespace").write_text("upgrades\n")
    monkeypatch.setattr(kmod, "SERVICE_ACCOUNT_DIR", str(tmp_path / "sa"))
    src = await KubernetesSource.create(section, agent="demo-agent")
    assert src.namespace == "upgrades"
    await src.aclose()


async def test_unreachable_server_is_a_one_line_source_error(tmp_path: Path) -> None:
    port = free_port()  # nothing listens on it
    path = kubeconfig_for(f"http://user:pw@127.0.0.1:{port}", str(tmp_path / "kc"), token="s3cret-token")
    section = OperationsSection(source="kubernetes", kubeconfig=path, node_name="n")
    src = await KubernetesSource.create(section, agent="demo-agent")
    try:
        with anyio.fail_after(40), pytest.raises(SourceError) as caught:
            await src.snapshot()
        message = str(caught.value)
        assert "\n" not in message and "s3cret" not in message and "pw@" not in message
        assert f"127.0.0.1:{port}" in message
    finally:
        await src.aclose()


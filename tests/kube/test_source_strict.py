"""``KubernetesSource`` against the strict mock: statuses within the CRD's bounds, objects being deleted
never started, credentials read again after a 401 (kubeconfig token, ``tokenFile``, ``exec`` plugin) and a
refusal that stays, ``fieldValidation=Strict`` on every write, bookmarks moving the watch's version."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.config.loader import OperationsSection
from agent.operations.kubernetes import KubernetesSource
from agent.operations.model import CredentialsRefused, clamp
from tests.kube.apiserver import UpgradeOperationsAPI, kubeconfig_for, serve
from tests.kube.test_source import NS, done, put, requests, source_for
from upgrade_core import OperationStatus

pytestmark = pytest.mark.anyio
Mock = UpgradeOperationsAPI
Source = KubernetesSource


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def mock() -> Any:
    async with serve(any_token_is_admin=False) as api:
        api.issue_token("s3cret-token")
        yield api


@pytest.fixture
async def src(mock: Mock, tmp_path: Path) -> Any:
    source = await source_for(mock, tmp_path)
    try:
        yield source
    finally:
        await source.aclose()


def test_clamp_cuts_on_a_character_and_says_so() -> None:
    assert clamp("1.2.3", 128) == "1.2.3"
    assert clamp("1" * 129, 128) == "1" * 125 + "..."
    cut = clamp("é" * 100, 128)  # 2 bytes each: 62 whole characters, then the ellipsis
    assert cut == "é" * 62 + "..." and len(cut.encode()) == 127


async def test_a_status_beyond_the_crd_bounds_is_written_clamped(mock: Mock, src: Source) -> None:
    obj = put(mock, "long")
    (op,) = await src.snapshot()
    status = OperationStatus(op.operation, "Succeeded", result="committed", from_version="1.0.0",
                             to_version="2.0.0-" + "x" * 300, message="é" * 20_000, journal_seq=3,
                             boot_id="b" * 32, started_at=1_796_000_000.0, finished_at=1_796_000_060.0)
    with anyio.fail_after(30):
        assert await src.publish(op, status) is True
    held = mock.stored(NS, obj["metadata"]["name"])
    assert held is not None
    written = held["status"]
    assert written["phase"] == "Succeeded" and written["journalSeq"] == 3
    # cut by the sanitiser within the CRD's maxLength (128 for a version), saying how much was left out
    assert written["toVersion"].startswith("2.0.0-xxx") and len(written["toVersion"].encode()) <= 128
    assert written["toVersion"].endswith("more characters]")
    assert len(written["message"].encode()) <= 32768 and written["message"].endswith("more characters]")
    assert written["conditions"][0]["message"] == written["message"]


async def test_an_object_being_deleted_is_refused_and_never_reported_started(mock: Mock, src: Source) -> None:
    mock.put_object(NS, {"metadata": {"name": "held", "finalizers": ["example.com/hold"]},
                         "spec": put(mock, "plain")["spec"]})
    mock.request_delete(NS, "held")
    ops = {op.name: op for op in await src.snapshot()}
    assert ops["default/plain"].problem is None
    held = ops["default/held"]
    assert held.problem is not None and "being deleted; not started" in held.problem
    assert held.generation == 2  # the DELETE bumped it
    # listed before the DELETE, started after it: the InProgress status is not written
    mock.put_object(NS, {"metadata": {"name": "late", "finalizers": ["example.com/hold"]},
                         "spec": put(mock, "other")["spec"]})
    late = next(op for op in await _relisted(src) if op.name == "default/late")
    assert late.problem is None
    mock.request_delete(NS, "late")
    with anyio.fail_after(30):
        assert await src.publish(late, OperationStatus(late.operation, "InProgress")) is False
        assert await src.publish(late, done(late.operation)) is True  # a result is still reported
    assert mock.status_history(NS, "late") == [mock.stored(NS, "late")["status"]]  # type: ignore[index]


async def _relisted(src: Source) -> Any:
    src._resource_version = None
    return await src.snapshot()


async def test_status_writes_ask_for_strict_field_validation(mock: Mock, src: Source) -> None:
    put(mock, "a")
    (op,) = await src.snapshot()
    with anyio.fail_after(30):
        assert await src.publish(op, done(op.operation)) is True
    (write,) = requests(mock, method="PUT", subresource="status")
    assert write.params["fieldValidation"] == "Strict"


def _exec_kubeconfig(url: str, path: Path, token_file: Path) -> str:
    """A kubeconfig whose user is an exec plugin printing an ExecCredential with the token in ``token_file``
    (client.authentication.k8s.io/v1, as ``kubectl`` and client-go run it)."""
    code = ("import json,sys; print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', "
            "'kind': 'ExecCredential', 'status': {'token': open(sys.argv[1]).read().strip()}}))")
    doc = json.loads(Path(kubeconfig_for(url, str(path), namespace=NS)).read_text())
    doc["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                        "command": sys.executable, "args": ["-c", code, str(token_file)],
                                        "interactiveMode": "Never"}}
    path.write_text(json.dumps(doc))
    return str(path)


def _token_file_kubeconfig(url: str, path: Path, token_file: Path) -> str:
    doc = json.loads(Path(kubeconfig_for(url, str(path), namespace=NS)).read_text())
    doc["users"][0]["user"] = {"tokenFile": str(token_file)}
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("where", ["kubeconfig", "tokenFile", "exec"])
async def test_a_401_reads_the_credentials_again(tmp_path: Path, where: str) -> None:
    """The token expires; a renewed one is on disk (the kubeconfig rewritten, its tokenFile rewritten, or
    what its exec plugin prints): the next call succeeds without a restart, and sends the new token."""
    async with serve(any_token_is_admin=False) as mock:
        mock.issue_token("first", expires_in_s=3600)
        token_file = tmp_path / "token"
        token_file.write_text("first")  # kubernetes_asyncio keeps a trailing newline of a tokenFile
        token_file.chmod(0o600)  # a credential file others may read is refused
        path = tmp_path / "kubeconfig"
        if where == "kubeconfig":
            kubeconfig_for(mock.base_url, str(path), namespace=NS, token="first")
        elif where == "tokenFile":
            _token_file_kubeconfig(mock.base_url, path, token_file)
        else:
            _exec_kubeconfig(mock.base_url, path, token_file)
        section = OperationsSection(source="kubernetes", kubeconfig=str(path), node_name="node-a",
                                    namespace=NS)
        with anyio.fail_after(30):
            source = await KubernetesSource.create(section, agent="demo-agent")
        try:
            put(mock, "a")
            with anyio.fail_after(30):
                assert [op.name for op in await source.snapshot()] == ["default/a"]
            mock.issue_token("first", expires_in_s=-1)  # expired
            mock.issue_token("second")
            if where == "kubeconfig":
                kubeconfig_for(mock.base_url, str(path), namespace=NS, token="second")
            else:
                token_file.write_text("second")
            put(mock, "b")
            with anyio.fail_after(30):
                await source.wait_for_change(5)  # the watch: 401, read again, watched again
                (op,) = [op for op in await source.snapshot() if op.name == "default/b"]
                assert await source.publish(op, done(op.operation)) is True
        finally:
            await source.aclose()
        tokens = [r.headers.get("Authorization") for r in requests(mock, watch=None)]
        tokens += [r.headers.get("Authorization") for r in requests(mock, method="PUT")]
        assert tokens[0] == "Bearer first" and tokens[-1] == "Bearer second"
        assert mock.status_history(NS, "b")[-1]["phase"] == "Succeeded"


async def test_a_401_with_the_credentials_read_again_is_credentials_refused(mock: Mock, src: Source) -> None:
    put(mock, "a")
    await src.snapshot()
    mock.revoke_token("s3cret-token")
    with pytest.raises(CredentialsRefused) as caught:
        with anyio.fail_after(30):
            await src.wait_for_change(5)
    line = str(caught.value)
    assert "\n" not in line and "s3cret" not in line
    assert "watch: HTTP 401 Unauthorized with the credentials read again from" in line
    assert "kubeconfig: the token is revoked or expired; renew it" in line
    (op,) = await src.snapshot()
    with pytest.raises(CredentialsRefused, match=r"get default/a: HTTP 401 Unauthorized"):
        with anyio.fail_after(30):
            await src.publish(op, done(op.operation))


async def test_a_bookmark_moves_the_watch_version_past_other_nodes_events(mock: Mock, src: Source) -> None:
    put(mock, "a")
    await src.snapshot()

    async def elsewhere_once_watching() -> None:
        # the watch cache bookmarks only writes made after the watch began (tests/kube/test_conformance.py)
        with anyio.fail_after(10):
            while not requests(mock, watch=True):
                await anyio.sleep(0.01)
        put(mock, "elsewhere", node="node-b")  # filtered out: only a bookmark tells the watch it is past it

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(elsewhere_once_watching)
            await src.wait_for_change(3)  # the server ends it after 3 s, its bookmark comes 2 s before
    assert src._resource_version == str(mock.resource_version)
    mock.expire_history()  # a watch from the listed version would now be 410 and list again
    with anyio.fail_after(30):
        await src.wait_for_change(3)
    assert len(requests(mock, watch=False)) == 1
    assert requests(mock, watch=True)[0].params["allowWatchBookmarks"] == "True"

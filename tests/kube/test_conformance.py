"""What the operator relies on from the Kubernetes API, pinned against the mock, or against a real server.

By default these run against ``tests/kube/apiserver.py`` (kmock's ``KubernetesEmulator``, subclassed). With
``UPGRADE_CORE_KUBECONFIG`` naming a kubeconfig (a real API server with ``deploy/kubernetes/crd.yaml``
applied), the same tests run there instead, unchanged, so each behaviour the mock fakes is checkable (the
RBAC test also needs ``UPGRADE_CORE_AGENT_TOKEN``, see ``conftest.py``). Each test pins one behaviour; the
fidelity table (behaviour | mock | conformance test | real server) is in docs/managed.md, "The mock API
server". What the mock fakes, in short: identity and generation on create; one global resourceVersion; the
status subresource; generation on spec changes; the spec's immutability rule; optimistic concurrency (409,
422 without a version); field selectors; watch resume from a bounded history, 410 Expired, timeoutSeconds;
the CRD's schema on every write (422 Invalid, one cause per field); pruning of unknown fields with a warning
each, refused under ``fieldValidation=Strict``; bookmarks; 401 for a revoked or expired token; 403 outside
the Role of ``deploy/kubernetes/rbac.yaml``; finalizers and ``deletionTimestamp``.

Still not modelled (not relied on): admission webhooks, validation ratcheting, CEL rules beyond the spec's,
duplicate fields, strategic-merge and JSON patch, label selectors, pagination, server-side apply, TLS client
certificates, ClusterRoles and group subjects, the exact wording of field errors (asserted by reason and
field only).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from agent.operations.kubernetes import GROUP, PLURAL, VERSION, _lean_import
from tests.kube.apiserver import serve
from tests.kube.conftest import Cluster, spec

pytestmark = pytest.mark.anyio

ApiException = _lean_import().ApiException


async def _status_put(c: Cluster, obj: dict[str, Any], status: dict[str, Any], **changes: Any) -> Any:
    body = dict(obj, status=status, **changes)
    with anyio.fail_after(30):
        return await c.api.replace_namespaced_custom_object_status(
            GROUP, VERSION, c.namespace, PLURAL, obj["metadata"]["name"], body)


async def test_create_sets_identity_and_drops_status(cluster: Cluster) -> None:
    obj = await cluster.create("ident", status={"phase": "Succeeded"})
    meta = obj["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    assert "status" not in obj or not obj["status"]
    again = await cluster.create("ident2")
    assert again["metadata"]["uid"] != meta["uid"]
    assert int(again["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])


async def test_status_subresource_ignores_spec(cluster: Cluster) -> None:
    obj = await cluster.create("st")
    written = await _status_put(cluster, obj, {"phase": "InProgress"}, spec=spec(node="elsewhere"))
    assert written["status"] == {"phase": "InProgress"}
    assert written["spec"] == obj["spec"]
    assert written["metadata"]["generation"] == 1
    assert int(written["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])


async def test_main_resource_ignores_status(cluster: Cluster) -> None:
    obj = await cluster.create("main")
    obj = await _status_put(cluster, obj, {"phase": "InProgress"})
    body = dict(obj, status={"phase": "Succeeded"})
    body["metadata"] = dict(obj["metadata"], labels={"x": "y"})
    with anyio.fail_after(30):
        written = await cluster.api.replace_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, obj["metadata"]["name"], body)
    assert written["status"] == {"phase": "InProgress"}
    assert written["metadata"]["labels"] == {"x": "y"}
    assert written["metadata"]["generation"] == 1


async def test_stale_resource_version_is_409(cluster: Cluster) -> None:
    obj = await cluster.create("conflict")
    await cluster.label(obj["metadata"]["name"], "someone-else")
    with pytest.raises(ApiException) as caught:
        await _status_put(cluster, obj, {"phase": "Succeeded"})
    assert caught.value.status == 409
    assert "status" not in await cluster.get(obj["metadata"]["name"])


async def test_watch_from_expired_version_is_410(cluster: Cluster) -> None:
    old = await cluster.expired_version()
    events = await cluster.watch(old, timeout_s=5)  # an HTTP 410 comes back as an ERROR event too
    assert events and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")


async def test_field_selectors_filter_list_and_watch(cluster: Cluster) -> None:
    mine = await cluster.create("mine", node="node-a")
    await cluster.create("theirs", node="node-b")
    with anyio.fail_after(30):
        listed = await cluster.api.list_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, field_selector="spec.nodeName=node-a")
    names = {o["metadata"]["name"] for o in listed["items"]}
    assert mine["metadata"]["name"] in names and cluster.prefix + "theirs" not in names
    assert all(o["spec"]["nodeName"] == "node-a" for o in listed["items"])
    assert listed["metadata"]["resourceVersion"]
    with anyio.fail_after(30):
        by_name = await cluster.api.list_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, field_selector=f"metadata.name={cluster.prefix}theirs")
    assert [o["metadata"]["name"] for o in by_name["items"]] == [cluster.prefix + "theirs"]
    since = listed["metadata"]["resourceVersion"]
    await cluster.create("theirs2", node="node-b")
    await cluster.create("mine2", node="node-a")
    events = await cluster.watch(since, field_selector="spec.nodeName=node-a", until=cluster.prefix + "mine2")
    assert [e["object"]["metadata"]["name"] for e in events] == [cluster.prefix + "mine2"]


async def test_generation_bumps_on_spec_change_only(cluster: Cluster) -> None:
    obj = await cluster.create("gen")
    name = obj["metadata"]["name"]
    obj = await _status_put(cluster, obj, {"phase": "InProgress"})
    obj = await cluster.label(name, "v1")
    assert obj["metadata"]["generation"] == 1
    # the CRD makes spec immutable (x-kubernetes-validations self == oldSelf): a change is refused
    with pytest.raises(ApiException) as caught:
        with anyio.fail_after(30):
            await cluster.api.patch_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, PLURAL, name, {"spec": {"expectVersion": "9.9.9"}},
                _content_type="application/merge-patch+json")
    assert caught.value.status == 422
    assert (await cluster.get(name))["metadata"]["generation"] == 1


async def test_mock_generation_bumps_on_a_spec_change_when_mutable(tmp_path: Any) -> None:
    async with serve(immutable_spec=False) as mock:
        obj = mock.put_object("default", {"metadata": {"name": "g"}, "spec": spec()})
        changed = mock.mutate("default", "g", lambda o: o["spec"].update(expectVersion="2.0.0"))
        assert changed["metadata"]["generation"] == obj["metadata"]["generation"] + 1
        same = mock.mutate("default", "g", lambda o: o["metadata"].update(labels={"a": "b"}))
        assert same["metadata"]["generation"] == changed["metadata"]["generation"]


async def test_watch_resumes_without_replaying_older_events(cluster: Cluster) -> None:
    first = await cluster.create("first")
    touched = await cluster.label(first["metadata"]["name"], "v1")
    since = touched["metadata"]["resourceVersion"]
    second = await cluster.create("second")
    events = await cluster.watch(since, until=second["metadata"]["name"])
    ours = [e for e in events if e["object"]["metadata"]["name"].startswith(cluster.prefix)]
    seen = [(e["type"], e["object"]["metadata"]["name"]) for e in ours]
    assert seen == [("ADDED", second["metadata"]["name"])]
    assert all(int(e["object"]["metadata"]["resourceVersion"]) > int(since) for e in events)


async def test_watch_ends_after_timeout_seconds(cluster: Cluster) -> None:
    obj = await cluster.create("quiet")
    events = await cluster.watch(obj["metadata"]["resourceVersion"], timeout_s=1)
    assert all(e["type"] != "ERROR" for e in events)


async def test_update_without_resource_version_is_refused(cluster: Cluster) -> None:
    obj = await cluster.create("uncond")
    meta = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    with pytest.raises(ApiException) as caught:
        await _status_put(cluster, obj, {"phase": "Succeeded"}, metadata=meta)
    assert caught.value.status in (409, 422)


def _status_of(exc: Any) -> dict[str, Any]:
    """The ``Status`` body of an ``ApiException``."""
    doc: dict[str, Any] = json.loads(exc.body)
    assert doc["kind"] == "Status" and doc["status"] == "Failure", doc
    return doc


def _causes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(c["reason"], c["field"]) for c in doc["details"]["causes"]}


async def test_status_beyond_the_schema_is_422_naming_the_field(cluster: Cluster) -> None:
    obj = await cluster.create("toolong")
    with pytest.raises(ApiException) as caught:
        await _status_put(cluster, obj, {"phase": "Succeeded", "toVersion": "1" * 129})
    assert caught.value.status == 422
    doc = _status_of(caught.value)
    assert (doc["code"], doc["reason"]) == (422, "Invalid")
    assert ("FieldValueTooLong", "status.toVersion") in _causes(doc)
    assert "status" not in await cluster.get(obj["metadata"]["name"])
    fits = await _status_put(cluster, obj, {"phase": "Succeeded", "toVersion": "1" * 128})
    assert fits["status"]["toVersion"] == "1" * 128


async def test_a_spec_against_the_schema_is_422_with_one_cause_per_field(cluster: Cluster) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "UpgradeOperation",
            "metadata": {"name": cluster.prefix + "badspec"},
            "spec": {"nodeName": "node-a", "agent": "Not An Agent", "expectVersion": "v" * 129}}
    with pytest.raises(ApiException) as caught:
        with anyio.fail_after(30):
            await cluster.api.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, body)
    assert caught.value.status == 422
    assert _causes(_status_of(caught.value)) >= {("FieldValueInvalid", "spec.agent"),
                                                 ("FieldValueRequired", "spec.archive"),
                                                 ("FieldValueTooLong", "spec.expectVersion")}


async def test_unknown_fields_are_pruned_with_a_warning(cluster: Cluster) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "UpgradeOperation",
            "metadata": {"name": cluster.prefix + "typo"}, "spec": spec(expectedVersion="9.9.9")}
    with anyio.fail_after(30):
        created, code, headers = await cluster.api.create_namespaced_custom_object_with_http_info(
            GROUP, VERSION, cluster.namespace, PLURAL, body)
    cluster.names.append(cluster.prefix + "typo")
    assert code == 201
    assert "expectedVersion" not in created["spec"] and created["spec"] == spec()
    assert '299 - "unknown field \\"spec.expectedVersion\\""' in headers.getall("Warning", [])


async def test_unknown_fields_with_strict_field_validation_are_400(cluster: Cluster) -> None:
    name = cluster.prefix + "strict"
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "UpgradeOperation", "metadata": {"name": name},
            "spec": spec(expectedVersion="9.9.9")}
    with pytest.raises(ApiException) as caught:
        with anyio.fail_after(30):
            await cluster.api.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, body,
                                                              field_validation="Strict")
    doc = _status_of(caught.value)
    assert (caught.value.status, doc["reason"]) == (400, "BadRequest")
    assert 'strict decoding error: unknown field "spec.expectedVersion"' in doc["message"]
    with pytest.raises(ApiException) as gone:
        await cluster.get(name)
    assert gone.value.status == 404
    obj = await cluster.create("strict-ok")  # a status write with only declared fields passes Strict
    with anyio.fail_after(30):
        written = await cluster.api.replace_namespaced_custom_object_status(
            GROUP, VERSION, cluster.namespace, PLURAL, obj["metadata"]["name"],
            dict(obj, status={"phase": "InProgress"}), field_validation="Strict")
    assert written["status"] == {"phase": "InProgress"}


async def test_watch_sends_bookmarks_when_allowed(cluster: Cluster) -> None:
    # A change this watch filters out (another node's object) moves the resourceVersion past what the watch
    # was given: the bookmark (2 s before timeoutSeconds) carries the newer version, so the watcher resumes
    # after the change. The watch cache sends no bookmark that would not move a watch on: not one for the
    # events it already had when the watch began (given, or filtered out, before it began to wait), so the
    # other node's object is made once the watch has delivered one of ours.
    mine = "spec.nodeName=node-a"
    first = await cluster.create("bookmark", node="node-a")
    since = first["metadata"]["resourceVersion"]
    delivered = anyio.Event()
    events: list[dict[str, Any]] = []

    async def watch() -> None:
        events.extend(await cluster.watch(since, timeout_s=6, bookmarks=True, field_selector=mine,
                                          on_event=lambda e: delivered.set()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        ours = await cluster.create("bookmark-2", node="node-a")
        with anyio.fail_after(10):
            await delivered.wait()
        other = await cluster.create("bookmark-b", node="node-b")
    assert (events[0]["type"], events[0]["object"]["metadata"]["name"]) == ("ADDED", ours["metadata"]["name"])
    marks = [e["object"] for e in events[1:]]
    assert marks and all(e["type"] == "BOOKMARK" for e in events[1:]), events  # node-b's ADDED: filtered
    assert all(m["kind"] == "UpgradeOperation" and m["metadata"]["resourceVersion"] for m in marks)
    assert int(marks[-1]["metadata"]["resourceVersion"]) >= int(other["metadata"]["resourceVersion"])
    plain = await cluster.watch(since, timeout_s=4, field_selector=mine)
    assert [e["type"] for e in plain] == ["ADDED"], plain  # without allowWatchBookmarks: none


async def test_a_revoked_token_is_401(cluster: Cluster) -> None:
    async with cluster.with_token(cluster.revoked_token()) as (api, _):
        with pytest.raises(ApiException) as caught:
            with anyio.fail_after(30):
                await api.list_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL)
    assert caught.value.status == 401
    assert _status_of(caught.value)["reason"] == "Unauthorized"


async def test_verbs_outside_the_role_are_403(cluster: Cluster) -> None:
    token = cluster.agent_token()
    if token is None:
        pytest.skip("UPGRADE_CORE_AGENT_TOKEN is not set (a real server needs the ServiceAccount's token)")
    obj = await cluster.create("rbac")
    name = obj["metadata"]["name"]
    async with cluster.with_token(token) as (api, _):
        with anyio.fail_after(30):  # what rbac.yaml grants: read the objects, replace their status
            got = await api.get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, name)
            await api.list_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL)
            await api.replace_namespaced_custom_object_status(
                GROUP, VERSION, cluster.namespace, PLURAL, name, dict(got, status={"phase": "InProgress"}))
        ns, other = cluster.namespace, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "UpgradeOperation",
                                         "metadata": {"name": name + "-2"}, "spec": spec()}
        merge = {"_content_type": "application/merge-patch+json"}
        refused: list[Callable[[], Awaitable[Any]]] = [
            lambda: api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name,
                                                       {"metadata": {"labels": {"x": "y"}}}, **merge),
            lambda: api.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name,
                                                              {"status": {"phase": "Failed"}}, **merge),
            lambda: api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name),
            lambda: api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, other),
        ]
        for call in refused:
            with pytest.raises(ApiException) as caught:
                with anyio.fail_after(30):
                    await call()
            assert caught.value.status == 403
            assert _status_of(caught.value)["reason"] == "Forbidden"
    assert (await cluster.get(name))["status"] == {"phase": "InProgress"}


async def test_a_delete_with_a_finalizer_marks_the_object_and_bumps_generation(cluster: Cluster) -> None:
    name = cluster.prefix + "held"
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "UpgradeOperation",
            "metadata": {"name": name, "finalizers": ["upgrade-core.io/conformance"]}, "spec": spec()}
    with anyio.fail_after(30):
        await cluster.api.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, body)
        cluster.names.append(name)
        await cluster.api.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, name)
    held = await cluster.get(name)
    meta = held["metadata"]
    assert meta["deletionTimestamp"].endswith("Z") and meta["generation"] == 2
    written = await _status_put(cluster, held, {"phase": "Failed"})  # the status can still be written
    assert written["status"] == {"phase": "Failed"}
    with pytest.raises(ApiException) as caught:  # no new finalizer once being deleted
        with anyio.fail_after(30):
            await cluster.api.patch_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, PLURAL, name,
                {"metadata": {"finalizers": ["upgrade-core.io/conformance", "upgrade-core.io/another"]}},
                _content_type="application/merge-patch+json")
    assert caught.value.status == 422
    with anyio.fail_after(30):
        await cluster.api.patch_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, name, {"metadata": {"finalizers": None}},
            _content_type="application/merge-patch+json")
    with pytest.raises(ApiException) as gone:
        await cluster.get(name)
    assert gone.value.status == 404

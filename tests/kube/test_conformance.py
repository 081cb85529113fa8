"""What the operator relies on from the Kubernetes API, pinned against the mock, or against a real server.

By default these run against ``tests/kube/apiserver.py`` (kmock's ``KubernetesEmulator``, subclassed). With
``UPGRADE_CORE_KUBECONFIG`` naming a kubeconfig (a real API server with ``deploy/kubernetes/crd.yaml``
applied), the same tests run there instead, so each behaviour the mock fakes is checkable:

=====================================  =======================================================================
behaviour                               how the mock fakes it
=====================================  =======================================================================
uid, creationTimestamp, generation 1    set on create (uuid4, now in whole seconds); ``status`` in a create
                                        body dropped (the status subresource is enabled)
resourceVersion                         one global integer counter, +1 on every write; list answers carry it;
                                        a write that changes nothing is not a write (no new version)
status subresource                      PUT/PATCH ``.../status`` copies only ``.status``; PUT/PATCH on the
                                        object copy spec, labels, annotations, never ``.status``
generation                              +1 when ``spec`` changes; never for metadata or status
spec immutability (the CRD's CEL rule)  a spec change on the object is 422 Invalid (``immutable_spec``)
optimistic concurrency                  a body whose ``metadata.resourceVersion`` is not the current one is
                                        409 Conflict; a PUT without one is 422 (no unconditional update)
field selectors                         ``spec.nodeName`` (the CRD's selectableField), ``metadata.name``,
                                        ``metadata.namespace``; ``=``, ``==``, ``!=``, comma = and
watch resume                            a bounded history of events (``history``, default 100); a watch from
                                        version V sends only the events after V; from none or "0", ADDED for
                                        the current objects first
410 Gone                                a watch from a version older than the history: HTTP 200 then one
                                        ERROR event, object a Status with code 410, reason Expired
                                        (``expire_history()`` forgets the history, as etcd compaction does)
watch timeoutSeconds                    the server ends the stream after that many seconds (default 60)
=====================================  =======================================================================

Not faked (not relied on): authentication and authorization, admission, OpenAPI validation (checked offline
in ``test_manifests.py``), finalizers, strategic-merge and JSON patch, label selectors, pagination,
bookmarks, server-side apply.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from agent.operations.kubernetes import GROUP, PLURAL, VERSION, _lean_import
from tests.kube.apiserver import serve
from tests.kube.conftest import REAL_KUBECONFIG, Cluster, spec

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


@pytest.mark.skipif(bool(REAL_KUBECONFIG), reason="the mock's own switch; the CRD makes spec immutable")
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

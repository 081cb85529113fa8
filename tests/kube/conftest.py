"""Fixtures of the Kubernetes tests: the mock API server and a real one, a client, a clean namespace.

The :func:`cluster` fixture runs each conformance test twice: ``mock`` (``tests/kube/apiserver.py``) and
``real``, a real ``kube-apiserver`` and etcd that :mod:`tests.kube.realserver` builds and starts once per
session (``real_kube`` in :mod:`tests.kube.backends`), with ``deploy/kubernetes/crd.yaml`` and ``rbac.yaml``
applied. Both serve the objects in the Role's namespace, ``upgrade-core``; objects are named ``conf-*`` and
deleted afterwards on the real server (their finalizers removed first).

``UPGRADE_CORE_KUBECONFIG`` points ``real`` at another server instead (a cluster of yours with the CRD
applied; namespace ``UPGRADE_CORE_NAMESPACE`` or ``default``); ``UPGRADE_CORE_AGENT_TOKEN``, a token of the
``upgrade-agent`` ServiceAccount with ``rbac.yaml`` applied (``kubectl -n upgrade-core create token
upgrade-agent``), enables the RBAC test there (``UPGRADE_CORE_NAMESPACE`` must then be the Role's namespace).
kubernetes_asyncio runs on asyncio only, so these tests do too.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from agent.operations.kubernetes import GROUP, PLURAL, VERSION, _lean_import
from tests.kube.apiserver import UpgradeOperationsAPI, kubeconfig_for, serve, service_account
from tests.kube.backends import RealBackend

REAL_KUBECONFIG = os.environ.get("UPGRADE_CORE_KUBECONFIG", "")
REAL_AGENT_TOKEN = os.environ.get("UPGRADE_CORE_AGENT_TOKEN", "")
SHA = "ab" * 32


@pytest.fixture
def anyio_backend() -> str:
    """kubernetes_asyncio (and aiohttp under kmock) need asyncio."""
    return "asyncio"


def spec(node: str = "node-a", **extra: Any) -> dict[str, Any]:
    """A valid ``UpgradeOperation`` spec."""
    url = "https://releases.example/demo-agent-1.1.0.tar.gz"
    doc: dict[str, Any] = {"nodeName": node, "agent": "demo-agent", "archive": {"url": url, "sha256": SHA}}
    doc.update(extra)
    return doc


class Cluster:
    """A client on the mock or on a real API server, and the objects a test made there.

    Attributes:
        api: a ``CustomObjectsApi``; ``namespace``; ``mock``: the mock, None on a real server;
        ``kubeconfig``: the kubeconfig path the client uses.
    """

    def __init__(self, api: Any, client: Any, namespace: str, mock: UpgradeOperationsAPI | None,
                 kubeconfig: str, real: RealBackend | None = None) -> None:
        self.api, self.client, self.namespace = api, client, namespace
        self.mock, self.kubeconfig, self.real = mock, kubeconfig, real
        self.prefix = f"conf-{uuid.uuid4().hex[:8]}-"
        self.names: list[str] = []

    async def create(self, short: str, node: str = "node-a", status: Any = None,
                     labels: dict[str, str] | None = None) -> dict[str, Any]:
        name = self.prefix + short
        body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "UpgradeOperation",
                                "metadata": {"name": name, "labels": labels or {}}, "spec": spec(node)}
        if status is not None:
            body["status"] = status
        with anyio.fail_after(30):
            obj = await self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        self.names.append(name)
        return dict(obj)

    async def get(self, name: str) -> dict[str, Any]:
        with anyio.fail_after(30):
            obj = await self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        return dict(obj)

    async def label(self, name: str, value: str) -> dict[str, Any]:
        """A metadata-only change by merge patch (a concurrent writer)."""
        with anyio.fail_after(30):
            return dict(await self.api.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, {"metadata": {"labels": {"touched": value}}},
                _content_type="application/merge-patch+json"))

    async def expired_version(self) -> str:
        """A resourceVersion a watch can no longer start from: the mock expires its history; a real server
        has compacted version 1 long ago."""
        if self.mock is None:
            return "1"
        obj = await self.create("expire-probe")
        await self.label(obj["metadata"]["name"], "x")
        self.mock.expire_history()
        return str(obj["metadata"]["resourceVersion"])

    def revoked_token(self) -> str:
        """A bearer token the server no longer accepts: on the mock one issued then revoked; on the real
        server one bound to a ServiceAccount deleted since; on another server one it never issued (the same
        answer from its point of view)."""
        if self.real is not None:
            return self.real.refused_token()
        token = f"conf-{uuid.uuid4().hex}"
        if self.mock is not None:
            self.mock.issue_token(token)
            self.mock.revoke_token(token)
        return token

    def agent_token(self) -> str | None:
        """A token of rbac.yaml's ServiceAccount (its Role applies), None when another server gave none."""
        if self.real is not None:
            return self.real.issue_token("", service_account()[1])
        if self.mock is None:
            return REAL_AGENT_TOKEN or None
        return self.mock.issue_token(f"agent-{uuid.uuid4().hex}", service_account()[1])

    def with_token(self, token: str) -> _client:
        """``async with cluster.with_token(t) as (api, client)``: this kubeconfig's server and CA, but
        authenticated by the bearer token ``t`` only (no client certificate)."""
        return _client(_lean_import(), self.kubeconfig, token=token)

    async def watch(self, resource_version: str, *, timeout_s: int = 5, field_selector: str = "",
                    until: str | None = None, bookmarks: bool = False,
                    on_event: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """The events of one watch from ``resource_version``, until ``until`` names an object seen in an
        event, or the server ends it (``timeoutSeconds``), or an ERROR event; bounded by timeout_s + 10.
        ``bookmarks``: ask for them (``allowWatchBookmarks``); ``on_event`` sees each event as it comes."""
        events: list[dict[str, Any]] = []
        with anyio.fail_after(timeout_s + 10):
            response = await self.api.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, watch=True, resource_version=resource_version,
                timeout_seconds=timeout_s, field_selector=field_selector, allow_watch_bookmarks=bookmarks,
                _preload_content=False)
            try:
                if response.status != 200:  # an HTTP error as the event a stream would carry
                    return [{"type": "ERROR", "object": json.loads(await response.content.read())}]
                while line := await response.content.readline():
                    event = json.loads(line)
                    events.append(event)
                    if on_event is not None:
                        on_event(event)
                    if event["type"] == "ERROR" or event["object"]["metadata"].get("name") == until:
                        break
            finally:
                response.release()
        return events


@pytest.fixture(params=["mock", "real"])
async def cluster(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Cluster]:
    """A :class:`Cluster` on the mock (on 127.0.0.1), then on the real server: the one the session started,
    or ``UPGRADE_CORE_KUBECONFIG``'s."""
    kube = _lean_import()
    if request.param == "real":
        real: RealBackend | None = None
        if REAL_KUBECONFIG:
            path, ns = REAL_KUBECONFIG, os.environ.get("UPGRADE_CORE_NAMESPACE", "default")
        else:
            real = request.getfixturevalue("real_kube")
            path, ns = real.cluster.admin_kubeconfig, real.cluster.namespace
        async with _client(kube, path) as (api, client):
            c = Cluster(api, client, ns, None, path, real)
            try:
                yield c
            finally:
                for name in c.names:
                    with anyio.move_on_after(30):
                        with contextlib.suppress(kube.ApiException):
                            await api.patch_namespaced_custom_object(
                                GROUP, VERSION, ns, PLURAL, name, {"metadata": {"finalizers": None}},
                                _content_type="application/merge-patch+json")
                        with contextlib.suppress(kube.ApiException):
                            await api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        return
    async with serve() as mock:
        ns = service_account()[0]
        path = kubeconfig_for(mock.base_url, str(tmp_path / "kubeconfig"), namespace=ns)
        async with _client(kube, path) as (api, client):
            yield Cluster(api, client, ns, mock, path)


class _client:
    """``async with _client(kube, kubeconfig) as (CustomObjectsApi, ApiClient)``."""

    def __init__(self, kube: Any, path: str, *, token: str | None = None) -> None:
        self.kube, self.path, self.token = kube, path, token

    async def __aenter__(self) -> tuple[Any, Any]:
        cfg = self.kube.Configuration()
        await self.kube.load_kube_config(config_file=self.path, client_configuration=cfg,
                                         persist_config=False)
        if self.token is not None:
            cfg.api_key = {"BearerToken": f"Bearer {self.token}"}
            cfg.cert_file = cfg.key_file = None
        self.client = self.kube.ApiClient(cfg)
        return self.kube.CustomObjectsApi(self.client), self.client

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

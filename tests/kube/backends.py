"""The two API servers the Kubernetes tests run against, behind one small interface.

:class:`RealBackend` is a real ``kube-apiserver`` and etcd (:mod:`tests.kube.realserver`, started once per
test session by the fixture :func:`real_kube`); :class:`MockBackend` is the strict mock
(:mod:`tests.kube.apiserver`) served by a thread. Both offer what the operator tests read and do outside the
operator's own requests: create an object as an administrator, the status documents written to an object,
the requests a user made (verb, resource, allowed, URI), a token of the ServiceAccount ``rbac.yaml`` defines,
a token the server refuses, and a kubeconfig for a token. On the real server the last two are real: a token
of a ServiceAccount that was deleted since, and a kubeconfig carrying the server's CA; the history and the
requests come from the API server's audit log (:data:`tests.kube.realserver.AUDIT_POLICY`).
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest

from tests.kube import realserver
from tests.kube.apiserver import GROUP, PLURAL, VERSION, kubeconfig_for, service_account, threaded

Obj = dict[str, Any]
AUDIT_SYNC_S = 10.0
"""How long a read of the audit log waits for its marker request to appear (:meth:`RealBackend.sync`)."""


class Backend(Protocol):
    """What the operator tests use of an API server besides the operator's own requests."""

    url: str

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(backend, *args)``, on the mock's own thread for the mock."""

    def put_object(self, namespace: str, body: Obj) -> Obj:
        """Create an ``UpgradeOperation`` (as an administrator); the stored object."""

    def status_history(self, namespace: str, name: str) -> list[Obj]:
        """Every status document accepted for the object, oldest first."""

    def access_log(self, user: str) -> list[tuple[str, str, bool]]:
        """``(verb, resource[/subresource], allowed)`` of every request ``user`` made."""

    def issue_token(self, token: str, user: str) -> str:
        """A bearer token for ``user`` (``rbac.yaml``'s ServiceAccount); ``token`` names it on the mock."""

    def refused_token(self) -> str:
        """A token the server authenticated once and refuses now (401)."""

    def kubeconfig(self, path: str, *, namespace: str, token: str) -> str:
        """Write a kubeconfig (mode 0600) reaching this server with ``token``; returns ``path``."""

    def update_params(self, user: str) -> list[dict[str, str]]:
        """The query parameters of every update (PUT) ``user`` made."""

    def request_delete(self, namespace: str, name: str) -> Obj:
        """A DELETE by someone else (an administrator)."""


class MockBackend:
    """The strict mock (:class:`tests.kube.apiserver.threaded`), RBAC enforced (no token is an admin)."""

    def __init__(self, server: threaded) -> None:
        self.server, self.url = server, server.url

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.server.call(lambda api: fn(self, *args))

    def put_object(self, namespace: str, body: Obj) -> Obj:
        created: Obj = self.server.api.put_object(namespace, body)
        return created

    def status_history(self, namespace: str, name: str) -> list[Obj]:
        return list(self.server.api.status_history(namespace, name))

    def access_log(self, user: str) -> list[tuple[str, str, bool]]:
        return list(self.server.api.access_log(user))

    def issue_token(self, token: str, user: str) -> str:
        issued: str = self.server.api.issue_token(token, user)
        return issued

    def refused_token(self) -> str:
        token = f"refused-{uuid.uuid4().hex}"
        self.server.api.issue_token(token, service_account()[1])
        self.server.api.revoke_token(token)
        return token

    def kubeconfig(self, path: str, *, namespace: str, token: str) -> str:
        return kubeconfig_for(self.url, path, namespace=namespace, token=token)

    def update_params(self, user: str) -> list[dict[str, str]]:
        return [dict(r.params) for r in self.server.api._requests if r.method.value == "PUT"]

    def request_delete(self, namespace: str, name: str) -> Obj:
        deleted: Obj = self.server.api.request_delete(namespace, name)
        return deleted


class RealBackend:
    """A real API server started by :func:`tests.kube.realserver.start`.

    Attributes:
        cluster: the running servers; url: the API server's URL.
    """

    def __init__(self, cluster: realserver.Cluster, admin: httpx.Client | None = None,
                 offset: int = 0) -> None:
        self.cluster, self.url = cluster, cluster.url
        self._admin = admin or cluster.admin()
        self._offset = offset

    def close(self) -> None:
        self._admin.close()

    def scoped(self) -> RealBackend:
        """This server, its audit log read only from now on: a test's own requests and status writes, not
        those of the tests before it in the session."""
        return RealBackend(self.cluster, self._admin, realserver.audit_size(self.cluster.audit_log))

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(self, *args)

    def _ok(self, r: httpx.Response, what: str) -> Obj:
        if r.status_code >= 300:
            raise AssertionError(f"{what}: HTTP {r.status_code}: {r.text[:500]}")
        doc: Obj = r.json()
        return doc

    def put_object(self, namespace: str, body: Obj) -> Obj:
        doc = dict(body, apiVersion=f"{GROUP}/{VERSION}", kind="UpgradeOperation")
        return self._ok(self._admin.post(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}",
                                         json=doc, params={"fieldValidation": "Strict"}), "create")

    def get(self, namespace: str, name: str) -> Obj | None:
        r = self._admin.get(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}")
        return None if r.status_code == 404 else self._ok(r, "get")

    def request_delete(self, namespace: str, name: str) -> Obj:
        """A DELETE by someone else (the administrator); the object as the server answered."""
        return self._ok(self._admin.delete(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"),
                        "delete")

    def sync(self) -> None:
        """Wait until the audit log holds every request completed before this call: one marker request of
        the administrator is made and waited for (the audit backend writes an event after the response has
        been sent, so a read right after a client finished could miss its last request).

        Raises:
            AssertionError: the marker did not appear within ``AUDIT_SYNC_S`` seconds.
        """
        marker = uuid.uuid4().hex
        self._admin.get(f"/api/v1/namespaces/{self.cluster.namespace}/configmaps/audit-marker-{marker}")
        deadline = time.monotonic() + AUDIT_SYNC_S
        while time.monotonic() < deadline:
            if any(marker in e.get("requestURI", "") for e in self._events()):
                return
            time.sleep(0.05)
        raise AssertionError(f"the audit log {self.cluster.audit_log} did not show a request within "
                             f"{AUDIT_SYNC_S:.0f} s")

    def _events(self) -> Iterator[Obj]:
        return realserver.audit_events(self.cluster.audit_log, self._offset)

    def status_history(self, namespace: str, name: str, *, synced: bool = True) -> list[Obj]:
        if synced:
            self.sync()
        written: list[Obj] = []
        for e in self._events():
            ref = e.get("objectRef", {})
            if (ref.get("resource"), ref.get("subresource"), ref.get("namespace"), ref.get("name")) != (
                    PLURAL, "status", namespace, name) or e.get("verb") not in ("update", "patch"):
                continue
            if 200 <= e.get("responseStatus", {}).get("code", 0) < 300:
                written.append(e["responseObject"].get("status", {}))
        return written

    def requests(self, user: str, *, synced: bool = True) -> list[Obj]:
        """The audit events of ``user``'s requests (``verb``, ``requestURI``, ``objectRef``, ...)."""
        if synced:
            self.sync()
        return [e for e in self._events() if e.get("user", {}).get("username") == user]

    def update_params(self, user: str) -> list[dict[str, str]]:
        return [dict(httpx.URL(e["requestURI"]).params) for e in self.requests(user) if e["verb"] == "update"]

    def access_log(self, user: str) -> list[tuple[str, str, bool]]:
        used = []
        for e in self.requests(user):
            ref = e.get("objectRef", {})
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            decision = e.get("annotations", {}).get("authorization.k8s.io/decision")
            used.append((e["verb"], resource, decision == "allow"))
        return used

    def issue_token(self, token: str, user: str) -> str:
        ns, name = user.removeprefix("system:serviceaccount:").split(":")
        r = self._admin.post(f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token", json={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": realserver.TOKEN_LIFETIME_S}})
        issued: str = self._ok(r, "TokenRequest")["status"]["token"]
        return issued

    def refused_token(self) -> str:
        """A bound token of a ServiceAccount made for it and deleted since: the API server checks that the
        account a token is bound to still exists (the token's ``kubernetes.io`` claims name its uid)."""
        ns, name = self.cluster.namespace, f"refused-{uuid.uuid4().hex[:12]}"
        account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        self._ok(self._admin.post(f"/api/v1/namespaces/{ns}/serviceaccounts", json=account),
                 "create a ServiceAccount")
        token = self.issue_token("", f"system:serviceaccount:{ns}:{name}")
        self._ok(self._admin.delete(f"/api/v1/namespaces/{ns}/serviceaccounts/{name}"), "delete it")
        return token

    def kubeconfig(self, path: str, *, namespace: str, token: str) -> str:
        ca = base64.b64encode(Path(self.cluster.ca).read_bytes()).decode()
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "real",
            "clusters": [{"name": "real", "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": "real", "user": {"token": token}}],
            "contexts": [{"name": "real",
                          "context": {"cluster": "real", "user": "real", "namespace": namespace}}],
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the operator refuses a wider mode
        os.fchmod(fd, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        return path


@pytest.fixture(params=["mock", "real"])
def api_server(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Each test once on the strict mock (RBAC enforced, served by a thread) and once on the session's real
    API server (its audit log read from the test's start)."""
    if request.param == "mock":
        with threaded(any_token_is_admin=False) as server:
            yield MockBackend(server)
    else:
        yield request.getfixturevalue("real_kube").scoped()


@pytest.fixture(scope="session")
def real_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealBackend]:
    """A real ``kube-apiserver`` and etcd for the whole test session (built on first use, about 8 minutes
    cold; cached outside the checkout), stopped at the end. A build or start that fails fails the tests that
    use it, with the harness's one line: the real server is part of ``make test``, never skipped."""
    where = tmp_path_factory.mktemp("kube-real")
    try:
        cluster = realserver.start(str(where / "cluster"), say=lambda _: None)
    except realserver.KubeRealError as exc:
        pytest.fail(f"kube-real: {exc}", pytrace=False)
    backend = RealBackend(cluster)
    try:
        yield backend
    finally:
        backend.close()
        realserver.stop(cluster.dir, say=lambda _: None)

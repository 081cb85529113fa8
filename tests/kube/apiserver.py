"""A Kubernetes-aware mock API server for ``upgradeoperations``, on real HTTP on 127.0.0.1.

:class:`UpgradeOperationsAPI` subclasses ``kmock.KubernetesEmulator``: kmock parses the requests (URL ->
group, version, plural, namespace, name, subresource), records them in ``.requests`` and serves discovery;
its emulator stores objects as plain dicts merged on PATCH, with no resourceVersion, no subresources, no
preconditions and watches that replay everything. For the resource ``upgradeoperations`` this class serves
every request itself instead (``_handle``), with what the API conventions and the apiserver do and the
operator relies on; other resources keep kmock's behaviour.

What it implements (see ``tests/kube/test_conformance.py``, which checks the same behaviours against a real
API server when ``UPGRADE_CORE_KUBECONFIG`` is set):

- ``metadata.uid`` (a UUID), ``creationTimestamp`` (RFC 3339, whole seconds), ``generation`` (1 at
  creation, +1 when ``spec`` changes, never for metadata or status), ``resourceVersion`` from one global
  counter bumped on every write (an update that changes nothing is not a write, as in the apiserver);
- the status subresource: PUT/PATCH on ``/status`` change only ``.status``; create and writes to the main
  resource ignore ``.status``;
- optimistic concurrency: a PUT must carry ``metadata.resourceVersion`` (422 Invalid otherwise, custom
  resources do not allow unconditional updates); a stale one, in a PUT or a PATCH, is 409 Conflict;
- ``spec`` immutable after creation (the CRD's ``self == oldSelf`` rule): a spec change is 422 Invalid,
  unless built with ``immutable_spec=False``;
- list with ``metadata.resourceVersion``; ``fieldSelector`` on ``spec.nodeName`` (a CRD selectable field),
  ``metadata.name`` and ``metadata.namespace``, with ``=``, ``==``, ``!=`` and commas;
- watch: from no/``0`` resourceVersion, synthetic ADDED events for the current objects then live events;
  from a resourceVersion, only the events after it, from a bounded history (``history`` events); one older
  than the history gives HTTP 200 and one ERROR event whose object is a Status (code 410, reason Expired);
  an object leaving/entering the field selector is DELETED/ADDED; ``timeoutSeconds`` ends the stream;
- test hooks: :meth:`expire_history` (every watch from an older version gets 410), :meth:`status_writes`
  (accepted status-subresource writes per object), :meth:`after_next_get` (run a concurrent write right after
  the next GET of an object, to provoke a 409), :meth:`put_object` / :meth:`mutate` (server-side writes);
  misbehaviours on request: ``expired_as_http`` (410 as the HTTP status), ``honour_watch_timeout=False``.

What it does not do: authentication, admission, schema validation (``tests/kube/test_manifests.py`` checks
the CRD schema offline), finalizers, ``deletionTimestamp``, strategic-merge or JSON patches (merge patch
only), label selectors, pagination, bookmarks, and kmock's DSL reactions are not consulted for this resource.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp.web
import attrs
from kmock import KubernetesEmulator, Request, Server

GROUP = "upgrades.upgrade-core.io"
VERSION = "v1alpha1"
PLURAL = "upgradeoperations"
KIND = "UpgradeOperation"
API_VERSION = f"{GROUP}/{VERSION}"
DEFAULT_WATCH_S = 60.0
_TRUE = ("1", "t", "T", "true", "TRUE", "True")  # Go's strconv.ParseBool, as the apiserver parses ?watch=

Obj = dict[str, Any]


class ApiError(Exception):
    """An error the handler renders as a ``Status`` (``code``, ``reason``, ``message``)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> Obj:
        return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "code": self.code, "reason": self.reason, "message": self.message}


def _merge(base: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _field(obj: Obj, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "" if node is None else str(node)


def parse_field_selector(text: str) -> list[tuple[str, bool, str]]:
    """``a=b,c!=d`` -> ``[(field, equal, value)]``; only the fields the CRD makes selectable."""
    terms = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            equal = False
        elif "==" in raw:
            key, value = raw.split("==", 1)
            equal = True
        elif "=" in raw:
            key, value = raw.split("=", 1)
            equal = True
        else:
            raise ApiError(400, "BadRequest", f"invalid field selector term {raw!r}")
        if key not in ("spec.nodeName", "metadata.name", "metadata.namespace"):
            raise ApiError(400, "BadRequest", f'field label not supported: "{key}"')
        terms.append((key, equal, value))
    return terms


@attrs.frozen
class _Event:
    rv: int
    kind: str  # ADDED, MODIFIED, DELETED
    old: Obj | None
    new: Obj  # for DELETED: the object as deleted, with the deletion's resourceVersion


@attrs.define(kw_only=True)
class UpgradeOperationsAPI(KubernetesEmulator):
    """The mock (see the module docstring). Use ``async with serve() as api``; ``api.base_url`` is its URL."""

    history: int = 100
    immutable_spec: bool = True
    expired_as_http: bool = False
    """Answer a watch from an expired version with HTTP 410 (a Status body) instead of an ERROR event."""
    honour_watch_timeout: bool = True
    """False: ignore ``timeoutSeconds`` (a misbehaving server or proxy; the client must bound itself)."""
    _store: dict[tuple[str, str], Obj] = attrs.field(factory=dict, init=False)
    _events: deque[_Event] = attrs.field(init=False)
    _rv: int = attrs.field(default=1000, init=False)
    _oldest: int = attrs.field(default=1000, init=False)
    _changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _stopping: bool = attrs.field(default=False, init=False)
    _status_writes: dict[tuple[str, str], int] = attrs.field(factory=dict, init=False)
    _status_docs: dict[tuple[str, str], list[Obj]] = attrs.field(factory=dict, init=False)
    _after_get: dict[tuple[str, str], list[Callable[[], None]]] = attrs.field(factory=dict, init=False)

    @_events.default
    def _events_default(self) -> deque[_Event]:
        return deque(maxlen=self.history)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = self.ResourceInfo(
            kind=KIND, namespaced=True, subresources={"status"},
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        )

    # -- test hooks ------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the (first) server serving this handler."""
        return str(self.servers[0].url).rstrip("/")

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion."""
        return self._rv

    def expire_history(self) -> None:
        """Forget the watch history: a watch from any version older than now gets 410 Gone (Expired)."""
        self._events.clear()
        self._oldest = self._rv

    def status_writes(self, namespace: str, name: str) -> int:
        """How many status-subresource writes of this object were accepted (2xx)."""
        return self._status_writes.get((namespace, name), 0)

    def status_history(self, namespace: str, name: str) -> list[Obj]:
        """Every status the status subresource accepted for this object, oldest first (copies)."""
        return copy.deepcopy(self._status_docs.get((namespace, name), []))

    def after_next_get(self, namespace: str, name: str, action: Callable[[], None]) -> None:
        """Run ``action`` once, right after a GET of this object is answered (a concurrent writer); actions
        registered several times run one per GET, in order."""
        self._after_get.setdefault((namespace, name), []).append(action)

    def stored(self, namespace: str, name: str) -> Obj | None:
        """The stored object (a copy), None when absent."""
        obj = self._store.get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def put_object(self, namespace: str, body: Obj) -> Obj:
        """Create an object server-side, as a POST would (uid, timestamps, generation; status dropped)."""
        return self._create(namespace, body)

    def mutate(self, namespace: str, name: str, change: Callable[[Obj], None]) -> Obj:
        """A server-side write by someone else: ``change`` edits a copy; spec/metadata/status all allowed."""
        old = self._require(namespace, name)
        new = copy.deepcopy(old)
        change(new)
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old["metadata"]["generation"] + 1
        return self._write(namespace, name, old, new)

    def remove(self, namespace: str, name: str) -> None:
        """Delete an object server-side."""
        self._delete(namespace, name)

    # -- storage ---------------------------------------------------------------------------------------
    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _record(self, kind: str, old: Obj | None, new: Obj) -> None:
        if len(self._events) == self._events.maxlen:
            self._oldest = self._events[0].rv
        self._events.append(_Event(self._rv, kind, copy.deepcopy(old), copy.deepcopy(new)))
        self._changed.set()
        self._changed = asyncio.Event()

    def _require(self, namespace: str, name: str) -> Obj:
        obj = self._store.get((namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{PLURAL}.{GROUP} "{name}" not found')
        return obj

    def _create(self, namespace: str, body: Any) -> Obj:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise ApiError(400, "BadRequest", "the body must be an object with metadata")
        name = body["metadata"].get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if (namespace, name) in self._store:
            raise ApiError(409, "AlreadyExists", f'{PLURAL}.{GROUP} "{name}" already exists')
        obj = {k: copy.deepcopy(v) for k, v in body.items() if k != "status"}
        meta = obj["metadata"]
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "deletionTimestamp"):
            meta.pop(key, None)
        obj["apiVersion"], obj["kind"] = API_VERSION, KIND
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), generation=1,
                    creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    resourceVersion=str(self._bump()))
        self._store[(namespace, name)] = obj
        self._record("ADDED", None, obj)
        return copy.deepcopy(obj)

    def _write(self, namespace: str, name: str, old: Obj, new: Obj) -> Obj:
        """Store ``new`` as the next version of ``old`` (a no-op change is not a write)."""
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return copy.deepcopy(old)
        new["metadata"]["resourceVersion"] = str(self._bump())
        self._store[(namespace, name)] = new
        self._record("MODIFIED", old, new)
        return copy.deepcopy(new)

    def _delete(self, namespace: str, name: str) -> Obj:
        old = self._require(namespace, name)
        del self._store[(namespace, name)]
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self._bump())
        self._record("DELETED", old, gone)
        return gone

    def _precondition(self, current: Obj, body: Any, *, required: bool) -> None:
        rv = body.get("metadata", {}).get("resourceVersion") if isinstance(body, dict) else None
        if rv in (None, ""):
            if required:
                raise ApiError(422, "Invalid", "metadata.resourceVersion: Invalid value: 0x0: must be "
                                               "specified for an update")
            return
        if str(rv) != current["metadata"]["resourceVersion"]:
            name = current["metadata"]["name"]
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {PLURAL}.{GROUP} "{name}": '
                                            "the object has been modified; please apply your changes to "
                                            "the latest version and try again")

    def _update(self, request: Request, namespace: str, name: str) -> Obj:
        current = self._require(namespace, name)
        body = request.data
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        put = request.method.value == "PUT"
        self._precondition(current, body, required=put)
        if put:
            incoming = copy.deepcopy(body)
        else:
            incoming = _merge(current, {k: v for k, v in body.items() if k != "metadata"}
                              | {"metadata": {k: v for k, v in body.get("metadata", {}).items()
                                              if k != "resourceVersion"}})
        new = copy.deepcopy(current)
        if request.subresource == "status":
            if "status" in incoming:
                new["status"] = incoming["status"]
            else:
                new.pop("status", None)
        else:
            if "spec" in incoming and incoming["spec"] != current.get("spec"):
                if self.immutable_spec:
                    raise ApiError(422, "Invalid", f'{PLURAL}.{GROUP} "{name}" is invalid: spec: Invalid '
                                                   "value: \"object\": spec is immutable")
                new["spec"] = incoming["spec"]
                new["metadata"]["generation"] += 1
            meta_in = incoming.get("metadata", {}) if isinstance(incoming.get("metadata"), dict) else {}
            for key in ("labels", "annotations", "finalizers"):
                if key in meta_in:
                    new["metadata"][key] = meta_in[key]
                elif put:
                    new["metadata"].pop(key, None)
        written = self._write(namespace, name, current, new)
        if request.subresource == "status":
            where = (namespace, name)
            self._status_writes[where] = self._status_writes.get(where, 0) + 1
            self._status_docs.setdefault(where, []).append(copy.deepcopy(written.get("status") or {}))
        return written

    def _matches(self, obj: Obj | None, namespace: str | None, terms: list[tuple[str, bool, str]]) -> bool:
        if obj is None:
            return False
        if namespace is not None and obj["metadata"].get("namespace") != namespace:
            return False
        return all((_field(obj, key) == value) == equal for key, equal, value in terms)

    # -- HTTP ------------------------------------------------------------------------------------------
    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is None or (res.group, res.version, res.plural) != (GROUP, VERSION, PLURAL):
            return await super()._handle(request)
        try:
            return await self._serve(request)
        except ApiError as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.code)

    async def _serve(self, request: Request) -> aiohttp.web.StreamResponse:
        method = request.method.value
        ns, name, sub = request.namespace, request.name, request.subresource
        if sub not in (None, "status"):
            raise ApiError(404, "NotFound", f"no subresource {sub}")
        if method == "GET" and request.params.get("watch") in _TRUE:
            return await self._watch(request)
        if name is None:
            if method == "GET":
                terms = parse_field_selector(request.params.get("fieldSelector", ""))
                items = [copy.deepcopy(o) for (o_ns, _), o in sorted(self._store.items())
                         if self._matches(o, ns, terms) and (ns is None or o_ns == ns)]
                return aiohttp.web.json_response({
                    "apiVersion": API_VERSION, "kind": f"{KIND}List",
                    "metadata": {"resourceVersion": str(self._rv)}, "items": items,
                })
            if method == "POST" and ns is not None:
                return aiohttp.web.json_response(self._create(ns, request.data), status=201)
            raise ApiError(405, "MethodNotAllowed", f"{method} on the collection")
        assert ns is not None
        if method == "GET":
            obj = copy.deepcopy(self._require(ns, name))
            pending = self._after_get.get((ns, name))
            if pending:
                pending.pop(0)()
            return aiohttp.web.json_response(obj)
        if method in ("PUT", "PATCH"):
            return aiohttp.web.json_response(self._update(request, ns, name))
        if method == "DELETE" and sub is None:
            return aiohttp.web.json_response(self._delete(ns, name))
        raise ApiError(405, "MethodNotAllowed", f"{method} on an object")

    async def _watch(self, request: Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        ns = request.namespace
        terms = parse_field_selector(request.params.get("fieldSelector", ""))
        if request.name is not None:
            terms.append(("metadata.name", True, request.name))
        timeout = float(request.params.get("timeoutSeconds") or DEFAULT_WATCH_S)
        if not self.honour_watch_timeout:
            timeout = DEFAULT_WATCH_S
        deadline = asyncio.get_running_loop().time() + timeout
        since_text = request.params.get("resourceVersion", "")
        if self.expired_as_http and since_text not in ("", "0") and int(since_text) < self._oldest:
            raise ApiError(410, "Expired", f"too old resource version: {since_text} ({self._oldest})")
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)

        async def send(kind: str, obj: Obj) -> None:
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        try:
            if since_text in ("", "0"):
                since = self._rv
                for (_, _), obj in sorted(self._store.items()):
                    if self._matches(obj, ns, terms):
                        await send("ADDED", obj)
            else:
                try:
                    since = int(since_text)
                except ValueError:
                    since = -1
                if since < self._oldest:
                    await send("ERROR", ApiError(410, "Expired", f"too old resource version: {since_text} "
                                                                 f"({self._oldest})").status())
                    return response
            async for kind, obj in self._events_after(since, deadline, ns, terms):
                await send(kind, obj)
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    async def _events_after(self, since: int, deadline: float, ns: str | None,
                            terms: list[tuple[str, bool, str]]) -> AsyncIterator[tuple[str, Obj]]:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            if since < self._oldest:  # the history was expired while this watch was open
                yield "ERROR", ApiError(410, "Expired", "too old resource version").status()
                return
            for event in list(self._events):
                if event.rv <= since:
                    continue
                since = event.rv
                was = event.kind != "ADDED" and self._matches(event.old, ns, terms)
                now = self._matches(event.new, ns, terms)
                if event.kind == "DELETED":
                    if was:
                        yield "DELETED", copy.deepcopy(event.new)
                elif was and now:
                    yield "MODIFIED", copy.deepcopy(event.new)
                elif now:
                    yield "ADDED", copy.deepcopy(event.new)
                elif was:
                    yield "DELETED", copy.deepcopy(event.new)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return

    async def __aexit__(self, *exc: Any) -> None:
        self._stopping = True
        self._changed.set()
        await super().__aexit__(*exc)


class serve:
    """``async with serve(**options) as api``: an :class:`UpgradeOperationsAPI` listening on 127.0.0.1.

    ``api.url`` is the base URL (``http://127.0.0.1:PORT``).
    """

    def __init__(self, **options: Any) -> None:
        self.api = UpgradeOperationsAPI(**options)
        self.server = Server(self.api)

    async def __aenter__(self) -> UpgradeOperationsAPI:
        await self.api.__aenter__()
        await self.server.__aenter__()
        return self.api

    async def __aexit__(self, *exc: Any) -> None:
        self.api._stopping = True
        self.api._changed.set()
        await self.server.__aexit__(*exc)
        await self.api.__aexit__(*exc)


def kubeconfig_for(url: str, path: str, *, namespace: str = "default", token: str = "test-token") -> str:
    """Write a kubeconfig for ``url`` (a bearer token, no TLS) at ``path``, mode 0600; returns ``path``."""
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "mock",
        "clusters": [{"name": "mock", "cluster": {"server": url}}],
        "users": [{"name": "mock", "user": {"token": token}}],
        "contexts": [{"name": "mock", "context": {"cluster": "mock", "user": "mock",
                                                  "namespace": namespace}}],
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the operator refuses a wider mode
    os.fchmod(fd, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f)  # JSON is YAML
    return path


class threaded:
    """``with threaded(**options) as t``: the mock served by a thread of its own (its own asyncio loop), for
    tests and benchmarks whose client is another process (the operator). ``t.url`` is its base URL;
    ``t.call(fn, *args)`` runs ``fn(api, *args)`` on the server's loop (the mock is not thread-safe) and
    returns the result. Every wait is bounded (``TIMEOUT_S``).

    Raises:
        RuntimeError: the server did not come up within ``TIMEOUT_S`` seconds.
    """

    TIMEOUT_S = 30.0

    def __init__(self, **options: Any) -> None:
        self.options = options
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="kube-mock", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the thread that waits for the server
            self._failed = exc
            self._ready.set()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(**self.options) as api:
            self.api = api
            self.url = api.base_url
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> threaded:
        self._thread.start()
        if not self._ready.wait(self.TIMEOUT_S) or self._failed is not None:
            raise RuntimeError(f"the mock API server did not start: {self._failed!r}")
        return self

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        async def run() -> Any:
            return fn(self.api, *args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(self.TIMEOUT_S)

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(self.TIMEOUT_S)

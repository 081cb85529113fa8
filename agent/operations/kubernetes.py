"""The Kubernetes source (docs/managed.md): ``UpgradeOperation`` objects through ``kubernetes_asyncio``.

One :class:`KubernetesSource` watches the namespaced custom resource ``upgradeoperations`` (group
``upgrades.upgrade-core.io``, version ``v1alpha1``) in one namespace, takes only the objects whose
``spec.nodeName`` is this node and whose ``spec.agent`` is this agent, and writes their status through the
``status`` subresource. An object addressed to another agent on the same node is that agent's operator's
to run and report: this one never writes to it (a ``Failed`` written there would be taken by its own
operator as acknowledged, and the upgrade would never run). It follows the
list-then-watch pattern of the Kubernetes API conventions ("Efficient detection of changes"): one list
gives the objects and a ``resourceVersion``; each watch resumes from the last ``resourceVersion`` it saw; a
``410 Gone`` (the history no longer reaches that far back) makes the next :meth:`KubernetesSource.snapshot`
list again. Status writes are optimistic-concurrency updates carrying the object's ``resourceVersion``: a
``409 Conflict`` re-reads the object and tries again; it never runs anything again.

Memory: the client package's ``__init__`` imports every generated model (~70 MiB resident); this module
loads only the few modules it uses (:func:`_lean_import`).
"""

from __future__ import annotations

import calendar
import functools
import importlib
import importlib.util
import json
import os
import re
import sys
import time
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import anyio
import yaml

from agent.errors import ConfigError
from agent.fs.regular import read_regular_file, read_text
from agent.fs.secrets import check_credential_file
from agent.operations.model import CredentialsRefused, Operation, SourceError, k8s_status
from agent.redact import redact_url
from agent.sanitize import clean_text
from upgrade_core import OperationStatus

__all__ = [
    "GROUP",
    "PLURAL",
    "SERVICE_ACCOUNT_DIR",
    "VERSION",
    "KubernetesSource",
    "check_kubeconfig_files",
]

GROUP: Final = "upgrades.upgrade-core.io"
VERSION: Final = "v1alpha1"
PLURAL: Final = "upgradeoperations"

SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where a pod finds its service account: ``token``, ``ca.crt`` and ``namespace`` (the in-cluster
configuration of client-go and kubernetes_asyncio)."""

REQUEST_TIMEOUT_S: Final = 30.0
"""Bound of every request but a watch (seconds), enforced by the HTTP client and again around the call."""

CONFLICT_RETRIES: Final = 5
"""How many times :meth:`KubernetesSource.publish` re-reads and retries after a 409 Conflict."""

FIELD_VALIDATION: Final = "Strict"
"""``fieldValidation`` of every write: a field the CRD does not declare is refused (400) instead of being
dropped with only a warning (the apiserver's default, ``Warn``), so a misspelt field can never vanish."""

_OPERATION_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_T = TypeVar("_T")


def _lean_import() -> types.SimpleNamespace:
    """Load the parts of ``kubernetes_asyncio`` this source uses, without its generated models.

    Why: ``import kubernetes_asyncio.client`` runs the package ``__init__``, which imports every API class
    and every generated model (~860 modules, ~70 MiB resident), while the idle operator's target is 40 MiB
    (design §9). Custom objects are plain dicts, so no model is ever needed. The three package modules
    ``kubernetes_asyncio``, ``.client`` and ``.client.api`` are registered as bare packages (their
    ``__path__`` only, their ``__init__`` not run), ``.client.models`` as an empty one, and then only the
    modules below are imported. ``config`` and ``kube_config`` take ``Configuration`` and ``ApiClient``
    from ``kubernetes_asyncio.client``, so they are set on the bare package first.

    This relies on the package layout of the releases pinned in pyproject.toml; ``tests/kube/test_lean.py``
    checks it against what is installed. When the full client is already imported, it is used as is.

    Returns:
        A namespace with ``Configuration``, ``ApiClient``, ``ApiException``, ``CustomObjectsApi``,
        ``ConfigException``, ``load_kube_config`` (async) and ``load_incluster_config``.
    """
    pkg = "kubernetes_asyncio"
    if pkg not in sys.modules:
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError("[operations] source = kubernetes: the kubernetes_asyncio package is missing")
        root = next(iter(spec.submodule_search_locations))
        parent: types.ModuleType | None = None
        for name, rel in ((pkg, ""), (f"{pkg}.client", "client"), (f"{pkg}.client.api", "client/api"),
                          (f"{pkg}.client.models", "client/models")):
            module = types.ModuleType(name)
            module.__path__ = [os.path.join(root, rel) if rel else root]
            module.__package__ = name
            sys.modules[name] = module
            if parent is not None:
                setattr(parent, name.rsplit(".", 1)[1], module)
            parent = module if name != f"{pkg}.client.models" else parent
    client = sys.modules[f"{pkg}.client"]
    configuration = importlib.import_module(f"{pkg}.client.configuration")
    exceptions = importlib.import_module(f"{pkg}.client.exceptions")
    if not hasattr(client, "Configuration"):
        client.Configuration = configuration.Configuration  # type: ignore[attr-defined]
    api_client = importlib.import_module(f"{pkg}.client.api_client")
    if not hasattr(client, "ApiClient"):
        client.ApiClient = api_client.ApiClient  # type: ignore[attr-defined]
    custom = importlib.import_module(f"{pkg}.client.api.custom_objects_api")
    config = importlib.import_module(f"{pkg}.config")
    return types.SimpleNamespace(
        Configuration=configuration.Configuration,
        ApiClient=api_client.ApiClient,
        ApiException=exceptions.ApiException,
        CustomObjectsApi=custom.CustomObjectsApi,
        ConfigException=config.ConfigException,
        load_kube_config=config.load_kube_config,
        KubeConfigLoader=importlib.import_module(f"{pkg}.config.kube_config").KubeConfigLoader,
        load_incluster_config=config.load_incluster_config,
    )


def _one_line(text: object, limit: int = 200) -> str:
    """An API server's or client library's text on one line, whitespace runs collapsed, cleaned and
    bounded by :func:`agent.sanitize.clean_text` (``limit`` characters)."""
    return clean_text(" ".join(str(text).split()), limit)


_MAX_KUBECONFIG_BYTES = 1024 * 1024  # a kubeconfig is a few KiB; a larger one is left to the loader


def _credential_files(kubeconfig: str, doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(path, what)`` of the files the kubeconfig ``doc`` (read from ``kubeconfig``) has its current
    context read credentials from: the user's ``tokenFile`` and ``client-key`` (relative to the
    kubeconfig's directory, as the loader resolves them)."""

    def named(key: str, name: object) -> Mapping[str, Any]:
        for entry in doc.get(key) or ():
            if isinstance(entry, Mapping) and entry.get("name") == name:
                inner = entry.get(key[:-1])
                return inner if isinstance(inner, Mapping) else {}
        return {}

    user = named("users", named("contexts", doc.get("current-context")).get("user"))
    base = os.path.dirname(kubeconfig)
    return [(os.path.join(base, user[key]), f"the kubeconfig's {key}") for key in ("tokenFile", "client-key")
            if isinstance(user.get(key), str) and user[key]]


def check_kubeconfig_files(kubeconfig: str) -> Mapping[str, Any] | None:
    """Refuse a kubeconfig, or a token or client key it names, that group or others may read or write, or
    that another user owns (:func:`agent.fs.secrets.check_credential_file`), and return the kubeconfig as
    read then: the one read the client is configured from (a file swapped after the check is not read).

    The in-cluster service account token is not checked: the kubelet projects it into the pod's own mount
    namespace with the mode the pod's volume asks for.

    Returns:
        The parsed kubeconfig, or None when it cannot be read or parsed as a mapping (the loader then says
        why).

    Raises:
        HostRefusedError: exit 4, one line naming the file.
    """
    check_credential_file(kubeconfig, "[operations] kubeconfig")
    try:
        doc = yaml.safe_load(read_regular_file(kubeconfig, limit=_MAX_KUBECONFIG_BYTES))
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(doc, Mapping):
        return None
    for path, what in _credential_files(kubeconfig, doc):
        check_credential_file(path, what)
    return doc


def _service_account_namespace() -> str:
    """The pod's namespace (the service account's ``namespace`` file), else ``default``."""
    ns = read_text(os.path.join(SERVICE_ACCOUNT_DIR, "namespace"), limit=256)
    return (ns or "").strip() or "default"


def _creation_seconds(stamp: object) -> float:
    """``metadata.creationTimestamp`` (RFC 3339, UTC, whole seconds) as Unix seconds; 0.0 when unreadable."""
    if not isinstance(stamp, str):
        return 0.0
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return 0.0


def _being_deleted(obj: Mapping[str, Any]) -> bool:
    """True when ``metadata.deletionTimestamp`` is set: a DELETE was asked for and finalizers hold the
    object (Kubernetes API conventions, "finalizers"); such an object is never started (docs/managed.md)."""
    meta = obj.get("metadata")
    return isinstance(meta, Mapping) and bool(meta.get("deletionTimestamp"))


def _credentials_origin(operations: Any) -> str:
    """Where the credentials come from, for messages: the kubeconfig's path, or the service account token."""
    return str(operations.kubeconfig) or os.path.join(SERVICE_ACCOUNT_DIR, "token")


async def _configuration(kube: types.SimpleNamespace, operations: Any) -> Any:
    """A client ``Configuration`` read anew from ``[operations] kubeconfig`` (its token, ``tokenFile``, or
    ``exec`` plugin, which runs now) or, for "", from the in-cluster service account (its token file).

    Raises:
        ConfigError: one line naming the file (see :meth:`KubernetesSource.create`).
    """
    configuration = kube.Configuration()
    path = operations.kubeconfig
    if path:
        doc = check_kubeconfig_files(path)
        try:
            if doc is None:  # unreadable or not a mapping: the loader words why
                await kube.load_kube_config(config_file=path, client_configuration=configuration,
                                            persist_config=False)
            else:  # what was checked is what configures the client (relative paths from its directory)
                loader = kube.KubeConfigLoader(config_dict=dict(doc), config_base_path=os.path.dirname(path))
                await loader.load_and_set(configuration)
        except Exception as exc:  # the loader raises OSError, YAML errors, KeyError, ConfigException...
            raise ConfigError(
                f"{path}: [operations] kubeconfig: not a usable kubeconfig: {type(exc).__name__}: "
                f"{_one_line(exc)}"
            ) from None
    else:
        try:
            kube.load_incluster_config(client_configuration=configuration)
        except Exception as exc:
            token = os.path.join(SERVICE_ACCOUNT_DIR, "token")
            raise ConfigError(
                f"{token}: [operations] kubeconfig = \"\" needs the in-cluster service account: "
                f"{_one_line(exc)}"
            ) from None
    return configuration


class KubernetesSource:
    """``UpgradeOperation`` objects addressed to this node: an :class:`~.model.OperationSource`.

    Build it with :meth:`create`. It keeps a cache of this node's objects keyed by ``metadata.uid`` and the
    ``resourceVersion`` the cache reflects; :meth:`snapshot` lists only when that version is unknown (first
    call, after a 410 Gone), :meth:`wait_for_change` applies watch events to the cache.

    Every method raises :class:`~agent.operations.model.SourceError` (one line: the verb, the object, the HTTP
    status and the API's reason; no token, no URL credentials) for transport and API failures.
    """

    label: str

    def __init__(self, kube: types.SimpleNamespace, api_client: Any, namespace: str, node: str,
                 server: str, *, agent: str, operations: Any = None) -> None:
        """Use :meth:`create`; this only stores its arguments (``server`` is the API URL, redacted;
        ``agent`` this agent's name, ``spec.agent`` of the objects it takes; ``operations`` the
        ``[operations]`` section the credentials are read from again after a 401)."""
        self._kube = kube
        self._operations = operations
        self._client = api_client
        self._api = kube.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.node = node
        self.agent = agent
        self.label = f"kubernetes {namespace}/{PLURAL} node {node} agent {agent} at {server}"
        self._field_selector = f"spec.nodeName={node}"
        self._cache: dict[str, Operation] = {}
        self._resource_version: str | None = None
        self._closed = False

    @classmethod
    async def create(cls, operations: Any, *, agent: str) -> KubernetesSource:
        """Connect as ``[operations]`` says (design §10).

        Args:
            operations: an :class:`agent.config.loader.OperationsSection`: ``kubeconfig`` "" for the
                in-cluster service account (``SERVICE_ACCOUNT_DIR``), else the kubeconfig file's absolute
                path (its current context); ``namespace`` "" for the pod's namespace, else ``default``;
                ``node``.
            agent: ``[agent] name``: only objects whose ``spec.agent`` is this name are taken.

        Raises:
            ConfigError: exit 2, one line naming the file: the kubeconfig is missing, unreadable or not
                usable, or there is no in-cluster environment. Nothing is contacted yet.
            HostRefusedError: exit 4, one line naming the file: the kubeconfig, or the token or client key
                it names, is readable or writable by group or others, or owned by another user
                (:func:`check_kubeconfig_files`).
        """
        kube = _lean_import()
        configuration = await _configuration(kube, operations)
        namespace = operations.namespace or _service_account_namespace()
        return cls(kube, kube.ApiClient(configuration), namespace, operations.node,
                   redact_url(str(configuration.host)), agent=agent, operations=operations)

    # -- calls -----------------------------------------------------------------------------------------
    async def _call(self, what: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """Make one API call (``call()``) under :data:`REQUEST_TIMEOUT_S`; every failure becomes a one-line
        SourceError. A 401 Unauthorized reads the credentials again and makes the call once more
        (:meth:`_unauthorized`).

        An ``ApiException``'s HTTP status is kept in ``SourceError.http_status`` for the callers acting on it.

        Raises:
            CredentialsRefused: 401 again with the credentials read anew, or they cannot be read any more.
            SourceError: any other failure.
        """
        for again in (False, True):
            try:
                with anyio.fail_after(REQUEST_TIMEOUT_S + 1):
                    return await call()
            except TimeoutError:
                raise SourceError(f"{self.label}: {what}: no answer within {REQUEST_TIMEOUT_S:g} s") from None
            except Exception as exc:
                failure = self._failure(what, exc)
                if not isinstance(failure, SourceError) or failure.http_status != 401:
                    raise failure from None
            await self._unauthorized(what, again=again)
        raise AssertionError("unreachable: the second 401 raised")

    async def _unauthorized(self, what: str, *, again: bool) -> None:
        """After a 401 Unauthorized: the first time, read the credentials again (:func:`_configuration`:
        the kubeconfig from disk, its ``tokenFile``, its ``exec`` plugin run again, or the service account's
        token file) and use a new HTTP client; a bound token that expired (``kubectl create token
        --duration``) and was renewed on disk is taken up without a restart.

        Raises:
            CredentialsRefused: ``again`` (the renewed credentials were refused too), or they cannot be read.
        """
        origin = _credentials_origin(self._operations) if self._operations is not None else "the client"
        if again or self._operations is None:
            raise CredentialsRefused(
                f"{self.label}: {what}: HTTP 401 Unauthorized with the credentials read again from {origin}: "
                "the token is revoked or expired; renew it"
            )
        try:
            configuration = await _configuration(self._kube, self._operations)
        except ConfigError as exc:
            raise CredentialsRefused(
                f"{self.label}: {what}: HTTP 401 Unauthorized, and the credentials cannot be read again: "
                f"{exc}"
            ) from None
        old, self._client = self._client, self._kube.ApiClient(configuration)
        self._api = self._kube.CustomObjectsApi(self._client)
        await old.close()

    def _failure(self, what: str, exc: Exception) -> Exception:
        """The one-line :class:`SourceError` for an API or transport failure; anything else unchanged.

        Transport: ``OSError``, ``ValueError`` (a bad JSON line) and aiohttp's errors (not all of which are
        OSErrors). The message carries the exception type and text, never headers (so never the token).
        """
        if isinstance(exc, SourceError):
            return exc
        if isinstance(exc, self._kube.ApiException):
            return self._api_error(what, exc)
        if isinstance(exc, (OSError, ValueError)) or type(exc).__module__.startswith("aiohttp"):
            return SourceError(f"{self.label}: {what}: {type(exc).__name__}: {_one_line(exc)}")
        return exc

    def _api_error(self, what: str, exc: Any) -> SourceError:
        status = getattr(exc, "status", None)
        reason = getattr(exc, "reason", None) or ""
        message = ""
        body = getattr(exc, "body", None)
        if body:
            try:
                doc = json.loads(body)
                message = doc.get("message", "") if isinstance(doc, dict) else ""
            except (ValueError, TypeError):
                message = ""
        detail = f"HTTP {status} {_one_line(reason, 80)}" + (f": {_one_line(message)}" if message else "")
        return SourceError(f"{self.label}: {what}: {detail}",
                           http_status=status if isinstance(status, int) else None)

    # -- the cache -------------------------------------------------------------------------------------
    def _ours(self, obj: Any) -> bool:
        """True when ``obj`` is addressed to this node *and* this agent (``spec.nodeName``, ``spec.agent``).

        The list's field selector already picks the node (defence in depth here); the agent is checked
        here only, since the CRD's ``selectableFields`` name ``spec.nodeName`` alone.
        """
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        return (isinstance(spec, Mapping) and spec.get("nodeName") == self.node
                and spec.get("agent") == self.agent)

    def _operation(self, obj: Any) -> Operation | None:
        """The :class:`Operation` of one object, None when it is not addressed to this node and agent."""
        if not isinstance(obj, Mapping):
            return None
        meta = obj.get("metadata")
        spec = obj.get("spec")
        if not isinstance(meta, Mapping) or not isinstance(spec, Mapping) or not self._ours(obj):
            return None
        uid = str(meta.get("uid", ""))
        name = f"{meta.get('namespace', self.namespace)}/{meta.get('name', '')}"
        generation = meta.get("generation")
        status = obj.get("status")
        problem = None
        if not _OPERATION_ID.fullmatch(uid):
            problem = f"metadata.uid {clean_text(uid)}: not an operation id"
        if problem is None and _being_deleted(obj):
            when = _one_line(meta.get("deletionTimestamp"), 40)
            problem = f"metadata.deletionTimestamp {when}: the object is being deleted; not started"
        return Operation(
            operation=uid,
            name=name,
            spec=spec,
            generation=generation if isinstance(generation, int) and generation > 0 else 1,
            status=status if isinstance(status, Mapping) else None,
            problem=problem,
            order=(_creation_seconds(meta.get("creationTimestamp")), name),
        )

    def _apply(self, kind: str, obj: Any) -> None:
        uid = obj.get("metadata", {}).get("uid") if isinstance(obj, Mapping) else None
        if not isinstance(uid, str):
            return
        op = self._operation(obj) if kind != "DELETED" else None
        if op is None:
            self._cache.pop(uid, None)
        else:
            self._cache[uid] = op

    async def _relist(self) -> None:
        doc = await self._call(
            "list",
            lambda: self._api.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, field_selector=self._field_selector,
                _request_timeout=REQUEST_TIMEOUT_S,
            ),
        )
        items = doc.get("items") if isinstance(doc, Mapping) else None
        rv = doc.get("metadata", {}).get("resourceVersion") if isinstance(doc, Mapping) else None
        if not isinstance(items, list) or not isinstance(rv, str) or not rv:
            raise SourceError(f"{self.label}: list: the answer is not a list with a resourceVersion")
        self._cache = {}
        for item in items:
            self._apply("ADDED", item)
        self._resource_version = rv

    # -- OperationSource -------------------------------------------------------------------------------
    async def snapshot(self) -> Sequence[Operation]:
        """This node's and agent's operations in :attr:`Operation.order` (creation time, then
        ``namespace/name``).

        Lists (with ``fieldSelector=spec.nodeName=<node>``) the first time and after a 410 Gone; otherwise
        answers from the cache the watches keep.

        Raises:
            SourceError: the list failed.
        """
        if self._resource_version is None:
            await self._relist()
        return sorted(self._cache.values(), key=lambda op: op.order)

    async def wait_for_change(self, timeout_s: float) -> None:
        """Watch from the last ``resourceVersion`` until the first batch of events or ``timeout_s`` seconds.

        The server is asked to end the watch after ``max(1, floor(timeout_s))`` seconds (``timeoutSeconds``)
        and the client stops reading at ``timeout_s`` regardless. ``ADDED``/``MODIFIED``/``DELETED`` update
        the cache, ``BOOKMARK`` only the version; a ``410 Gone`` (an ``ERROR`` event whose Status has code
        410, or the HTTP status) forgets the version, so the next :meth:`snapshot` lists again, and returns.
        Before any list it lists (and returns). (Kubernetes "API concepts": efficient detection of changes;
        resource versions are opaque strings, compared only for equality.)

        Args:
            timeout_s: seconds, the latest this returns.

        Raises:
            SourceError: the watch could not be opened or the server sent another error.
        """
        if self._resource_version is None:
            await self._relist()
            return
        server_timeout = max(1, int(timeout_s))
        with anyio.move_on_after(max(timeout_s, 0.0)):
            for again in (False, True):
                try:
                    response = await self._api.list_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, field_selector=self._field_selector,
                        watch=True, resource_version=self._resource_version, timeout_seconds=server_timeout,
                        allow_watch_bookmarks=True, _preload_content=False,
                        _request_timeout=timeout_s + REQUEST_TIMEOUT_S,
                    )
                except Exception as exc:
                    if getattr(exc, "status", None) == 410 and isinstance(exc, self._kube.ApiException):
                        self._resource_version = None
                        return
                    raise self._failure("watch", exc) from None
                if response.status == 401:  # the credentials are read again and the watch opened again
                    response.release()
                    await self._unauthorized("watch", again=again)
                    continue
                try:
                    if response.status != 200:  # not checked by the client when the body is streamed
                        await self._watch_refused(response)
                        return
                    await self._read_watch(response)
                except Exception as exc:
                    raise self._failure("watch", exc) from None
                finally:
                    response.release()
                return

    async def _watch_refused(self, response: Any) -> None:
        """A watch answered with an HTTP error: 410 forgets the version (relist), anything else raises."""
        body = await response.content.read(64 * 1024)
        try:
            doc = json.loads(body)
        except ValueError:
            doc = {}
        code = doc.get("code", response.status) if isinstance(doc, dict) else response.status
        if response.status == 410 or code == 410:
            self._resource_version = None
            return
        message = _one_line(doc.get("message", "")) if isinstance(doc, dict) else ""
        reason = _one_line(response.reason or "", 80)
        raise SourceError(f"{self.label}: watch: HTTP {response.status} {reason}"
                          + (f": {message}" if message else ""), http_status=response.status)

    async def _read_watch(self, response: Any) -> None:
        """Apply events until the stream ends or the first batch is applied (the lines already buffered
        after the first event are read without waiting for more)."""
        changed = False
        while True:
            if changed:
                line = b""
                with anyio.move_on_after(0):
                    line = await response.content.readline()
                if not line:
                    return
            else:
                line = await response.content.readline()
                if not line:
                    return  # the server ended the watch (timeoutSeconds)
            event = json.loads(line)
            kind = event.get("type") if isinstance(event, Mapping) else None
            obj = event.get("object") if isinstance(event, Mapping) else None
            if kind == "ERROR":
                code = obj.get("code") if isinstance(obj, Mapping) else None
                if code == 410:
                    self._resource_version = None
                    return
                reason = _one_line(obj.get("message", "")) if isinstance(obj, Mapping) else ""
                raise SourceError(f"{self.label}: watch: error event code {code}: {reason}")
            rv = obj.get("metadata", {}).get("resourceVersion") if isinstance(obj, Mapping) else None
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(kind, obj)
                changed = True
            if isinstance(rv, str) and rv:
                self._resource_version = rv

    async def publish(self, op: Operation, status: OperationStatus) -> bool:
        """Write ``k8s_status(status, op.generation)`` through the status subresource, once.

        Reads the object; returns False when it is gone (404, or a new object with the same name: another
        uid) or already holds exactly this status, and for a non-terminal status (``InProgress``, which the
        operator writes before it starts anything) when the object is being deleted (``deletionTimestamp``
        set since it was listed: the operator then does not start it). Else replaces its status with the
        object's ``resourceVersion`` as the precondition and ``fieldValidation=Strict``. A 409 Conflict
        (someone wrote in between) re-reads and tries again, at most :data:`CONFLICT_RETRIES` times; nothing
        is ever run again. (Kubernetes API conventions: "Concurrency Control and Consistency" and the
        ``/status`` subresource, which ignores everything but ``.status``.)

        Args:
            op: an operation from :meth:`snapshot` (``name`` is ``namespace/name``, ``operation`` the uid).
            status: rendered with ``op.generation`` as ``observedGeneration``.

        Returns:
            True when this call wrote the status.

        Raises:
            CredentialsRefused: 401 Unauthorized again after the credentials were read again.
            SourceError: an API or transport failure, or still conflicting after the retries.
        """
        document = k8s_status(status, op.generation)
        namespace, _, name = op.name.partition("/")
        for _attempt in range(CONFLICT_RETRIES + 1):
            try:
                obj = await self._call(
                    f"get {op.name}",
                    lambda: self._api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                                   _request_timeout=REQUEST_TIMEOUT_S),
                )
            except SourceError as exc:
                if exc.http_status == 404:
                    self._cache.pop(op.operation, None)
                    return False
                raise
            if (not isinstance(obj, dict) or obj.get("metadata", {}).get("uid") != op.operation
                    or not self._ours(obj)):  # gone, replaced, or (spec is immutable) never ours
                self._cache.pop(op.operation, None)
                return False
            if obj.get("status") == document:
                self._apply("MODIFIED", obj)
                return False
            if not status.terminal and _being_deleted(obj):  # deleted since it was listed: never started
                self._apply("MODIFIED", obj)
                return False
            body = dict(obj)
            body["status"] = document
            try:
                written = await self._call(
                    f"update status of {op.name}",
                    functools.partial(self._replace_status, namespace, name, body),
                )
            except SourceError as exc:
                code = exc.http_status
                if code == 409:
                    continue
                if code == 404:
                    self._cache.pop(op.operation, None)
                    return False
                raise
            self._apply("MODIFIED", written)
            return True
        raise SourceError(f"{self.label}: update status of {op.name}: still 409 Conflict after "
                          f"{CONFLICT_RETRIES} re-reads")

    def _replace_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> Awaitable[Any]:
        """The PUT of ``body`` to the object's status subresource, on the current client (it changes when
        the credentials are read again), with ``fieldValidation`` :data:`FIELD_VALIDATION`."""
        return self._api.replace_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, body, field_validation=FIELD_VALIDATION,
            _request_timeout=REQUEST_TIMEOUT_S,
        )

    async def aclose(self) -> None:
        """Close the HTTP session; idempotent."""
        if not self._closed:
            self._closed = True
            await self._client.close()

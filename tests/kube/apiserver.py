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
- the CRD's ``openAPIV3Schema`` (read from ``deploy/kubernetes/crd.yaml``): every write is validated (types,
  required, minLength/maxLength in characters, pattern, enum, minimum, maxItems, ``format: date-time``); a
  violation is 422 Invalid with one ``details.causes`` entry per field error (``FieldValueTooLong``,
  ``FieldValueRequired``, ``FieldValueInvalid``, ``FieldValueNotSupported``...; ``field`` as
  ``status.toVersion``), nothing stored;
- unknown fields are pruned: ``fieldValidation`` ``Warn`` (the default) answers with one
  ``Warning: 299 - "unknown field \"spec.x\""`` header each, ``Ignore`` silently, ``Strict`` refuses the
  write with 400 BadRequest (``strict decoding error: unknown field "spec.x"``);
- authentication: a bearer token never issued is ``ADMIN`` unless ``any_token_is_admin=False``; a revoked
  (:meth:`revoke_token`) or expired (:meth:`issue_token` with ``expires_in_s``) one, or none, is 401
  Unauthorized;
- authorization: a token issued for the ServiceAccount of ``deploy/kubernetes/rbac.yaml`` gets only what its
  Role grants in the Role's namespace (read from the file); anything else is 403 Forbidden in the
  apiserver's words (``User "..." cannot patch resource "upgradeoperations/status" in API group ...``);
- finalizers: a DELETE of an object with ``metadata.finalizers`` sets ``deletionTimestamp``,
  ``deletionGracePeriodSeconds: 0`` and bumps ``generation``; the object stays (status writes allowed, new
  finalizers refused with 422) until its last finalizer is removed, which deletes it (one DELETED event);
- watch bookmarks: with ``allowWatchBookmarks=true``, a ``BOOKMARK`` event (kind, apiVersion,
  ``metadata.resourceVersion`` only) every minute and 2 s before ``timeoutSeconds`` ends the watch, once a
  write made after the watch began has moved the resourceVersion on (the watch cache sends no bookmark that
  would not move the watch past what it was given when it began);
- test hooks: :meth:`expire_history` (every watch from an older version gets 410), :meth:`status_writes`
  (accepted status-subresource writes per object), :meth:`after_next_get` (run a concurrent write right after
  the next GET of an object, to provoke a 409), :meth:`put_object` / :meth:`mutate` (server-side writes,
  pruned and validated), :meth:`request_delete` (a DELETE by someone else), :meth:`issue_token` /
  :meth:`revoke_token`; misbehaviours on request: ``expired_as_http`` (410 as the HTTP status),
  ``honour_watch_timeout=False``.

What it does not do: admission webhooks, CEL rules other than the spec's ``self == oldSelf``, validation
ratcheting (an unchanged invalid field is refused too), duplicate JSON fields, pruning or validating
``metadata`` beyond ``name``, strategic-merge or JSON patches (merge patch only), label selectors,
pagination, server-side apply, ClusterRoles and groups in RBAC, TLS and client certificates (bearer tokens
only), and kmock's DSL reactions are not consulted for this resource.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import os
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonschema
import yaml
from kmock import KubernetesEmulator, Request, Server

GROUP = "upgrades.upgrade-core.io"
VERSION = "v1alpha1"
PLURAL = "upgradeoperations"
KIND = "UpgradeOperation"
API_VERSION = f"{GROUP}/{VERSION}"
DEFAULT_WATCH_S = 60.0
_TRUE = ("1", "t", "T", "true", "TRUE", "True")  # Go's strconv.ParseBool, as the apiserver parses ?watch=
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
ADMIN = "mock-admin"
"""The user of every bearer token the mock was not told about (``any_token_is_admin``): allowed everything."""
BOOKMARK_EVERY_S = 60.0
"""The apiserver's watch cache sends a bookmark about once a minute and 2 s before ``timeoutSeconds`` ends
the watch (``cacheWatcher.nextBookmarkTime``)."""

Obj = dict[str, Any]


def _load_yaml(name: str) -> list[Obj]:
    with open(DEPLOY / name, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def crd_schema() -> Obj:
    """The ``openAPIV3Schema`` of ``deploy/kubernetes/crd.yaml`` (its one version)."""
    (version,) = _load_yaml("crd.yaml")[0]["spec"]["versions"]
    schema: Obj = version["schema"]["openAPIV3Schema"]
    return schema


def rbac_documents() -> list[Obj]:
    """The objects of ``deploy/kubernetes/rbac.yaml`` (ServiceAccount, Role, RoleBinding)."""
    return _load_yaml("rbac.yaml")


def service_account() -> tuple[str, str]:
    """``(namespace, user name)`` of the ServiceAccount ``rbac.yaml`` defines: the user name is the one the
    apiserver gives its tokens (``system:serviceaccount:NAMESPACE:NAME``)."""
    (account,) = [d for d in rbac_documents() if d["kind"] == "ServiceAccount"]
    ns, name = account["metadata"]["namespace"], account["metadata"]["name"]
    return ns, f"system:serviceaccount:{ns}:{name}"


class ApiError(Exception):
    """An error the handler renders as a ``Status`` (``code``, ``reason``, ``message``, ``details``)."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        doc: Obj = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                    "code": self.code, "reason": self.reason, "message": self.message}
        if self.details is not None:
            doc["details"] = self.details
        return doc


def invalid(name: str, causes: list[Obj]) -> ApiError:
    """422 Invalid as the apiserver words it: ``Kind.group "name" is invalid: field: message`` (several
    causes: ``[f1: m1, f2: m2]``), ``details.causes`` one ``{reason, message, field}`` per field error
    (``k8s.io/apimachinery/pkg/util/validation/field``: FieldValueRequired, FieldValueInvalid,
    FieldValueTooLong, FieldValueNotSupported, FieldValueTypeInvalid, FieldValueTooMany,
    FieldValueForbidden)."""
    said = [f"{c['field']}: {c['message']}" for c in causes]
    text = said[0] if len(said) == 1 else "[" + ", ".join(said) + "]"
    return ApiError(422, "Invalid", f'{KIND}.{GROUP} "{name}" is invalid: {text}',
                    {"name": name, "group": GROUP, "kind": KIND, "causes": causes})


def _go_quote(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


_formats = jsonschema.FormatChecker(formats=())


@_formats.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    """RFC 3339 date-time, as the apiserver checks ``format: date-time``."""
    if isinstance(value, str):
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", value):
            raise ValueError(value)
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return True


def _field_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_IN_BODY = {  # kube-openapi's wording after "<field> in body " ({0}: the schema's bound, {1}: the value)
    "type": "must be of type {0}",
    "pattern": "should match '{0}'",
    "minLength": "should be at least {0} chars long",
    "minimum": "should be greater than or equal to {0}",
    "format": "must be of type {0}: {1}",
}


def schema_causes(obj: Obj, schema: Obj) -> list[Obj]:
    """The field errors of ``obj`` (without ``metadata``) against the CRD's structural schema, in the
    apiserver's cause shape and wording; empty when valid. ``maxLength`` counts characters (runes), as
    kube-openapi's validator does."""
    doc = {k: v for k, v in obj.items() if k != "metadata"}
    causes = []
    validator = jsonschema.Draft4Validator(schema, format_checker=_formats)
    for e in sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path]):
        where = _field_path(e.absolute_path)
        value, bound = e.instance, e.validator_value
        if e.validator == "required":
            missing = re.match(r"'(.+)' is a required property", e.message)
            field = _field_path([*e.absolute_path, missing.group(1) if missing else "?"])
            causes.append({"reason": "FieldValueRequired", "message": "Required value", "field": field})
            continue
        shown = _go_quote(value)
        if e.validator == "maxLength":
            reason, message = "FieldValueTooLong", f"Too long: may not be more than {bound} bytes"
        elif e.validator == "maxItems":
            reason, message = "FieldValueTooMany", f"Too many: {len(value)}: must have at most {bound} items"
        elif e.validator == "enum":
            allowed = ", ".join(_go_quote(v) for v in bound)
            reason = "FieldValueNotSupported"
            message = f"Unsupported value: {shown}: supported values: {allowed}"
        elif e.validator in _IN_BODY:
            reason = "FieldValueTypeInvalid" if e.validator == "type" else "FieldValueInvalid"
            message = f"Invalid value: {shown}: {where} in body {_IN_BODY[e.validator].format(bound, shown)}"
        else:
            reason, message = "FieldValueInvalid", f"Invalid value: {shown}: {e.message}"
        causes.append({"reason": reason, "message": message, "field": where})
    return causes


def prune(node: Any, schema: Obj, path: str = "") -> list[str]:
    """Drop, in place, every field the structural schema does not declare (``metadata`` is ObjectMeta, not
    pruned by the schema); returns their paths (``spec.expectedVersion``, ``status.conditions[0].x``), as the
    apiserver's unknown-field warnings and strict decoding errors name them."""
    dropped: list[str] = []
    properties = schema.get("properties")
    if isinstance(node, dict) and isinstance(properties, dict):
        for key in list(node):
            where = f"{path}.{key}" if path else key
            if key not in properties:
                del node[key]
                dropped.append(where)
            elif key != "metadata" or path:
                dropped += prune(node[key], properties[key], where)
    elif isinstance(node, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(node):
            dropped += prune(item, schema["items"], f"{path}[{i}]")
    return dropped


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
    any_token_is_admin: bool = True
    """A bearer token never issued (:meth:`issue_token`) nor revoked is the all-powerful ``ADMIN``; False:
    401, as the apiserver answers a token it does not know."""
    _tokens: dict[str, tuple[str, float | None]] = attrs.field(factory=dict, init=False)
    _revoked: set[str] = attrs.field(factory=set, init=False)
    _schema: Obj = attrs.field(factory=crd_schema, init=False)
    _rbac: list[Obj] = attrs.field(factory=rbac_documents, init=False)
    _access: list[tuple[str, str, str, bool]] = attrs.field(factory=list, init=False)
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
        """Delete an object server-side, finalizers or not (what the garbage collector does at the end)."""
        self._delete(namespace, name)

    def request_delete(self, namespace: str, name: str) -> Obj:
        """A DELETE by someone else: with finalizers the object stays, ``deletionTimestamp`` set (see
        :meth:`_request_delete`)."""
        return self._request_delete(namespace, name)

    def issue_token(self, token: str, user: str = ADMIN, *, expires_in_s: float | None = None) -> str:
        """Accept ``token`` as ``user`` (``ADMIN``, or the ServiceAccount of rbac.yaml, whose Role then
        applies), until ``expires_in_s`` seconds from now (None: no expiry); returns ``token``."""
        self._tokens[token] = (user, None if expires_in_s is None else time.time() + expires_in_s)
        self._revoked.discard(token)
        return token

    def access_log(self, user: str) -> list[tuple[str, str, bool]]:
        """``(verb, resource, allowed)`` of every authenticated request ``user`` made, in order."""
        return [(verb, resource, allowed) for who, verb, resource, allowed in self._access if who == user]

    def revoke_token(self, token: str) -> None:
        """From now on ``token`` gets 401 Unauthorized (a deleted ServiceAccount, a rotated secret)."""
        self._revoked.add(token)

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

    def _decode(self, body: Any, validation: str, warnings: list[str]) -> Obj:
        """A copy of a request body with the fields the schema does not declare dropped, as the apiserver
        decodes a custom resource: ``fieldValidation`` ``Strict`` refuses them (400 BadRequest, "strict
        decoding error"), ``Warn`` (the default since 1.27) adds one warning each, ``Ignore`` says nothing."""
        if validation not in ("", "Ignore", "Warn", "Strict"):
            raise ApiError(400, "BadRequest", f"fieldValidation: Invalid value: {_go_quote(validation)}: "
                                              'must be one of "Ignore", "Warn" or "Strict"')
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        doc = copy.deepcopy(body)
        unknown = [f'unknown field "{path}"' for path in prune(doc, self._schema)]
        if unknown and validation == "Strict":
            raise ApiError(400, "BadRequest", f'{KIND} in version "{VERSION}" cannot be handled as a {KIND}: '
                                              f"strict decoding error: {', '.join(unknown)}")
        if validation != "Ignore":
            warnings += unknown
        return doc

    def _validate(self, obj: Obj) -> None:
        causes = schema_causes(obj, self._schema)
        if causes:
            raise invalid(obj["metadata"].get("name", ""), causes)

    def _create(self, namespace: str, body: Any, validation: str = "Ignore",
                warnings: list[str] | None = None) -> Obj:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise ApiError(400, "BadRequest", "the body must be an object with metadata")
        body = self._decode(body, validation, [] if warnings is None else warnings)
        name = body["metadata"].get("name")
        if not name:
            raise invalid("", [{"reason": "FieldValueRequired", "message": "Required value",
                                "field": "metadata.name"}])
        if (namespace, name) in self._store:
            raise ApiError(409, "AlreadyExists", f'{PLURAL}.{GROUP} "{name}" already exists')
        obj = {k: copy.deepcopy(v) for k, v in body.items() if k != "status"}
        meta = obj["metadata"]
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "deletionTimestamp",
                    "deletionGracePeriodSeconds"):
            meta.pop(key, None)
        obj["apiVersion"], obj["kind"] = API_VERSION, KIND
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), generation=1,
                    creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    resourceVersion="0")
        self._validate(obj)
        meta["resourceVersion"] = str(self._bump())
        self._store[(namespace, name)] = obj
        self._record("ADDED", None, obj)
        return copy.deepcopy(obj)

    def _write(self, namespace: str, name: str, old: Obj, new: Obj) -> Obj:
        """Store ``new`` as the next version of ``old`` (a no-op change is not a write), validated against
        the CRD's schema (422 Invalid). An object being deleted whose last finalizer goes is deleted
        instead (one DELETED event, as the registry's update does)."""
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return copy.deepcopy(old)
        self._validate(new)
        new["metadata"]["resourceVersion"] = str(self._bump())
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            del self._store[(namespace, name)]
            self._record("DELETED", old, new)
            return copy.deepcopy(new)
        self._store[(namespace, name)] = new
        self._record("MODIFIED", old, new)
        return copy.deepcopy(new)

    def _request_delete(self, namespace: str, name: str) -> Obj:
        """DELETE: an object without finalizers goes at once; one with finalizers stays, marked: the first
        DELETE sets ``deletionTimestamp`` (now), ``deletionGracePeriodSeconds`` 0 and bumps ``generation``
        (the registry's ``markAsDeleting``, for resources without graceful deletion), later ones change
        nothing. Either way the answer is the object (200)."""
        old = self._require(namespace, name)
        if not old["metadata"].get("finalizers"):
            return self._delete(namespace, name)
        if old["metadata"].get("deletionTimestamp"):
            return copy.deepcopy(old)
        new = copy.deepcopy(old)
        new["metadata"].update(deletionTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               deletionGracePeriodSeconds=0, generation=old["metadata"]["generation"] + 1)
        return self._write(namespace, name, old, new)

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

    def _update(self, request: Request, namespace: str, name: str, warnings: list[str]) -> Obj:
        current = self._require(namespace, name)
        body = request.data
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        put = request.method.value == "PUT"
        self._precondition(current, body, required=put)
        validation = request.params.get("fieldValidation", "")
        if put:
            incoming = self._decode(body, validation, warnings)
        else:
            meta_patch = body.get("metadata", {}) if isinstance(body.get("metadata"), dict) else {}
            incoming = self._decode(
                _merge(current, {k: v for k, v in body.items() if k != "metadata"}
                       | {"metadata": {k: v for k, v in meta_patch.items() if k != "resourceVersion"}}),
                validation, warnings)
        new = copy.deepcopy(current)
        if request.subresource == "status":
            if "status" in incoming:
                new["status"] = incoming["status"]
            else:
                new.pop("status", None)
        else:
            if "spec" in incoming and incoming["spec"] != current.get("spec"):
                if self.immutable_spec:  # the CRD's x-kubernetes-validations rule and its message
                    raise invalid(name, [{"reason": "FieldValueInvalid", "field": "spec",
                                          "message": 'Invalid value: "object": spec is immutable; create a '
                                                     "new UpgradeOperation instead"}])
                new["spec"] = incoming["spec"]
                new["metadata"]["generation"] += 1
            meta_in = incoming.get("metadata", {}) if isinstance(incoming.get("metadata"), dict) else {}
            for key in ("labels", "annotations", "finalizers"):
                if key in meta_in:
                    new["metadata"][key] = meta_in[key]
                else:  # left out of a PUT, or removed by the merge patch (null)
                    new["metadata"].pop(key, None)
            added = sorted(set(new["metadata"].get("finalizers") or ())
                           - set(current["metadata"].get("finalizers") or ()))
            if current["metadata"].get("deletionTimestamp") and added:
                listed = ", ".join(json.dumps(f) for f in added)
                message = ("Forbidden: no new finalizers can be added if the object is being deleted, found "
                           f"new finalizers []string{{{listed}}}")
                raise invalid(name, [{"reason": "FieldValueForbidden", "field": "metadata.finalizers",
                                      "message": message}])
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
    def _authenticate(self, request: Request) -> str:
        """The user of the request's bearer token; 401 Unauthorized (reason ``Unauthorized``) for none, a
        revoked or expired one, and one never issued unless ``any_token_is_admin`` (anonymous requests are
        refused too, as on a server started with ``--anonymous-auth=false``)."""
        header = request.headers.get("Authorization") or request.headers.get("authorization") or ""
        token = header[len("Bearer "):] if header.startswith("Bearer ") else ""
        if token and token not in self._revoked:
            known = self._tokens.get(token)
            if known is not None:
                user, expires = known
                if expires is None or time.time() < expires:
                    return user
            elif self.any_token_is_admin:
                return ADMIN
        raise ApiError(401, "Unauthorized", "Unauthorized")

    def _authorize(self, user: str, request: Request) -> None:
        """RBAC as rbac.yaml grants it: ``user`` may act when a RoleBinding of the request's namespace binds
        it (a ServiceAccount subject is ``system:serviceaccount:NS:NAME``) to a Role of that namespace with
        a rule naming the API group, the resource (``upgradeoperations`` or ``upgradeoperations/status``)
        and the verb (get, list, watch, create, update, patch, delete, deletecollection); else 403 Forbidden
        in the apiserver's words. ``ADMIN`` may do anything."""
        method, ns, name = request.method.value, request.namespace, request.name
        if method == "GET":
            verb = "watch" if request.params.get("watch") in _TRUE else ("get" if name else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                    "DELETE": "delete" if name else "deletecollection"}.get(method, method.lower())
        resource = PLURAL + (f"/{request.subresource}" if request.subresource else "")
        allowed = user == ADMIN or self._granted(user, ns, verb, resource)
        self._access.append((user, verb, resource, allowed))
        if allowed:
            return
        what = f'{PLURAL}.{GROUP} "{name}"' if name else f"{PLURAL}.{GROUP}"
        where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
        details: Obj = {"group": GROUP, "kind": PLURAL} | ({"name": name} if name else {})
        raise ApiError(403, "Forbidden", f'{what} is forbidden: User "{user}" cannot {verb} resource '
                                         f'"{resource}" in API group "{GROUP}"{where}', details)

    def _granted(self, user: str, ns: str | None, verb: str, resource: str) -> bool:
        roles = {d["metadata"]["name"]: d for d in self._rbac
                 if d["kind"] == "Role" and d["metadata"].get("namespace") == ns}
        for binding in self._rbac:
            if binding["kind"] != "RoleBinding" or binding["metadata"].get("namespace") != ns:
                continue
            subjects = {f"system:serviceaccount:{s.get('namespace', ns)}:{s['name']}"
                        if s["kind"] == "ServiceAccount" else s["name"] for s in binding.get("subjects", [])}
            role = roles.get(binding["roleRef"]["name"]) if binding["roleRef"]["kind"] == "Role" else None
            if user not in subjects or role is None:
                continue
            for rule in role.get("rules", []):
                if ({GROUP, "*"} & set(rule.get("apiGroups", []))
                        and {resource, "*"} & set(rule.get("resources", []))
                        and {verb, "*"} & set(rule.get("verbs", []))):
                    return True
        return False

    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is None or (res.group, res.version, res.plural) != (GROUP, VERSION, PLURAL):
            return await super()._handle(request)
        try:
            self._authorize(self._authenticate(request), request)
            return await self._serve(request)
        except ApiError as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.code)

    @staticmethod
    def _answer(doc: Obj, warnings: list[str], status: int = 200) -> aiohttp.web.Response:
        """A JSON answer with one ``Warning: 299 - "text"`` header per warning (RFC 7234 warn-code 299, the
        form the apiserver uses)."""
        response = aiohttp.web.json_response(doc, status=status)
        for text in warnings:
            response.headers.add("Warning", "299 - " + json.dumps(text))
        return response

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
                warnings: list[str] = []
                created = self._create(ns, request.data, request.params.get("fieldValidation", ""), warnings)
                return self._answer(created, warnings, 201)
            raise ApiError(405, "MethodNotAllowed", f"{method} on the collection")
        assert ns is not None
        if method == "GET":
            obj = copy.deepcopy(self._require(ns, name))
            pending = self._after_get.get((ns, name))
            if pending:
                pending.pop(0)()
            return aiohttp.web.json_response(obj)
        if method in ("PUT", "PATCH"):
            warnings = []
            return self._answer(self._update(request, ns, name, warnings), warnings)
        if method == "DELETE" and sub is None:
            return aiohttp.web.json_response(self._request_delete(ns, name))
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
            bookmarks = request.params.get("allowWatchBookmarks") in _TRUE
            async for kind, obj in self._events_after(since, deadline, ns, terms, bookmarks=bookmarks):
                await send(kind, obj)
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    async def _events_after(self, since: int, deadline: float, ns: str | None,
                            terms: list[tuple[str, bool, str]], *,
                            bookmarks: bool = False) -> AsyncIterator[tuple[str, Obj]]:
        """The watch's events after ``since`` until ``deadline``; with ``bookmarks`` (the client sent
        ``allowWatchBookmarks=true``) also a ``BOOKMARK`` (an object with only kind, apiVersion and
        ``metadata.resourceVersion``: the version every event up to which was sent or filtered out) every
        ``BOOKMARK_EVERY_S`` and 2 s before the deadline, as the apiserver's watch cache does, and as it does
        only once a write made after the watch began has moved the version past every event the watch was
        given or filtered out when it began (``cacheWatcher.process`` sends a bookmark only with a newer
        version; a quiet watch gets none)."""
        loop = asyncio.get_running_loop()
        started = self._rv

        def next_bookmark() -> float | None:
            at = min(loop.time() + BOOKMARK_EVERY_S, deadline - 2.0)
            return at if bookmarks and at > loop.time() else None

        bookmark_at = next_bookmark()
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
            if bookmark_at is not None and loop.time() >= bookmark_at:
                if self._rv > started:
                    yield "BOOKMARK", {"kind": KIND, "apiVersion": API_VERSION,
                                       "metadata": {"resourceVersion": str(self._rv)}}
                bookmark_at = next_bookmark()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                wait = remaining if bookmark_at is None else min(remaining, bookmark_at - loop.time())
                wait = max(0.0, wait)
                await asyncio.wait_for(self._changed.wait(), wait)
            except TimeoutError:
                if loop.time() >= deadline:
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

"""``deploy/kubernetes/`` checked offline: the CRD's schema (with the ``jsonschema`` validator), the sample,
every status document the operator can render, the printer columns and the RBAC's exact grants."""

from __future__ import annotations

import copy
import datetime
import re
from pathlib import Path
from typing import Any, get_args

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.operations.kubernetes import GROUP, PLURAL, VERSION
from agent.operations.model import check_spec, k8s_status
from upgrade_core import OperationStatus, OperationStep

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


def _load(name: str) -> list[dict[str, Any]]:
    with open(DEPLOY / name, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


CRD = _load("crd.yaml")[0]
(CRD_VERSION,) = CRD["spec"]["versions"]
SCHEMA = CRD_VERSION["schema"]["openAPIV3Schema"]
SAMPLE = _load("sample-upgradeoperation.yaml")[0]

_formats = jsonschema.FormatChecker(formats=())


@_formats.checks("date-time", raises=ValueError)
def _date_time(value: object) -> bool:
    """RFC 3339 date-time, as the apiserver checks ``format: date-time`` (``metav1.Time``)."""
    if not isinstance(value, str):
        return True
    if not _DATE_TIME.fullmatch(value):
        raise ValueError(f"not an RFC 3339 date-time: {value!r}")
    datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return True


def errors(doc: Any, schema: dict[str, Any] = SCHEMA) -> list[str]:
    """The schema violations of ``doc`` (OpenAPI v3 as the CRD uses it is draft-4 JSON Schema plus
    ``x-kubernetes-*`` keywords, which the validator ignores)."""
    validator = jsonschema.Draft4Validator(schema, format_checker=_formats)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_crd_names_the_resource_the_source_watches() -> None:
    assert CRD["apiVersion"] == "apiextensions.k8s.io/v1" and CRD["kind"] == "CustomResourceDefinition"
    spec = CRD["spec"]
    assert (spec["group"], spec["names"]["plural"], spec["scope"]) == (GROUP, PLURAL, "Namespaced")
    assert CRD["metadata"]["name"] == f"{PLURAL}.{GROUP}" and spec["names"]["kind"] == "UpgradeOperation"
    assert (CRD_VERSION["name"], CRD_VERSION["served"], CRD_VERSION["storage"]) == (VERSION, True, True)
    assert CRD_VERSION["subresources"] == {"status": {}}
    assert CRD_VERSION["selectableFields"] == [{"jsonPath": ".spec.nodeName"}]
    assert spec["names"]["categories"] == ["upgrade-core"]  # kubectl get upgrade-core
    rules = SCHEMA["properties"]["spec"]["x-kubernetes-validations"]
    assert [r["rule"] for r in rules] == ["self == oldSelf"]


def _walk(node: dict[str, Any], path: str) -> list[str]:
    """Schema nodes without a ``type`` (a structural schema needs one everywhere)."""
    missing = [] if "type" in node else [path or "/"]
    for key, child in node.get("properties", {}).items():
        missing += _walk(child, f"{path}.{key}")
    if "items" in node:
        missing += _walk(node["items"], f"{path}[]")
    return missing


def test_crd_schema_is_structural_and_valid_json_schema() -> None:
    assert _walk(SCHEMA, "") == []
    jsonschema.Draft4Validator.check_schema(SCHEMA)
    assert SCHEMA["properties"]["spec"]["required"] == ["nodeName", "agent", "archive"]
    assert SCHEMA["properties"]["spec"]["properties"]["archive"]["required"] == ["url", "sha256"]
    delta = SCHEMA["properties"]["spec"]["properties"]["delta"]
    assert delta["required"] == ["url", "sha256"]  # memberSHA256 optional: the frame's checksum then
    status = SCHEMA["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["Pending", "InProgress", "Succeeded", "Failed", "RolledBack",
                                       "NeedsAttention"]
    assert set(status) == {"observedGeneration", "phase", "operation", "fromVersion", "toVersion",
                           "journalSeq", "bootID", "startedAt", "finishedAt", "message", "step", "attempt",
                           "bytesFetched", "conditions"}
    assert status["step"]["enum"] == list(get_args(OperationStep))
    assert (status["attempt"]["type"], status["attempt"]["minimum"]) == ("integer", 1)
    assert (status["bytesFetched"]["type"], status["bytesFetched"]["minimum"]) == ("integer", 0)


def test_sample_validates_and_the_operator_accepts_its_spec() -> None:
    assert errors(SAMPLE) == []
    assert (SAMPLE["apiVersion"], SAMPLE["kind"]) == (f"{GROUP}/{VERSION}", "UpgradeOperation")
    checked = check_spec(SAMPLE["spec"], agent="demo-agent", node_name="web-1", node_required=True)
    assert checked.sha256 == SAMPLE["spec"]["archive"]["sha256"]


def test_a_spec_with_a_delta_validates_and_the_operator_accepts_it() -> None:
    doc = copy.deepcopy(SAMPLE)
    doc["spec"]["delta"] = {
        "url": "https://releases.example/d.zst", "sha256": "ab" * 32, "memberSHA256": "cd" * 32,
    }
    assert errors(doc) == []
    checked = check_spec(doc["spec"], agent="demo-agent", node_name="web-1", node_required=True)
    assert (checked.delta_sha256, checked.delta_member_sha256) == ("ab" * 32, "cd" * 32)


def _broken(change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SAMPLE)
    change(doc)
    return doc


@pytest.mark.parametrize("doc", [
    pytest.param(_broken(lambda d: d["spec"]["archive"].pop("sha256")), id="missing-sha256"),
    pytest.param(_broken(lambda d: d["spec"]["archive"].update(sha256="AB" * 32)), id="upper-case-digest"),
    pytest.param(_broken(lambda d: d["spec"]["archive"].update(sha256="ab" * 31)), id="short-digest"),
    pytest.param(_broken(lambda d: d["spec"]["archive"].pop("url")), id="missing-url"),
    pytest.param(_broken(lambda d: d["spec"].pop("nodeName")), id="missing-node"),
    pytest.param(_broken(lambda d: d["spec"].pop("agent")), id="missing-agent"),
    pytest.param(_broken(lambda d: d["spec"].update(delta={"url": "https://x/d"})),
                 id="delta-without-digest"),
    pytest.param(_broken(lambda d: d["spec"].update(agent="Demo Agent")), id="bad-agent-name"),
    pytest.param(_broken(lambda d: d.pop("spec")), id="missing-spec"),
    pytest.param(_broken(lambda d: d.update(status={"phase": "Done"})), id="bad-phase"),
    pytest.param(_broken(lambda d: d.update(status={"finishedAt": "yesterday"})), id="bad-time"),
    pytest.param(_broken(lambda d: d.update(status={"journalSeq": -1})), id="negative-seq"),
    pytest.param(_broken(lambda d: d.update(status={"step": "Downloading"})), id="bad-step"),
    pytest.param(_broken(lambda d: d.update(status={"attempt": 0})), id="attempt-zero"),
    pytest.param(_broken(lambda d: d.update(status={"bytesFetched": -1})), id="negative-bytes"),
    pytest.param(_broken(lambda d: d.update(status={"conditions": [
        {"type": "Complete", "status": "Yes", "reason": "Succeeded"}]})), id="bad-condition-status"),
])
def test_broken_documents_are_rejected(doc: dict[str, Any]) -> None:
    assert errors(doc) != []


_ids = st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True)
_versions = st.none() | st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){2}(-[a-z0-9.]{1,20})?", fullmatch=True) | (
    st.text(max_size=400))  # whatever a candidate's version output was, over the CRD's 128 characters too
_long_text = st.builds(lambda c, n: c * n, st.characters(), st.integers(min_value=32_000, max_value=40_000))
_times = st.none() | st.floats(min_value=0, max_value=2**33, allow_nan=False)
_statuses = st.builds(
    OperationStatus,
    operation=_ids,
    phase=st.sampled_from(["Pending", "InProgress", "Succeeded", "Failed", "RolledBack", "NeedsAttention"]),
    result=st.none() | st.sampled_from(["committed", "noop", "aborted", "rolled_back", "needs_attention"]),
    from_version=_versions,
    to_version=_versions,
    message=(st.none() | st.text(max_size=300) | _long_text
             | st.text(min_size=1, max_size=50).map(lambda t: t * 2_000)),
    journal_seq=st.none() | st.integers(min_value=0, max_value=2**63 - 1),
    boot_id=st.none() | st.from_regex(r"[0-9a-f]{32}", fullmatch=True),
    started_at=_times,
    finished_at=_times,
    step=st.none() | st.sampled_from(get_args(OperationStep)),
    attempt=st.none() | st.integers(min_value=1, max_value=2**31 - 1),
    bytes_fetched=st.none() | st.integers(min_value=0, max_value=2**63 - 1),
)


@settings(max_examples=300, deadline=None)
@given(status=_statuses, generation=st.integers(min_value=1, max_value=2**62))
def test_every_rendered_status_validates(status: OperationStatus, generation: int) -> None:
    doc = dict(SAMPLE, status=k8s_status(status, generation))
    assert errors(doc) == []


def test_a_status_quoting_60_kb_and_control_characters_stays_within_the_crd() -> None:
    """A message quoting a control plane's 60 KB string (the CRD bounds ``status.message`` to 32768
    characters: the API server would refuse the write, and the operation would never be reported), a
    200-character version (``maxLength`` 128) and a long boot id (64): every field is bounded and escaped."""
    loud = OperationStatus("op1", "Failed", "aborted", "1.0.0", "9" * 200,
                           "refused: " + "x\n\x1b[31m" * 12_000, 7, "b" * 100, 1.0e9, 1.0e9 + 5)
    status = k8s_status(loud, 1)
    assert errors(dict(SAMPLE, status=status)) == []
    assert "\n" not in status["message"] and "\x1b" not in status["message"]
    assert status["message"].startswith("refused: x\\n\\x1b[31m")


def _schema_has(path: str) -> bool:
    node = SCHEMA
    parts = path.lstrip(".").split(".")
    if parts[0] == "metadata":  # ObjectMeta: the apiserver's own schema
        return parts[1:] in (["creationTimestamp"], ["name"], ["namespace"])
    for part in parts:
        props = node.get("properties", {})
        if part not in props:
            return False
        node = props[part]
    return True


def test_printer_columns_point_into_the_schema() -> None:
    columns = CRD_VERSION["additionalPrinterColumns"]
    assert [c["name"] for c in columns] == ["Node", "Agent", "Phase", "Step", "From", "To", "Age", "Message"]
    # kubectl shows priority 0 columns always and priority 1 only with -o wide
    assert [c["name"] for c in columns if c.get("priority", 0) > 0] == ["Message"]
    assert [c["jsonPath"] for c in columns if not _schema_has(c["jsonPath"])] == []


def test_rbac_grants_exactly_read_and_status_replace_in_one_namespace() -> None:
    docs = _load("rbac.yaml")
    assert sorted(d["kind"] for d in docs) == ["Role", "RoleBinding", "ServiceAccount"]
    namespaces = {d["metadata"]["namespace"] for d in docs}
    assert len(namespaces) == 1
    (role,) = (d for d in docs if d["kind"] == "Role")
    grants = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
              for v in rule["verbs"]}
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])  # no resourceNames
    assert grants == {(GROUP, PLURAL, v) for v in ("get", "list", "watch")} | {
        (GROUP, f"{PLURAL}/status", "update")}
    (binding,) = (d for d in docs if d["kind"] == "RoleBinding")
    (account,) = (d for d in docs if d["kind"] == "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    assert SAMPLE["metadata"]["namespace"] in namespaces

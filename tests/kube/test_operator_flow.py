"""The whole operator loop (the real session, journal and CLI, a temp host without systemd) against the
strict mock with RBAC enforced and against a real API server (``api_server``): the ServiceAccount of
``deploy/kubernetes/rbac.yaml`` runs, refuses and reports operations using exactly the verbs its Role grants;
an object being deleted is never started; a token refused again after the credentials were read again stops
the process (exit 3, one line).

The upgrade itself ends before any switch (the archive does not match its digest): what ran is read from
the journal, what was reported from the status history the mock keeps or the real server's audit log."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

from agent.operations import operator as operator_module
from agent.session.session import Session
from tests.agent_fetch import _servers as servers
from tests.cli._rig import Rig
from tests.kube.apiserver import rbac_documents, service_account
from tests.kube.backends import Backend
from tests.kube.conftest import spec
from upgrade_core import operation_status

pytestmark = pytest.mark.anyio
NODE = "n1"
TERMINAL = ("Succeeded", "Failed", "RolledBack", "NeedsAttention")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _rig(tmp_path: Path, kubeconfig: str, namespace: str, node: str) -> Rig:
    rig = Rig(tmp_path, "kube-flow")
    rig.install_by_hand()
    rig.write_config(f'[operations]\nsource = "kubernetes"\nnamespace = "{namespace}"\n'
                     f'node_name = "{node}"\nkubeconfig = "{kubeconfig}"\n')
    return rig


def _role_grants() -> set[tuple[str, str]]:
    (role,) = [d for d in rbac_documents() if d["kind"] == "Role"]
    return {(verb, resource) for rule in role["rules"] for resource in rule["resources"]
            for verb in rule["verbs"]}


async def test_the_operator_under_rbac_uses_exactly_its_roles_verbs_and_never_starts_a_deleted_object(
    tmp_path: Path, api_server: Backend,
) -> None:
    ns, user = service_account()
    kube = api_server
    with servers.serve() as release:
        release.routes["/a.tar.gz"] = servers.body(b"not the archive the digest names")
        node = f"n-{tmp_path.name[-12:].lower().replace('_', '-')}"
        token = kube.call(lambda b: b.issue_token("agent-token", user))
        path = kube.kubeconfig(str(tmp_path / "kubeconfig"), namespace=ns, token=token)
        rig = _rig(tmp_path, path, ns, node)
        ours = spec(node, agent=rig.name)
        ours["archive"] = {"url": release.url("/a.tar.gz"), "sha256": "0" * 64}
        name = {short: f"{node}-{short}" for short in ("run", "foreign", "held", "elsewhere")}
        stored = {
            "run": kube.call(lambda b: b.put_object(ns, {"metadata": {"name": name["run"]}, "spec": ours})),
            "foreign": kube.call(lambda b: b.put_object(ns, {"metadata": {"name": name["foreign"]},
                                                             "spec": spec(node, agent="other-agent")})),
            "held": kube.call(lambda b: b.put_object(ns, {"metadata": {"name": name["held"],
                                                                       "finalizers": ["example.com/hold"]},
                                                          "spec": ours})),
        }
        kube.call(lambda b: b.request_delete(ns, name["held"]))
        kube.call(lambda b: b.put_object(ns, {"metadata": {"name": name["elsewhere"]},
                                              "spec": spec(node + "-2", agent=rig.name)}))
        names = ("run", "held")

        def settled() -> bool:
            histories = kube.call(lambda b: [b.status_history(ns, name[n]) for n in names])
            reported = all(any(s.get("phase") in TERMINAL for s in h) for h in histories)
            return reported and any(verb == "watch" for verb, _, _ in kube.call(lambda b: b.access_log(user)))

        session = Session.load(str(rig.config))
        source = await operator_module.open_source(session)
        operator = operator_module.Operator(session, source)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(operator.run)
                with anyio.fail_after(60):
                    while not await anyio.to_thread.run_sync(settled):
                        await anyio.sleep(0.1)
                operator.request_stop("SIGTERM")
        finally:
            await source.aclose()

        histories = {n: kube.call(lambda b, n=n: b.status_history(ns, name[n])) for n in names}
        final = {n: history[-1] for n, history in histories.items()}
        uids = {n: obj["metadata"]["uid"] for n, obj in stored.items()}
        assert kube.call(lambda b: b.status_history(ns, name["elsewhere"])) == []
        # another agent's object: never written
        assert kube.call(lambda b: b.status_history(ns, name["foreign"])) == []
        used = kube.call(lambda b: b.access_log(user))
        writes = kube.call(lambda b: b.update_params(user))

    view = session.view()
    ran = operation_status(view, uids["run"])
    assert ran is not None and ran.phase == "Failed" and ran.result == "aborted"
    assert final["run"]["phase"] == "Failed" and final["run"]["journalSeq"] == ran.journal_seq
    assert [s["phase"] for s in histories["held"]] == ["Failed"]  # never reported InProgress
    assert "being deleted; not started" in final["held"]["message"]
    assert final["held"]["observedGeneration"] == 2
    assert operation_status(view, uids["held"]) is None and operation_status(view, uids["foreign"]) is None
    assert all(allowed for _, _, allowed in used), used
    assert {(verb, resource) for verb, resource, _ in used} == _role_grants()
    assert writes and all(params.get("fieldValidation") == "Strict" for params in writes), writes


def test_a_token_refused_again_after_reading_the_kubeconfig_again_exits_3_in_one_line(
    tmp_path: Path, api_server: Backend,
) -> None:
    ns, _user = service_account()
    token = api_server.call(lambda b: b.refused_token())
    path = api_server.kubeconfig(str(tmp_path / "kubeconfig"), namespace=ns, token=token)
    rig = _rig(tmp_path, path, ns, NODE)
    out = rig.cli("operator")  # not --once: a refusal that stays ends the long-running process too
    error = out.error_payload(3)["error"]
    assert re.search(r"list: HTTP 401 Unauthorized with the credentials read again from .*kubeconfig: the "
                     r"token is revoked or expired; renew it$", error), error
    lines = out.stderr.splitlines()
    assert len(lines) == 2, out.stderr  # the operator's start line, then the cause
    assert lines[0].startswith("upgrade-agent: operator: node n1, kubernetes"), out.stderr
    assert lines[1].endswith(error), out.stderr
    assert token not in out.stderr + out.stdout

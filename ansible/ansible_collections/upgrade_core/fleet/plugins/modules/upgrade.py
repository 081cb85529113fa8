# Copyright: upgrade-core developers
# Apache License 2.0 (see the repository's pyproject.toml)
"""Ansible module ``upgrade_core.fleet.upgrade``: one supervised ``upgrade-agent upgrade`` on the host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: upgrade
short_description: Upgrade a host's agent binary blue/green with upgrade-agent
version_added: "0.1.0"
description:
  - Runs C(upgrade-agent --config CONFIG --json upgrade --archive ARCHIVE ...) on the managed host and returns
    the one JSON object it prints (operation, result, from_version, to_version, slot, reason).
  - The agent fetches and verifies the release, switches the inactive slot in, restarts the service and
    health-checks it; a candidate that fails is rolled back to the last good binary before the task returns.
  - The task is C(changed) only when a new release was committed by this run, that is when the binary that
    C(current) names differs before and after. A C(noop) (the host already runs this release), or a repeated
    O(operation) whose result the agent had already published, is C(ok).
  - The task fails, with the agent's reason, when the result is C(rolled_back), C(aborted) or
    C(needs_attention); and, with the agent's one-line error, on any other failure (exit 2 usage or
    configuration, 3, 4 the host refused, 75 busy, 130 interrupted).
  - In check mode it runs C(upgrade --preflight), which fetches nothing and changes nothing, and returns
    the plan.
    As nothing is fetched, the task reports C(changed) unless O(expect_version) is given and the host already
    reports that version.
author:
  - upgrade-core developers (@upgrade-core)
extends_documentation_fragment:
  - upgrade_core.fleet.agent
options:
  archive:
    description:
      - Where the release archive is, as C(upgrade-agent) accepts it (an C(https://) or C(http://) URL, or a
        local path on the managed host).
    type: str
    required: true
  sha256:
    description:
      - Expected sha256 of the archive as published, 64 hexadecimal digits.
      - Without it the agent's own rules apply (with C([trust]) keys, the signature alone vouches for it).
    type: str
  signature:
    description:
      - Where the detached minisign signature is; default the agent's C(ARCHIVE.minisig).
    type: str
  expect_version:
    description:
      - The version the candidate must report; anything else is aborted before the switch.
    type: str
  operation:
    description:
      - Operation id recorded in the host's journal. Running again with an id the host has already finished
        returns that result without a second upgrade.
      - Default a fresh id chosen by the agent.
    type: str
  timeout:
    description:
      - Seconds the agent may run. Past that it is sent SIGTERM (it aborts before the switch, or finishes
        after it) and the task fails.
    type: int
    default: 3600
attributes:
  check_mode:
    description: Can run in check mode and predict whether the task would change the host, changing nothing.
    support: full
    details: Runs C(upgrade --preflight); nothing is fetched, created or locked on the host.
  diff_mode:
    description: Returns the version C(current) runs before and after the task.
    support: full
    details:
      - The before and after texts are C(version - V) lines naming the slot in their header.
      - In check mode the after version is O(expect_version), or unknown when it is not given (nothing is
        fetched).
notes:
  - Needs C(upgrade-agent) installed on the managed host and the agent already installed there
    (C(upgrade-agent install)); on a bare host the agent exits 2 and the task fails saying so.
seealso:
  - module: upgrade_core.fleet.status
"""

EXAMPLES = r"""
- name: Upgrade the agent to 1.4.0, checking digest and signature
  upgrade_core.fleet.upgrade:
    config: /etc/upgrade-agent/demo-agent.toml
    archive: https://releases.example.com/demo-agent-1.4.0.tar.gz
    sha256: 0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0
    expect_version: 1.4.0
    operation: rollout-1.4.0
  register: upgraded

- name: Show what it did
  ansible.builtin.debug:
    msg: "{{ upgraded.result }}: {{ upgraded.from_version }} -> {{ upgraded.to_version }}"

- name: Preview the plan without touching the host
  upgrade_core.fleet.upgrade:
    archive: https://releases.example.com/demo-agent-1.4.0.tar.gz
    sha256: 0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0
  check_mode: true
"""

RETURN = r"""
operation:
  description: The operation id the host journaled the upgrade under.
  returned: when not in check mode and the agent printed a result
  type: str
  sample: rollout-1.4.0
result:
  description:
    - The terminal result, one of C(committed), C(noop), C(rolled_back), C(aborted), C(needs_attention).
  returned: when not in check mode and the agent printed a result
  type: str
  sample: committed
from_version:
  description: The version that ran before (null when unknown).
  returned: when not in check mode and the agent printed a result
  type: str
  sample: 1.3.2
to_version:
  description: The version of the release this upgrade was about (null when it never got that far).
  returned: when not in check mode and the agent printed a result
  type: str
  sample: 1.4.0
slot:
  description: The slot C(current) names at the end, C(blue) or C(green).
  returned: when not in check mode and the agent printed a result
  type: str
  sample: green
reason:
  description: Why the upgrade did not commit (null when it did).
  returned: when not in check mode and the agent printed a result
  type: str
  sample: "health check failed 2 times: demo-agent.service exited (status 1)"
exit_code:
  description: The agent's exit status (0 committed or noop, 1 rolled back or aborted, 2, 3, 4, 75, 130).
  returned: always
  type: int
  sample: 0
agent:
  description: The whole JSON object the agent printed (keys may be added by newer agents).
  returned: when the agent printed one
  type: dict
plan:
  description: In check mode, the steps the upgrade would take.
  returned: in check mode
  type: list
  elements: str
  sample: ["fetch https://releases.example.com/demo-agent-1.4.0.tar.gz and check its sha256"]
preflight:
  description: In check mode, the agent's whole preflight object (plan, inactive_slot, lock, open_episode).
  returned: in check mode
  type: dict
"""

from typing import Any, NoReturn

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.upgrade_core.fleet.plugins.module_utils.agent_cli import (
    AgentRun,
    agent_argument_spec,
    checked_executable,
    finish,
    preflight,
    run_agent,
)


def _request_args(params: dict[str, Any]) -> list[str]:
    """The ``upgrade`` options for the module's parameters (those given, in a fixed order)."""
    args = ["upgrade", "--archive", params["archive"]]
    for name, flag in (("sha256", "--sha256"), ("signature", "--signature"),
                       ("expect_version", "--expect-version"), ("operation", "--operation")):
        if params[name] is not None:
            args += [flag, params[name]]
    return args


def _current(module: AnsibleModule, executable: str) -> dict[str, Any]:
    """What ``current`` names (``slot``, ``path``, ``sha256``, ``version``), from ``upgrade-agent status``;
    empty on a bare host. Fails the task when the host cannot say."""
    run = run_agent(executable, module.params["config"], ["status"], float(module.params["timeout"]))
    if run.code != 0 or run.doc is None:
        _fail(module, run, "cannot read the host's status")
    current = run.doc.get("current") if run.doc is not None else None
    return dict(current) if isinstance(current, dict) else {}


def _committed_now(module: AnsibleModule, executable: str, doc: dict[str, Any],
                   before: dict[str, Any] | None) -> bool:
    """Whether this run committed a new release (the task's ``changed``).

    Args:
        doc: the agent's result.
        before: ``current`` read before the upgrade, or None when no operation id was given (then the result
            cannot be a replay, and ``committed`` means this run switched).
    """
    if doc.get("result") != "committed":
        return False
    if before is None:
        return True
    # A commit always moves current to the other slot: the same slot means a replayed result. Another slot
    # may still be the replay of an older operation, so the binary current names now decides.
    if before.get("slot") == doc.get("slot"):
        return False
    return _current(module, executable).get("sha256") != before.get("sha256")


def _fail(module: AnsibleModule, run: AgentRun, what: str | None = None) -> NoReturn:
    line = run.error_line()
    module.fail_json(msg=f"{what}: {line}" if what else line, exit_code=run.code,
                     agent=run.doc or {}, stderr=run.stderr)
    raise AssertionError("fail_json returned")  # it exits the module; this tells the type checker


def _diff(before_slot: Any, before: Any, after_slot: Any, after: Any) -> dict[str, str]:
    """Ansible's diff of the version ``current`` runs (``--diff``): one ``version - V`` line each side, the
    slot in the header; ``unknown`` for a version nobody reported."""
    return {
        "before_header": f"current ({before_slot or 'no slot'})",
        "before": f"version - {before or 'unknown'}\n",
        "after_header": f"current ({after_slot or 'no slot'})",
        "after": f"version - {after or 'unknown'}\n",
    }


def main() -> None:
    """Module entry point: check the parameters, run the agent, report (see DOCUMENTATION)."""
    module = AnsibleModule(
        argument_spec={
            "archive": {"type": "str", "required": True},
            "sha256": {"type": "str"},
            "signature": {"type": "str"},
            "expect_version": {"type": "str"},
            "operation": {"type": "str"},
            **agent_argument_spec(),
            "timeout": {"type": "int", "default": 3600},
        },
        supports_check_mode=True,
    )
    params = module.params
    executable = checked_executable(module)
    timeout_s = float(params["timeout"])
    args = _request_args(params)

    if module.check_mode:
        plan = preflight(module, executable, args, timeout_s)
        # Nothing is fetched in check mode, so the digest is unknown: "would change" unless the host already
        # reports the version the task expects.
        now = _current(module, executable)
        same = params["expect_version"] is not None and now.get("version") == params["expect_version"]
        extra: dict[str, Any] = {}
        if module._diff:
            after_slot = now.get("slot") if same else plan.get("inactive_slot")
            extra["diff"] = _diff(now.get("slot"), now.get("version"), after_slot, params["expect_version"])
        module.exit_json(changed=not same, exit_code=0, plan=list(plan.get("plan") or []), preflight=plan,
                         **extra)

    # A repeated operation id makes the agent return the result it already published, so "committed" alone
    # does not say this run switched anything; only then (or for --diff, which shows the slot it ran) is the
    # host's status read around the upgrade.
    want_before = params["operation"] is not None or module._diff
    before = _current(module, executable) if want_before else None
    run = run_agent(executable, params["config"], args, timeout_s)
    doc = run.doc
    changed = doc is not None and _committed_now(module, executable, doc, before)
    shown: dict[str, Any] = {}
    if module._diff and doc is not None and "result" in doc:
        # committed: from_version ran before, to_version runs now in the slot the result names; noop: the same
        if changed:
            shown["diff"] = _diff((before or {}).get("slot"), doc.get("from_version"), doc.get("slot"),
                                  doc.get("to_version"))
        else:
            runs = doc.get("to_version") or doc.get("from_version")
            shown["diff"] = _diff(doc.get("slot"), runs, doc.get("slot"), runs)
    finish(module, run, changed, shown)


if __name__ == "__main__":
    main()

# Copyright: upgrade-core developers
# Apache License 2.0 (see the repository's pyproject.toml)
"""Ansible module ``upgrade_core.fleet.rollback``: one operator ``upgrade-agent rollback`` on the host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rollback
short_description: Roll a host's agent back to its last good binary with upgrade-agent
version_added: "0.2.0"
description:
  - Runs C(upgrade-agent --config CONFIG --json rollback [--operation ID]) on the managed host, an operator
    rollback journaled on the host as an episode of its own (kind C(rollback)), that points C(current) at
    the slot C(last-good) names, restarts the service and health-checks it (docs/recovery.md).
  - The task is C(changed) when the rollback committed (the host now runs the last good release).
  - The task fails, with the agent's reason, when the result is C(rolled_back) (last-good was unhealthy and
    the host is back where it was), C(aborted) or C(needs_attention); and, with the agent's one-line error,
    on any other failure (exit 2 when there is nothing to roll back to, 4 the host refused, 75 busy).
  - The C(upgrade_core.fleet.rollout) playbook runs it on the hosts of a wave that broke its failure budget
    and had committed the release.
author:
  - upgrade-core developers (@upgrade-core)
extends_documentation_fragment:
  - upgrade_core.fleet.agent
options:
  operation:
    description:
      - Operation id recorded in the host's journal. Running again with an id the host has already finished
        returns that result without a second rollback.
      - Default a fresh id chosen by the agent.
    type: str
  below_watermark:
    description:
      - Roll back even when last-good is below the host's anti-rollback watermark (the episode journals it).
    type: bool
    default: false
  timeout:
    description:
      - Seconds the agent may run before it is sent SIGTERM and the task fails.
    type: int
    default: 600
attributes:
  check_mode:
    description: Can run in check mode and report the plan, changing nothing.
    support: full
    details: Runs C(rollback --preflight), which changes nothing, and returns the plan.
seealso:
  - module: upgrade_core.fleet.upgrade
  - module: upgrade_core.fleet.status
"""

EXAMPLES = r"""
- name: Put the host back on its last good release
  upgrade_core.fleet.rollback:
    config: /etc/upgrade-agent/demo-agent.toml
    operation: rollout-1.4.0-rollback
  register: rolled
"""

RETURN = r"""
operation:
  description: The operation id the host journaled the rollback under.
  returned: when not in check mode and the agent printed a result
  type: str
  sample: rollout-1.4.0-rollback
result:
  description: C(committed), C(rolled_back), C(aborted) or C(needs_attention).
  returned: when not in check mode and the agent printed a result
  type: str
  sample: committed
from_version:
  description: The version that ran before the rollback.
  returned: when not in check mode and the agent printed a result
  type: str
  sample: 1.4.0
to_version:
  description: The version of the last good release it rolled back to.
  returned: when not in check mode and the agent printed a result
  type: str
  sample: 1.3.2
slot:
  description: The slot C(current) names at the end.
  returned: when not in check mode and the agent printed a result
  type: str
  sample: blue
reason:
  description: Why the rollback did not commit (null when it did).
  returned: when not in check mode and the agent printed a result
  type: str
exit_code:
  description: The agent's exit status.
  returned: always
  type: int
  sample: 0
agent:
  description: The whole JSON object the agent printed.
  returned: when the agent printed one
  type: dict
plan:
  description: In check mode, the steps the rollback would take.
  returned: in check mode
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.upgrade_core.fleet.plugins.module_utils.agent_cli import (
    agent_argument_spec,
    checked_executable,
    finish,
    preflight,
    run_agent,
)


def main() -> None:
    """Module entry point: run ``upgrade-agent rollback`` and report its result (see DOCUMENTATION)."""
    module = AnsibleModule(
        argument_spec={
            "operation": {"type": "str"},
            "below_watermark": {"type": "bool", "default": False},
            **agent_argument_spec(),
            "timeout": {"type": "int", "default": 600},
        },
        supports_check_mode=True,
    )
    params = module.params
    executable = checked_executable(module)
    args = ["rollback"]
    if params["operation"] is not None:
        args += ["--operation", params["operation"]]
    if params["below_watermark"]:
        args.append("--below-watermark")
    if module.check_mode:
        plan = preflight(module, executable, args, float(params["timeout"]))
        module.exit_json(changed=True, exit_code=0, plan=list(plan.get("plan") or []), preflight=plan)
    finish(module, run_agent(executable, params["config"], args, float(params["timeout"])))


if __name__ == "__main__":
    main()

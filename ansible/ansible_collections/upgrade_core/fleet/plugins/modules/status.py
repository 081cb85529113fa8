# Copyright: upgrade-core developers
# Apache License 2.0 (see the repository's pyproject.toml)
"""Ansible module ``upgrade_core.fleet.status``: the host's ``upgrade-agent status`` as facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: status
short_description: Read a host's upgrade-agent status as facts
version_added: "0.1.0"
description:
  - Runs C(upgrade-agent --config CONFIG --json status) on the managed host and sets the fact
    C(upgrade_core_status) to the object it prints (slots, links, service, open episode, what to run next).
  - The agent reads its journal, its links, the lock and the unit directory; it never runs a binary and
    changes nothing, so the task is never C(changed).
author:
  - upgrade-core developers (@upgrade-core)
extends_documentation_fragment:
  - upgrade_core.fleet.agent
options:
  timeout:
    description: Seconds the agent may run before the task fails.
    type: int
    default: 60
attributes:
  check_mode:
    description: Can run in check mode and return the same result, changing nothing.
    support: full
    details: Reading the status changes nothing, so it runs as usual.
  facts:
    description: Returns an C(ansible_facts) dictionary that updates the host's facts.
    support: full
seealso:
  - module: upgrade_core.fleet.upgrade
"""

EXAMPLES = r"""
- name: Read the agent's status
  upgrade_core.fleet.status:
    config: /etc/upgrade-agent/demo-agent.toml

- name: Say which version each host runs
  ansible.builtin.debug:
    msg: "{{ upgrade_core_status.current.version | default('not installed') }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts set on the host.
  returned: success
  type: complex
  contains:
    upgrade_core_status:
      description:
        - The agent's status object (design §7), e.g. C(current) and C(last_good) (each null or slot, path,
          sha256, version), C(service) (active_state, sub_state, main_pid, exe), C(episode), C(next).
      type: dict
      sample:
        agent: demo-agent
        current: {slot: green, path: /opt/upgrade-agent/lib/demo-agent/demo-agent-green, sha256: "0f1e...",
                  version: 1.4.0}
        service: {active_state: active, sub_state: running, main_pid: 812, exe: /usr/bin/demo-agent}
        episode: null
        next: null
exit_code:
  description: The agent's exit status.
  returned: always
  type: int
  sample: 0
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.upgrade_core.fleet.plugins.module_utils.agent_cli import (
    agent_argument_spec,
    checked_executable,
    run_agent,
)


def main() -> None:
    """Module entry point: run ``upgrade-agent status`` and return its object as a fact."""
    module = AnsibleModule(
        argument_spec={
            **agent_argument_spec(),
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    params = module.params
    executable = checked_executable(module)
    run = run_agent(executable, params["config"], ["status"], float(params["timeout"]))
    if run.code != 0 or run.doc is None or "error" in run.doc:
        module.fail_json(msg=run.error_line(), exit_code=run.code, stderr=run.stderr)
    module.exit_json(changed=False, exit_code=run.code, ansible_facts={"upgrade_core_status": run.doc})


if __name__ == "__main__":
    main()

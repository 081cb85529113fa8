# Copyright: upgrade-core developers
# Apache License 2.0 (see the repository's pyproject.toml)
"""The options every module of ``upgrade_core.fleet`` shares (``extends_documentation_fragment:
upgrade_core.fleet.agent``); their argument spec is :func:`agent_cli.agent_argument_spec`."""

from __future__ import annotations


class ModuleDocFragment:
    """Documentation of ``config`` and ``executable``: how a module finds the agent on the managed host."""

    DOCUMENTATION = r"""
options:
  config:
    description:
      - The agent's configuration file on the managed host.
      - Default the agent's own (C($UPGRADE_AGENT_CONFIG), else the only C(/etc/upgrade-agent/*.toml)).
    type: path
  executable:
    description:
      - The C(upgrade-agent) program on the managed host, a path or a name looked up on the module's PATH.
    type: str
    default: upgrade-agent
"""

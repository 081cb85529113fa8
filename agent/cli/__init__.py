"""The command line: entry points (:mod:`agent.cli.main`), the grammar (:mod:`agent.cli.parser`), the
standard-library-only no-op path of ``recover`` (:mod:`agent.cli.fastpath`), the bundle's entry
(:mod:`agent.cli.frozen`) and one module per command family (:mod:`agent.cli.commands`).

Top of the layer order (docs/architecture.md): a command parses, asks the session, and prints. This file
imports nothing, so that ``recover-agent-upgrade``'s no-op path loads only what it needs.
"""

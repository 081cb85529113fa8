"""The entry point of the self-contained runtime (``make bundle``, ``scripts/build_bundle.py``).

The bundle holds one executable, ``upgrade-agent``, and beside it two relative symlinks to it,
``recover-agent-upgrade`` and ``agent-upgrade``. This module picks the command from the name the process
was started under (``argv[0]``), the way the three ``[project.scripts]`` do for a Python install: one frozen
interpreter and one copy of the libraries instead of three, and
:func:`agent.session.wiring.recover_executable`
finds ``recover-agent-upgrade`` beside ``sys.executable`` exactly as it does in a venv.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run the command named by ``basename(argv[0])``; exits with its code (design §7)."""
    from agent.cli import main as cli
    name = os.path.basename(sys.argv[0])
    if name == "recover-agent-upgrade":
        cli.main_recover()
    elif name == "agent-upgrade":
        cli.main_upgrade()
    sys.exit(cli.main())


if __name__ == "__main__":
    main()

"""``python -m agent.cli``: the ``upgrade-agent`` command (``make demo`` runs it this way)."""

from agent.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())

"""The agent: the host side of upgrade-core (the CLI, the host, the release fetch, systemd, the fs rules).

One import-time rule lives here, because every ``agent.*`` import runs this file first: httpx's package
``__init__`` loads its command-line client (``httpx._main``: ``click``, ``pygments``, ``rich.console``,
``rich.progress``) whenever ``click`` happens to be installed (the development venv has it; a venv built by
``make install`` does not, and there httpx gives up at ``import click``). That costs 35-60 ms of CPU and about
6 MiB resident at every start of a process that fetches (``fetch.extract`` rows, design §9) although the
agent never runs that client. A None entry in ``sys.modules`` makes that one import fail, and httpx then
defines the stub ``main`` it has for an install without its ``cli`` extra, as on such a host; nothing else
in httpx imports ``httpx._main``. When httpx is already loaded (a process that imported it first), nothing
changes.
"""

import sys

if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "do not import"

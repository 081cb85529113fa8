"""Case C11: a reader resolving ``current`` in a tight loop never sees it missing while it is switched."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import anyio

from agent.fs import durable
from agent.host.adapter import AgentHost

from ._helpers import GREEN_BYTES, NAME, installed_host

# The reader runs in its own process (its own core, no GIL shared with the switcher). It counts
# resolutions and failures (readlink, or opening through the link, raising) until the stop file appears.
READER = r"""
import os, sys
link, stop = sys.argv[1], sys.argv[2]
reads = fails = 0
print("ready", flush=True)
while True:
    for _ in range(200):
        try:
            os.readlink(link)
            with open(os.path.realpath(link), "rb"):
                pass
        except OSError:
            fails += 1
        reads += 1
    if os.path.exists(stop):
        break
print(reads, fails, flush=True)
"""


def run_reader_while(link: str, tmp_path: Path, flip: object) -> tuple[int, int]:
    stop = tmp_path / "stop"
    argv = [sys.executable, "-c", READER, link, str(stop)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30.0)
    assert ready and proc.stdout.readline().strip() == "ready"
    try:
        flip()  # type: ignore[operator]
    finally:
        stop.write_text("")
        out, _ = proc.communicate(timeout=60)
        stop.unlink()
    reads, fails = (int(x) for x in out.split())
    return reads, fails


def test_reader_never_sees_current_missing_during_thousands_of_switches(tmp_path: Path) -> None:
    host = installed_host(tmp_path / "R")
    durable.atomic_write_bytes(host.slot_path("green"), GREEN_BYTES, 0o755)
    link = host.current_link_path()
    flips = 3000

    async def switch_many() -> None:
        for i in range(flips):
            await host.point_current("green" if i % 2 == 0 else "blue")

    def flip() -> None:
        anyio.run(switch_many)

    reads, fails = run_reader_while(link, tmp_path, flip)
    assert fails == 0
    assert reads > flips  # the reader really ran concurrently with the switches
    assert sorted(os.listdir(host.layout.agent_dir)) == sorted(
        [f"{NAME}-blue", f"{NAME}-green", f"{NAME}-current", f"{NAME}-last-good"])


def test_the_reader_does_detect_a_non_atomic_switch(tmp_path: Path) -> None:
    """Control: ``ln -sfn`` style (unlink, then symlink) is seen missing, so the test above can fail."""
    host: AgentHost = installed_host(tmp_path / "R")
    durable.atomic_write_bytes(host.slot_path("green"), GREEN_BYTES, 0o755)
    link = host.current_link_path()
    seen: list[int] = []

    def flip_non_atomically() -> None:
        deadline = time.monotonic() + 20.0
        i = 0
        while time.monotonic() < deadline:
            for _ in range(500):
                os.unlink(link)
                os.symlink(f"{NAME}-{'green' if i % 2 == 0 else 'blue'}", link)
                i += 1
            # Poll: the reader reports only at the end, so probe the race ourselves meanwhile.
            if i >= 20000:
                break
        seen.append(i)

    reads, fails = run_reader_while(link, tmp_path, flip_non_atomically)
    assert fails > 0, f"no missing link seen in {reads} reads over {seen[0]} non-atomic switches"

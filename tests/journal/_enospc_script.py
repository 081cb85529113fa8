"""Run inside ``unshare -m`` with a 64 KiB tmpfs mounted at argv[1]: append until ENOSPC, then report.

Prints one JSON object: acknowledged seqs, the replay after the failure, and a second refusal.
"""

from __future__ import annotations

import json
import os
import sys

import anyio

from journal import JournalFullError, JournalWriter, replay
from tests.journal._support import CODEC, Noted, visible


async def main(directory: str) -> dict[str, object]:
    acked = []
    errors = []
    async with await JournalWriter.open(directory, CODEC) as w:
        for i in range(10_000):
            try:
                acked.append(visible([await w.append("op", Noted(i, "z" * 900))])[0])
            except JournalFullError as exc:
                errors.append(str(exc))
                if len(errors) == 2:
                    break
        writer_view = visible(w.records())
    result = replay(directory, CODEC)
    return {
        "acked": len(acked),
        "errors": errors,
        "replay_equals_acked": visible(result.records) == acked == writer_view,
        "torn": None if result.torn_tail is None else [result.torn_tail.file, result.torn_tail.offset],
        "files": sorted(os.listdir(directory)),
    }


if __name__ == "__main__":
    print(json.dumps(anyio.run(main, os.path.join(sys.argv[1], "journal"))))

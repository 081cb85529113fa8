"""No command reports work it did not do: ``journal compact`` on a full file system (a real tmpfs filled to
the last block, in a private mount namespace) says why it did nothing, and exits 3."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from ._rig import REPO, SUBPROCESS_TIMEOUT_S, Rig, cli_env

# Inside the namespace: a 256 KiB tmpfs (mode 0700, as state_dir must be) on state_dir; a journal whose
# first closed episode sits in a sealed segment and whose second is live (the next compaction must write a
# history snapshot); every free block taken by a filler file; then the CLI.
_SCRIPT = textwrap.dedent("""\
    set -e
    mount -t tmpfs -o size=256k,mode=0700 tmpfs "$STATE"
    "$PY" - <<'PY'
    import os, sys
    from pathlib import Path
    from tests.cli._journals import committed_episode, write_journal
    journal = Path(os.environ["STATE"]) / "journal"
    write_journal(journal, [("op-commit", committed_episode("op-commit", os.environ["NAME"]))])
    PY
    "$PY" -m agent.cli.main --config "$CONFIG" journal compact >/dev/null  # seals op-commit's segment
    "$PY" - <<'PY'
    import os
    from pathlib import Path
    from tests.cli._journals import T0, aborted_episode, write_journal
    journal = Path(os.environ["STATE"]) / "journal"
    write_journal(journal, [("op-abort", aborted_episode("op-abort"))], start=T0 + 3600)
    PY
    dd if=/dev/zero of="$STATE/filler" bs=1k 2>/dev/null || true
    set +e
    "$PY" -m agent.cli.main --config "$CONFIG" "$@"
    echo "exit=$?"
    """)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
@pytest.mark.parametrize("json_out", [True, False], ids=["json", "human"])
def test_journal_compact_on_a_full_file_system_reports_no_compaction(
    installed_rig: Rig, json_out: bool
) -> None:
    rig = installed_rig
    rig.write_config("[journal]\nkeep_episodes = 1\n")
    rig.state_dir.mkdir(mode=0o700)
    argv = ["--json"] * json_out + ["journal", "compact"]
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", _SCRIPT, "sh", *argv], cwd=REPO, capture_output=True, text=True,
        env=cli_env({"STATE": str(rig.state_dir), "PY": sys.executable, "CONFIG": str(rig.config),
                     "NAME": rig.name}),
        timeout=SUBPROCESS_TIMEOUT_S, check=False,
    )
    *out, last = done.stdout.splitlines()
    assert last == "exit=3", (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("upgrade-agent: ")]
    expected = f"upgrade-agent: {rig.state_dir}/journal: not compacted: No space left on device"
    assert errors[-1] == expected, done.stderr
    if json_out:
        payload = json.loads("".join(out))
        assert payload["exit_code"] == 3 and "compacted" not in payload, payload
    else:
        assert out == [], out  # nothing claims "compacted"
    assert list(rig.state_dir.iterdir()) == []  # the tmpfs lived only in the private namespace

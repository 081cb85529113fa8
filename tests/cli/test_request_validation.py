"""Bad input never opens an episode (docs/cli.md): checked before the lock and before ``EpisodeOpened``.

Each case runs the real CLI against a host installed by hand. Expected outcome, for every case: exit 2,
exactly one error line on stderr (no traceback), the one JSON object with ``exit_code`` 2, the redacted
source only, and an untouched host: no lock file created, no ``state_dir`` created on a fresh host, and on
a host with a journal the journal's bytes unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ._rig import Rig

SECRET, TOKEN = "S3CRETpw", "T0KENsig"


def _cases(tmp: Path) -> dict[str, list[str]]:
    fifo = tmp / "archive.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    (tmp / "a-dir").mkdir(exist_ok=True)
    return {
        "ftp scheme": ["--archive", f"ftp://user:{SECRET}@host/x.tar.gz?sig={TOKEN}"],
        "data scheme": ["--archive", "data:,hello"],
        "missing path": ["--archive", "/no/such/file.tar.gz"],
        "missing file url": ["--archive", "file:///no/such/file.tar.gz"],
        "directory": ["--archive", str(tmp / "a-dir")],
        "fifo (never opened)": ["--archive", str(fifo)],
        "file url with a host": ["--archive", "file://otherhost/x.tar.gz"],
        "https without host": ["--archive", "https:///x.tar.gz"],
        "unparsable port": ["--archive", f"https://u:{SECRET}@host:99x/x.tar.gz"],
        "plain http off loopback": ["--archive", f"http://example.invalid/x.tar.gz?sig={TOKEN}"],
        "malformed sha256": ["--archive", "/etc/hostname", "--sha256", "abc123"],
        "bad operation id": ["--archive", "/etc/hostname", "--operation", "no spaces allowed"],
        "operation id too long": ["--archive", "/etc/hostname", "--operation", "x" * 65],
        "bad expected version": ["--archive", "/etc/hostname", "--expect-version", "latest"],
        "nul byte in a file url": ["--archive", "file:///tmp/x%00y.tar.gz"],
        "no valid scheme, secrets": ["--archive", f"my_scheme://user:{SECRET}@host/x?sig={TOKEN}"],
        "host with a space": ["--archive", "https://exa mple.com/x.tar.gz"],
    }


CASE_NAMES = [
    "ftp scheme",
    "data scheme",
    "missing path",
    "missing file url",
    "directory",
    "fifo (never opened)",
    "file url with a host",
    "https without host",
    "unparsable port",
    "plain http off loopback",
    "malformed sha256",
    "bad operation id",
    "operation id too long",
    "bad expected version",
    "nul byte in a file url",
    "no valid scheme, secrets",
    "host with a space",
]


def _assert_refused(rig: Rig, argv: list[str]) -> None:
    run = rig.cli("upgrade", *argv)
    assert run.code == 2, (run.code, run.stdout, run.stderr)
    run.assert_clean_stderr()
    assert len(run.error_lines()) == 1, run.stderr
    assert run.error_payload(2)["error"]
    for secret in (SECRET, TOKEN):
        assert secret not in run.stdout + run.stderr


@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input_on_a_fresh_host_creates_nothing(installed_rig: Rig, tmp_path: Path, case: str) -> None:
    argv = _cases(tmp_path)[case]
    before = installed_rig.host_facts()
    _assert_refused(installed_rig, argv)
    assert not installed_rig.lock_path.exists(), "the lock file was created"
    assert not installed_rig.lock_path.parent.exists(), "the lock directory was created"
    assert not installed_rig.state_dir.exists(), "state_dir was created"
    assert installed_rig.host_facts() == before


@pytest.mark.parametrize("case", ["ftp scheme", "missing path", "malformed sha256", "bad operation id"])
def test_bad_input_leaves_an_existing_journal_byte_identical(
    installed_rig: Rig, tmp_path: Path, case: str
) -> None:
    # A first, valid request whose archive is not a tar: an aborted episode, so a journal exists.
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    first = installed_rig.cli("upgrade", "--archive", str(junk), "--operation", "first")
    assert first.code == 1 and first.payload()["result"] == "aborted", first.stderr
    journal_before = installed_rig.state_bytes()
    assert journal_before
    _assert_refused(installed_rig, _cases(tmp_path)[case])
    assert installed_rig.state_bytes() == journal_before
    status = installed_rig.cli("status")
    assert status.code == 0 and status.payload()["episode"] is None

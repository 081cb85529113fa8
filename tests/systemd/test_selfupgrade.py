"""The self-upgrade flow (design §4.4) end to end: examples/selfupgrade_daemon.py under the private systemd.

The daemon embeds the library (its shebang is this venv's interpreter, so it imports the project), is
installed with the real CLI, and is asked to upgrade itself with ``POST /upgrade?archive=...``:

- a good candidate: the running daemon stages, verifies and switches, schedules its own restart and
  answers 202; the new process resumes the episode at start-up, holds healthy and commits from inside.
- an unhealthy candidate (``/healthz`` answers 503): the new process spends its attempts and exits 1
  without serving; ``Restart=`` and the start limit end in ``OnFailure=`` -> ``NAME-recover.service`` ->
  ``recover-agent-upgrade --trigger on-failure``, which rolls back. The test only waits for the episode to
  close: it calls no CLI command to help.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from agent.config.boot import machine_arch
from agent.testing.releases import ReleaseServer, build_release, sha256_file
from agent.testing.sandbox import PrivateSystemd
from upgrade_core import Recorded

from ._cli_agent import CliAgent, sha256_path, tags_with_occurrence
from .conftest import wait_for

SELFUPGRADE_DAEMON = Path(__file__).resolve().parents[2] / "examples" / "selfupgrade_daemon.py"

pytestmark = pytest.mark.systemd

RELEASE_NAME = "selfupgrade-daemon"
ARCH = machine_arch() or "amd64"
MEMBER = f"{RELEASE_NAME}-linux-{ARCH}"
V1, V2, V3 = "2.0.0", "2.1.0", "2.2.0"
EXEC_ARGS = ["serve", "--config", "{config}", "--port", "{port}"]


@attrs.frozen
class Releases:
    """Self-upgrade daemon releases on a loopback server (archive path and member bytes' sha256)."""

    server: ReleaseServer
    files: dict[str, Path]

    def url(self, version: str) -> str:
        """Loopback URL of a version's archive."""
        return self.server.url(self.files[version])


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Releases]:
    """2.0.0 and 2.1.0 good; 2.2.0 passes its version check but answers 503 on /healthz."""
    out = tmp_path_factory.mktemp("selfupgrade-releases")
    files = {
        v: build_release(out, v, behaviour, name=RELEASE_NAME, arch=ARCH, source=SELFUPGRADE_DAEMON,
                         interpreter=sys.executable)
        for v, behaviour in ((V1, "good"), (V2, "good"), (V3, "unhealthy"))
    }
    server = ReleaseServer.start(out)
    try:
        yield Releases(server, files)
    finally:
        server.close()


@pytest.fixture
def daemon(sandbox: PrivateSystemd, releases: Releases, tmp_path: Path) -> Iterator[CliAgent]:
    """The daemon at 2.0.0, installed by the CLI (exec_args pass it the config and its port)."""
    agent = CliAgent.create(sandbox, tmp_path, prefix="selfup", member=MEMBER, exec_args=EXEC_ARGS,
                            stability_s=0.5, timeout_s=3.0, max_attempts=2)
    try:
        done = agent.cli("install", "--archive", releases.url(V1),
                         "--sha256", sha256_file(releases.files[V1]), "--expect-version", V1)
        assert done.returncode == 0, f"install failed ({done.returncode}): {done.stderr[-1500:]}"
        yield agent
    finally:
        agent.teardown()


def _post_upgrade(agent: CliAgent, releases: Releases, version: str, operation: str) -> tuple[int, Any]:
    query = urllib.parse.urlencode({
        "archive": releases.url(version),
        "sha256": sha256_file(releases.files[version]),
        "operation": operation,
    })
    request = urllib.request.Request(f"http://127.0.0.1:{agent.port}/upgrade?{query}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _served(agent: CliAgent) -> tuple[int, str | None] | None:
    """(status, version) from the daemon's /healthz; None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/healthz", timeout=2) as resp:
            return resp.status, json.loads(resp.read()).get("version")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}").get("version")
    except OSError:
        return None


def _diagnose(agent: CliAgent) -> str:
    """What to read when the flow does not end: the journal dump, the units' status, their log."""
    dump = agent.cli("journal", "dump").stdout[-3000:]
    status = agent.sandbox.run("systemctl", "status", "--no-pager", "-n", "30", agent.unit,
                               f"{agent.name}-recover.service", check=False).stdout[-4000:]
    return f"journal:\n{dump}\nsystemctl status:\n{status}"


def _trail(records: Sequence[Recorded]) -> str:
    """One line per episode for the test log: each tag, with its trigger where it has one."""
    return " ".join(
        type(r.event).TAG + (f"({getattr(r.event, 'trigger', None) or getattr(r.event, 'reason', '')[:60]})"
                             if type(r.event).TAG in ("RecoveryStarted", "HealthFailed") else "")
        for r in records
    )


def _wait_closed(agent: CliAgent, operation: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (result := agent.result_file(operation)) is None or agent.open_episodes():
        if time.monotonic() > deadline:
            pytest.fail(f"episode {operation} not closed after {timeout_s} s\n{_diagnose(agent)}")
        time.sleep(0.1)
    return result


def _assert_runs(agent: CliAgent, slot: str, version: str) -> None:
    """The unit is active, its MainPID runs the current link, which names ``slot``; it serves ``version``."""
    assert agent.link("current") == f"{agent.name}-{slot}"

    def running() -> bool:
        svc = agent.service()
        cmd = agent.main_cmdline(svc["MainPID"]) if svc.get("MainPID", "0") != "0" else []
        return ((svc["ActiveState"], svc["SubState"]) == ("active", "running")
                and str(agent.lib / f"{agent.name}-current") in cmd and _served(agent) == (200, version))

    wait_for(running, timeout_s=15.0, what=f"the unit running {slot} ({version}) and serving")


def test_good_candidate_commits_from_inside(daemon: CliAgent, releases: Releases) -> None:
    """POST /upgrade -> 202; the new process resumes, holds healthy and commits; no CLI involved."""
    _assert_runs(daemon, "blue", V1)
    old_pid = daemon.service()["MainPID"]
    status, body = _post_upgrade(daemon, releases, V2, "self-good")
    assert status == 202, body
    assert body["operation"] == "self-good" and body["restart_unit"].startswith(f"{daemon.name}-restart-")
    result = _wait_closed(daemon, "self-good", timeout_s=30.0)
    assert result["result"] == "committed", result
    assert (result["from_version"], result["to_version"], result["slot"]) == (V1, V2, "green")
    assert daemon.slot_sha("current") == sha256_path(daemon.lib / f"{daemon.name}-green")
    assert daemon.link("last-good") == f"{daemon.name}-blue"  # the previous slot stays the way back
    _assert_runs(daemon, "green", V2)
    assert daemon.service()["MainPID"] != old_pid
    tags = [f"{t}#{n}" for t, n in tags_with_occurrence(daemon.episode("self-good"))]
    print("\nself-good episode:", _trail(daemon.episode("self-good")))
    # The commit came from the resumed process (trigger "resume"), not from a recovery.
    recovery = [r.event for r in daemon.episode("self-good") if type(r.event).TAG == "RecoveryStarted"]
    assert [getattr(e, "trigger", None) for e in recovery] in ([], ["resume"]), tags
    assert "UpgradeCommitted#1" in tags and "RollbackStarted#1" not in tags


def test_unhealthy_candidate_is_rolled_back_by_systemd_on_failure(
    daemon: CliAgent, releases: Releases
) -> None:
    """POST /upgrade of a 503 candidate: attempts spent, exit 1, start limit, OnFailure= (or the recovery
    timer, whichever comes first) rolls it back with no operator action."""
    _assert_runs(daemon, "blue", V1)
    status, body = _post_upgrade(daemon, releases, V3, "self-bad")
    assert status == 202, body
    result = _wait_closed(daemon, "self-bad", timeout_s=90.0)
    assert result["result"] == "rolled_back", f"{result}\n{_diagnose(daemon)}"
    assert (result["from_version"], result["to_version"], result["slot"]) == (V1, V3, "blue")
    records = daemon.episode("self-bad")
    triggers = [getattr(r.event, "trigger", None) for r in records if type(r.event).TAG == "RecoveryStarted"]
    # Recovered with no operator action: by OnFailure= (NAME-recover.service), or by NAME-recover.timer when
    # its period came round first while the crash-looping daemon left the episode open (both are systemd's).
    started_by_systemd = {"on-failure", "timer"} & set(triggers)
    assert started_by_systemd, f"no systemd-started recovery in {triggers}\n{_diagnose(daemon)}"
    print("\nself-bad episode:", _trail(records))
    failed = [r.event for r in records if type(r.event).TAG == "HealthFailed"]
    assert [getattr(e, "target", None) for e in failed] == ["candidate", "candidate"], _trail(records)
    # The last-good passed its first check: an install-like "inactive before the restart job ran" sample
    # must not spend a rollback attempt (it did before the HealthJudge fix, about one run in two).
    _assert_runs(daemon, "blue", V1)
    assert daemon.link("last-good") == f"{daemon.name}-blue"

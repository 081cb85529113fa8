"""Case kind K9 (C23, C25), design §10: the agent touches only what it owns, and proves it first.

Real CLI subprocesses (``tests/cli/_rig.py``, ``host.systemctl_prefix = ["/bin/false"]``), run as root. An
unprivileged user (``nobody`` through ``setpriv``) plants files where the situation says so. Every
subprocess is bounded (:data:`TIMEOUT_S`): a FIFO must never make a command wait. Each test's docstring
states the situation and the expected outcome.

Where each refusal comes from (all exit 4 unless said otherwise; the config layer only looks at path
strings, so no filesystem replacement is ever caught there: exit 2 is only a foreign journal owner):

- ``state_dir``, ``journal/``, ``results/``: ``agent.host.ownership.check_state`` (before the host lock);
- a result file: ``agent.host.ownership.check_result`` (before the host lock);
- ``journal/owner.json``: ``agent.host.ownership.check_owner`` through ``journal.read_owner``;
- a journal segment: the journal writer's or reader's scan (``journal.safefs.open_file``);
- the lock file: ``agent.host.lock.HostLock`` (``journal.safefs.open_file``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import JournalBusyError, JournalWriter, replay
from upgrade_core import EVENT_CODEC

from ._journals import committed_episode, write_journal
from ._rig import PYTHON, REPO, Rig, Run, cli_env, snapshot

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as another user: needs root")

TIMEOUT_S = 30.0  # per command; a hang on a FIFO fails the test instead of blocking the suite
NOBODY = 65534
SEGMENT = "00000000000000000001.jnl"
CANARY_BYTES = b"root-owned canary: must keep these bytes\n" * 8


def run_bounded(rig: Rig, *argv: str) -> Run:
    """``upgrade-agent --config C --json ARGV`` bounded by :data:`TIMEOUT_S` (fails the test on a hang)."""
    args = [PYTHON, "-m", "agent.cli", "--config", str(rig.config), "--json", *argv]
    try:
        done = subprocess.run(
            args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv} did not finish within {TIMEOUT_S} s (waiting on a FIFO?)")
    return Run(tuple(argv), done.returncode, done.stdout, done.stderr)


def as_nobody(*argv: str) -> None:
    """Run ``argv`` as ``nobody`` (no groups), bounded."""
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    subprocess.run(cmd, check=True, timeout=TIMEOUT_S, capture_output=True)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_refused(run: Run, code: int = 4, *, naming: str | None = None) -> str:
    """One clear line, the documented exit code, no traceback, no Python repr; returns the error."""
    payload = run.error_payload(code)
    error = payload["error"]
    lines = run.error_lines()
    assert lines and lines[-1] == f"upgrade-agent: {error}", run.stderr  # one line (after any progress log)
    assert sum(error in line for line in lines) == 1, run.stderr
    assert "Traceback" not in run.stderr and "Error(" not in error and "{'" not in error, run
    if naming is not None:
        assert naming in error, error
    return str(error)


@pytest.fixture
def base() -> Iterator[Path]:
    """A temp directory nobody can traverse into (0755 root, under the sticky /tmp): pytest's own
    ``tmp_path`` is below a 0700 directory an unprivileged user cannot enter."""
    d = Path(tempfile.mkdtemp(prefix="ua-own-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _rig(base: Path, name: str = "own-agent") -> Rig:
    r = Rig(base, name)
    r.install_by_hand()
    (base / "archive.tar.gz").write_bytes(b"not looked at: refused before any fetch")
    canary = base / "canary"
    canary.write_bytes(CANARY_BYTES)
    canary.chmod(0o644)
    return r


def _journal_by_agent(rig: Rig) -> None:
    """A real journal of this agent (segment + owner record), made by the agent itself."""
    run = run_bounded(rig, "journal", "compact")
    assert run.code == 0, run
    assert (rig.state_dir / "journal" / SEGMENT).is_file()
    assert (rig.state_dir / "journal" / "owner.json").is_file()


def _upgrade(rig: Rig) -> Run:
    return run_bounded(
        rig, "upgrade", "--archive", str(rig.base / "archive.tar.gz"), "--operation", "prop-op"
    )


# -- (a) a state_dir prepared by another user ------------------------------------------------------------
@pytest.mark.parametrize("parent", ["shared", "private"])
@pytest.mark.parametrize("command", ["install", "upgrade", "recover", "recover-boot", "status"])
def test_c23_state_dir_prepared_by_nobody_with_a_symlink_at_the_live_segment(
    base: Path, command: str, parent: str
) -> None:
    """Situation: ``nobody`` owns ``state_dir`` (0777) and created ``state_dir/journal`` before the agent ever
    ran, with a symlink where the live segment goes, pointing at a root-owned canary. ``shared``: nobody made
    ``state_dir`` itself, in a sticky, root-owned, world-writable parent like ``/tmp``; ``private``: the
    parent is root's 0755 and ``state_dir`` was handed to nobody.

    Expected: ``install``, ``upgrade``, ``recover`` (manual and ``--trigger boot``, which tries the lean
    fast path first) and ``status`` refuse with one line: ``shared``, exit 2 naming ``host.state_dir`` (an
    agent directory directly in a directory every user may write is a configuration error: anyone can make
    it first); ``private``, exit 4 naming ``state_dir`` and its owner. The canary's sha256 is unchanged and
    the symlink is still a symlink (nothing repaired through it, nothing created).
    """
    rig = Rig(base, "own-agent")
    (base / parent).mkdir()
    (base / parent).chmod(0o1777 if parent == "shared" else 0o755)
    rig.state_dir = base / parent / "state"
    rig.write_config()
    canary = base / "canary"
    canary.write_bytes(CANARY_BYTES)
    canary.chmod(0o644)
    if command != "install":
        rig.install_by_hand()
    (base / "archive.tar.gz").write_bytes(b"x")
    before = sha(canary)
    if parent == "shared":
        as_nobody("mkdir", "-m", "0777", str(rig.state_dir))
    else:
        rig.state_dir.mkdir()
        rig.state_dir.chmod(0o777)
        os.chown(rig.state_dir, NOBODY, NOBODY)
    as_nobody("mkdir", "-m", "0777", str(rig.state_dir / "journal"))
    as_nobody("ln", "-s", str(canary), str(rig.state_dir / "journal" / SEGMENT))
    planted = snapshot(rig.state_dir)
    argv = {
        "install": ["install", "--archive", str(base / "archive.tar.gz")],
        "upgrade": ["upgrade", "--archive", str(base / "archive.tar.gz")],
        "recover": ["recover"],
        "recover-boot": ["recover", "--trigger", "boot"],
        "status": ["status"],
    }[command]
    run = run_bounded(rig, *argv)
    if parent == "shared":
        placed = f"host.state_dir: {rig.state_dir} sits directly in {base / parent}"
        error = assert_refused(run, 2, naming=placed)
    else:
        error = assert_refused(run, naming=str(rig.state_dir))
        assert f"owned by uid {NOBODY}, not 0" in error
    assert sha(canary) == before
    assert os.path.islink(rig.state_dir / "journal" / SEGMENT)
    assert snapshot(rig.state_dir) == planted
    if command == "install":
        assert not rig.root.exists(), "nothing of the layout may be created"


# -- (b) a live segment replaced by a symlink ---------------------------------------------------------------
@pytest.mark.parametrize("command", ["upgrade", "recover", "compact", "status", "verify"])
def test_c23_live_segment_replaced_by_a_symlink_is_never_repaired_through(base: Path, command: str) -> None:
    """Situation: the agent's own journal, whose live segment was replaced by a symlink to a root-owned
    canary that holds the segment's bytes plus a torn tail (what a writer would "repair" by truncating).

    Expected: exit 4 naming the segment ("is a symlink"); the canary keeps every byte (never truncated,
    never appended to); the symlink stays.
    """
    rig = _rig(base)
    _journal_by_agent(rig)
    segment = rig.state_dir / "journal" / SEGMENT
    canary = base / "canary"
    canary.write_bytes(segment.read_bytes() + b"\x00" * 24)  # a torn tail: a writer would truncate it
    segment.unlink()
    segment.symlink_to(canary)
    before = sha(canary)
    argv = {
        "upgrade": ["upgrade", "--archive", str(base / "archive.tar.gz")],
        "recover": ["recover"],
        "compact": ["journal", "compact"],
        "status": ["status"],
        "verify": ["journal", "verify"],
    }[command]
    run = run_bounded(rig, *argv)
    error = assert_refused(run, naming=str(segment))
    assert "is a symlink" in error
    assert sha(canary) == before
    assert segment.is_symlink()


# -- (c) a FIFO where the segment goes ----------------------------------------------------------------------
FIFO_COMMANDS = [
    ["recover", "--trigger", "boot"],
    ["recover"],
    ["recover", "--trigger", "on-failure"],
    ["status"],
    ["history"],
    ["journal", "verify"],
    ["journal", "dump"],
    ["journal", "compact"],
    ["trust", "reset"],
    ["upgrade", "--preflight", "--archive", "ARCHIVE"],
    ["upgrade", "--archive", "ARCHIVE"],
    ["install", "--archive", "ARCHIVE"],
]


def test_c23_fifo_at_the_live_segment_never_makes_a_command_wait(base: Path) -> None:
    """Situation: a FIFO (no writer) stands where the agent's live segment is.

    Expected: every command, including the boot-time ``recover --trigger boot`` (whose lean fast path runs
    first), exits promptly (well within :data:`TIMEOUT_S`) with 4 and one line naming the segment as a
    FIFO; the FIFO is still there.
    """
    rig = _rig(base)
    _journal_by_agent(rig)
    segment = rig.state_dir / "journal" / SEGMENT
    segment.unlink()
    os.mkfifo(segment, 0o600)
    for argv in FIFO_COMMANDS:
        argv = [str(base / "archive.tar.gz") if a == "ARCHIVE" else a for a in argv]
        run = run_bounded(rig, *argv)
        error = assert_refused(run, naming=str(segment))
        assert "is a FIFO" in error, (argv, error)
        assert stat.S_ISFIFO(os.lstat(segment).st_mode)


# -- (d) two configurations, one state_dir; two writers, one journal -----------------------------------------
def test_c25_second_configuration_sharing_a_state_dir_is_refused_naming_both(base: Path) -> None:
    """Situation: agent A has an episode open after its switch in ``state_dir``; a second configuration,
    agent B (its own name, unit, host root and lock), names the same ``state_dir``.

    Expected: B's ``recover`` (manual and boot), ``status``, ``history``, ``journal verify`` and ``upgrade``
    exit 2 with one line naming both agents and units; A's journal (every byte) is untouched and A's
    episode is still open (A's own ``status`` shows it).
    """
    a = _rig(base, "agent-a")
    ops = committed_episode("op-a", "agent-a")[:8]  # ... SwitchCommitted: open after its switch
    write_journal(a.state_dir / "journal", [("op-a", ops)])
    run = run_bounded(a, "journal", "compact")  # A's first writer adopts the journal (owner record)
    assert run.code == 0, run
    owner = json.loads((a.state_dir / "journal" / "owner.json").read_text())
    assert owner == {"agent": "agent-a", "unit": "agent-a.service"}
    assert stat.S_IMODE(os.stat(a.state_dir / "journal" / "owner.json").st_mode) == 0o600
    journal_before = snapshot(a.state_dir)

    b = Rig(base / "b", "agent-b")
    b.install_by_hand()
    b.config.write_text(b.config_text().replace(str(b.state_dir), str(a.state_dir)))
    (base / "b" / "archive.tar.gz").write_bytes(b"x")
    commands = (
        ["recover"], ["recover", "--trigger", "boot"], ["status"], ["history"], ["journal", "verify"],
        ["upgrade", "--archive", str(base / "b" / "archive.tar.gz")],
    )
    for argv in commands:
        run = run_bounded(b, *argv)
        error = assert_refused(run, 2)
        assert (
            f"state_dir {a.state_dir} holds the journal of agent agent-a (unit agent-a.service); "
            "this configuration is agent agent-b (unit agent-b.service)"
        ) in error, error
    assert snapshot(a.state_dir) == journal_before
    status = run_bounded(a, "status").payload()
    assert status["episode"] == {
        "operation": "op-a", "state": "switched", "upgrader_pid": None, "abandoned": True,
    }


def test_c25_same_name_other_unit_is_refused(base: Path) -> None:
    """Situation: the journal records agent A with unit a.service; a configuration with the same name but
    ``unit = "other.service"`` opens it. Expected: exit 2 naming both units; journal untouched."""
    a = _rig(base, "agent-a")
    _journal_by_agent(a)
    before = snapshot(a.state_dir)
    a.write_config(agent_extra='unit = "other.service"')
    run = run_bounded(a, "journal", "compact")
    error = assert_refused(run, 2)
    assert "(unit agent-a.service); this configuration is agent agent-a (unit other.service)" in error
    assert snapshot(a.state_dir) == before


def test_journal_without_owner_is_adopted_by_its_first_writer_never_by_a_reader(base: Path) -> None:
    """Situation: a journal written by the previous version (no owner record). Expected: ``status`` and
    ``journal verify`` read it (exit 0) and create nothing; the first writer records the owner."""
    rig = _rig(base)
    write_journal(rig.state_dir / "journal", [("op-1", committed_episode("op-1", rig.name))])
    owner = rig.state_dir / "journal" / "owner.json"
    for argv in (["status"], ["journal", "verify"], ["history"]):
        assert run_bounded(rig, *argv).code == 0
        assert not owner.exists()
    assert run_bounded(rig, "journal", "compact").code == 0
    assert json.loads(owner.read_text()) == {"agent": rig.name, "unit": f"{rig.name}.service"}


def test_a_second_writer_on_one_journal_directory_gets_75(base: Path) -> None:
    """Situation: another process holds the journal directory's own lock (a writer of another
    configuration with its own host lock). Expected: ``journal compact`` and ``upgrade`` exit 75 naming
    the journal directory, at once; the journal is unchanged and verifies."""
    rig = _rig(base)
    _journal_by_agent(rig)
    directory = rig.state_dir / "journal"
    before = snapshot(directory)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for argv in (["journal", "compact"], ["upgrade", "--archive", str(base / "archive.tar.gz")]):
            run = run_bounded(rig, *argv)
            assert_refused(run, 75, naming=str(directory))
        assert run_bounded(rig, "status").code == 0  # readers never take it
    finally:
        os.close(fd)
    assert snapshot(directory) == before
    assert run_bounded(rig, "journal", "verify").payload()["ok"] is True


@pytest.mark.anyio
async def test_two_writers_in_one_process_never_interleave(tmp_path: Path) -> None:
    """Two :class:`JournalWriter` on one directory: the second open raises ``JournalBusyError`` (nothing
    read or changed) while the first is open, and succeeds after it closed; every record is replayed once."""
    d = tmp_path / "journal"
    first = await JournalWriter.open(d, EVENT_CODEC, owner={"agent": "a", "unit": "a.service"})
    try:
        ops = committed_episode("op-1", "a")
        await first.append("op-1", ops[0])
        with pytest.raises(JournalBusyError, match=str(d)):
            await JournalWriter.open(d, EVENT_CODEC, owner={"agent": "a", "unit": "a.service"})
    finally:
        await first.aclose()
    async with await JournalWriter.open(d, EVENT_CODEC, owner={"agent": "a", "unit": "a.service"}) as second:
        await second.append("op-1", ops[1])
    assert [r.seq for r in replay(d, EVENT_CODEC).records] == [1, 2]


# -- (e) configuration: system directories and overlaps ---------------------------------------------------
@pytest.mark.parametrize(
    ("host", "key", "expected"),
    [
        ({"state_dir": "/"}, "host.state_dir", 'must not be "/" itself'),
        ({"state_dir": "/var"}, "host.state_dir", 'must not be "/var" itself'),
        ({"state_dir": "/etc/"}, "host.state_dir", 'must not be "/etc" itself'),
        ({"state_dir": "/var/lib/../../etc"}, "host.state_dir", 'must not be "/etc" itself'),
        ({"root": "/usr"}, "host.root", 'must not be "/usr" itself'),
        ({"lock_path": "/run"}, "host.lock_path", 'must not be "/run" itself'),
        ({"root": "/srv/ua", "state_dir": "/srv/ua/state"}, "host.state_dir", "inside host.root"),
        ({"root": "/srv/ua/state/r", "state_dir": "/srv/ua/state"}, "host.root", "inside host.state_dir"),
        ({"root": "/srv/ua", "state_dir": "/srv/ua"}, "host.state_dir", "inside host.root"),
        ({"root": "/srv/ua", "lock_path": "/srv/ua/x.lock"}, "host.lock_path", "inside host.root"),
    ],
)
@pytest.mark.parametrize("command", [["status"], ["recover"], ["recover", "--trigger", "boot"]])
def test_config_refuses_system_directories_and_overlaps(
    base: Path, host: dict[str, str], key: str, expected: str, command: list[str]
) -> None:
    """Situation: a configuration naming a system directory itself, or overlapping host.root and
    state_dir, or a lock inside host.root. Expected: exit 2, one line ``FILE: KEY: message`` (also on the
    boot path), nothing created anywhere."""
    rig = Rig(base, "cfg-agent")
    lines = "".join(f'{k} = "{v}"\n' for k, v in host.items())
    rig.config.write_text(f'[agent]\nname = "cfg-agent"\n[host]\n{lines}systemctl_prefix = ["/bin/false"]\n')
    before = snapshot(base)
    run = run_bounded(rig, *command)
    error = assert_refused(run, 2)
    assert error.startswith(f"{rig.config}: {key}: "), error
    assert expected in error, error
    assert snapshot(base) == before


# -- the whole kind: every path under state_dir, every replacement ----------------------------------------
TARGETS = ("state_dir", "journal", "segment", "owner", "results", "result", "lock")
DIRECTORY_TARGETS = {"state_dir", "journal", "results"}
KINDS = ("symlink", "fifo", "directory", "hardlink", "other_uid", "mode_0777")
CASES = [
    (t, k) for t in TARGETS for k in KINDS
    if not (t in DIRECTORY_TARGETS and k in ("directory", "hardlink"))  # a directory is no replacement of one
]


def _target_path(rig: Rig, target: str) -> Path:
    return {
        "state_dir": rig.state_dir,
        "journal": rig.state_dir / "journal",
        "segment": rig.state_dir / "journal" / SEGMENT,
        "owner": rig.state_dir / "journal" / "owner.json",
        "results": rig.state_dir / "results",
        "result": rig.state_dir / "results" / "prop-op.json",
        "lock": rig.lock_path,
    }[target]


def _replace(path: Path, kind: str, canary: Path) -> None:
    """Put ``kind`` where ``path`` was (keeping the original's bytes where the kind keeps the file)."""
    is_dir = path.is_dir() and not path.is_symlink()
    if kind == "other_uid":
        os.chown(path, NOBODY, NOBODY)
        return
    if kind == "mode_0777":
        path.chmod(0o777)
        return
    if is_dir:
        shutil.rmtree(path)
    else:
        path.unlink()
    if kind == "symlink":
        path.symlink_to(canary, target_is_directory=is_dir)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "directory":
        path.mkdir(0o700)
    elif kind == "hardlink":
        os.link(canary, path)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(CASES))
def test_c23_every_path_every_replacement_is_refused_with_exit_4(case: tuple[str, str]) -> None:
    """Whole kind C23: for every path the agent opens under ``state_dir`` (``state_dir``, ``journal/``, the
    live segment, ``journal/owner.json``, ``results/``, a result file) and the lock file, a replacement
    (symlink to a root-owned canary, FIFO, directory, hard link to the canary, owned by another uid, mode
    0777) makes ``upgrade --operation prop-op`` exit 4 (never 2: the config layer only checks path strings)
    with one line naming that path; the canary keeps its bytes and nothing under the base changes (the
    lock file's pid line aside, when the host lock was taken before the journal refused)."""
    target, kind = case
    with tempfile.TemporaryDirectory(prefix="ua-prop-", dir="/tmp") as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        rig = _rig(base)
        _journal_by_agent(rig)
        (rig.state_dir / "results").mkdir(0o700)
        (rig.state_dir / "results" / "prop-op.json").write_bytes(b"{}\n")
        (rig.state_dir / "results" / "prop-op.json").chmod(0o600)
        canary = base / "canary"
        if target in DIRECTORY_TARGETS and kind == "symlink":
            canary = base / "canary-dir"  # a directory canary for a directory's symlink
            canary.mkdir()
            (canary / "keep").write_bytes(CANARY_BYTES)
        path = _target_path(rig, target)
        _replace(path, kind, canary)
        canary_before = snapshot(canary) if canary.is_dir() else sha(canary)
        before = snapshot(base)
        run = _upgrade(rig)
        error = assert_refused(run, 4, naming=str(path))
        assert (snapshot(canary) if canary.is_dir() else sha(canary)) == canary_before
        after = snapshot(base)
        if target != "lock":
            lock = str(rig.lock_path.relative_to(base))
            before.pop(lock, None)
            after.pop(lock, None)
        assert after == before, (case, error)


def test_reader_on_a_fresh_host_creates_nothing(base: Path) -> None:
    """Readers never create ``state_dir``, ``journal/`` or the lock: ``status`` on an installed host
    without state exits 0 and leaves ``state_dir`` absent."""
    rig = _rig(base)
    assert run_bounded(rig, "status").code == 0
    assert not rig.state_dir.exists() and not rig.lock_path.exists()


def test_writer_creates_state_0700_and_files_0600(base: Path) -> None:
    """The directories the agent creates under ``state_dir`` are 0700, its files 0600 (design §10)."""
    rig = _rig(base)
    _journal_by_agent(rig)
    for d in (rig.state_dir, rig.state_dir / "journal"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    for f in (rig.state_dir / "journal" / SEGMENT, rig.state_dir / "journal" / "owner.json", rig.lock_path):
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600


def test_exit_4_for_an_unwritable_host_is_not_exit_1() -> None:
    """``describe_error``: EACCES, EPERM, EROFS (and ELOOP, ENOTDIR, EISDIR, ENXIO) exit 4, never 1."""
    import errno

    from agent.errors import describe_error

    for code in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ELOOP, errno.EISDIR):
        exit_code, line = describe_error(OSError(code, os.strerror(code), "/var/lib/x"))
        assert exit_code == 4 and line.startswith("/var/lib/x: "), line


def test_help_lists_the_exit_codes() -> None:
    """``upgrade-agent --help`` lists every exit code, 4 included."""
    done = subprocess.run(
        [PYTHON, "-m", "agent.cli", "--help"], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert "4    the host refused: permission, ownership, file type, read-only file system" in done.stdout
    for code in ("0 ", "1 ", "2 ", "3 ", "75 ", "130 "):
        assert f"\n  {code}" in done.stdout

"""design §7, the command line, against temp host roots with no systemd (``systemctl_prefix = /bin/false``).

The CLI runs as a real subprocess (``python -m agent.cli.main``) from the repository root; the three console
entry functions run in-process once each. Every ``--json`` exit must print exactly one JSON object on
stdout, every expected failure one ``upgrade-agent: ...`` line on stderr and never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main as cli
from agent.config.boot import machine_arch
from agent.host.lock import HostLock

from ._journals import T0, aborted_episode, committed_episode, write_journal
from ._rig import Rig, run_cli, snapshot

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")
NOOP = {
    "operation": None,
    "result": "noop",
    "from_version": None,
    "to_version": None,
    "slot": None,
    "reason": None,
}
READERS = (["status"], ["history"], ["journal", "verify"], ["journal", "dump"], ["units"], ["host-root"])


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _closed_journal(rig: Rig) -> Any:
    return write_journal(
        rig.journal_dir,
        [("op-commit", committed_episode("op-commit", rig.name)), ("op-abort", aborted_episode("op-abort"))],
    )


# -- options, version, discovery ----------------------------------------------------------------------
def test_version_prints_the_tools_own_version() -> None:
    run = run_cli(["--version"])
    assert run.code == 0, run
    assert re.fullmatch(r"upgrade-agent \S+\n", run.stdout), run.stdout
    run.assert_clean_stderr()


@pytest.mark.parametrize(
    "layout",
    [
        ["--config", "{c}", "--json", "host-root"],
        ["host-root", "--config", "{c}", "--json"],
        ["--json", "host-root", "--config", "{c}"],
        ["--config", "{c}", "host-root", "--json"],
        ["--config={c}", "host-root", "--json"],
    ],
    ids=["before", "after", "json-before", "config-before", "equals-form"],
)
def test_config_and_json_accepted_before_and_after_the_subcommand(rig: Rig, layout: list[str]) -> None:
    run = run_cli([w.replace("{c}", str(rig.config)) for w in layout])
    assert run.code == 0, run
    assert run.payload() == {"host_root": str(rig.root)}
    run.assert_clean_stderr()


@pytest.mark.parametrize("where", ["before", "after"])
def test_recover_fast_path_honours_options_in_either_position(rig: Rig, where: str) -> None:
    argv = (
        ["--config", str(rig.config), "--json", "recover"]
        if where == "before"
        else ["recover", "--json", "--config", str(rig.config)]
    )
    run = run_cli(argv)
    assert run.code == 0, run
    assert run.payload() == NOOP


def test_without_json_the_output_is_not_json(rig: Rig) -> None:
    run = rig.cli("host-root", json_out=False)
    assert run.code == 0, run
    assert run.stdout == f"{rig.root}\n"


def test_config_from_the_environment_variable(rig: Rig) -> None:
    run = run_cli(["--json", "host-root"], env={"UPGRADE_AGENT_CONFIG": str(rig.config)})
    assert run.code == 0, run
    assert run.payload() == {"host_root": str(rig.root)}


def test_config_option_wins_over_the_environment_variable(rig: Rig, tmp_path: Path) -> None:
    other = Rig(tmp_path / "other", "other-agent")
    run = run_cli(
        ["--json", "--config", str(rig.config), "host-root"], env={"UPGRADE_AGENT_CONFIG": str(other.config)}
    )
    assert run.payload() == {"host_root": str(rig.root)}


@pytest.mark.skipif(os.path.exists("/etc/upgrade-agent"), reason="this machine has a real /etc/upgrade-agent")
@pytest.mark.parametrize("command", [["host-root"], ["recover"]])
def test_no_config_anywhere_exits_2(command: list[str]) -> None:
    """No --config, no $UPGRADE_AGENT_CONFIG and no /etc/upgrade-agent (read, never written, here): exit 2.
    The "several configs" case needs files in /etc/upgrade-agent, which tests never write; it is covered at
    the unit level by agent.config.boot.discover_config_path(config_dir=...)."""
    run = run_cli(["--json", *command])
    err = run.error_payload(2)
    assert "/etc/upgrade-agent" in err["error"] and "UPGRADE_AGENT_CONFIG" in err["error"], err


@pytest.mark.parametrize("via", ["option", "env"])
@pytest.mark.parametrize(
    "command", [["host-root"], ["status"], ["recover"], ["upgrade", "--archive", "/x.tar.gz"]]
)
def test_missing_config_file_exits_2_naming_it(tmp_path: Path, via: str, command: list[str]) -> None:
    missing = tmp_path / "nowhere" / "agent.toml"
    if via == "option":
        run = run_cli(["--json", "--config", str(missing), *command])
    else:
        run = run_cli(["--json", *command], env={"UPGRADE_AGENT_CONFIG": str(missing)})
    err = run.error_payload(2)
    assert str(missing) in err["error"]
    assert [line for line in run.error_lines() if str(missing) in line], run.stderr
    assert not (tmp_path / "nowhere").exists()


# -- bad configuration --------------------------------------------------------------------------------
BAD_CONFIGS = {
    "unknown-key": ("[limits]\nmax_entrys = 5\n", "limits.max_entrys"),
    "unknown-section": ("[limit]\nmax_entries = 5\n", "limit"),
    "bad-enum": ('[download]\nallow_http = "sometimes"\n', "download.allow_http"),
    "wrong-type": ('[limits]\nmax_entries = "5"\n', "limits.max_entries"),
    "negative": ("[verify]\ntimeout_s = -1.0\n", "verify.timeout_s"),
    "bad-probe": ('[health]\nhttp_probe = "ftp://x/"\n', "health.http_probe"),
}
CONFIG_COMMANDS = {
    "status": ["status"],
    "history": ["history"],
    "units": ["units"],
    "host-root": ["host-root"],
    "journal-verify": ["journal", "verify"],
    "upgrade": ["upgrade", "--archive", "/x.tar.gz"],
    "recover": ["recover"],
}


# Every bad config against two commands that load it on different paths, every command against one.
BAD_CONFIG_MATRIX = sorted(
    {(case, command) for case in BAD_CONFIGS for command in ("status", "upgrade", "recover")}
    | {("unknown-key", command) for command in CONFIG_COMMANDS}
)


@pytest.mark.parametrize(
    ("case", "command"),
    [(BAD_CONFIGS[c], CONFIG_COMMANDS[cmd]) for c, cmd in BAD_CONFIG_MATRIX],
    ids=[f"{c}-{cmd}" for c, cmd in BAD_CONFIG_MATRIX],
)
def test_bad_config_exits_2_naming_file_and_key(
    rig: Rig, case: tuple[str, str], command: list[str]
) -> None:
    extra, key = case
    text = rig.config_text()
    if extra.startswith("[health]"):  # the base config already has [health]: extend that table
        text = text.replace("[health]\n", extra, 1)
    else:
        text += extra
    rig.config.write_text(text)
    before = snapshot(rig.base)
    run = rig.cli(*command)
    err = run.error_payload(2)
    assert key in err["error"] and str(rig.config) in err["error"], err
    lines = run.error_lines()
    assert len(lines) == 1 and key in lines[0], run.stderr
    assert snapshot(rig.base) == before


def test_invalid_toml_exits_2_naming_the_file(rig: Rig) -> None:
    rig.config.write_text(rig.config_text() + "[agent\n")
    run = rig.cli("status")
    err = run.error_payload(2)
    assert str(rig.config) in err["error"] and "TOML" in err["error"]


def test_bad_agent_name_exits_2_naming_the_key(rig: Rig) -> None:
    rig.config.write_text(rig.config_text().replace(f'name = "{rig.name}"', 'name = "../evil"'))
    for command in (["status"], ["recover"]):
        err = rig.cli(*command).error_payload(2)
        assert "agent.name" in err["error"], err


# -- usage errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["upgrade"],
        ["journal", "mend"],
        ["recover", "--trigger", "sometimes"],
        ["status", "--bogus"],
    ],
    ids=[
        "no-command",
        "unknown-command",
        "upgrade-without-archive",
        "bad-journal-action",
        "bad-trigger",
        "bad-option",
    ],
)
def test_usage_errors_exit_2_with_one_json_object(rig: Rig, argv: list[str]) -> None:
    run = rig.cli(*argv)
    run.error_payload(2)
    assert not rig.state_dir.exists() and not rig.lock_path.exists()


def test_upgrade_on_a_bare_host_exits_2_and_creates_nothing(rig: Rig) -> None:
    before = snapshot(rig.base)
    run = rig.cli("upgrade", "--archive", str(rig.config))
    err = run.error_payload(2)
    assert "not installed" in err["error"]
    assert snapshot(rig.base) == before


@pytest.mark.parametrize("sha", ["zz", "a" * 63, "a" * 65, "sha512:" + "a" * 64, "g" * 64])
def test_bad_sha256_syntax_exits_2_before_touching_anything(rig: Rig, sha: str) -> None:
    rig.install_by_hand()
    before = snapshot(rig.base)
    run = rig.cli("upgrade", "--archive", str(rig.config), "--sha256", sha)
    err = run.error_payload(2)
    assert "--sha256" in err["error"]
    assert snapshot(rig.base) == before


@pytest.mark.parametrize("op", ["../x", "a b", "x" * 65, "op/1", ""])
def test_bad_operation_id_exits_2_before_touching_anything(rig: Rig, op: str) -> None:
    rig.install_by_hand()
    before = snapshot(rig.base)
    run = rig.cli("upgrade", "--archive", str(rig.config), "--operation", op)
    err = run.error_payload(2)
    assert "operation" in err["error"]
    assert snapshot(rig.base) == before


# -- the host lock ------------------------------------------------------------------------------------
def test_upgrade_while_the_lock_is_held_exits_75(rig: Rig, tmp_path: Path) -> None:
    rig.install_by_hand()
    archive = tmp_path / "never-read.tar.gz"
    archive.write_bytes(b"")  # checked to exist (bad input never opens an episode), never read
    with HostLock(str(rig.lock_path)):
        before = snapshot(rig.base)
        run = rig.cli("upgrade", "--archive", str(archive))
        after = snapshot(rig.base)
    err = run.error_payload(75)
    assert str(rig.lock_path) in err["error"] and str(os.getpid()) in err["error"]
    assert after == before


def test_recover_of_an_open_episode_while_the_lock_is_held_exits_75(rig: Rig) -> None:
    rig.install_by_hand()
    write_journal(rig.journal_dir, [("op-open", aborted_episode("op-open")[:1])])
    with HostLock(str(rig.lock_path)):
        before = snapshot(rig.base)
        run = rig.cli("recover", "--trigger", "boot")
        assert snapshot(rig.base) == before
    err = run.error_payload(75)
    assert str(rig.lock_path) in err["error"]


def test_journal_compact_while_the_lock_is_held_exits_75(rig: Rig) -> None:
    _closed_journal(rig)
    with HostLock(str(rig.lock_path)):
        before = snapshot(rig.base)
        run = rig.cli("journal", "compact")
        assert snapshot(rig.base) == before
    run.error_payload(75)


def test_preflight_reports_a_busy_lock_with_75_and_creates_nothing(rig: Rig) -> None:
    rig.install_by_hand()
    before = snapshot(rig.base)
    free = rig.cli("upgrade", "--archive", str(rig.config), "--preflight")
    assert free.code == 0, free
    plan = free.payload()
    assert plan["preflight"] is True and plan["lock"] == "free" and plan["inactive_slot"] == "green"
    assert plan["open_episode"] is None and all(isinstance(p, str) for p in plan["plan"]) and plan["plan"]
    assert snapshot(rig.base) == before  # no lock file, no state_dir
    with HostLock(str(rig.lock_path)):
        busy = rig.cli("upgrade", "--archive", str(rig.config), "--preflight")
    assert busy.code == 75, busy
    assert busy.payload()["lock"] == "busy"


# -- install on an installed host (design §7: same digest -> noop, else exit 2) ---------------------------
def test_install_over_an_installed_host(rig: Rig, tmp_path: Path) -> None:
    import gzip
    import io
    import tarfile

    rig.install_by_hand()
    facts = rig.host_facts()

    def archive_of(data: bytes, path: Path) -> Path:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w") as tar:
            info = tarfile.TarInfo(f"{rig.name}-linux-{machine_arch()}")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        path.write_bytes(gzip.compress(raw.getvalue()))
        return path

    same = rig.cli(
        "install", "--archive", str(archive_of(rig.slot("blue").read_bytes(), tmp_path / "same.tar.gz"))
    )
    assert same.code == 0, same
    assert same.payload()["result"] == "noop"
    other = rig.cli(
        "install", "--archive", str(archive_of(b"#!/bin/sh\necho 5.0.0\n", tmp_path / "new.tar.gz"))
    )
    err = other.error_payload(2)
    assert "already installed" in err["error"] and "upgrade" in err["error"]
    assert rig.host_facts() == facts and rig.staging_leftovers() == []


# -- recover with nothing open ------------------------------------------------------------------------
def test_recover_without_a_journal_is_noop_and_creates_nothing(rig: Rig) -> None:
    before = snapshot(rig.base)
    run = rig.cli("recover", "--trigger", "boot")
    assert run.code == 0, run
    assert run.payload() == NOOP
    assert snapshot(rig.base) == before
    assert not rig.state_dir.exists() and not rig.lock_path.exists()
    text = rig.cli("recover", json_out=False)
    assert text.code == 0 and text.stdout.strip(), text


def test_recover_with_only_closed_episodes_takes_the_fast_path(rig: Rig) -> None:
    rig.install_by_hand()
    _closed_journal(rig)
    before = snapshot(rig.base)
    for trigger in ("boot", "on-failure", "manual"):
        run = rig.cli("recover", "--trigger", trigger)
        assert run.code == 0, run
        assert run.payload() == NOOP
        run.assert_clean_stderr()
    # The fast path neither takes the lock (which would create the lock file) nor touches the journal.
    assert not rig.lock_path.exists()
    assert snapshot(rig.base) == before


def test_the_fast_paths_noop_is_byte_for_byte_the_full_paths(rig: Rig) -> None:
    """The lean path writes its JSON result out by hand (json loads re): the same bytes as the full path,
    which a configuration outside the boot reader's plain TOML (an escaped character in the name) forces."""
    rig.install_by_hand()
    _closed_journal(rig)
    fast = rig.cli("recover", "--trigger", "boot")
    escaped = f"\\u{ord(rig.name[0]):04x}{rig.name[1:]}"
    rig.config.write_text(rig.config_text().replace(f'name = "{rig.name}"', f'name = "{escaped}"'))
    full = rig.cli("recover", "--trigger", "boot")
    assert rig.lock_path.exists()  # the full path took the lock: it answered, not the lean one
    assert (fast.code, fast.stdout) == (full.code, full.stdout) == (0, full.stdout)
    assert fast.payload() == NOOP


def test_the_fast_path_loads_neither_re_nor_json_typing_or_tomllib(rig: Rig) -> None:
    """Each of them costs a large share of the boot-time budget in the installed venv (design §9
    ``recover.noop``). Run without ``site`` (``-S``): the development venv's editable-install hook loads
    ``re`` in every process, an installed venv does not."""
    import subprocess

    rig.install_by_hand()
    _closed_journal(rig)
    code = (
        f"import sys; sys.path.insert(0, {str(Path(cli.__file__).parents[2])!r})\n"
        "from agent.cli.main import main\n"
        f"code = main(['recover', '--config', {str(rig.config)!r}, '--trigger', 'boot'])\n"
        "heavy = ('re', 'json', 'typing', 'tomllib', 'enum', 'datetime', 'attrs', 'anyio', 'contextlib',\n"
        "         'functools')\n"
        "print(code, sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["nothing to recover: no open episode", "0 []"], done
    assert not rig.lock_path.exists()


def test_recover_with_an_open_episode_is_not_answered_by_the_fast_path(rig: Rig) -> None:
    """Control for the test above: with an episode open before its switch, recover takes the lock and
    aborts the episode (nothing was switched), so the fast path's silence above means something."""
    rig.install_by_hand()
    opened = aborted_episode("op-open")[:1]
    write_journal(rig.journal_dir, [("op-open", opened)])
    facts = rig.host_facts()
    run = rig.cli("recover")
    assert run.code == 0, run
    out = run.payload()
    assert out["operation"] == "op-open" and out["result"] == "aborted", out
    assert rig.lock_path.exists()
    assert rig.host_facts() == facts
    again = rig.cli("recover")
    assert again.payload() == NOOP


def test_after_compaction_history_survives_and_recover_stays_on_the_fast_path(rig: Rig) -> None:
    rig.write_config("[journal]\nkeep_episodes = 1\n")
    write_journal(rig.journal_dir, [("op-commit", committed_episode("op-commit", rig.name))])
    assert rig.cli("journal", "compact").code == 0  # seals the segment holding op-commit
    write_journal(rig.journal_dir, [("op-abort", aborted_episode("op-abort"))], start=T0 + 3600)
    history = rig.cli("history").payload()
    assert [e["operation"] for e in history["episodes"]] == ["op-abort", "op-commit"]
    compact = rig.cli("journal", "compact")  # op-commit is now old: its segment goes, a summary stays
    assert compact.code == 0, compact
    assert rig.cli("history").payload() == history
    verify = rig.cli("journal", "verify").payload()
    assert verify["ok"] is True and verify["records"] < 20, verify
    os.unlink(rig.lock_path)  # left by compact (a writer); the fast path must not bring it back
    before = snapshot(rig.base)
    run = rig.cli("recover", "--trigger", "boot")
    assert run.code == 0 and run.payload() == NOOP, run
    assert snapshot(rig.base) == before and not rig.lock_path.exists()


# -- journal verify / dump ----------------------------------------------------------------------------
def test_journal_verify_on_a_good_journal(rig: Rig) -> None:
    written = _closed_journal(rig)
    run = rig.cli("journal", "verify")
    assert run.code == 0, run
    assert run.payload() == {"ok": True, "records": len(written.ends), "torn_tail": None, "corrupt": None}


def test_journal_verify_without_a_journal(rig: Rig) -> None:
    run = rig.cli("journal", "verify")
    assert run.code == 0, run
    assert run.payload() == {"ok": True, "records": 0, "torn_tail": None, "corrupt": None}
    assert not rig.state_dir.exists()


def test_journal_verify_reports_middle_corruption_with_exit_3(rig: Rig) -> None:
    written = _closed_journal(rig)
    middle = len(written.ends) // 2
    start, end = written.record_span(middle)
    data = bytearray(written.segment.read_bytes())
    data[(start + end) // 2] ^= 0x40
    written.segment.write_bytes(bytes(data))
    before = snapshot(rig.base)
    run = rig.cli("journal", "verify")
    assert run.code == 3, run
    out = run.payload()
    assert out["ok"] is False and out["torn_tail"] is None
    assert out["corrupt"]["file"] == str(written.segment)
    assert start <= out["corrupt"]["offset"] < end, (out, start, end)
    lines = run.error_lines()
    assert len(lines) == 1 and str(written.segment) in lines[0] and str(out["corrupt"]["offset"]) in lines[0]
    run.assert_clean_stderr()
    assert snapshot(rig.base) == before  # a reader never repairs
    # Every other command that reads the journal refuses it too, with 3 and one line.
    for argv in (["status"], ["history"], ["journal", "dump"], ["recover"]):
        other = rig.cli(*argv)
        err = other.error_payload(3)
        assert str(written.segment) in err["error"], (argv, err)


def test_journal_verify_reports_a_torn_tail_as_ok(rig: Rig) -> None:
    written = _closed_journal(rig)
    start, end = written.record_span(len(written.ends) - 1)
    with open(written.segment, "r+b") as f:
        f.truncate(start + (end - start) // 2)
    before = snapshot(rig.base)
    run = rig.cli("journal", "verify")
    assert run.code == 0, run
    out = run.payload()
    assert out == {
        "ok": True,
        "records": len(written.ends) - 1,
        "torn_tail": {"file": str(written.segment), "offset": start},
        "corrupt": None,
    }
    assert snapshot(rig.base) == before  # reported, not repaired: only the lock holder repairs


def test_journal_dump(rig: Rig) -> None:
    written = _closed_journal(rig)
    run = rig.cli("journal", "dump")
    assert run.code == 0, run
    records = run.payload()["records"]
    assert [r["seq"] for r in records] == list(range(1, len(written.ends) + 1))
    assert [r["episode"] for r in records] == ["op-commit"] * 16 + ["op-abort"] * 4
    assert [r["time"] for r in records] == [_iso(t) for t in written.times]
    assert (
        records[0]["event"]["_type"] == "EpisodeOpened" and records[-1]["event"]["_type"] == "EpisodeClosed"
    )
    assert records[-1]["event"]["result"] == "aborted"
    text = rig.cli("journal", "dump", json_out=False)
    assert text.code == 0 and len(text.stdout.splitlines()) == len(written.ends)


def test_journal_dump_and_the_reason_line_show_foreign_characters_escaped(installed_rig: Rig) -> None:
    """A source whose path carries a right-to-left override, a C1 CSI (``\\x9b``: a terminal's escape
    introducer) and a line separator is journaled as given; ``journal dump``, the result's ``reason:`` line
    and the log lines show them as escapes, one line per record."""
    rig = installed_rig
    rig.write_config("[download]\nretry_deadline_s = 0\n")  # one attempt: nothing listens on port 9
    source = "http://127.0.0.1:9/a\u202egnp\u009b[2J\u2028x.tar.gz"
    shown = "http://127.0.0.1:9/a\\u202egnp\\x9b[2J\\u2028x.tar.gz"
    run = rig.cli("upgrade", "--archive", source, "--sha256", "0" * 64, json_out=False)
    assert run.code == 1, run
    assert f"reason: {shown}: connection failed" in run.stdout.splitlines(), run.stdout
    dump = rig.cli("journal", "dump", json_out=False)
    records = rig.cli("journal", "dump").payload()["records"]
    assert records[0]["event"]["source"] == source  # the journal keeps what was asked for
    lines = dump.stdout.splitlines()
    assert dump.code == 0 and len(lines) == len(records), dump.stdout
    assert f"source={shown} " in lines[0], lines[0]
    for text in (run.stdout, run.stderr, dump.stdout):
        assert not set("\u202e\u009b\u2028") & set(text)


# -- status, history, units, host-root ----------------------------------------------------------------
def test_status_on_a_bare_host(rig: Rig) -> None:
    before = snapshot(rig.base)
    run = rig.cli("status")
    assert run.code == 0, run
    out = run.payload()
    assert out["agent"] == rig.name and out["current"] is None and out["last_good"] is None
    assert out["episode"] is None
    assert set(out["service"]) == {"active_state", "sub_state", "main_pid", "exe"}
    assert snapshot(rig.base) == before
    run.assert_clean_stderr()


def test_status_on_an_installed_host_reads_links_and_journal(rig: Rig) -> None:
    import hashlib

    rig.install_by_hand()
    _closed_journal(rig)
    before = snapshot(rig.base)
    out = rig.cli("status").payload()
    blue = rig.slot("blue")
    assert out["current"]["slot"] == "blue" and out["last_good"]["slot"] == "blue"
    assert out["current"]["path"] == str(blue)
    assert out["current"]["sha256"] == hashlib.sha256(blue.read_bytes()).hexdigest()
    assert out["episode"] is None
    assert snapshot(rig.base) == before


def test_history_newest_first_in_rfc3339_utc(rig: Rig) -> None:
    written = _closed_journal(rig)
    run = rig.cli("history")
    assert run.code == 0, run
    episodes = run.payload()["episodes"]
    assert [e["operation"] for e in episodes] == ["op-abort", "op-commit"]
    for e in episodes:
        assert set(e) >= {"operation", "result", "from_version", "to_version", "opened_at", "closed_at"}
        assert RFC3339_UTC.match(e["opened_at"]) and RFC3339_UTC.match(e["closed_at"]), e
    abort, commit = episodes
    assert (commit["result"], commit["from_version"], commit["to_version"]) == ("committed", "1.0.0", "2.0.0")
    assert (commit["opened_at"], commit["closed_at"]) == (_iso(written.times[0]), _iso(written.times[15]))
    assert abort["result"] == "aborted"
    assert (abort["opened_at"], abort["closed_at"]) == (_iso(written.times[16]), _iso(written.times[19]))
    assert commit["opened_at"] == _iso(T0) == "2026-01-01T00:00:00Z"


def test_history_on_a_bare_host_is_empty(rig: Rig) -> None:
    run = rig.cli("history")
    assert run.code == 0 and run.payload() == {"episodes": []}
    assert not rig.state_dir.exists()


def test_units_prints_every_unit(rig: Rig) -> None:
    run = rig.cli("units")
    assert run.code == 0, run
    units = run.payload()["units"]
    assert set(units) == {
        f"{rig.name}.service",
        f"{rig.name}-recover.service",
        f"{rig.name}-recover-boot.service",
        f"{rig.name}-recover.timer",
        f"{rig.name}-recover-timer.service",
    }
    assert f"Unit={rig.name}-recover-timer.service" in units[f"{rig.name}-recover.timer"]
    assert "--trigger timer" in units[f"{rig.name}-recover-timer.service"]
    current = rig.agent_dir / f"{rig.name}-current"
    assert f"ExecStart={current} serve" in units[f"{rig.name}.service"]
    assert f"OnFailure={rig.name}-recover.service" in units[f"{rig.name}.service"]
    for name in (f"{rig.name}-recover.service", f"{rig.name}-recover-boot.service",
                 f"{rig.name}-recover-timer.service"):
        assert f"--config {rig.config}" in units[name]
    assert not rig.unit_dir.exists()


@pytest.mark.parametrize("argv", READERS, ids=[" ".join(r) for r in READERS])
@pytest.mark.parametrize("host", ["bare", "installed", "torn-tail"])
def test_readers_never_write(rig: Rig, argv: list[str], host: str) -> None:
    if host != "bare":
        rig.install_by_hand()
        written = _closed_journal(rig)
        if host == "torn-tail":
            _start, end = written.record_span(len(written.ends) - 1)
            with open(written.segment, "r+b") as f:
                f.truncate(end - 3)
    before = snapshot(rig.base)
    run = rig.cli(*argv)
    assert run.code == 0, run
    run.payload()
    run.assert_clean_stderr()
    assert snapshot(rig.base) == before
    assert not rig.lock_path.exists()
    if host == "bare":
        assert not rig.state_dir.exists()


# -- the three entry functions, in-process --------------------------------------------------------------
def test_entry_function_main(rig: Rig, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["host-root", "--json", "--config", str(rig.config)])
    out = capsys.readouterr()
    assert code == 0
    assert json.loads(out.out) == {"host_root": str(rig.root)}


def test_entry_function_main_upgrade(
    rig: Rig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        sys, "argv", ["agent-upgrade", "--archive", str(rig.config), "--config", str(rig.config), "--json"]
    )
    with pytest.raises(SystemExit) as exited:
        cli.main_upgrade()
    assert exited.value.code == 2
    out = capsys.readouterr()
    obj = json.loads(out.out)
    assert obj["exit_code"] == 2 and "not installed" in obj["error"]
    assert "Traceback" not in out.err


def test_entry_function_main_recover(
    rig: Rig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        sys, "argv", ["recover-agent-upgrade", "--config", str(rig.config), "--json", "--trigger", "boot"]
    )
    with pytest.raises(SystemExit) as exited:
        cli.main_recover()
    assert exited.value.code == 0
    assert json.loads(capsys.readouterr().out) == NOOP
    assert not rig.state_dir.exists() and not rig.lock_path.exists()

"""Unit rendering: golden texts, the ExecStart quoting table, and a round trip through real systemd."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.errors import ConfigError
from agent.systemd.manager import write_order
from agent.systemd.units import (
    exec_line,
    quote_exec_word,
    render_agent_unit,
    render_socket_unit,
    render_units,
)
from agent.testing.sandbox import PrivateSystemd

from .conftest import PYTHON, wait_for

# The first line names the owner: install rewrites and reset/uninstall remove only such a unit file.
HEADER = (
    "# Managed by upgrade-agent for demo-agent; do not edit\n"
    "# Written by upgrade-agent (upgrade-core). Rewritten on install; local edits are lost.\n"
)

GOLDEN_AGENT = HEADER + """\
[Unit]
Description=demo-agent (blue/green binary managed by upgrade-agent)
OnFailure=demo-agent-recover.service
StartLimitIntervalSec=60
StartLimitBurst=5

[Service]
Type=exec
ExecStart=/opt/upgrade-agent/lib/demo-agent/demo-agent-current --listen 127.0.0.1:8080 \
--motd "it's 100%% \\"free\\"" $$HOME ""
Restart=on-failure
RestartSec=1

[Install]
WantedBy=multi-user.target
"""

GOLDEN_RECOVER = HEADER + """\
[Unit]
Description=Recover an interrupted demo-agent upgrade (OnFailure= of demo-agent.service)

[Service]
Type=oneshot
ExecStart=/usr/local/bin/recover-agent-upgrade --config "/etc/upgrade-agent/demo agent.toml" \
--trigger on-failure
"""

GOLDEN_RECOVER_BOOT = HEADER + """\
[Unit]
Description=Recover an interrupted demo-agent upgrade at boot
Before=demo-agent.service

[Service]
Type=oneshot
ExecStart=/usr/local/bin/recover-agent-upgrade --config "/etc/upgrade-agent/demo agent.toml" --trigger boot

[Install]
WantedBy=multi-user.target
"""


GOLDEN_TIMER = HEADER + """\
[Unit]
Description=Recover an abandoned demo-agent upgrade every 300 s

[Timer]
OnBootSec=300s
OnUnitActiveSec=300s
AccuracySec=10s
Unit=demo-agent-recover-timer.service

[Install]
WantedBy=timers.target
"""

GOLDEN_TIMER_SERVICE = HEADER + """\
[Unit]
Description=Recover an abandoned demo-agent upgrade (started by demo-agent-recover.timer)

[Service]
Type=oneshot
ExecStart=/usr/local/bin/recover-agent-upgrade --config "/etc/upgrade-agent/demo agent.toml" --trigger timer
TimeoutStartSec=30min
"""


def test_render_units_golden() -> None:
    units = render_units(
        name="demo-agent",
        unit="demo-agent.service",
        current_link="/opt/upgrade-agent/lib/demo-agent/demo-agent-current",
        exec_args=["--listen", "127.0.0.1:8080", "--motd", 'it\'s 100% "free"', "$HOME", ""],
        max_attempts=3,
        recover_exe="/usr/local/bin/recover-agent-upgrade",
        config_path="/etc/upgrade-agent/demo agent.toml",
    )
    assert list(units) == [
        "demo-agent.service", "demo-agent-recover.service", "demo-agent-recover-boot.service",
        "demo-agent-recover.timer", "demo-agent-recover-timer.service",
    ]
    assert units["demo-agent.service"] == GOLDEN_AGENT
    assert units["demo-agent-recover.service"] == GOLDEN_RECOVER
    assert units["demo-agent-recover-boot.service"] == GOLDEN_RECOVER_BOOT
    assert units["demo-agent-recover.timer"] == GOLDEN_TIMER
    assert units["demo-agent-recover-timer.service"] == GOLDEN_TIMER_SERVICE


GOLDEN_SOCKET = HEADER + """\
[Unit]
Description=Listening socket of demo-agent.service, kept open across its upgrades by upgrade-agent

[Socket]
ListenStream=127.0.0.1:8080
Service=demo-agent.service
Backlog=4096
NoDelay=true

[Install]
WantedBy=sockets.target
"""

GOLDEN_SOCKET_AGENT = HEADER + """\
[Unit]
Description=demo-agent (blue/green binary managed by upgrade-agent)
OnFailure=demo-agent-recover.service
Requires=demo-agent.socket
After=demo-agent.socket
StartLimitIntervalSec=60
StartLimitBurst=5

[Service]
Type=exec
Sockets=demo-agent.socket
ExecStart=/opt/upgrade-agent/lib/demo-agent/demo-agent-current serve
Restart=on-failure
RestartSec=1

[Install]
WantedBy=multi-user.target
"""


def test_a_socket_renders_name_socket_and_an_agent_unit_that_takes_it() -> None:
    """``[agent] socket`` (design §11): ``NAME.socket`` first (removal stops it before the service it would
    start again), the agent unit ``Requires=``/``After=`` it and takes its fd (``Sockets=``); the socket is
    written before the unit that names it; the other units are those of a configuration without a socket."""
    common = dict(name="demo-agent", unit="demo-agent.service",
                  current_link="/opt/upgrade-agent/lib/demo-agent/demo-agent-current", exec_args=["serve"],
                  max_attempts=3, recover_exe="/usr/local/bin/recover-agent-upgrade",
                  config_path="/etc/upgrade-agent/demo agent.toml")
    units = render_units(**common, socket="127.0.0.1:8080")  # type: ignore[arg-type]
    plain = render_units(**common)  # type: ignore[arg-type]
    assert list(units) == ["demo-agent.socket", *plain]
    assert units["demo-agent.socket"] == GOLDEN_SOCKET
    assert units["demo-agent.service"] == GOLDEN_SOCKET_AGENT
    assert {n: t for n, t in units.items() if n not in ("demo-agent.socket", "demo-agent.service")} == {
        n: t for n, t in plain.items() if n != "demo-agent.service"}
    order = write_order(units)
    assert order.index("demo-agent.socket") < order.index("demo-agent.service")
    assert order.index("demo-agent-recover.service") < order.index("demo-agent.service")


@pytest.mark.parametrize(
    ("listen", "lines"),
    [
        ("8080", ["ListenStream=8080", "NoDelay=true"]),
        ("[::1]:8080", ["ListenStream=[::1]:8080", "NoDelay=true"]),
        ("/run/demo-agent/http.sock", ["ListenStream=/run/demo-agent/http.sock", "RemoveOnStop=true"]),
        ("@demo-agent", ["ListenStream=@demo-agent"]),
    ],
)
def test_socket_forms(listen: str, lines: list[str]) -> None:
    """TCP sockets get ``NoDelay=``; a unix socket path is removed when the socket stops (``reset``,
    ``uninstall`` leave no file behind); an abstract socket has no file and no TCP option."""
    text = render_socket_unit(name="demo-agent", unit="other.service", listen=listen)
    socket_lines = text.split("[Socket]\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert socket_lines == [lines[0], "Service=other.service", "Backlog=4096", *lines[1:]]


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("localhost:8080", '"localhost:8080" is not a ListenStream= stream address'),
        ("127.0.0.1:0", "port 0 is out of range (1 to 65535)"),
        ("70000", "port 70000 is out of range"),
        ("/run/%n.sock", "holds '%'"),
        ("/run/a b.sock", "holds a space"),
        ("/run/../x.sock", "must be normalised"),
        ("/" + "s" * 107, "1 to 107 bytes"),
    ],
)
def test_a_bad_socket_is_a_config_error_naming_the_key(listen: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        render_socket_unit(name="demo-agent", unit="demo-agent.service", listen=listen)
    assert str(info.value).startswith("agent.socket: ") and expected in str(info.value), str(info.value)
    with pytest.raises(ConfigError, match=r"^agent\.socket: "):
        render_agent_unit(name="demo-agent", unit="demo-agent.service", current_link="/c", exec_args=[],
                          max_attempts=1, socket=listen)


QUOTE_CASES = [
    # (word, as an argument, as the executable)
    ("plain", "plain", "plain"),
    ("/usr/bin/x", "/usr/bin/x", "/usr/bin/x"),
    ("--key=value,a:b@c+d", "--key=value,a:b@c+d", "--key=value,a:b@c+d"),
    ("100%", "100%%", "100%%"),
    ("%h", "%%h", "%%h"),
    ("$HOME", "$$HOME", "$HOME"),  # no $ substitution in the executable path: kept literal
    ("${X}", '"$${X}"', '"${X}"'),
    ("a b", '"a b"', '"a b"'),
    ("", '""', '""'),
    ("it's", '"it\'s"', '"it\'s"'),
    ('say "hi"', '"say \\"hi\\""', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"', '"back\\\\slash"'),
    (";", '";"', '";"'),  # a lone unquoted ; would separate commands
    ("a;b", '"a;b"', '"a;b"'),
    ("tab\there", '"tab\\there"', '"tab\\there"'),
    ("new\nline", '"new\\nline"', '"new\\nline"'),
    ("bell\x07", '"bell\\x07"', '"bell\\x07"'),
    ("caf\u00e9", '"caf\u00e9"', '"caf\u00e9"'),
]


@pytest.mark.parametrize(("word", "as_arg", "as_exe"), QUOTE_CASES)
def test_quote_exec_word(word: str, as_arg: str, as_exe: str) -> None:
    assert quote_exec_word(word) == as_arg
    assert quote_exec_word(word, executable=True) == as_exe


def test_bad_inputs_are_config_errors_naming_the_key() -> None:
    base = dict(name="demo-agent", unit="demo-agent.service", current_link="/x/current", exec_args=[],
                max_attempts=3)
    with pytest.raises(ConfigError, match=r"agent\.name"):
        render_agent_unit(**{**base, "name": "Bad Name"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"agent\.unit"):
        render_agent_unit(**{**base, "unit": "../evil.service"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"health\.max_attempts"):
        render_agent_unit(**{**base, "max_attempts": 0})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="absolute"):
        render_agent_unit(**{**base, "current_link": "relative/current"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="NUL"):
        quote_exec_word("a\0b")
    with pytest.raises(ConfigError, match="--config"):
        render_units(name="a", unit="a.service", current_link="/c", exec_args=[], max_attempts=1,
                     recover_exe="/r", config_path="agent.toml")


def _argv_dumper(directory: Path) -> tuple[Path, Path]:
    """An executable ``directory/dump`` that writes its argv as JSON to ``directory/argv.json`` atomically."""
    dump, out = directory / "dump", directory / "argv.json"
    dump.write_text(
        f"#!{PYTHON}\nimport json, os, sys\n"
        f"open({str(out)!r} + '.tmp', 'w').write(json.dumps(sys.argv))\n"
        f"os.rename({str(out)!r} + '.tmp', {str(out)!r})\n"
    )
    dump.chmod(0o755)
    return dump, out


ROUND_TRIP_ARGS = [word for word, _, _ in QUOTE_CASES] + ["%%", "$$", "\\;", "-", "@x", "'", '"', "\\"]


@pytest.mark.systemd
@pytest.mark.parametrize("dirname", ["bin-$x-%y", "bin dir $x %y"])
def test_exec_line_round_trips_through_systemd(sandbox: PrivateSystemd, tmp_path: Path, dirname: str) -> None:
    """systemd itself parses the rendered line and hands the process exactly the words we meant."""
    bindir = tmp_path / dirname
    bindir.mkdir()
    dump, out = _argv_dumper(bindir)
    unit = f"roundtrip-{secrets.token_hex(4)}.service"
    line = exec_line(str(dump), ROUND_TRIP_ARGS)
    (sandbox.unit_dir / unit).write_text(f"[Service]\nType=oneshot\nExecStart={line}\n")
    try:
        sandbox.run("systemctl", "daemon-reload")
        sandbox.run("systemctl", "start", unit)
        wait_for(out.exists, what="the dump script's output")
        assert json.loads(out.read_text()) == [str(dump), *ROUND_TRIP_ARGS]
    finally:
        (sandbox.unit_dir / unit).unlink()
        sandbox.run("systemctl", "daemon-reload")


@pytest.mark.systemd
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.lists(st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=12),
                     max_size=6))
def test_any_argv_round_trips_through_systemd(
    sandbox: PrivateSystemd, tmp_path_factory: pytest.TempPathFactory, args: list[str]
) -> None:
    """Generated argument lists (every character but NUL and surrogates) reach the process unchanged."""
    work = tmp_path_factory.mktemp("argv")
    dump, out = _argv_dumper(work)
    unit = f"argv-{secrets.token_hex(4)}.service"
    (sandbox.unit_dir / unit).write_text(
        f"[Service]\nType=oneshot\nExecStart={exec_line(str(dump), args)}\n", encoding="utf-8"
    )
    try:
        sandbox.run("systemctl", "daemon-reload")
        sandbox.run("systemctl", "start", unit)
        wait_for(out.exists, what="the dump script's output")
        assert json.loads(out.read_text()) == [str(dump), *args]
    finally:
        (sandbox.unit_dir / unit).unlink()

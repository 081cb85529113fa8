"""The agent's systemd unit files, rendered as text (design §3, 6, 10): no I/O, no systemd needed.

The agent unit, ``NAME-recover.service`` (its ``OnFailure=``), ``NAME-recover-boot.service`` (ordered
before it), ``NAME-recover.timer`` with the service it starts, ``NAME-recover-timer.service`` (design §10:
an episode left open by a dead upgrader is recovered without an operator and without a reboot),
``NAME.socket`` when ``[agent] socket`` is set (design §11: the listening socket outlives every restart),
their names, and the checks of names and paths they embed. ``ExecStart=`` lines are quoted per
systemd.syntax(7) and systemd.service(5) "Command lines"; see :func:`exec_line`. The service manager that
writes and drives them is :class:`agent.systemd.manager.SystemdServiceManager`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Final

from agent.errors import ConfigError
from agent.systemd.listen import listen_is_ip, listen_stream_problem

__all__ = [
    "RECOVER_TIMER_PERIOD_S",
    "bootstrap_unit_name",
    "check_abs",
    "check_agent_unit",
    "check_name",
    "check_unit",
    "exec_line",
    "owner_header",
    "quote_exec_word",
    "recover_boot_unit_name",
    "recover_timer_name",
    "recover_timer_service_name",
    "recover_unit_name",
    "render_agent_unit",
    "render_bootstrap_unit",
    "render_recover_boot_unit",
    "render_recover_timer",
    "render_recover_timer_service",
    "render_recover_unit",
    "render_socket_unit",
    "render_units",
    "socket_unit_name",
    "unit_owner",
]

RECOVER_TIMER_PERIOD_S: Final = 300
"""Seconds between two runs of ``recover-agent-upgrade --trigger timer`` (``OnBootSec=`` and
``OnUnitActiveSec=`` of ``NAME-recover.timer``): an episode abandoned by a killed upgrader is closed within
about this long (plus ``AccuracySec=``), without an operator and without a reboot."""

RECOVER_TIMER_ACCURACY_S: Final = 10
"""``AccuracySec=`` of the timer (systemd's default of one minute would add up to 60 s to the period)."""

RECOVER_TIMER_TIMEOUT: Final = "30min"
"""``TimeoutStartSec=`` of the timer's oneshot: longer than any sane health policy's attempts (a recovery
gives the candidate its remaining attempts), yet bounded; a recovery killed by it is itself recovered by
the next run (recovery is journaled and crash-safe)."""

SOCKET_BACKLOG: Final = 4096
"""``Backlog=`` of ``NAME.socket``: connections the kernel queues while no agent process accepts (during a
restart, upgrade or rollback, from the old process's exit to the new one's first ``accept``); at about 1,000
connections a second, four seconds' worth. The kernel caps it at ``net.core.somaxconn`` (listen(2))."""

BOOTSTRAP_RESTART_S: Final = 10
"""``RestartSec=`` of ``NAME-bootstrap.service``: seconds before a failed first-boot install runs again."""

BOOTSTRAP_RESTART_STEPS: Final = 5
"""``RestartSteps=`` (systemd >= 254): the delay grows from ``RestartSec=`` to ``RestartMaxDelaySec=`` in this
many steps (10, 20, 39, 77, 152, 300 s)."""

BOOTSTRAP_RESTART_MAX: Final = "5min"
"""``RestartMaxDelaySec=`` (systemd >= 254): the longest delay between two first-boot install runs."""

_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
# systemd.unit(5): unit names are ASCII letters, digits, ":", "-", "_", ".", "\\" and "@" plus a type suffix.
# systemd.unit(5) names, unescaped: no "\\" escape sequences, and a first character that is a letter, digit or
# "_" ("-.service" and ".x.service" are names only an escaped path produces; "-" alone means the root).
_UNIT_TYPES: Final = "service|socket|target|timer|path|slice|scope"
_UNIT_RE: Final = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9:_.@-]{{0,245}}\.({_UNIT_TYPES})")
# Characters that need no quoting in an ExecStart= word (after % and $ are doubled).
_SAFE_WORD_RE: Final = re.compile(r"[A-Za-z0-9_@%+=:,./$-]+")
_C_ESCAPES: Final = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_HEADER: Final = "# Written by upgrade-agent (upgrade-core). Rewritten on install; local edits are lost.\n"
# The first line of every unit file the agent writes (render_units): whose it is. Install rewrites, and
# reset/uninstall remove, only a unit file whose first line names this agent (design §10, docs/host.md).
_OWNER_PREFIX: Final = "# Managed by upgrade-agent for "
_OWNER_SUFFIX: Final = "; do not edit"
_OWNER_RE: Final = re.compile(
    re.escape(_OWNER_PREFIX) + r"([a-z0-9][a-z0-9._-]{0,62})" + re.escape(_OWNER_SUFFIX)
)
# Units written before the owner line existed start with _HEADER; their Description names the agent.
_LEGACY_DESCRIPTION_RE: Final = re.compile(
    r"Description=(?:([a-z0-9][a-z0-9._-]{0,62}) \(blue/green binary managed by upgrade-agent\)"
    r"|Recover an interrupted ([a-z0-9][a-z0-9._-]{0,62}) upgrade\b.*)"
)


# ----------------------------------------------------------------------------------------------- names
def check_name(name: str) -> None:
    """Raise ``ConfigError`` unless ``name`` is a valid ``agent.name``."""
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(f"agent.name: {name!r} must match [a-z0-9][a-z0-9._-]{{0,62}}")


def check_unit(unit: str, key: str = "agent.unit") -> None:
    """Raise ``ConfigError`` (naming ``key``) unless ``unit`` is a systemd unit name (systemd.unit(5)) that
    needs no escaping: letters, digits, ``:_.@-``, not starting with ``-``, ``.``, ``:`` or ``@``."""
    if not _UNIT_RE.fullmatch(unit):
        raise ConfigError(f"{key}: {unit!r} is not a valid systemd unit name (systemd.unit(5))")


def check_agent_unit(name: str, unit: str) -> None:
    """Raise ``ConfigError`` naming ``agent.unit`` unless ``unit`` can be the agent unit of ``name``.

    A plain ``.service`` (no socket, timer or other type; no template ``x@.service`` or instance
    ``x@y.service``), and none of the agent's own units (those :func:`render_units` adds besides it, e.g.
    ``NAME-recover.service``), so the agent unit never overwrites or is overwritten by one of them.
    """
    check_unit(unit)
    if not unit.endswith(".service"):
        raise ConfigError(f"agent.unit: {unit} must be a .service unit")
    if "@" in unit:
        raise ConfigError(f"agent.unit: {unit} is a template or instance unit; name a plain .service")
    own = set(render_units(name=name, unit=f"{name}.service", current_link="/", exec_args=(),
                           max_attempts=1, recover_exe="/", config_path="/",
                           operator=("/", "spool", 1), socket="1")) - {f"{name}.service"}
    own.add(bootstrap_unit_name(name))
    if unit in own:
        raise ConfigError(f"agent.unit: {unit} is one of the units upgrade-agent itself renders for {name}")


def owner_header(name: str) -> str:
    """The first line of every unit file written for agent ``name``:
    ``# Managed by upgrade-agent for NAME; do not edit``."""
    return f"{_OWNER_PREFIX}{name}{_OWNER_SUFFIX}\n"


def unit_owner(text: str) -> str | None:
    """The agent a unit file's text was written for, from its first line; None when upgrade-agent did
    not write it. A unit written before the owner line existed (first line the old generic header) is
    attributed to the agent its ``Description=`` names."""
    first, _, rest = text.partition("\n")
    m = _OWNER_RE.fullmatch(first)
    if m:
        return m.group(1)
    if first + "\n" == _HEADER:
        for line in rest.splitlines():
            d = _LEGACY_DESCRIPTION_RE.fullmatch(line)
            if d:
                return d.group(1) or d.group(2)
    return None


def check_abs(path: str, key: str) -> None:
    """Raise ``ConfigError`` (naming ``key``) unless ``path`` is absolute and has no NUL."""
    if not os.path.isabs(path) or "\0" in path:
        raise ConfigError(f"{key}: {path!r} must be an absolute path")


def recover_unit_name(name: str) -> str:
    """``NAME-recover.service``: the agent unit's ``OnFailure=`` target (design §3, 6)."""
    return f"{name}-recover.service"


def recover_boot_unit_name(name: str) -> str:
    """``NAME-recover-boot.service``: boot-time recovery ordered before the agent unit (design §3, 6)."""
    return f"{name}-recover-boot.service"


def recover_timer_name(name: str) -> str:
    """``NAME-recover.timer``: starts :func:`recover_timer_service_name` every
    :data:`RECOVER_TIMER_PERIOD_S` seconds."""
    return f"{name}-recover.timer"


def operator_unit_name(name: str) -> str:
    """``NAME-operator.service``: ``upgrade-agent operator`` when ``[operations]`` is configured (design
    §10)."""
    return f"{name}-operator.service"


def socket_unit_name(name: str) -> str:
    """``NAME.socket``: the agent unit's listening socket when ``[agent] socket`` is set (design §11)."""
    return f"{name}.socket"


def check_listen_stream(value: str) -> None:
    """Raise ``ConfigError`` naming ``agent.socket`` unless ``value`` is ``""`` or a ``ListenStream=``
    value the agent renders (:func:`agent.systemd.listen.listen_stream_problem`)."""
    problem = listen_stream_problem(value)
    if problem is not None:
        raise ConfigError(f"agent.socket: {problem}")


def bootstrap_unit_name(name: str) -> str:
    """``NAME-bootstrap.service``: the first-boot install of a host provisioned by Ignition (design §10)."""
    return f"{name}-bootstrap.service"


def recover_timer_service_name(name: str) -> str:
    """``NAME-recover-timer.service``: the oneshot the timer starts (``--trigger timer``).

    A unit of its own rather than the timer's default ``NAME-recover.service``: that one is the agent unit's
    ``OnFailure=`` target (``--trigger on-failure``, exit 75 when busy); the timer's run must instead exit 0
    at once when a live upgrade holds the lock, so that the timer's service never shows ``failed``, and an
    ``OnFailure=`` start must never be swallowed because a periodic run of the same unit is active.
    """
    return f"{name}-recover-timer.service"


# ----------------------------------------------------------------------------------------------- quoting
def quote_exec_word(word: str, *, executable: bool = False) -> str:
    """Quote one word of an ``ExecStart=`` command line so systemd hands it to the process unchanged.

    Rules (systemd.syntax(7) "Quoting", systemd.service(5) "Command lines", checked against systemd 252):

    - ``%`` starts a specifier everywhere: doubled to ``%%``;
    - ``$`` starts an environment substitution in arguments only (not in the executable path, where
      ``$$`` would stay literal): doubled to ``$$`` in arguments;
    - a word with whitespace, quotes, backslashes, ``;``, control or other special characters, and the
      empty word, is put in double quotes with C-style escapes (``\\\\``, ``\\"``, ``\\n``, ``\\t``,
      ``\\xHH``); inside quotes a lone ``;`` no longer separates commands.

    Args:
        word: the literal argument (or executable path) the process should see.
        executable: True for the first word (the absolute program path).

    Returns:
        The quoted word, ready to join with spaces.

    Raises:
        ConfigError: the word contains a NUL byte (it cannot reach a process's argv).
    """
    if "\0" in word:
        raise ConfigError(f"ExecStart word {word!r} contains a NUL byte")
    text = word.replace("%", "%%")
    if not executable:
        text = text.replace("$", "$$")
    if text and _SAFE_WORD_RE.fullmatch(text):
        return text
    out = []
    for ch in text:
        if ch in _C_ESCAPES:
            out.append(_C_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def exec_line(executable: str, args: Sequence[str]) -> str:
    """The value of an ``ExecStart=``: the quoted absolute ``executable`` then each quoted argument.

    Raises:
        ConfigError: ``executable`` is not absolute, or a word holds a NUL byte.
    """
    check_abs(executable, "ExecStart executable")
    return " ".join([quote_exec_word(executable, executable=True), *(quote_exec_word(a) for a in args)])


# ----------------------------------------------------------------------------------------------- rendering
def render_agent_unit(
    *, name: str, unit: str, current_link: str, exec_args: Sequence[str], max_attempts: int, socket: str = ""
) -> str:
    """Render the agent unit (design §6): runs the ``current`` link, restarts on failure, recovers on failure.

    ``Type=exec`` (systemd >= 240), not ``simple``: the unit turns ``active`` only once ``execve`` of the
    ``current`` link succeeded. With ``simple`` it is ``active`` right after ``fork``, when
    ``/proc/<MainPID>/exe`` still names the systemd binary, and a health check that fails at once on an exe
    mismatch (design §4.3 step 7) could reject a good candidate; a missing or non-executable slot also fails
    the start job itself instead of passing as "started". Even then, for a few microseconds after exec the
    kernel may show an empty ``cmdline``: read that as "not known yet", never as a mismatch.

    ``StartLimitBurst=max_attempts+2`` within ``StartLimitIntervalSec=60``: a candidate that crash-loops
    (case C16c) exhausts the limit, the unit ends ``failed`` with ``Result=start-limit-hit``, and
    ``OnFailure=NAME-recover.service`` runs ``recover-agent-upgrade --trigger on-failure`` (design §4.4).

    With ``socket`` (``[agent] socket``, design §11) the unit takes its listening socket from
    ``NAME.socket`` (:func:`render_socket_unit`): ``Sockets=`` hands it the socket's file descriptor
    (``LISTEN_FDS``, sd_listen_fds(3)), ``Requires=`` and ``After=`` bind it to the socket and start it after
    it (systemd.unit(5)). A restart of the service, whoever asks for it, never stops the socket: ``Requires=``
    propagates a stop from the socket to the service, not back. The socket stays open while the old process
    exits and the new one starts, and connections arriving meanwhile wait in its queue.

    Args:
        name: ``agent.name``.
        unit: ``agent.unit``, e.g. ``demo-agent.service``.
        current_link: absolute path of ``R/lib/NAME/NAME-current``.
        exec_args: ``agent.exec_args``, passed literally (quoted and escaped here).
        max_attempts: ``health.max_attempts`` (>= 1).
        socket: ``agent.socket``, a ``ListenStream=`` value, or "" for none.

    Returns:
        The unit file text.

    Raises:
        ConfigError: a bad name, unit, path, ``max_attempts`` or socket, naming the key.
    """
    check_name(name)
    check_unit(unit)
    check_listen_stream(socket)
    if max_attempts < 1:
        raise ConfigError(f"health.max_attempts: {max_attempts} must be >= 1")
    sock = socket_unit_name(name)
    return (
        _HEADER
        + "[Unit]\n"
        + f"Description={name} (blue/green binary managed by upgrade-agent)\n"
        + f"OnFailure={recover_unit_name(name)}\n"
        + (f"Requires={sock}\nAfter={sock}\n" if socket else "")
        + "StartLimitIntervalSec=60\n"
        + f"StartLimitBurst={max_attempts + 2}\n"
        + "\n[Service]\n"
        + "Type=exec\n"
        + (f"Sockets={sock}\n" if socket else "")
        + f"ExecStart={exec_line(current_link, exec_args)}\n"
        + "Restart=on-failure\n"
        + "RestartSec=1\n"
        + "\n[Install]\n"
        + "WantedBy=multi-user.target\n"
    )


def render_socket_unit(*, name: str, unit: str, listen: str) -> str:
    """Render ``NAME.socket`` (design §11): the agent unit's listening socket, owned by systemd, so that it
    outlives every restart of the agent (upgrade, rollback, operator rollback, ``Restart=on-failure``).

    ``[Socket]``: ``ListenStream=listen``; ``Service=unit`` (the agent unit need not be ``NAME.service``;
    traffic while it is stopped starts it, systemd.socket(5)); ``Backlog=`` :data:`SOCKET_BACKLOG`
    connections queued while no process accepts; for a TCP address ``NoDelay=true`` (small answers are not
    held back by Nagle's algorithm, tcp(7)); for a unix socket path ``RemoveOnStop=true``, so that ``reset``
    and ``uninstall``, which stop the socket, leave no socket file behind. Enabled
    (``WantedBy=sockets.target``) and started by ``install``.

    Args:
        name: ``agent.name``.
        unit: ``agent.unit``, the service it hands its file descriptor to.
        listen: ``agent.socket``, not "".

    Returns:
        The unit file text.

    Raises:
        ConfigError: a bad name or unit; ``listen`` empty or not an accepted ``ListenStream=`` value (naming
            ``agent.socket``).
    """
    check_name(name)
    check_unit(unit)
    if not listen:
        raise ConfigError("agent.socket: empty: no socket unit to render")
    check_listen_stream(listen)
    return (
        _HEADER
        + "[Unit]\n"
        + f"Description=Listening socket of {unit}, kept open across its upgrades by upgrade-agent\n"
        + "\n[Socket]\n"
        + f"ListenStream={listen}\n"
        + f"Service={unit}\n"
        + f"Backlog={SOCKET_BACKLOG}\n"
        + ("NoDelay=true\n" if listen_is_ip(listen) else "")
        + ("RemoveOnStop=true\n" if listen.startswith("/") else "")
        + "\n[Install]\n"
        + "WantedBy=sockets.target\n"
    )


def _recover_oneshot(
    *, name: str, unit: str, recover_exe: str, config_path: str, trigger: str, description: str,
    unit_lines: str = "", service_lines: str = "", install: bool = False,
) -> str:
    """The shared shape of both recovery units: a oneshot running the absolute ``recover-agent-upgrade``
    with the absolute ``--config`` and ``--trigger``; ``unit_lines`` go into ``[Unit]``."""
    check_name(name)
    check_unit(unit)
    check_abs(recover_exe, "recover-agent-upgrade path")
    check_abs(config_path, "--config")
    command = exec_line(recover_exe, ["--config", config_path, "--trigger", trigger])
    return (
        _HEADER
        + "[Unit]\n"
        + f"Description={description}\n"
        + unit_lines
        + "\n[Service]\n"
        + "Type=oneshot\n"
        + f"ExecStart={command}\n"
        + service_lines
        + ("\n[Install]\nWantedBy=multi-user.target\n" if install else "")
    )


def render_recover_unit(*, name: str, unit: str, recover_exe: str, config_path: str) -> str:
    """Render ``NAME-recover.service``: oneshot ``recover-agent-upgrade --trigger on-failure`` (design §4.4).

    Args:
        name: ``agent.name``.
        unit: the agent unit whose ``OnFailure=`` starts it.
        recover_exe: absolute path of the installed ``recover-agent-upgrade``.
        config_path: absolute path of the configuration file.

    Raises:
        ConfigError: a bad name or unit, or a relative path.
    """
    return _recover_oneshot(
        name=name, unit=unit, recover_exe=recover_exe, config_path=config_path, trigger="on-failure",
        description=f"Recover an interrupted {name} upgrade (OnFailure= of {unit})",
    )


def render_recover_boot_unit(*, name: str, unit: str, recover_exe: str, config_path: str) -> str:
    """Render ``NAME-recover-boot.service``: oneshot ``--trigger boot``, ordered ``Before=`` the agent unit.

    Boot recovery never waits for the agent (design §4.5): it decides from the journal and the links and hands
    any health check to a transient unit ordered after the agent.

    Args:
        name: ``agent.name``.
        unit: the agent unit it must run before.
        recover_exe: absolute path of the installed ``recover-agent-upgrade``.
        config_path: absolute path of the configuration file.

    Raises:
        ConfigError: a bad name or unit, or a relative path.
    """
    return _recover_oneshot(
        name=name, unit=unit, recover_exe=recover_exe, config_path=config_path, trigger="boot",
        description=f"Recover an interrupted {name} upgrade at boot", unit_lines=f"Before={unit}\n",
        install=True,
    )


def render_recover_timer_service(*, name: str, unit: str, recover_exe: str, config_path: str) -> str:
    """Render ``NAME-recover-timer.service``: oneshot ``recover-agent-upgrade --trigger timer``.

    Started only by ``NAME-recover.timer`` (no ``[Install]``). With the host lock free it recovers an open
    episode like ``--trigger manual`` (health attempts included); with the lock held by a live upgrade it
    exits 0 at once (``busy: ...``), never 75 and never waiting, so the unit never shows ``failed`` for that.

    Raises:
        ConfigError: a bad name or unit, or a relative path.
    """
    return _recover_oneshot(
        name=name, unit=unit, recover_exe=recover_exe, config_path=config_path, trigger="timer",
        description=f"Recover an abandoned {name} upgrade (started by {recover_timer_name(name)})",
        service_lines=f"TimeoutStartSec={RECOVER_TIMER_TIMEOUT}\n",
    )


def render_recover_timer(*, name: str, period_s: int = RECOVER_TIMER_PERIOD_S) -> str:
    """Render ``NAME-recover.timer``: starts ``NAME-recover-timer.service`` every ``period_s`` seconds.

    ``OnBootSec=`` and ``OnUnitActiveSec=`` both ``period_s`` (monotonic: a wall-clock jump changes
    nothing); a timer started after that much uptime (at ``install``) elapses at once, once. Enabled
    (``WantedBy=timers.target``) and started by ``install``.

    Args:
        name: ``agent.name``.
        period_s: seconds between runs (:data:`RECOVER_TIMER_PERIOD_S`), >= 1.

    Raises:
        ConfigError: a bad name or period.
    """
    check_name(name)
    if period_s < 1:
        raise ConfigError(f"recover timer period {period_s} s must be >= 1")
    return (
        _HEADER
        + "[Unit]\n"
        + f"Description=Recover an abandoned {name} upgrade every {period_s} s\n"
        + "\n[Timer]\n"
        + f"OnBootSec={period_s}s\n"
        + f"OnUnitActiveSec={period_s}s\n"
        + f"AccuracySec={RECOVER_TIMER_ACCURACY_S}s\n"
        + f"Unit={recover_timer_service_name(name)}\n"
        + "\n[Install]\n"
        + "WantedBy=timers.target\n"
    )


def render_operator_unit(
    *, name: str, unit: str, upgrade_exe: str, config_path: str, source: str, stop_timeout_s: int
) -> str:
    """Render ``NAME-operator.service``: ``upgrade-agent --config CFG operator`` (docs/managed.md).

    ``Type=exec``, ``Restart=on-failure`` (a SIGKILL or a crash restarts it; its start-up gate republishes
    what the journal holds and never runs an operation twice), ordered after the boot-time recovery unit
    and the network. SIGTERM lets a running operation reach its terminal state once the switch has started,
    so ``TimeoutStopSec=`` is ``stop_timeout_s`` (the whole health budget and some margin), not systemd's
    default 90 s.

    Args:
        name: ``agent.name``.
        unit: the agent unit it upgrades.
        upgrade_exe: absolute path of the installed ``upgrade-agent``.
        config_path: absolute path of the configuration file.
        source: ``[operations] source`` (for the description).
        stop_timeout_s: seconds, >= 1.

    Raises:
        ConfigError: a bad name or unit, a relative path, a bad timeout.
    """
    check_name(name)
    check_unit(unit)
    check_abs(upgrade_exe, "upgrade-agent path")
    check_abs(config_path, "--config")
    if stop_timeout_s < 1:
        raise ConfigError(f"operator stop timeout {stop_timeout_s} s must be >= 1")
    return (
        _HEADER
        + "[Unit]\n"
        + f"Description=Managed upgrades of {unit} ({source} operations)\n"
        + f"After=network-online.target {recover_boot_unit_name(name)}\n"
        + "Wants=network-online.target\n"
        + "\n[Service]\n"
        + "Type=exec\n"
        + f"ExecStart={exec_line(upgrade_exe, ['--config', config_path, 'operator'])}\n"
        + "Restart=on-failure\n"
        + "RestartSec=5\n"
        + f"TimeoutStopSec={stop_timeout_s}\n"
        + "\n[Install]\n"
        + "WantedBy=multi-user.target\n"
    )


def render_bootstrap_unit(
    *,
    name: str,
    runtime_archive: str,
    runtime_dir: str,
    upgrade_exe: str,
    config_path: str,
    release_archive: str,
    sha256: str,
    signature: str | None,
    marker: str,
) -> str:
    """Render ``NAME-bootstrap.service`` (design §10): the one-time first-boot install on a host that Ignition
    provisioned (``upgrade-agent ignition``), starting with :func:`owner_header`.

    A oneshot that unpacks the runtime archive into ``runtime_dir`` (``tar`` of the host, no Python needed;
    the archive's one top directory, ``upgrade-core-runtime/`` as ``make bundle`` builds it, is stripped),
    runs ``upgrade-agent --config CFG install --archive RELEASE --sha256 HEX`` from there, then writes
    ``marker`` and disables itself. ``ConditionPathExists=!marker``: once the install succeeded it never runs
    again, even if enabled by hand; when a step fails, nothing after it runs (no marker), and systemd runs
    the unit again within the same boot (``install`` of the same release is a ``noop``, unpacking again is
    harmless): ``Restart=on-failure``, ``RestartSec=10``, no start limit (``StartLimitIntervalSec=0``), and
    on systemd >= 254 a delay growing to five minutes (``RestartSteps=5``, ``RestartMaxDelaySec=5min``,
    systemd.service(5)). Older systemd (Debian 12 ships 252) ignores those two keys with a warning and
    retries every 10 s. Ordered after the network (a ``[trust]`` keyring may be remote), which it also
    wants: the retries cover a network that is up but whose release server does not answer yet. It is
    deliberately not ``Before=`` the agent unit or the recovery units: ``install`` starts those itself and
    waits for them, and such an ordering would make those start jobs wait for this very unit; none of them
    is enabled before ``install`` enables it.

    Args:
        name: ``agent.name``.
        runtime_archive: absolute path of the runtime tar.gz on the host.
        runtime_dir: absolute directory it is unpacked into (must exist: Ignition creates it).
        upgrade_exe: absolute path of ``upgrade-agent`` inside ``runtime_dir``.
        config_path: absolute path of the configuration file on the host.
        release_archive: absolute path of the release archive on the host.
        sha256: its digest, 64 lowercase hex.
        signature: absolute path of its minisign signature on the host, or None.
        marker: absolute path written once the install succeeded.

    Returns:
        The unit file text.

    Raises:
        ConfigError: a bad name or a relative path.
    """
    check_name(name)
    for path, key in ((runtime_archive, "runtime archive"), (runtime_dir, "runtime directory"),
                      (release_archive, "release archive"), (marker, "bootstrap marker"),
                      (config_path, "--config")):
        check_abs(path, key)
    install = ["--config", config_path, "install", "--archive", release_archive, "--sha256", sha256]
    if signature is not None:
        install += ["--signature", signature]
    unit = bootstrap_unit_name(name)
    return owner_header(name) + (
        _HEADER
        + "[Unit]\n"
        + f"Description=First-boot install of {name} by upgrade-agent (provisioned by Ignition)\n"
        + f"ConditionPathExists=!{marker}\n"
        + "Wants=network-online.target\n"
        + "After=network-online.target\n"
        + "StartLimitIntervalSec=0\n"
        + "\n[Service]\n"
        + "Type=oneshot\n"
        + "Restart=on-failure\n"
        + f"RestartSec={BOOTSTRAP_RESTART_S}\n"
        + "# systemd >= 254: the delay grows to RestartMaxDelaySec; older versions ignore both keys\n"
        + f"RestartSteps={BOOTSTRAP_RESTART_STEPS}\n"
        + f"RestartMaxDelaySec={BOOTSTRAP_RESTART_MAX}\n"
        + "ExecStart="
        + exec_line("/usr/bin/tar", ["--no-same-owner", "--strip-components=1", "-xzf", runtime_archive,
                                     "-C", runtime_dir])
        + "\n"
        + f"ExecStart={exec_line(upgrade_exe, install)}\n"
        + f"ExecStart={exec_line('/usr/bin/touch', [marker])}\n"
        + f"ExecStart={exec_line('/usr/bin/systemctl', ['disable', unit])}\n"
        + f"TimeoutStartSec={RECOVER_TIMER_TIMEOUT}\n"
        + "\n[Install]\n"
        + "WantedBy=multi-user.target\n"
    )


def render_units(
    *,
    name: str,
    unit: str,
    current_link: str,
    exec_args: Sequence[str],
    max_attempts: int,
    recover_exe: str,
    config_path: str,
    operator: tuple[str, str, int] | None = None,
    socket: str = "",
) -> dict[str, str]:
    """Every unit file, keyed by file name (what ``upgrade-agent units`` prints, design §7): the operator
    (when ``operator`` is given), ``NAME.socket`` (when ``socket`` is set), the agent unit, both recovery
    services, the timer and its service (in this order: removal stops them in it, the operator before
    anything it could start an upgrade of, the socket before the service it would start again on the next
    connection, the timer before the service it starts). Each starts with :func:`owner_header`: the set of
    units the agent owns is exactly what this returns.

    Args:
        operator: ``(upgrade-agent path, [operations] source, stop timeout in seconds)`` when
            ``[operations]`` is configured, else None.
        socket: ``agent.socket`` (a ``ListenStream=`` value), or "" for no socket unit.

    Raises:
        ConfigError: as the render functions.
    """
    units = {}
    if operator is not None:
        upgrade_exe, source, stop_timeout_s = operator
        units[operator_unit_name(name)] = render_operator_unit(
            name=name, unit=unit, upgrade_exe=upgrade_exe, config_path=config_path, source=source,
            stop_timeout_s=stop_timeout_s,
        )
    if socket:
        units[socket_unit_name(name)] = render_socket_unit(name=name, unit=unit, listen=socket)
    units |= {
        unit: render_agent_unit(
            name=name, unit=unit, current_link=current_link, exec_args=exec_args, max_attempts=max_attempts,
            socket=socket,
        ),
        recover_unit_name(name): render_recover_unit(
            name=name, unit=unit, recover_exe=recover_exe, config_path=config_path
        ),
        recover_boot_unit_name(name): render_recover_boot_unit(
            name=name, unit=unit, recover_exe=recover_exe, config_path=config_path
        ),
        recover_timer_name(name): render_recover_timer(name=name),
        recover_timer_service_name(name): render_recover_timer_service(
            name=name, unit=unit, recover_exe=recover_exe, config_path=config_path
        ),
    }
    return {fname: owner_header(name) + text for fname, text in units.items()}


# ----------------------------------------------------------------------------------------------- helpers

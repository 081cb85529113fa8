"""Case C26 under the real private systemd: ``NAME-recover.timer`` converges a host whose
upgrader was killed outright, without any operator command and without a reboot.

Expected outcomes, written down:

- ``install`` leaves ``NAME-recover.timer`` enabled (its ``timers.target.wants`` link in ``unit_dir``) and
  active (``waiting``).
- With the period shortened to 2 s by a drop-in (the unit files stay as rendered), the timer fires by itself
  (``LastTriggerUSec`` set, its service's ``Result=success``): while nothing is open it is the boot-style
  no-op; while an upgrade holds the lock it is "busy", exit 0, never ``failed``.
- An upgrade to a good 1.1.0 SIGKILLed (the documented crash hook) right after ``SwitchCommitted`` leaves
  the episode open and no result. Then, with no command from the test, within a bounded 90 s: the episode is
  closed by a recovery journaled with ``trigger: timer``, its result file says ``committed``, ``current``
  names green whose bytes are 1.1.0's member, and the unit's MainPID runs the current link and serves
  1.1.0 (``assert_running``). The timer's service never ended ``failed``.
- ``upgrade --in-window`` outside a closed ``[schedule]`` window stages 1.1.0 (result ``staged``); the timer's
  runs leave it staged (``current`` on blue, the same MainPID) while the window stays closed; once the
  configuration names an open window, the timer switches to it by itself: ``current`` names green, MainPID
  serves 1.1.0, the newest episode is an ``activate`` that committed, nothing is staged any more.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from . import agent_env
from .agent_env import AgentEnv, poll

pytestmark = pytest.mark.systemd

make_env = agent_env.make_env
release_server = agent_env.release_server

MakeEnv = Callable[..., AgentEnv]
CONVERGE_DEADLINE_S = 90.0  # a 2 s period, one restart and a 0.5 s stability window, on a loaded machine


def _fast_timer(env: AgentEnv, period: str = "2s") -> None:
    """A drop-in that makes the timer fire every ``period``; the rendered unit file is left as it is."""
    dropin = env.sandbox.unit_dir / f"{env.name}-recover.timer.d"
    dropin.mkdir(exist_ok=True)
    (dropin / "fast.conf").write_text(
        f"[Timer]\nOnBootSec=\nOnUnitActiveSec=\nOnActiveSec={period}\nOnUnitActiveSec={period}\n"
        "AccuracySec=100ms\n"
    )
    env.sandbox.run("systemctl", "daemon-reload")
    env.sandbox.run("systemctl", "restart", f"{env.name}-recover.timer")


def test_timer_recovers_an_upgrade_killed_after_its_switch(make_env: MakeEnv) -> None:
    env = make_env(inside=True)
    timer, service = f"{env.name}-recover.timer", f"{env.name}-recover-timer.service"
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    assert (env.sandbox.unit_dir / "timers.target.wants" / timer).is_symlink()
    state = env.show(timer, "ActiveState", "SubState", "UnitFileState")
    assert (state["ActiveState"], state["SubState"], state["UnitFileState"]) == (
        "active", "waiting", "enabled")
    try:
        _fast_timer(env)
        # The timer fires by itself; with nothing open its run is the no-op and succeeds.
        poll(lambda: env.show(timer, "LastTriggerUSec")["LastTriggerUSec"] not in ("", "n/a", "0"),
             20.0, "the timer to fire")
        poll(lambda: env.show(service, "Result")["Result"] == "success", 20.0, "a successful timer run")

        op = "killed-after-switch"
        killed = env.upgrade(v2, op, env={"UPGRADE_AGENT_TEST_KILL_AFTER": "SwitchCommitted"})
        assert killed.code in (-9, 137), killed.stderr  # nsenter reports its child's SIGKILL as 128+9
        # What the kill left: the switch landed, nothing published. (The timer may already be at work.)
        assert env.link("current") == f"{env.name}-green"

        poll(lambda: env.result_file(op) is not None, CONVERGE_DEADLINE_S, "the timer's recovery to publish")
        poll(lambda: env.events(op)[-1:] == ["EpisodeClosed"], 20.0, "the episode to close")
        result = env.result_file(op)
        assert result is not None and result["result"] == "committed", result
        records = [r for r in env.journal() if r["episode"] == op]
        triggers = [r["event"]["trigger"] for r in records if r["event"]["_type"] == "RecoveryStarted"]
        assert triggers == ["timer"], triggers
        assert env.link("current") == f"{env.name}-green"
        env.assert_running("green", v2)
        status = env.cli("status")
        assert status.code == 0 and status.json is not None and status.json["episode"] is None, status
        assert env.show(service, "Result")["Result"] == "success"
        assert env.show(timer, "ActiveState")["ActiveState"] == "active"
    finally:
        shutil.rmtree(env.sandbox.unit_dir / f"{env.name}-recover.timer.d", ignore_errors=True)


def test_the_timer_switches_to_a_candidate_staged_outside_the_window_once_it_opens(make_env: MakeEnv) -> None:
    # ``upgrade --in-window`` outside the maintenance window stages 1.1.0 and leaves the switch to the timer;
    # the timer, firing by itself every 2 s, leaves it staged while the window is closed and activates it
    # (restart, health check, commit) once the configuration's window is open.
    at = datetime.now(UTC) + timedelta(hours=3)
    closed = f'[schedule]\nwindow = "*-*-* {at:%H:%M}:00 UTC"\nwindow_s = 600\n'
    env = make_env(inside=True, extra_config=closed)
    service = f"{env.name}-recover-timer.service"
    v1, v2 = env.release("1.0.0"), env.release("1.1.0")
    env.install(v1)
    staged = env.cli("upgrade", "--in-window", "--archive", v2.url, "--sha256", v2.sha256,
                     "--operation", "in-the-window")
    assert staged.code == 0 and staged.json is not None and staged.json["result"] == "staged", staged
    pid = env.assert_running("blue", v1)
    try:
        _fast_timer(env)
        # a run that began after this point and has ended (the next may already be running: the timer
        # fires every 2 s, and under load a run can outlast that, so "inactive now" may never be seen)
        def stamp(name: str) -> int:
            return int(env.show(service, name)[name])

        since = stamp("InactiveExitTimestampMonotonic")
        poll(lambda: stamp("InactiveEnterTimestampMonotonic") > since, 60.0,
             "a timer run with the window closed")
        assert env.show(service, "Result")["Result"] == "success"
        assert env.link("current") == f"{env.name}-blue"
        assert env.main_process()[0] == pid  # nothing restarted
        assert env.cli("status").json["staged"]["switch_in_window"] is True  # type: ignore[index]

        text = env.config.read_text().replace(closed, '[schedule]\nwindow = "*-*-* *:*:00"\nwindow_s = 600\n')
        env.config.write_text(text)  # a window every minute, ten long: open now
        poll(lambda: env.link("current") == f"{env.name}-green", CONVERGE_DEADLINE_S,
             "the timer to switch inside the window")
        poll(lambda: (env.cli("status").json or {}).get("episode", "open") is None, 60.0,
             "the activation to close")
        env.assert_running("green", v2)
        history = env.cli("history").json
        assert history is not None
        newest = history["episodes"][0]
        assert (newest["kind"], newest["result"], newest["to_version"]) == ("activate", "committed", "1.1.0")
        assert env.cli("status").json["staged"] is None  # type: ignore[index]
        assert env.show(service, "Result")["Result"] == "success"
    finally:
        shutil.rmtree(env.sandbox.unit_dir / f"{env.name}-recover.timer.d", ignore_errors=True)

"""``operator.idle`` (design §9): what ``upgrade-agent operator`` costs while it waits for work.

The real operator process (the installed venv's ``upgrade-agent``,
:func:`benchmarks._harness.installed_prefix`, as hosts run it) is started on a configuration whose source
holds ``ACKNOWLEDGED`` finished operations (each with its terminal status, so nothing is left to do), left to
settle, then observed for a bounded window (``UPGRADE_CORE_BENCH_IDLE_S``, default 120 s): CPU seconds of the
process and all its threads, read from its CPU-time clock (``clock_getcpuclockid(3)``, nanoseconds: the 10 ms
ticks of ``/proc/PID/stat`` are 7 % of the budget in a 120 s window, so one tick more or less moved the row
across it) and extrapolated to an hour (``cpu_ticks_s`` beside it is ``utime + stime`` of ``/proc/PID/stat``,
for comparison), and resident memory (``VmRSS`` at the end, ``VmHWM`` as the peak; ``Pss`` of ``smaps_rollup``
beside them, which divides the shared libraries among the processes that map them), and ``wakeups``: the
context switches of all its threads in the window (``/proc/PID/task/*/status``), one per wake-up of a sleeping
thread. Targets (``cpu_s_per_h`` and the peak RSS): the spool source <= 0.3 CPU s/h and <= 30 MiB, the
Kubernetes source <= 0.5 CPU s/h and <= 40 MiB; the row's value is the CPU rate, its baseline that budget
(target ratio 1), and ``met`` needs both. ``sleeper_cpu_s_per_h`` is a bare Python loop of ``time.sleep(2)``
measured in the same window, for context: on the benchmark VM a wake-up alone cost 0.2 to 1.1 ms of CPU (0.36
to 2.03 s/h at one wake every 2 s) within one day, with what its host was doing.

- ``operator.idle.spool``: the spool source on a local disk: it sleeps in inotify and reads the spool again
  every 60 s (``[operations] poll_s``, 2 s, applies only where inotify cannot see every writer).
- ``operator.idle.kubernetes``: the Kubernetes source watching the Kubernetes-aware mock API server of the
  tests on loopback (its own CPU is not counted), when the ``kubernetes`` extra is installed.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import _harness

ACKNOWLEDGED = 20
SETTLE_S = 5.0
BUDGETS = {"spool": (0.3, 30.0), "kubernetes": (0.5, 40.0)}
"""Source -> (CPU seconds per hour, RSS MiB) the idle operator may cost (design §9)."""
SLEEPER_S = 2.0
"""Seconds between the wake-ups of the bare sleeper measured beside the operator (the default poll_s)."""


def _window_s() -> float:
    return float(os.environ.get("UPGRADE_CORE_BENCH_IDLE_S", "120"))


def _cpu_ticks_s(pid: int) -> float:
    """``utime + stime`` of ``/proc/PID/stat`` (proc(5)), seconds, in 10 ms ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_clock(pid: int) -> int:
    """The process CPU-time clock of ``pid`` (every thread, exited ones included), from glibc's
    ``clock_getcpuclockid(3)``; Python's ``time`` offers only the per-thread one.

    Raises:
        OSError: the call failed (it returns the error number; it does not set errno).
    """
    libc = ctypes.CDLL(None)
    clock = ctypes.c_int()
    err = libc.clock_getcpuclockid(ctypes.c_int(pid), ctypes.byref(clock))
    if err:
        raise OSError(err, os.strerror(err))
    return clock.value


def _mem_mib(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    values = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return round(values["VmRSS"], 1), round(values["VmHWM"], 1)


def _wakeups(pid: int) -> int:
    """Context switches of every thread of ``pid`` so far (``voluntary_ctxt_switches`` +
    ``nonvoluntary_ctxt_switches`` of ``/proc/PID/task/*/status``): each wake-up of a sleeping thread is
    one."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        for line in status.splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def _pss_mib(pid: int) -> float:
    """Proportional set size (shared pages divided among their users), for the breakdown."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _config(work: Path, operations: str) -> Path:
    config = work / "bench-agent.toml"
    config.write_text(
        f"""[agent]
name = "bench-agent"

[host]
root = "{work}/root"
state_dir = "{work}/state"
lock_path = "{work}/run/bench-agent.lock"
unit_dir = "{work}/units"

[operations]
{operations}
"""
    )
    return config


def measure(config: Path, name: str, source: str, **extras: Any) -> dict[str, Any]:
    """Run ``upgrade-agent --config CONFIG operator``, let it settle, observe it for the window; one row."""
    # as hosts run it: the installed venv's entry script, an environment without PYTHON*
    argv = [_harness.installed("upgrade-agent"), "--config", str(config), "operator"]
    log = config.parent / "operator.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=_harness.clean_env(),
                                cwd=str(config.parent))
    sleeper: subprocess.Popen[bytes] | None = None
    try:
        # The VM's own cost of waking a sleeping Python process, in the same window: a bare loop of
        # ``time.sleep(SLEEPER_S)`` (context for the row, not part of its verdict).
        sleep_loop = f"import time\nwhile True: time.sleep({SLEEPER_S})"
        sleeper = subprocess.Popen([sys.executable, "-c", sleep_loop])
        time.sleep(SETTLE_S)
        if proc.poll() is not None:
            raise RuntimeError(f"operator exited {proc.returncode}: {log.read_text().strip()[-400:]}")
        window = _window_s()
        clock, sleeper_clock = _cpu_clock(proc.pid), _cpu_clock(sleeper.pid)
        start_cpu, start_ticks, start = time.clock_gettime(clock), _cpu_ticks_s(proc.pid), time.monotonic()
        start_wakeups = _wakeups(proc.pid)
        start_sleeper = time.clock_gettime(sleeper_clock)
        time.sleep(window)
        cpu, elapsed = time.clock_gettime(clock) - start_cpu, time.monotonic() - start
        sleeper_cpu = time.clock_gettime(sleeper_clock) - start_sleeper
        ticks = _cpu_ticks_s(proc.pid) - start_ticks
        wakeups = _wakeups(proc.pid) - start_wakeups
        rss, hwm = _mem_mib(proc.pid)
        pss = _pss_mib(proc.pid)
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait(timeout=5)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    per_hour = cpu / elapsed * 3600
    cpu_budget, rss_budget = BUDGETS[source]
    result = _harness.row(
        name, per_hour, "CPU s/h", f"budget {cpu_budget} CPU s/h", cpu_budget, 1.0,
        source=source, cpu_s_per_h=round(per_hour, 3), window_s=round(elapsed, 1), cpu_s=round(cpu, 4),
        cpu_ticks_s=round(ticks, 2), wakeups=wakeups, rss_mib=rss, peak_rss_mib=hwm,
        pss_mib=pss, rss_budget_mib=rss_budget, rss_met=hwm <= rss_budget,
        stopped_exit=proc.returncode, sleeper_cpu_s_per_h=round(sleeper_cpu / elapsed * 3600, 2),
        **extras,
    )
    result["met"] = result["met"] and result["rss_met"]
    return result


def idle_spool() -> dict[str, Any]:
    """``operator.idle.spool``: the spool source with ``ACKNOWLEDGED`` finished operations."""
    work = _harness.disk_dir("operator-idle-spool")
    spool = work / "spool"
    spool.mkdir(mode=0o700)
    for i in range(ACKNOWLEDGED):
        op = f"done-{i}"
        (spool / f"{op}.json").write_text(json.dumps({"agent": "bench-agent", "archive": {}}))
        status = {"operation": op, "phase": "Succeeded", "result": "committed"}
        (spool / f"{op}.status.json").write_text(json.dumps(status))
        for f in (spool / f"{op}.json", spool / f"{op}.status.json"):
            f.chmod(0o600)
    config = _config(work, f'source = "spool"\nspool_dir = "{spool}"\nnode_name = "bench-node"\n')
    try:
        return measure(config, "operator.idle.spool", "spool", operations=ACKNOWLEDGED, poll_s=2.0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def idle_kubernetes() -> dict[str, Any]:
    """``operator.idle.kubernetes``: the Kubernetes source watching ``ACKNOWLEDGED`` finished
    ``UpgradeOperation`` objects on the tests' mock API server (served by a thread of this process)."""
    from tests.kube.apiserver import kubeconfig_for, threaded

    work = _harness.disk_dir("operator-idle-kubernetes")
    with threaded() as kube:
        for i in range(ACKNOWLEDGED):
            body = {"apiVersion": "upgrades.upgrade-core.io/v1alpha1", "kind": "UpgradeOperation",
                    "metadata": {"name": f"done-{i}"},
                    "spec": {"nodeName": "bench-node", "agent": "bench-agent",
                             "archive": {"url": "https://releases.example/a.tar.gz", "sha256": "0" * 64}}}
            obj = kube.call(lambda api, b=body: api.put_object("default", b))

            def finish(o: dict[str, Any], uid: str = obj["metadata"]["uid"]) -> None:
                o["status"] = {"phase": "Succeeded", "operation": uid, "observedGeneration": 1}

            kube.call(lambda api, n=f"done-{i}", f=finish: api.mutate("default", n, f))
        kubeconfig = kubeconfig_for(kube.url, str(work / "kubeconfig"))
        config = _config(work, f'source = "kubernetes"\nnamespace = "default"\nnode_name = "bench-node"\n'
                               f'kubeconfig = "{kubeconfig}"\n')
        try:
            return measure(config, "operator.idle.kubernetes", "kubernetes", operations=ACKNOWLEDGED,
                           server="tests/kube/apiserver.py on loopback (its CPU not counted)")
        finally:
            shutil.rmtree(work, ignore_errors=True)


BENCHMARKS = {"operator.idle.spool": idle_spool, "operator.idle.kubernetes": idle_kubernetes}

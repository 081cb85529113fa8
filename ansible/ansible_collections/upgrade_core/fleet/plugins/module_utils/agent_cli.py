# Copyright: upgrade-core developers
# Apache License 2.0 (see the repository's pyproject.toml)
"""Run ``upgrade-agent ... --json`` on the managed host and read its one JSON object (design §7).

Shared by the ``upgrade_core.fleet.upgrade`` and ``upgrade_core.fleet.status`` modules; it runs inside the
module process on the managed host, so it uses only the standard library and Ansible's module_utils.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from typing import Any

# Exit codes of upgrade-agent (design §7 and 10); the names are what a failed task's message says.
EXIT_MEANINGS = {
    0: "committed or noop",
    1: "rolled back or aborted; the previous good binary runs",
    2: "usage or configuration error",
    3: "needs attention",
    4: "the host refused (permission, ownership, file type, read-only file system); nothing was changed",
    75: "busy: another upgrade holds the host lock",
    130: "interrupted",
}

# The keys of the agent's result object (design §7) that the ``upgrade`` and ``rollback`` modules return.
RESULT_KEYS = ("operation", "result", "from_version", "to_version", "slot", "reason")
# Results that fail the task: the host did not end on what the command was asked for (docs/recovery.md).
FAILED_RESULTS = ("rolled_back", "aborted", "needs_attention")

# After a timeout the agent gets SIGTERM (it aborts before the switch, or finishes after it) and this many
# seconds to print its result before SIGKILL.
TERM_GRACE_S = 60.0


class AgentRun:
    """One finished run of the agent.

    Attributes:
        argv: the command line that ran.
        code: its exit status (negative: killed by that signal).
        doc: the one JSON object it printed on stdout, or None when stdout held none.
        stderr: its stderr (progress and logs).
        timeout_s: the caller's timeout, seconds.
        timed_out: it was still running after ``timeout_s`` and was stopped.
    """

    def __init__(self, argv: list[str], code: int, doc: dict[str, Any] | None, stderr: str,
                 timeout_s: float, timed_out: bool) -> None:
        self.argv = argv
        self.code = code
        self.doc = doc
        self.stderr = stderr
        self.timeout_s = timeout_s
        self.timed_out = timed_out

    def error_line(self) -> str:
        """One line saying why this run failed: the agent's own ``error`` when it printed one, else the last
        line of stderr, else its exit status and what that status means."""
        meaning = EXIT_MEANINGS.get(self.code, "unexpected exit status")
        if self.timed_out:
            return (f"{self.argv[0]} did not finish within {self.timeout_s:g} s; it was sent SIGTERM and "
                    f"exited {self.code}")
        if self.doc is not None and self.doc.get("error"):
            return str(self.doc["error"]).strip().splitlines()[0]
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        if lines:
            return f"exit {self.code} ({meaning}): {lines[-1]}"
        return f"exit {self.code} ({meaning}) and no JSON result on stdout"


def resolve_executable(executable: str) -> str | None:
    """The absolute path of ``executable`` (a path, or a name looked up on the module's PATH); None if
    it names no executable file."""
    if os.sep in executable:
        return executable if os.path.isfile(executable) and os.access(executable, os.X_OK) else None
    return shutil.which(executable)


def agent_argument_spec() -> dict[str, dict[str, Any]]:
    """The argument spec of the options every module shares, ``config`` and ``executable`` (documented
    once, in the ``upgrade_core.fleet.agent`` doc fragment)."""
    return {
        "config": {"type": "path"},
        "executable": {"type": "str", "default": "upgrade-agent"},
    }


def checked_executable(module: Any) -> str:
    """The ``executable`` and ``timeout`` parameters both modules share, checked: the absolute path of
    ``upgrade-agent`` on the managed host. Fails the task with one line (``module.fail_json``) for a timeout
    that is not a positive number of seconds or an executable that cannot be found."""
    params = module.params
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout must be a positive number of seconds, not {params['timeout']}")
    executable = resolve_executable(params["executable"])
    if executable is None:
        module.fail_json(msg=f"upgrade-agent not found on the managed host: {params['executable']!r} is not "
                             "an executable file (nor a program on PATH); set the executable parameter")
        raise AssertionError("fail_json returned")  # it exits the module; this tells the type checker
    return executable


def run_agent(executable: str, config: str | None, args: list[str], timeout_s: float) -> AgentRun:
    """Run ``EXECUTABLE [--config CONFIG] --json ARGS`` and parse the single JSON object it prints.

    Args:
        executable: absolute path of ``upgrade-agent`` (see :func:`resolve_executable`).
        config: the agent's configuration file; None lets the agent pick its default.
        args: the subcommand and its options, e.g. ``["status"]``.
        timeout_s: seconds before the agent is sent SIGTERM (then SIGKILL after :data:`TERM_GRACE_S`).

    Returns:
        The finished run. Never raises for the agent's own failures; ``doc`` is None when stdout held no
        JSON object (e.g. the agent was killed).

    Raises:
        OSError: the executable could not be started.
    """
    argv = [executable, *(["--config", config] if config else []), "--json", *args]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace")
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    return AgentRun(argv, proc.returncode, _one_object(out), err, timeout_s, timed_out)


def preflight(module: Any, executable: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``ARGS --preflight`` (check mode of ``upgrade`` and ``rollback``: nothing fetched, created or
    locked on the host) and return the agent's preflight object (``plan``, ``inactive_slot``, ...).

    Fails the task with the agent's one-line error when it printed no preflight object."""
    run = run_agent(executable, module.params["config"], [*args, "--preflight"], timeout_s)
    if run.code != 0 or run.doc is None or not run.doc.get("preflight"):
        module.fail_json(msg=run.error_line(), exit_code=run.code, agent=run.doc or {}, stderr=run.stderr)
    if run.doc is None:  # fail_json exits; a stand-in module that returns gets an error, not None
        raise RuntimeError(run.error_line())
    return run.doc


def finish(module: Any, run: AgentRun, changed: bool | None = None, extra: dict[str, Any] | None = None
           ) -> None:
    """End the task with the agent's result (an ``upgrade`` or ``rollback`` run): the keys of
    :data:`RESULT_KEYS`, ``exit_code`` and the whole object as ``agent``.

    Fails it (``module.fail_json``) with one line when the agent printed no result, timed out, exited
    non-zero or reported one of :data:`FAILED_RESULTS` (the agent's reason, else its error line).

    Args:
        changed: the task's ``changed``; None means "the result is ``committed``".
        extra: more keys for a task that succeeds (``diff`` in diff mode).
    """
    doc = run.doc
    if doc is None or "result" not in doc or run.timed_out:
        module.fail_json(msg=run.error_line(), exit_code=run.code, agent=doc or {}, stderr=run.stderr)
    if doc is None:  # fail_json exits; a stand-in module that returns gets an error, not None
        raise RuntimeError(run.error_line())
    fields = {key: doc.get(key) for key in RESULT_KEYS}
    if doc["result"] in FAILED_RESULTS or run.code != 0:
        reason = doc.get("reason") or run.error_line()
        module.fail_json(msg=f"{doc['result']}: {reason}", exit_code=run.code, agent=doc, **fields)
    module.exit_json(changed=doc["result"] == "committed" if changed is None else changed,
                     exit_code=run.code, agent=doc, **fields, **(extra or {}))


def _one_object(stdout: str) -> dict[str, Any] | None:
    """The JSON object on stdout's last non-empty line (the agent prints exactly one), or None."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return None
    try:
        doc = json.loads(lines[-1])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None

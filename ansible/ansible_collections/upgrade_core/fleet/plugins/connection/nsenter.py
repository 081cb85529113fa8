# Copyright: upgrade-core developers
# Apache License 2.0 (see the repository's pyproject.toml)
"""Connection plugin ``upgrade_core.fleet.nsenter``: run tasks inside another process's namespaces.

Why a connection of our own: the hosts the collection's tests drive are private systemd instances on one
machine (``agent/testing/sandbox.py``), each the PID 1 of its own pid, mount, uts and ipc namespaces, with
no sshd to reach. ``ansible-core`` ships no connection that enters namespaces; the community one lives in a
collection that the ``ansible`` bundle carries (hundreds of megabytes) and enters every namespace of the
target (``--all``), which these sandboxes do not need. This plugin is small: every command, and every file
transfer, is one ``nsenter`` process, so what a task does happens in the host's own mount table, /run and
process tree, exactly as it would through ssh.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: nsenter
short_description: Run tasks inside the namespaces of a process on the controller's machine
version_added: "0.1.0"
description:
  - Runs every command of a task through C(nsenter -t PID -m -p -u -i -- /bin/sh -c COMMAND), so it runs in
    the mount, pid, uts and ipc namespaces of process PID (for example a private systemd that stands for a
    host); files are copied in and out through C(nsenter) as well.
  - Needs root on the controller's machine and C(nsenter) from util-linux.
author:
  - upgrade-core developers (@upgrade-core)
options:
  nsenter_pid:
    description:
      - The process whose namespaces the host's commands run in (its PID as the controller sees it).
    type: int
    required: true
    vars:
      - name: ansible_nsenter_pid
  nsenter_namespace:
    description:
      - The pid namespace process O(nsenter_pid) must be in, as C(readlink /proc/PID/ns/pid) prints it (for
        example C(pid:[4026532601])). A process in any other namespace, such as an unrelated one that reused
        the PID after the host stopped, is refused and the host reported unreachable.
    type: str
    vars:
      - name: ansible_nsenter_namespace
  nsenter_timeout:
    description:
      - Seconds one command or file transfer may take before it is killed and the task fails.
    type: int
    default: 3600
    vars:
      - name: ansible_nsenter_timeout
extends_documentation_fragment:
  - connection_pipelining
notes:
  - The remote user is ignored; commands run as the user running Ansible.
"""

import os
import shutil
import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

display = Display()

NAMESPACES = ("-m", "-p", "-u", "-i")


class Connection(ConnectionBase):
    """Commands and file transfers through ``nsenter`` into the namespaces of ``nsenter_pid``."""

    transport = "upgrade_core.fleet.nsenter"
    has_pipelining = True
    _connected: bool

    def _prefix(self) -> list[str]:
        """``nsenter -t PID -m -p -u -i --``.

        Raises:
            AnsibleConnectionFailure: PID is gone, is in another pid namespace than ``nsenter_namespace``, or
                is in the controller's own pid namespace (its commands would run on this machine itself).
        """
        pid = int(self.get_option("nsenter_pid"))
        try:
            namespace = os.readlink(f"/proc/{pid}/ns/pid") if pid > 0 else ""
        except OSError:
            namespace = ""
        if not namespace:
            raise AnsibleConnectionFailure(f"nsenter: process {pid} does not exist; the host is down")
        expected = self.get_option("nsenter_namespace")
        if expected and namespace != expected:
            raise AnsibleConnectionFailure(
                f"nsenter: process {pid} is in {namespace}, not {expected}; the host is down (PID reused)")
        if namespace == os.readlink("/proc/self/ns/pid"):
            raise AnsibleConnectionFailure(
                f"nsenter: process {pid} is in the controller's own pid namespace; refusing to run a host's "
                "commands on this machine itself (use the local connection for that)")
        nsenter = shutil.which("nsenter")
        if nsenter is None:
            raise AnsibleConnectionFailure("nsenter: the nsenter program (util-linux) is not on PATH")
        return [nsenter, "-t", str(pid), *NAMESPACES, "--"]

    def _connect(self) -> Connection:
        """Check that the target process exists; nothing stays open between commands."""
        if not self._connected:
            self._prefix()
            display.vvv(f"NSENTER CONNECTION TO PID {self.get_option('nsenter_pid')}",
                        host=self._play_context.remote_addr)
            self._connected = True
        return self

    def _run(self, argv: list[str], stdin: bytes | None) -> tuple[int, bytes, bytes]:
        """Run ``argv`` inside (after the nsenter prefix), bounded by ``nsenter_timeout`` seconds."""
        timeout_s = float(self.get_option("nsenter_timeout"))
        proc = subprocess.Popen([*self._prefix(), *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(stdin or b"", timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.communicate()
            raise AnsibleConnectionFailure(
                f"nsenter: {argv[0]} did not finish within {timeout_s:g} s") from exc
        return proc.returncode, out, err

    def exec_command(
        self, cmd: str, in_data: bytes | None = None, sudoable: bool = True
    ) -> tuple[int, bytes, bytes]:
        """Run the shell command ``cmd`` with ``/bin/sh -c`` inside; ``in_data`` is its stdin (pipelining)."""
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        display.vvv(f"EXEC {to_text(cmd)}", host=self._play_context.remote_addr)
        return self._run(["/bin/sh", "-c", to_text(cmd)], in_data)

    def put_file(self, in_path: str, out_path: str) -> None:
        """Copy the controller's ``in_path`` to ``out_path`` inside (``cat > out_path`` fed from it)."""
        super().put_file(in_path, out_path)
        display.vvv(f"PUT {in_path} TO {out_path}", host=self._play_context.remote_addr)
        try:
            with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as f:
                data = f.read()
        except FileNotFoundError as exc:
            raise AnsibleFileNotFound(f"file or module does not exist: {in_path}") from exc
        code, _out, err = self._run(["/bin/sh", "-c", 'cat > "$1"', "put", out_path], data)
        if code != 0:
            raise AnsibleError(f"nsenter: could not write {out_path}: {to_text(err).strip()}")

    def fetch_file(self, in_path: str, out_path: str) -> None:
        """Copy ``in_path`` inside to the controller's ``out_path``."""
        super().fetch_file(in_path, out_path)
        display.vvv(f"FETCH {in_path} TO {out_path}", host=self._play_context.remote_addr)
        code, out, err = self._run(["cat", "--", in_path], None)
        if code != 0:
            raise AnsibleError(f"nsenter: could not read {in_path}: {to_text(err).strip()}")
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as f:
            f.write(out)

    def close(self) -> None:
        """Nothing stays open between commands."""
        self._connected = False

"""Files that hold credentials the agent reads (a kubeconfig, the bearer token or client key it names): kept
from everyone but their owner.

The rule is OpenSSH's for a private key ("UNPROTECTED PRIVATE KEY FILE": a key readable by others is
refused, not used) and sshd's ``StrictModes`` for ownership: a credential file readable by group or others
has leaked already, and one writable by them, or owned by another user, lets them point a root-run agent at
a server of their choosing.
"""

from __future__ import annotations

import os
import stat

from upgrade_core.errors import HostRefusedError

__all__ = ["check_credential_file"]


def check_credential_file(path: str, what: str) -> None:
    """Refuse ``path`` unless it is owned by root or the effective user and has no permission bit for group
    or others (mode 0600 or stricter). A symlink is judged by its target (a mounted Secret is a chain of
    links); a path that does not exist or is not a regular file is left to the reader, which names it.

    Args:
        path: the credential file, as configured.
        what: what it is, for the message (``[operations] kubeconfig``, ``the kubeconfig's tokenFile``).

    Raises:
        HostRefusedError: exit 4, one line: ``<path>: <what> is readable or writable by group or others
            (mode 0644); make it mode 0600 ...; nothing was changed`` (or names the owner).
    """
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(st.st_mode):
        return
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        raise HostRefusedError(path, f"{what} is owned by uid {st.st_uid}: a credential file must be owned "
                                     "by root (or the user running this)")
    if mode & 0o077:
        raise HostRefusedError(path, f"{what} is readable or writable by group or others (mode {mode:04o}); "
                                     "a credential file must be mode 0600 or stricter (chmod 600)")

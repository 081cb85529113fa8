"""``[[mirrors]]`` entries as the host adapter copies to them: a fixed path, or a path inside the machine that
is active now (docs/configuration.md ``[[mirrors]]``, SPEC §12).

The seeds copied the agent's binary into the nspawn machine that was active (``kube1`` or ``kube2``, read from
the daemon's state) and copied again on rollback. Here an entry with ``active_from`` names a JSON file the
host keeps and ``active_key`` the JSON pointer (RFC 6901) of the active machine's root in it; ``path`` is then
relative to that root, and the root is the mirror tree the copy is confined beneath. The file is read at every
copy (:meth:`Mirror.resolve`): the switch copies to the machine active then, and a rollback re-syncs to the
machine active at the rollback.

Reading the file: its directories by the ancestor rule of docs/host.md (root's, not writable by others unless
sticky), the file itself regular, not a link, root's and not writable by group or others (it decides where
root writes), at most :data:`MAX_ACTIVE_FILE_BYTES`. The pointer is resolved by ``jsonpointer`` (the RFC
6901 reference implementation for Python); the value must be an absolute path without ``..``.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Final

import attrs

from agent.fs.regular import NotARegularFileError, UntrustedFileError, read_regular_file
from agent.fs.tree import check_ancestors
from agent.sanitize import clean_text
from upgrade_core.errors import ActiveMachineError, HostRefusedError

__all__ = ["MAX_ACTIVE_FILE_BYTES", "Mirror", "read_active_root"]

MAX_ACTIVE_FILE_BYTES: Final = 1 << 20
"""The largest ``active_from`` file read (bytes): a daemon's state document, not a data set."""


def read_active_root(active_from: str, active_key: str) -> str:
    """The active machine's root as ``active_from`` says at ``active_key`` (see the module doc).

    Args:
        active_from: absolute path of the JSON file.
        active_key: a JSON pointer (RFC 6901), e.g. ``/machines/active/root``.

    Returns:
        The root: an absolute, normalised path.

    Raises:
        HostRefusedError: a directory on the way, or the file, is not root's or is writable by others, or the
            file is a link, a FIFO or another non-regular file (exit 4).
        ActiveMachineError: the file is missing or unreadable, larger than :data:`MAX_ACTIVE_FILE_BYTES`,
            not JSON, or the pointer names nothing or no absolute path (exit 2; one line naming the file and
            the key).
    """
    where = f"{active_from} (mirrors active_key {active_key})"
    try:
        check_ancestors(active_from)
        data = read_regular_file(active_from, follow=False, limit=MAX_ACTIVE_FILE_BYTES + 1, trusted=True)
    except HostRefusedError:
        raise
    except (UntrustedFileError, NotARegularFileError) as e:
        raise HostRefusedError(active_from, f"{e.strerror}; not read as the active machine's file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise HostRefusedError(active_from, "is a symbolic link; not read as the active machine's file"
                                   ) from None
        if e.errno in (errno.EPERM, errno.EACCES):
            raise HostRefusedError(active_from, f"{e.strerror}; not read as the active machine's file"
                                   ) from None
        raise ActiveMachineError(f"{where}: cannot read it: {e.strerror or e}") from None
    if len(data) > MAX_ACTIVE_FILE_BYTES:
        raise ActiveMachineError(f"{where}: larger than {MAX_ACTIVE_FILE_BYTES} bytes")
    try:
        doc = json.loads(data)
    except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError
        raise ActiveMachineError(f"{where}: not JSON: {clean_text(e, 120)}") from None
    import jsonpointer  # loaded only by a configuration that names an active machine

    try:
        value = jsonpointer.resolve_pointer(doc, active_key)
    except jsonpointer.JsonPointerException as e:
        raise ActiveMachineError(f"{where}: {clean_text(e, 120)}") from None
    if not isinstance(value, str) or not os.path.isabs(value) or ".." in value.split("/"):
        shown = clean_text(json.dumps(value), 120)
        raise ActiveMachineError(f"{where}: names {shown}, not an absolute path of the active machine's root")
    return os.path.normpath(value)


@attrs.frozen
class Mirror:
    """One ``[[mirrors]]`` entry (:class:`agent.config.loader.MirrorEntry`'s fields).

    Attributes:
        path: the mirror file (absolute), or with ``active_from`` its path relative to the machine's root.
        root: the tree the copy is confined beneath ("" = ``path``'s directory; "" with ``active_from``).
        active_from / active_key: the JSON file and pointer naming the active machine's root, or "".
    """

    path: str
    root: str = ""
    active_from: str = ""
    active_key: str = ""

    def resolve(self) -> tuple[str, str]:
        """``(mirror file, tree root)`` now: for an active-machine entry the file is read again each call.

        Raises:
            HostRefusedError, ActiveMachineError: see :func:`read_active_root`.
        """
        if not self.active_from:
            return self.path, self.root or os.path.dirname(self.path)
        machine = read_active_root(self.active_from, self.active_key)
        return os.path.join(machine, self.path), machine

"""The agent's own errors: what an operator typed or configured (usage and configuration errors live
outside the pure core, which never sees a command line or a TOML file; docs/architecture.md, Errors).

Both subclass :class:`upgrade_core.errors.UpgradeError`, so the CLI maps every expected failure through
one ``exit_code`` attribute (design §7). This module imports nothing heavy: the boot-time no-op recovery
raises :class:`ConfigError` from its lean path.
"""

from __future__ import annotations

import errno
from typing import ClassVar

from agent.groups import sole_error
from journal.errors import (
    JournalBusyError,
    JournalCorruptError,
    JournalDecodeError,
    JournalFullError,
    JournalOwnerError,
    JournalPoisonedError,
    JournalRefusedError,
)
from journal.errors import JournalStoreError as StoreError
from upgrade_core.errors import (
    HostRefusedError,
    JournalDurabilityError,
    JournalUnreadableError,
    LockBusyError,
    UpgradeError,
)
from upgrade_core.errors import JournalError as CoreJournalError

__all__ = ["REFUSED_ERRNOS", "ConfigError", "UsageError", "describe_error", "journal_error"]


class ConfigError(UpgradeError):
    """The configuration file is missing, ambiguous, not TOML, or has an unknown key or a bad value.

    The message names the file and the dotted key (design §3). Exit 2.
    """

    exit_code: ClassVar[int] = 2


class UsageError(UpgradeError):
    """The command line or a caller's request is wrong: an unsupported source scheme, a malformed URL, a
    missing local archive, a bad digest, operation id or expected version. Nothing was locked, created or
    journaled. Exit 2."""

    exit_code: ClassVar[int] = 2


def journal_error(exc: Exception, directory: str) -> UpgradeError:
    """Translate a :mod:`journal` failure into the core's error of the same cause (exit 3), at this edge.

    A corrupt or undecodable record keeps its file and offset (:class:`JournalUnreadableError`); ENOSPC and
    a poisoning fsync error are :class:`JournalDurabilityError`; a path that is not ours is
    :class:`~upgrade_core.errors.HostRefusedError` (exit 4) and a directory another writer holds
    :class:`~upgrade_core.errors.LockBusyError` (exit 75); anything else (a newer format, a closed writer)
    keeps the journal's own message.
    """
    if isinstance(exc, JournalRefusedError):
        return HostRefusedError(exc.path or directory, exc.what)
    if isinstance(exc, JournalOwnerError):
        return ConfigError(str(exc))
    if isinstance(exc, JournalBusyError):
        return LockBusyError(
            f"{exc.path or directory}: journal directory locked by another writer (one writer per journal)"
        )
    if isinstance(exc, JournalCorruptError | JournalDecodeError):
        return JournalUnreadableError(exc.path or directory, exc.offset, exc.reason)
    if isinstance(exc, JournalFullError):
        return JournalDurabilityError(f"journal append failed, no space left: {exc}")
    if isinstance(exc, JournalPoisonedError):
        return JournalDurabilityError(f"journal append failed, journal poisoned: {exc}")
    return CoreJournalError(str(exc))


REFUSED_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO}
)
"""errno values of a raw ``OSError`` that mean "the host refused" (exit 4: permission, ownership, file type,
read-only file system; docs/design.md §10), not "rolled back or aborted" (exit 1 keeps only that meaning)."""


def describe_error(exc: BaseException) -> tuple[int | None, str]:
    """The exit code and one line for an exception that ends a command; ``(None, repr)`` for a bug.

    The one place an exit code is chosen: an :class:`~upgrade_core.errors.UpgradeError` (the core's and
    this module's) carries its own ``exit_code``; a raw journal error is first translated by
    :func:`journal_error`; a raw ``OSError`` exits 4 when its errno is in :data:`REFUSED_ERRNOS`, else 1. A
    single error inside an exception group (from a task group) stands for the group.

    Returns:
        ``(exit code, one line)``, or ``(None, repr(exc))`` for an exception no rule covers (a bug: the
        caller re-raises it).
    """
    exc = sole_error(exc)
    if isinstance(exc, StoreError):
        exc = journal_error(exc, exc.path or "?")
    if isinstance(exc, UpgradeError):
        return exc.exit_code, str(exc)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        if exc.errno in REFUSED_ERRNOS:
            code = HostRefusedError.exit_code
            return code, f"{where}{exc.strerror or exc}; the host refused, nothing was changed"
        return 1, f"{where}{exc.strerror or exc}"
    return None, repr(exc)

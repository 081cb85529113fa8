"""The agent's own errors: what an operator typed or configured (usage and configuration errors live
outside the pure core, which never sees a command line or a TOML file; docs/architecture.md, Errors).

Both subclass :class:`upgrade_core.errors.UpgradeError`, so the CLI maps every expected failure through
one ``exit_code`` attribute (design §7). This module imports nothing heavy: the boot-time no-op recovery
raises :class:`ConfigError` from its lean path.
"""

from __future__ import annotations

from typing import ClassVar

from journal.errors import (
    JournalBusyError,
    JournalCorruptError,
    JournalDecodeError,
    JournalFullError,
    JournalPoisonedError,
    JournalRefusedError,
)
from upgrade_core.errors import (
    HostRefusedError,
    JournalDurabilityError,
    JournalUnreadableError,
    LockBusyError,
    UpgradeError,
)
from upgrade_core.errors import JournalError as CoreJournalError

__all__ = ["ConfigError", "UsageError", "journal_error"]


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

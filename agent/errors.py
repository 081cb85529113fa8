"""The agent's own errors: what an operator typed or configured (issue 9: usage and configuration errors
live outside the pure core, which never sees a command line or a TOML file).

Both subclass :class:`upgrade_core.errors.UpgradeError`, so the CLI maps every expected failure through
one ``exit_code`` attribute (SPEC 7). This module imports nothing heavy: the boot-time no-op recovery
raises :class:`ConfigError` from its lean path.
"""

from __future__ import annotations

from typing import ClassVar

from upgrade_core.errors import UpgradeError

__all__ = ["ConfigError", "UsageError"]


class ConfigError(UpgradeError):
    """The configuration file is missing, ambiguous, not TOML, or has an unknown key or a bad value.

    The message names the file and the dotted key (SPEC 3). Exit 2.
    """

    exit_code: ClassVar[int] = 2


class UsageError(UpgradeError):
    """The command line or a caller's request is wrong: an unsupported source scheme, a malformed URL, a
    missing local archive, a bad digest, operation id or expected version. Nothing was locked, created or
    journaled. Exit 2."""

    exit_code: ClassVar[int] = 2

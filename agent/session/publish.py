"""The publisher's side of a release, for the command line: ``delta make`` (docs/delta.md).

Needs no configuration and touches no host: it reads two files and writes one.
"""

from __future__ import annotations

from agent.errors import UsageError
from agent.release.delta import DeltaMade
from agent.release.delta import make_delta as _make

__all__ = ["DeltaMade", "make_delta"]


def make_delta(old: str, new: str, out: str) -> DeltaMade:
    """Write at ``out`` the zstd patch-from delta of ``new`` against ``old`` (see
    :func:`agent.release.delta.make_delta`).

    Raises:
        UsageError: ``old`` or ``new`` cannot be read or is empty, or ``out`` cannot be written (exit 2,
            one line naming the file); ``out`` is as before then.
    """
    try:
        return _make(old, new, out)
    except OSError as exc:
        raise UsageError(f"delta make: {exc.filename or out}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"delta make: {exc}") from None

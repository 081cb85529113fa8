"""Where the system manager looks for unit files (systemd.unit(5), "Unit File Load Path", system mode), as
constants: the configuration's path rules and ``install`` both need them, and the boot path's quick reader
must not load more than the standard library to use them.
"""

from __future__ import annotations

__all__ = ["SYSTEM_UNIT_DIRS"]

SYSTEM_UNIT_DIRS = (
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/etc/systemd/system",
    "/etc/systemd/system.attached",
    "/run/systemd/system",
    "/run/systemd/system.attached",
    "/run/systemd/generator",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
    "/run/systemd/generator.late",
)
"""The system manager's unit directories, highest priority first (systemd.unit(5); ``/lib/systemd/system``
is where Debian's packages still put units)."""

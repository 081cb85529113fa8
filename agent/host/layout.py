"""Path arithmetic of the host layout (design §3), no I/O.

For an agent NAME under host root R::

    R/lib/NAME/NAME-blue, R/lib/NAME/NAME-green     the two slots (regular files, 0755)
    R/lib/NAME/NAME-current -> NAME-blue|NAME-green  bare, relative target; ExecStart runs it
    R/lib/NAME/NAME-last-good -> NAME-blue|...      the slot to roll back to
    R/bin/NAME -> ../lib/NAME/NAME-current           compatibility path
    R/lib/NAME/.NAME-<slot>.stage-<hex>              staging temp; the only pattern ever swept

Link targets are relative so that the layout still resolves when R is mounted elsewhere (a rescue view,
case C14).
"""

from __future__ import annotations

import os
import re
import secrets

import attrs

from upgrade_core import SLOTS, Slot

__all__ = ["Layout"]


@attrs.frozen
class Layout:
    """Where every file of agent ``name`` lives under host root ``root``.

    Attributes:
        root: the host root R, absolute (possibly a symlink to a legacy root).
        name: the agent name NAME (already validated by the configuration).
    """

    root: str
    name: str

    @property
    def lib_dir(self) -> str:
        """``R/lib``."""
        return os.path.join(self.root, "lib")

    @property
    def bin_dir(self) -> str:
        """``R/bin``."""
        return os.path.join(self.root, "bin")

    @property
    def agent_dir(self) -> str:
        """``R/lib/NAME``: the slots, the links and the staging files (one filesystem, one directory)."""
        return os.path.join(self.root, "lib", self.name)

    def slot_target(self, slot: Slot) -> str:
        """The bare link target naming ``slot``: ``NAME-<slot>``."""
        return f"{self.name}-{slot}"

    def slot_path(self, slot: Slot) -> str:
        """``R/lib/NAME/NAME-<slot>``."""
        return os.path.join(self.agent_dir, self.slot_target(slot))

    @property
    def current_link(self) -> str:
        """``R/lib/NAME/NAME-current``."""
        return os.path.join(self.agent_dir, f"{self.name}-current")

    @property
    def last_good_link(self) -> str:
        """``R/lib/NAME/NAME-last-good``."""
        return os.path.join(self.agent_dir, f"{self.name}-last-good")

    @property
    def bin_link(self) -> str:
        """``R/bin/NAME``."""
        return os.path.join(self.bin_dir, self.name)

    @property
    def bin_link_target(self) -> str:
        """The relative target of ``R/bin/NAME``: ``../lib/NAME/NAME-current``."""
        return f"../lib/{self.name}/{self.name}-current"

    def slot_of_target(self, target: str) -> Slot | None:
        """The slot a bare link target names, or None when it names no slot."""
        for slot in SLOTS:
            if target == self.slot_target(slot):
                return slot
        return None

    @property
    def _staging_re(self) -> re.Pattern[str]:
        return re.compile(rf"\.{re.escape(self.name)}-(blue|green)\.stage-[0-9a-f]{{1,64}}")

    def new_staging_path(self, slot: Slot) -> str:
        """A fresh ``R/lib/NAME/.NAME-<slot>.stage-<16 hex>`` path (not created)."""
        return os.path.join(self.agent_dir, f".{self.name}-{slot}.stage-{secrets.token_hex(8)}")

    def staging_slot(self, basename: str) -> Slot | None:
        """The slot a staging file name is for, or None when ``basename`` is not a staging name."""
        m = self._staging_re.fullmatch(basename)
        if m is None:
            return None
        return "blue" if m.group(1) == "blue" else "green"

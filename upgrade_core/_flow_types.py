"""The values the flows take and hand back, besides the journal's own events.

What a caller passes in: the operation-id rule (:data:`OPERATION_ID_RE`), the :class:`Policy` knobs and an
:class:`UpgradeRequest`. What a flow returns when it does not end with an
:class:`~upgrade_core.UpgradeResult`: :class:`RestartScheduled`, :class:`HandedOff` and
:class:`ResumeOutcome`. Plain frozen values: nothing here does I/O or touches the journal.
"""

from __future__ import annotations

import re
from typing import Final, Literal

import attrs

from ._events import UpgradeResult

OPERATION_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""The operation-id rule (design §4.3 step 1): use ``OPERATION_ID_RE.fullmatch(value)``. The one copy."""


@attrs.frozen
class Policy:
    """The knobs the flows need (from the ``[agent]``, ``[health]`` and ``[journal]`` config sections).

    Attributes:
        agent: NAME, used in transient unit names.
        unit: the agent unit, e.g. ``demo-agent.service``.
        stability_s: seconds the new process must hold every health condition.
        health_timeout_s: seconds per health attempt.
        max_attempts: health attempts per episode (recorded in ``EpisodeOpened``).
        poll_interval_s: the longest gap between health samples, seconds (design §4.3 step 7: 0.25); waits
            for a restart job or a first healthy sample start with shorter gaps (:func:`backoff_gap`).
        keep_episodes: closed episodes the journal keeps (compaction; informational here).
    """

    agent: str
    unit: str
    stability_s: float = 3.0
    health_timeout_s: float = 60.0
    max_attempts: int = 3
    poll_interval_s: float = 0.25
    keep_episodes: int = 50

    def __attrs_post_init__(self) -> None:
        if self.max_attempts < 1 or self.stability_s < 0 or self.health_timeout_s <= 0:
            raise ValueError("Policy: max_attempts >= 1, stability_s >= 0 and health_timeout_s > 0")


@attrs.frozen
class UpgradeRequest:
    """One upgrade (or install) request.

    Attributes:
        operation: the operation id, ``[A-Za-z0-9._-]{1,64}``.
        source: the archive URL or path as given; only :class:`ArchiveSource` sees it (it may hold secrets).
        source_redacted: the same without userinfo, query or fragment; the only form journaled (C08).
        expected_sha256: 64 lowercase hex of the compressed archive, or None.
        expected_version: ``--expect-version``, or None.
        signature: ``--signature``, the release signature's source as given (may hold secrets; the agent's
            archive source reads it, the core never journals it), or None for ``<archive>.minisig``.
        retry_known_bad: ``--retry-known-bad``: offer a candidate whose digest the journal knows as bad
            (docs/trust.md) anyway; otherwise it is refused after staging, before the switch.
        stage: ``upgrade --stage``: stop once the verified candidate is installed in the inactive slot
            (``StagedForActivation``, result ``staged``); ``activate`` switches to it later.
        switch_in_window: with ``stage``: the host was outside its maintenance window, so the recovery
            timer switches to the candidate once the window opens (``StagedForActivation.switch_in_window``).

    Raises:
        ValueError: an operation id not matching :data:`OPERATION_ID_RE` (caller misuse: the agent
            validates user input first and raises its own usage error).
    """

    operation: str
    source: str
    source_redacted: str
    expected_sha256: str | None = None
    expected_version: str | None = None
    signature: str | None = None
    retry_known_bad: bool = False
    stage: bool = False
    switch_in_window: bool = False

    def __attrs_post_init__(self) -> None:
        if not OPERATION_ID_RE.fullmatch(self.operation):
            raise ValueError(f"operation id {self.operation!r} must match {OPERATION_ID_RE.pattern}")


@attrs.frozen
class RestartScheduled:
    """The self-upgrade flow switched and scheduled its own restart (design §4.4); the episode stays open.

    Attributes:
        operation: the episode.
        unit: the transient restart unit's name.
    """

    operation: str
    unit: str


@attrs.frozen
class HandedOff:
    """A ``boot`` recovery handed the health check to a transient unit (design §4.5); the episode stays open.

    That unit (``recover-agent-upgrade --trigger manual``, ordered after the agent unit) owns the episode
    from now on; the caller reports ``handed_off`` and exits 0.

    Attributes:
        operation: the open episode.
        unit: the transient unit's name.
    """

    operation: str
    unit: str


@attrs.frozen
class ResumeOutcome:
    """What :func:`resume_self_upgrade` found.

    Attributes:
        status: ``none`` (nothing to resume: serve), ``committed`` (serve), or ``failed`` (exit non-zero
            without serving; systemd's restart and ``OnFailure=`` take it from there).
        result: the published result when the episode closed, else None.
        reason: one line for ``failed``.
        attempts_left: candidate attempts left after this one.
    """

    status: Literal["none", "committed", "failed"]
    result: UpgradeResult | None = None
    reason: str | None = None
    attempts_left: int = 0


__all__ = ["OPERATION_ID_RE", "HandedOff", "Policy", "RestartScheduled", "ResumeOutcome", "UpgradeRequest"]

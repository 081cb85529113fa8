"""The anti-rollback watermark's rules (docs/trust.md), pure: numbers in, a refusal line or None out.

The watermark is the highest ``security_version`` of a signed release ever committed on the host
(:attr:`~upgrade_core._fold.JournalView.security_watermark`). Once there is one, nothing may take the host
below it without a deliberate act: a signed release below it is refused (equal is a re-release at the same
level), an unsigned release is refused (it carries no security version, so it could be anything, which is
how stripping a signature rolled hosts back), and an operator ``rollback`` to a ``last-good`` below it, or of
unknown level, needs ``--below-watermark`` (RAUC refuses such a late fallback, Android's verified boot keeps
a rollback index for the same reason). ``upgrade-agent trust reset`` is the one way to clear the watermark.
"""

from __future__ import annotations

from ._events import Slot

__all__ = ["release_refusal", "rollback_refusal"]

RESET_HINT = "upgrade-agent trust reset clears the watermark"


def release_refusal(watermark: int | None, security_version: int | None) -> str | None:
    """Why a release offered to ``upgrade``/``install`` is refused by the watermark, or None.

    Args:
        watermark: the host's watermark, None when it has none.
        security_version: the release's signed ``security_version``; None for an unsigned release.

    Returns:
        The abort reason (exit 1), or None when the release may go on.
    """
    if watermark is None:
        return None
    if security_version is None:
        return (
            f"release is unsigned and this host's watermark is {watermark}: only signed releases are "
            f"accepted ({RESET_HINT})"
        )
    if security_version < watermark:
        return f"security version {security_version} is below this host's watermark {watermark}"
    return None


def rollback_refusal(watermark: int | None, slot: Slot, security_version: int | None) -> str | None:
    """Why an operator rollback to ``last-good`` (``slot``) is refused by the watermark, or None; the
    refusal names the override, ``--below-watermark``, which the caller honours (and journals).

    Args:
        watermark: the host's watermark, None when it has none.
        slot: the slot ``last-good`` names.
        security_version: the signed security version of the bytes ``slot`` holds (looked up by their
            sha256), None when the journal knows none (an unsigned or adopted release, or a journal that
            was quarantined since).

    Returns:
        The abort reason (exit 1), or None when the rollback may go on.
    """
    if watermark is None:
        return None
    override = f"--below-watermark to roll back anyway, or {RESET_HINT}"
    if security_version is None:
        return (
            f"last-good {slot} has no known security version and this host's watermark is {watermark}; "
            f"{override}"
        )
    if security_version < watermark:
        return (
            f"last-good {slot} has security version {security_version}, below this host's watermark "
            f"{watermark}; {override}"
        )
    return None

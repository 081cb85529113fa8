"""Exception groups from anyio task groups, reduced to the one error they stand for.

A task group wraps its children's errors in a ``BaseExceptionGroup`` even when only one child failed; the
CLI maps exceptions to one line and an exit code (design §7), and the extractor's worker/producer pair must
surface the one meaningful error, so both unwrap the same way here.
"""

from __future__ import annotations

__all__ = ["leaves", "sole_error"]


def leaves(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc`` (nested groups flattened), or ``[exc]`` for a plain one."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


def sole_error(
    exc: BaseException,
    *,
    ignore: tuple[type[BaseException], ...] = (),
    prefer: type[Exception] | None = None,
) -> BaseException:
    """The one error ``exc`` stands for; ``exc`` itself when it is not a group or no single error stands out.

    Args:
        exc: any exception, typically a task group's ``BaseExceptionGroup``.
        ignore: leaf types that only echo the real failure (e.g. the extractor's internal stream abort).
        prefer: when every remaining ``Exception`` leaf is of this type, the first one wins even if there
            are several (the worker and the producer may both report the same cause).

    Returns:
        ``exc`` unchanged if it is not a group; otherwise the preferred leaf, else the only remaining leaf,
        else ``exc`` (several unrelated failures: the group is the truth).
    """
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    kept = [e for e in leaves(exc) if not isinstance(e, ignore)]
    if prefer is not None:
        chosen = [e for e in kept if isinstance(e, prefer)]
        if chosen and len(chosen) == len([e for e in kept if isinstance(e, Exception)]):
            return chosen[0]
    if len(kept) == 1:
        return kept[0]
    return exc

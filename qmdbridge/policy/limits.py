"""The numbers a caller may pass to ``memory_search`` and ``memory_get``, checked the same way for
every backend (the manager) and by the one-shot CLI search before it answers on its own."""

from __future__ import annotations

from fallback.errors import UsageError

__all__ = ["MAX_LIMIT", "check_search_limits"]

# Upper bound of counts and line numbers a caller may pass (keeps JSON integers in range).
MAX_LIMIT = 2**31 - 1


def check_search_limits(max_results: int | None, min_score: float | None) -> None:
    """Check ``memory_search``'s optional limits.

    Args:
        max_results: hits wanted, ``1..MAX_LIMIT``, or ``None`` (the configured default).
        min_score: score floor in ``[0, 1]``, or ``None`` (the configured default).

    Raises:
        UsageError: ``max results must be between 1 and 2147483647`` or ``min score must be
            between 0 and 1``.
    """
    if max_results is not None and not 1 <= max_results <= MAX_LIMIT:
        raise UsageError(f"max results must be between 1 and {MAX_LIMIT}")
    if min_score is not None and not 0.0 <= min_score <= 1.0:
        raise UsageError("min score must be between 0 and 1")

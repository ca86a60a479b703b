"""Checks of a search request's arguments that every edge and backend share (standard library only)."""

from __future__ import annotations

from fallback.errors import UsageError

__all__ = ["require_query"]


def require_query(query: object) -> str:
    """The query with surrounding whitespace stripped, for a search.

    Args:
        query: the caller's query (any value: it comes from JSON, argv or a library call).

    Returns:
        The stripped text, never empty.

    Raises:
        UsageError: ``query must be a string, not <type>`` or ``query must not be empty``.
    """
    if not isinstance(query, str):
        raise UsageError(f"query must be a string, not {type(query).__name__}")
    text = query.strip()
    if not text:
        raise UsageError("query must not be empty")
    return text

"""Citations: a hit's ``path#La-Lb`` and the ``Source:`` footer (spec 9, 2.13).

Whether the footer is shown (``memory.citations``: ``auto`` | ``on`` | ``off``, by chat type)
is :func:`qmdbridge.policy.scope.citations_enabled`; the manager decorates every backend's
hits with these two functions, and so does the one-shot CLI search.
"""

from __future__ import annotations

__all__ = ["cited_snippet", "format_citation"]


def format_citation(path: str, start_line: int, end_line: int) -> str:
    """``path#La`` when one line, else ``path#La-Lb`` (spec 9); lines are 1-based inclusive."""
    if start_line == end_line:
        return f"{path}#L{start_line}"
    return f"{path}#L{start_line}-L{end_line}"


def cited_snippet(snippet: str, citation: str, *, include: bool) -> str:
    """The snippet an agent reads: with ``include``, stripped and followed by a blank line and
    ``Source: <citation>``; otherwise unchanged."""
    return f"{snippet.strip()}\n\nSource: {citation}" if include else snippet

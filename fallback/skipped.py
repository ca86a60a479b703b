"""``SkippedFile``: a file that discovery or indexing skipped (or indexed with a caveat), and why.

A plain frozen dataclass, not a pydantic model like its neighbours in ``fallback/models.py``
(which re-exports it and nests it in ``MemoryStatus.skipped``, dumped as ``{path, reason}``):
discovery produces it, and discovery runs on the one-shot search path, which loads no pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SkippedFile"]


@dataclass(frozen=True)
class SkippedFile:
    """A file seen but not indexed (symlink, too large, unreadable, hidden ...), or indexed with
    a caveat (invalid UTF-8 replaced, NUL bytes stripped, a name shown with escapes).

    Attributes:
        path: workspace-relative path with ``/`` separators (the printable form of a name that
            is not UTF-8).
        reason: one line saying why.
    """

    path: str
    reason: str

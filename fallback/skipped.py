"""``SkippedFile``: a file that discovery or indexing skipped (or indexed with a caveat), and why.

A plain dataclass (discovery runs on the one-shot search path, which loads no pydantic).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SkippedFile"]


@dataclass(frozen=True)
class SkippedFile:
    """A file seen but not indexed, or indexed with a caveat: its workspace-relative
    (printable) ``path`` and a one-line ``reason``."""

    path: str
    reason: str

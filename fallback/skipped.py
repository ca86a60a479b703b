"""``SkippedFile``: a file that discovery or indexing skipped (or indexed with a caveat), and
why; :data:`DEFAULT_MAX_FILE_BYTES`: the default size above which discovery skips a file.

A plain dataclass (discovery runs on the one-shot search path, which loads no pydantic).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_FILE_BYTES", "SkippedFile"]

# Files above this size (10 MiB) are not memory notes; indexing them would only bloat the store.
DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class SkippedFile:
    """A file seen but not indexed, or indexed with a caveat: its workspace-relative
    (printable) ``path`` and a one-line ``reason``."""

    path: str
    reason: str

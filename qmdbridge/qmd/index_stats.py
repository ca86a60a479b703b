"""qmd's index read-only: how many active documents each collection holds (standard library only,
for the one-shot CLI's prefetch; ``parse.IndexCounts`` caches it for the backend)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__ = ["file_stamp", "index_counts"]

log = logging.getLogger("qmdbridge.qmd.backend")


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """``(mtime_ns, size, inode)`` of one of qmd's files, or ``None`` when it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def index_counts(db: Path, *, log_errors: bool = True) -> tuple[dict[str, int], str | None]:
    """Active documents per collection in qmd's index: ``({collection: n}, error or None)``; a
    missing index is ``({}, None)``, an unreadable one logged (unless ``log_errors`` is False:
    the prefetch runs before logging is configured), never raised."""
    import sqlite3

    if not db.is_file():
        return {}, None
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)  # busy wait 1 s
        try:
            rows = conn.execute("SELECT collection, COUNT(*) FROM documents WHERE active = 1 "
                                "GROUP BY collection").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if log_errors:
            log.warning("failed to read qmd index stats: %s", exc)
        return {}, f"failed to read qmd index stats: {exc}"
    return {str(c): int(n) for c, n in rows}, None

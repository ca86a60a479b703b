"""qmd's index read-only: how many active documents each collection holds.

Standard library and ``fallback.store.errors`` only, so the one-shot CLI can read it before it
loads anything heavy (``qmdbridge/cli/qmd_prefetch.py``); ``parse.IndexCounts`` caches it for the
backend.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from fallback.store.errors import is_locked

__all__ = ["index_counts", "index_locked"]

log = logging.getLogger("qmdbridge.qmd.backend")


def index_counts(db: Path, *, log_errors: bool = True) -> tuple[dict[str, int], str | None]:
    """Active documents per collection in qmd's index: ``({collection: n}, error or None)``.

    A missing index is ``({}, None)``; an unreadable one ``({}, "failed to read qmd index
    stats: ...")`` (logged unless ``log_errors`` is False, never raised). The one-shot CLI's
    prefetch thread reads it before logging is configured, where a warning would reach stderr
    through logging's last-resort handler: it passes False.
    """
    if not db.is_file():
        return {}, None
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
        try:
            conn.execute("PRAGMA busy_timeout = 1000")
            rows = conn.execute("SELECT collection, COUNT(*) FROM documents WHERE active = 1 "
                                "GROUP BY collection").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if log_errors:
            log.warning("failed to read qmd index stats: %s", exc)
        return {}, f"failed to read qmd index stats: {exc}"
    return {str(c): int(n) for c, n in rows}, None


def index_locked(db: Path) -> bool:
    """Whether a writer holds qmd's index so that no search can read it now (an exclusive lock:
    ``qmd embed`` or ``qmd update`` writing, a WAL checkpoint): one read with no busy wait
    fails with "database is locked". ``False`` for a missing or otherwise unreadable index."""
    if not db.is_file():
        return False
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0)
        try:
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return is_locked(exc)  # by SQLite's result code, never by message
    return False

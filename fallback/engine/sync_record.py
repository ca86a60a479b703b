"""The failure of the last sync and of the last search's query embedding, each kept in a small
file beside the store so that every process's status sees it (a one-shot ``status`` after a
failed ``index`` or a search that answered keyword-only, a ``serve`` after a failed boot sync),
even when the store itself cannot take one more row (a full disk).

The files are ``<store>.sync-failed.json`` and ``<store>.query-failed.json``: ``{"reason",
"error", "errorType", "atMs"}``; a successful sync (a query embedded) removes its file. Writing
is best effort: when the disk is too full for even this file, status still tells the files
that wait (``fallback/engine/status.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from fallback.fs.atomic import write_atomic

__all__ = ["FAILED_SUFFIX", "QUERY_FAILED_SUFFIX", "clear_failure", "read_failure", "record_failure"]

# Suffixes of the records beside the store file: the last sync's, the last query embedding's.
FAILED_SUFFIX = ".sync-failed.json"
QUERY_FAILED_SUFFIX = ".query-failed.json"

log = logging.getLogger(__name__)


def record_failure(db_path: Path, *, reason: str, error: BaseException | str, at_ms: int,
                   suffix: str = FAILED_SUFFIX) -> None:
    """Keep the failure of a sync (``suffix``: of a query embedding) beside the store (blocking;
    never raises).

    Args:
        db_path: the store file.
        reason: why the sync ran (``cli``, ``watch``, ``search`` ...).
        error: what it failed with (an exception's class name is kept as ``errorType``), or
            the one line that says it.
        at_ms: when, epoch ms.
        suffix: :data:`FAILED_SUFFIX` or :data:`QUERY_FAILED_SUFFIX`.
    """
    doc = {"reason": reason, "error": str(error), "atMs": at_ms,
           "errorType": type(error).__name__ if isinstance(error, BaseException) else None}
    try:
        write_atomic(db_path.with_name(db_path.name + suffix), json.dumps(doc).encode(),
                     durable=False)
    except OSError as exc:  # the disk may be too full for this file too
        log.warning("cannot record the failed sync beside %s: %s", db_path, exc)


def clear_failure(db_path: Path, suffix: str = FAILED_SUFFIX) -> None:
    """Remove the record after a successful sync (``suffix``: query embedding); blocking,
    never raises."""
    with contextlib.suppress(OSError):
        db_path.with_name(db_path.name + suffix).unlink(missing_ok=True)


def read_failure(db_path: Path, suffix: str = FAILED_SUFFIX) -> dict[str, Any] | None:
    """The recorded failure ``{"reason", "error", "errorType", "atMs"}``, or ``None`` when the
    last sync (``suffix``: query embedding) succeeded or none failed; an unreadable record
    reads as ``None``."""
    try:
        doc = json.loads(db_path.with_name(db_path.name + suffix).read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("error"), str) else None

"""The failure of the last sync and of the last search's query embedding, each kept beside the
SQLite store (``<store>.sync-failed.json``, ``<store>.query-failed.json``) so every process's
status sees it; a success removes its file. On the postgres store the query's failure is kept
in the store (``EngineStore.keep_query_failure``), in the same shape (:func:`failure_doc`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from fallback.fs.atomic import write_atomic

__all__ = ["FAILED_SUFFIX", "QUERY_FAILED_SUFFIX", "clear_failure", "failure_doc", "read_failure",
           "record_failure"]

# Suffixes of the records beside the store file: the last sync's, the last query embedding's.
FAILED_SUFFIX = ".sync-failed.json"
QUERY_FAILED_SUFFIX = ".query-failed.json"

log = logging.getLogger(__name__)


def record_failure(db_path: Path, *, reason: str, error: BaseException | str, at_ms: int,
                   suffix: str = FAILED_SUFFIX) -> None:
    """Keep the failure (``error``: an exception, its class kept as ``errorType``, or one line)
    of a sync run for ``reason`` at ``at_ms`` (epoch ms) beside the store ``db_path``, in the
    record ``suffix`` names (blocking; never raises)."""
    try:
        write_atomic(db_path.with_name(db_path.name + suffix),
                     json.dumps(failure_doc(reason=reason, error=error, at_ms=at_ms)).encode(), durable=False)
    except OSError as exc:  # the disk may be too full for this file too
        log.warning("cannot record the failed sync beside %s: %s", db_path, exc)


def failure_doc(*, reason: str, error: BaseException | str, at_ms: int) -> dict[str, Any]:
    """A failure as recorded: ``{"reason", "error", "errorType", "atMs"}`` (arguments as
    :func:`record_failure`'s)."""
    return {"reason": reason, "error": str(error), "atMs": at_ms,
            "errorType": type(error).__name__ if isinstance(error, BaseException) else None}


def clear_failure(db_path: Path, suffix: str = FAILED_SUFFIX) -> None:
    """Remove the record ``suffix`` names after a success (blocking; never raises)."""
    with contextlib.suppress(OSError):
        db_path.with_name(db_path.name + suffix).unlink(missing_ok=True)


def read_failure(db_path: Path, suffix: str = FAILED_SUFFIX) -> dict[str, Any] | None:
    """The recorded failure ``{"reason", "error", "errorType", "atMs"}``, or ``None`` (none, or
    unreadable)."""
    try:
        doc = json.loads(db_path.with_name(db_path.name + suffix).read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("error"), str) else None

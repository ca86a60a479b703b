"""The failure of the last sync, kept in a small file beside the store so that every process's
status sees it (a one-shot ``status`` after a failed ``index``, a ``serve`` after a failed
boot sync), even when the store itself cannot take one more row (a full disk).

The file is ``<store>.sync-failed.json``: ``{"reason", "error", "errorType", "atMs"}``; a
successful sync removes it. Writing it is best effort: when the disk is too full for even this
file, status still tells the files that wait (``fallback/engine/status.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from fallback.fs.atomic import write_atomic

__all__ = ["FAILED_SUFFIX", "clear_failure", "read_failure", "record_failure"]

# Suffix of the record beside the store file.
FAILED_SUFFIX = ".sync-failed.json"

log = logging.getLogger(__name__)


def _record_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + FAILED_SUFFIX)


def record_failure(db_path: Path, *, reason: str, error: BaseException, at_ms: int) -> None:
    """Keep the failure of a sync beside the store (blocking; never raises).

    Args:
        db_path: the store file.
        reason: why the sync ran (``cli``, ``watch``, ``search`` ...).
        error: what it failed with (its class name is kept as ``errorType``).
        at_ms: when, epoch ms.
    """
    doc = {"reason": reason, "error": str(error), "errorType": type(error).__name__, "atMs": at_ms}
    try:
        write_atomic(_record_path(db_path), json.dumps(doc).encode(), durable=False)
    except OSError as exc:  # the disk may be too full for this file too
        log.warning("cannot record the failed sync beside %s: %s", db_path, exc)


def clear_failure(db_path: Path) -> None:
    """Remove the record after a successful sync (blocking; never raises)."""
    with contextlib.suppress(OSError):
        _record_path(db_path).unlink(missing_ok=True)


def read_failure(db_path: Path) -> dict[str, Any] | None:
    """The recorded failure ``{"reason", "error", "errorType", "atMs"}``, or ``None`` when the
    last sync succeeded (or none failed); an unreadable record reads as ``None``."""
    try:
        doc = json.loads(_record_path(db_path).read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("error"), str) else None

"""The failure of the last sync and of the last search's query embedding, as recorded (one shape
for both stores, :func:`failure_doc`), and their records beside the SQLite store
(``<store>.sync-failed.json``, ``<store>.query-failed.json``). ``EngineStore.keep_failure``
decides where a record goes (on postgres: the store).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from fallback.fs.atomic import write_atomic

__all__ = ["FailureKind", "failure_doc", "read_failure", "write_failure"]

# What failed: the last sync, or the last search's query embedding.
FailureKind = Literal["sync", "query"]


def failure_doc(*, reason: str, error: BaseException | str, at_ms: int) -> dict[str, Any]:
    """A failure as recorded: ``{"reason", "error", "errorType", "atMs"}`` of why the sync ran
    (``search`` for a query embedding), the exception (its class as ``errorType``) or one line,
    and when it failed (epoch ms)."""
    return {"reason": reason, "error": str(error), "atMs": at_ms,
            "errorType": type(error).__name__ if isinstance(error, BaseException) else None}


def _path(db_path: Path, kind: FailureKind) -> Path:
    return db_path.with_name(f"{db_path.name}.{kind}-failed.json")


def write_failure(db_path: Path, kind: FailureKind, doc: Mapping[str, Any] | None) -> None:
    """Keep ``doc`` (:func:`failure_doc`) as the ``kind`` record beside the store ``db_path``;
    ``None`` removes it (blocking). Raises ``OSError``: it cannot be written."""
    if doc is None:
        with contextlib.suppress(FileNotFoundError):
            _path(db_path, kind).unlink()
        return
    write_atomic(_path(db_path, kind), json.dumps(doc).encode(), durable=False)


def read_failure(db_path: Path, kind: FailureKind) -> Any:
    """The ``kind`` record beside the store ``db_path`` as parsed, or ``None`` (none, or not
    JSON; blocking)."""
    try:
        return json.loads(_path(db_path, kind).read_bytes())
    except (OSError, ValueError):
        return None

"""Keyword search of an index that is in sync: one read-only connection, blocking, no pydantic or anyio.

:func:`stale_reason` says whether the engine's pre-search sync would write (the sync planner's
:func:`~fallback.index.plan.scan_change` among others); when it would not, :func:`search_in_sync`
answers with the engine's own keyword steps. Keyword-only search of the ``memory`` source.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from fallback.index.identity import WORKSPACE_META, full_reindex_reason, other_workspace
from fallback.index.plan import recorded_files, scan_change
from fallback.index.racy import SCAN_STARTED_META
from fallback.request import SearchRequest
from fallback.search.fts_only import Hit, candidate_count, keyword_search
from fallback.sources.memory_files import ExtraPathEntry, list_memory_files
from fallback.store.files import has_leftovers
from fallback.store.migrations import META_KEY, MIGRATIONS
from fallback.store.readonly import ReadOnlyStore

__all__ = ["ExtraPathValue", "InSyncSettings", "search_in_sync", "stale_reason"]


@dataclass(frozen=True)
class InSyncSettings:
    """What a keyword-only search of one agent's index reads, as plain values: the SQLite
    store, the absolute workspace, ``extraPaths``, discovery's size cap in bytes, the index
    identity without a provider, ``sync.onSearch``, the ``query.*`` defaults and the temporal
    decay half-life in days (``None``: off)."""

    db_path: Path
    workspace_dir: Path
    extra_paths: Sequence[ExtraPathEntry]
    max_file_bytes: int
    identity: dict[str, Any]
    sync_on_search: bool
    max_results: int
    min_score: float
    candidate_multiplier: float
    half_life_days: int | None

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict (camelCase keys); :meth:`from_json` reads it back."""
        return {
            "dbPath": str(self.db_path), "workspaceDir": str(self.workspace_dir),
            "extraPaths": [p if isinstance(p, str) else {"path": p.path, "pattern": p.pattern}
                           for p in self.extra_paths],
            "maxFileBytes": self.max_file_bytes, "identity": self.identity,
            "syncOnSearch": self.sync_on_search, "maxResults": self.max_results,
            "minScore": self.min_score, "candidateMultiplier": self.candidate_multiplier,
            "halfLifeDays": self.half_life_days,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> InSyncSettings:
        """Settings from :meth:`to_json`'s dict. Raises ``KeyError`` / ``TypeError`` /
        ``ValueError``: a key is missing or has the wrong shape."""
        return cls(
            db_path=Path(doc["dbPath"]), workspace_dir=Path(doc["workspaceDir"]),
            extra_paths=[p if isinstance(p, str) else ExtraPathValue(
                str(p["path"]), None if p["pattern"] is None else str(p["pattern"]))
                for p in doc["extraPaths"]],
            max_file_bytes=int(doc["maxFileBytes"]), identity=dict(doc["identity"]),
            sync_on_search=bool(doc["syncOnSearch"]), max_results=int(doc["maxResults"]),
            min_score=float(doc["minScore"]),
            candidate_multiplier=float(doc["candidateMultiplier"]),
            half_life_days=None if doc["halfLifeDays"] is None else int(doc["halfLifeDays"]))


class ExtraPathValue(NamedTuple):
    """An ``extraPaths[]`` entry in object form as a plain value (``pattern`` ``None``: ``**/*.md``)."""

    path: str
    pattern: str | None


def stale_reason(index: ReadOnlyStore, settings: InSyncSettings) -> str | None:
    """Why the engine's pre-search sync would change the index (one line: ``schema version 7
    (latest 8)``, a ``full_reindex_reason``, ``no FTS5``, ``leftovers of a killed rebuild``,
    ``index holds workspace /other``, ``index is empty``, a ``scan_change``), or ``None`` when
    it is in sync. Raises ``IndexStoreError``."""
    version = index.user_version()
    if version != len(MIGRATIONS):
        return f"schema version {version} (latest {len(MIGRATIONS)})"
    reason = full_reindex_reason(index.get_meta_json(META_KEY), settings.identity)
    if reason is not None:
        return reason
    if index.fts_error is not None:
        return "no FTS5"
    if has_leftovers(index.path):
        return "leftovers of a killed rebuild"
    held = other_workspace(index.get_meta_json(WORKSPACE_META), str(settings.workspace_dir))
    if held is not None:  # the engine re-indexes the store for this workspace, and says so
        return f"index holds workspace {held}"
    if not settings.sync_on_search:  # the engine syncs only an empty index before a search
        return None if index.has_chunks() else "index is empty"
    started = index.get_meta_json(SCAN_STARTED_META)
    found = list_memory_files(settings.workspace_dir, settings.extra_paths,
                              max_file_bytes=settings.max_file_bytes)
    return scan_change(found, recorded_files(index, "memory"),
                       last_started=started if isinstance(started, int) else None,
                       stored_issues=index.get_meta_json("scan_issues"))


def search_in_sync(index: ReadOnlyStore, settings: InSyncSettings, request: SearchRequest, *,
                   now_ms: int | None = None) -> list[Hit]:
    """The hits, best first, of the keyword-only search of ``index`` as the engine answers
    ``request`` in FTS-only mode (:func:`~fallback.search.fts_only.keyword_search`, decay at
    ``now_ms``, epoch ms, default now); the caller checks :func:`stale_reason` first. Raises
    ``IndexStoreError``."""
    limit, floor = request.limits(settings.max_results, settings.min_score)
    return keyword_search(
        index, request.query, sources=["memory"], limit=limit,
        candidates=candidate_count(limit, settings.candidate_multiplier), floor=floor,
        half_life_days=settings.half_life_days,
        now_ms=int(time.time() * 1000) if now_ms is None else now_ms).hits

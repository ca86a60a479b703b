"""The qmd backend's status document: counters from qmd's index and qmd's health, as ``MemoryStatus``.

Split from ``qmdbridge/qmd/backend.py``, which gathers what it reads (documents per collection,
the search probe, the watcher) and calls :func:`status_document`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fallback.models import MemoryStatus, Source, SourceCount
from qmdbridge.qmd.runner import is_busy
from qmdbridge.qmd.search_calls import VEC0_HINT

if TYPE_CHECKING:
    from qmdbridge.qmd.backend import QmdBackend

__all__ = ["status_document"]


def status_document(backend: QmdBackend, *, counts: Mapping[str, int], count_error: str | None,
                    probe: str | None, dead_watcher: str | None,
                    model_problem: str | None = None, indexing: str | None = None) -> MemoryStatus:
    """The status of ``backend`` (see :meth:`QmdBackend.status`).

    Args:
        backend: the qmd backend.
        counts: active documents per collection in qmd's index.
        count_error: why qmd's index could not be counted, or ``None``.
        probe: why the search probe failed (one line), or ``None`` when qmd answered.
        dead_watcher: why the file watcher is dead (it is being re-armed), or ``None``.
        model_problem: why the searches of the configured mode cannot load their models
            (``models.model_problem``), or ``None`` (also in ``search`` mode, which needs none).
        indexing: ``indexing in progress (...)`` while qmd's index is being written
            (``update.indexing_in_progress``): ``dirty`` with that reason, and an index read
            that found it locked is no problem.

    Returns:
        ``files`` and ``chunks`` are qmd's documents, ``healthy`` is false when the probe
        failed or the last update or search failed, ``custom.qmd`` holds qmd's own state.
    """
    mode = backend.mode_override or backend.cfg.search_mode
    by_source: dict[Source, int] = {}
    for coll, n in counts.items():
        src = backend.roots[coll].source if coll in backend.roots else "memory"
        by_source[src] = by_source.get(src, 0) + n
    total = sum(counts.values())
    embed = backend.cycle.embed
    sources: list[Source] = sorted({c.source for c in backend.collections}) or ["memory"]
    # a lost or corrupt index first: the searches answer from the builtin engine until it is re-indexed
    unusable = backend.reconcile_state.no_usable_collection(backend.collections)
    issues = (([backend.health.problem] if backend.health.problem else [])
              + ([unusable] if unusable else [])
              + list(backend.reconcile_state.warnings) + [f"qmd start-up: {p}" for p in backend.startup_problems]
              + backend.hit_problems + ([VEC0_HINT] if backend.mode_override else [])
              + ([f"qmd search probe failed: {probe}"] if probe else []) + ([count_error] if count_error and not (indexing and is_busy(count_error)) else [])
              + ([f"qmd {mode} searches cannot run: {model_problem}"] if model_problem else []))
    last_error = (f"qmd search probe failed: {probe}" if probe else None) or unusable or (
        backend.cycle.last_error or backend.last_error)
    return MemoryStatus(
        backend="qmd", agent_id=backend.agent.agent_id, workspace_dir=str(backend.agent.workspace_dir),
        db_path=str(backend.home.index_db), files=total, chunks=total, provider="qmd",
        requested_provider="qmd", model="qmd", search_mode=backend.mode_override or backend.cfg.search_mode,
        sources=sources,
        source_counts=[SourceCount(source=s, files=n, chunks=n) for s, n in sorted(by_source.items())],
        vector={"enabled": backend.cfg.search_mode != "search"}, issues=issues,
        last_sync_at_ms=backend.cycle.last_update_at, healthy=last_error is None,
        last_error=last_error,
        dirty=bool(indexing or (backend.freshness and (backend.freshness.dirty or dead_watcher))),
        dirty_reason=(f"watcher dead: {dead_watcher}; re-arming" if dead_watcher else indexing
                      or (backend.freshness.dirty_reason if backend.freshness else None)),
        custom={"qmd": {
            "binary": str(backend.location.path), "version": getattr(backend.location, "version", None),
            "collections": len(backend.collections),
            "collectionNames": [c.name for c in backend.collections],
            "lastUpdateAt": backend.cycle.last_update_at, "embedFailures": embed.failures,
            "embedBackoffUntil": embed.backoff_until, "searchMode": backend.cfg.search_mode,
            "searchFallbackReason": backend.search_fallback_reason, "lastError": last_error,
            "refusedCollections": dict(backend.reconcile_state.refused),
            "searchModeOverride": backend.mode_override,
            "searchProbe": {"ok": probe is None, "error": probe},
            "lastSearchError": backend.last_search_error,
            "freshness": backend.freshness.snapshot() if backend.freshness else None,
            "warm": backend.warm.describe() if backend.warm is not None else {
                "enabled": False, "state": "off", "reason": "one-shot commands spawn qmd"
                if backend.mode == "cli" else "memory.qmd.mcp.enabled is false"},
            "indexProblem": backend.health.problem, "modelProblem": model_problem,
            "indexing": indexing,
            "startup": {"problems": list(backend.startup_problems)}}})

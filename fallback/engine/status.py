"""Builds the builtin engine's ``MemoryStatus`` from its store and runtime state (spec §11)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fallback.engine.query_vector import backlog_reason, read_index_vectors
from fallback.index.identity import WORKSPACE_META, other_workspace
from fallback.index.indexer import FTS_ONLY_MODEL, full_reindex_reason, index_identity
from fallback.index.plan import read_reason, recorded_files
from fallback.models import MemoryStatus, SourceCount
from fallback.search.pipeline import configured_mode
from fallback.search.substring import SUBSTRING_WARNING
from fallback.settings import EngineSettings
from fallback.skipped import SkippedFile
from fallback.sources.memory_files import describe_extra_path, list_memory_files, memory_roots
from fallback.store.db import META_KEY, ReadonlyRecovery, Store
from fallback.store.readonly import MetaReads, ReadOnlyStore
from fallback.text.counts import counted

if TYPE_CHECKING:
    from fallback.embeddings.base import EmbeddingProvider

__all__ = ["CJK_SCHEME", "build_postgres_status", "build_status", "files_waiting"]

# How the CJK substring search works (reported in status; see fallback/search/fts.py).
CJK_SCHEME = "trigram+like"


def files_waiting(store: MetaReads, settings: EngineSettings) -> int:
    """Memory files the index does not hold as they are on disk (blocking; stats every memory
    file): new or changed files (a file indexed with a caveat is indexed) plus indexed files
    that are gone; skipped files do not wait. Raises ``IndexStoreError``."""
    if "memory" not in settings.search.sources:
        return 0
    s = settings.search
    found = list_memory_files(settings.workspace_dir, s.extra_paths, max_file_bytes=s.max_file_bytes)
    recorded = recorded_files(store, "memory")
    skipped = {path for path, _, _ in recorded.skips} - set(recorded.rows)  # caveats have a row
    changed = sum(1 for f in found.files if f.rel_path not in skipped
                  and read_reason(f, recorded, last_started=None) in ("new", "changed"))
    return changed + len(set(recorded.rows) - {f.rel_path for f in found.files})


def build_status(store: Store | ReadOnlyStore, *, backend: str, settings: EngineSettings, selection: Any,
                 vector: dict[str, Any] | None, dirty: bool, dirty_reason: str | None,
                 last_error: str | None, synced: bool = True, live: Any = None,
                 notes: list[str] | None = None, provider_error: str | None = None,
                 sync_failure: dict[str, Any] | None = None) -> MemoryStatus:
    """The status read from the open ``store`` (a :class:`ReadOnlyStore` while it cannot be
    written; blocking): dirty for a degraded watcher, changes not indexed yet, chunks waiting
    for vectors, files waiting after a failed sync (``custom.filesWaiting``), a pending rebuild
    or another workspace; one ``source_counts`` entry per enabled source.

    Args:
        backend / settings / selection: backend name, engine settings, ``ProviderSelection``.
        vector: the vector index status when a provider exists, else ``None``.
        dirty / dirty_reason: the engine's own stale flag and why (``not synced yet`` before
            this process ``synced`` is dirty only for a store without an index, spec §5.1).
        last_error / provider_error: this engine's last error, the last query embedding's.
        live: ``LiveSync.snapshot()`` in live mode; ``notes``: one-off events for ``issues``.
        sync_failure: the last sync's failure as any process recorded it, or ``None``.

    Raises ``IndexStoreError``.
    """
    s = settings.search
    provider = selection.provider
    meta = store.get_meta_json(META_KEY)
    if dirty and not synced and dirty_reason == "not synced yet":
        dirty = meta is None
    nfiles, nchunks, cache_entries = store.index_counts()
    counts = {src: (nfiles.get(src, 0), nchunks.get(src, 0)) for src in s.sources}
    skipped = [SkippedFile(path=p, reason=r) for p, r, *_ in store.skip_rows()]
    issues = store.get_meta_json("scan_issues") or []
    last_sync = store.get_meta_json("last_sync_at_ms")
    fts_error = store.fts_error
    degraded = live.degraded_reason if live is not None else None
    stale = live.stale_reason if live is not None else None  # changes seen, not indexed yet
    if stale and not dirty:
        dirty, dirty_reason = True, f"index stale: {stale}"
    index = read_index_vectors(store)  # the backlog and vectorDims of the index meta
    pending = index.pending if provider is not None and index.pending > 0 else 0
    embed_error = index.error if pending else None
    if pending:  # chunks without a vector: the index is not complete until a sync fills them in
        dirty, dirty_reason = True, backlog_reason(pending, embed_error)
    waiting = files_waiting(store, settings) if sync_failure else 0  # a walk: only when it matters
    if waiting and not dirty:
        dirty, dirty_reason = True, f"{counted(waiting, 'file', 'wait')} to be indexed"
    custom: dict[str, Any] = {"model": provider.model if provider else FTS_ONLY_MODEL,
                              "readonlyRecovery": (store.readonly_recovery if isinstance(store, Store)
                                                   else ReadonlyRecovery()).as_dict(),
                              "filesWaiting": waiting, "indexStale": stale,
                              "syncFailure": sync_failure and {**sync_failure, "filesWaiting": waiting},
                              **(live.custom if live is not None else {})}
    if vector is not None:  # the vector index learns its dims on the first query
        vector = {**vector, "dims": vector.get("dims") or index.dims, "pending": pending}
    rebuild = (None if selection.error or meta is None
               else full_reindex_reason(meta, index_identity(settings, provider)))
    if rebuild is not None:
        dirty, dirty_reason = True, f"rebuild pending: {rebuild}"
    held = other_workspace(store.get_meta_json(WORKSPACE_META), str(settings.workspace_dir))
    if held is not None:  # the counts are another workspace's: the next search re-indexes
        dirty, dirty_reason = True, f"index holds workspace {held}"
    common = _common(backend, settings, selection, cache_entries, vector=vector,
                     provider_error=embed_error or provider_error, last_error=last_error,
                     sync_failure=sync_failure)
    return MemoryStatus(
        **common, db_path=str(store.path),
        files=sum(c[0] for c in counts.values()), chunks=sum(c[1] for c in counts.values()),
        dirty=dirty or degraded is not None,
        dirty_reason=degraded or (dirty_reason if dirty else None),
        source_counts=[SourceCount(source=src, files=f, chunks=c)
                       for src, (f, c) in counts.items()],
        fts={"enabled": common["search_mode"] != "vector-only",
             "available": fts_error is None, "tokenizer": store.fts_tokenizer,
             "error": fts_error, "cjk": CJK_SCHEME,
             "keyword": "bm25" if fts_error is None else "substring"},
        skipped=skipped, issues=[str(i) for i in issues] + list(notes or []) + (
            [SUBSTRING_WARNING.format(error=fts_error)] if fts_error is not None else []),
        last_sync_at_ms=int(last_sync) if isinstance(last_sync, (int, float)) else None,
        custom=custom)


def _common(backend: str, settings: EngineSettings, selection: Any, cache_entries: int, *,
            vector: dict[str, Any] | None, provider_error: str | None,
            last_error: str | None, sync_failure: dict[str, Any] | None) -> dict[str, Any]:
    """The status fields both stores fill alike (arguments as :func:`build_status`'s; the
    recorded ``sync_failure`` is the ``last_error`` when this engine has none); ``healthy``
    without error, provider failure or missing model."""
    s, provider = settings.search, selection.provider
    model_missing = provider.model_problem() if provider is not None else None
    provider_error = provider_error if provider is not None else None
    if sync_failure is not None and last_error is None:  # failed in another process (`index`)
        last_error = f"sync ({sync_failure.get('reason')}) failed: {sync_failure['error']}"
    return {"backend": backend, "agent_id": settings.agent_id,
            "search_mode": "unavailable" if selection.error and provider is None else configured_mode(
                has_provider=provider is not None and model_missing is None,
                hybrid_enabled=s.query.hybrid.enabled),
            "workspace_dir": str(settings.workspace_dir),
            "provider": "none" if provider is None else provider.provider_id,
            "model": None if provider is None else provider.model,
            "requested_provider": selection.requested or s.provider,
            "provider_unavailable_reason": selection.error or selection.unavailable_reason,
            "roots": [{"kind": r.kind, "path": str(r.entry), "pattern": r.pattern,
                       "exists": os.path.lexists(r.entry)}
                      for r in memory_roots(settings.workspace_dir, s.extra_paths)],
            "sources": list(s.sources),
            "extra_paths": [describe_extra_path(e) for e in s.extra_paths],
            "cache": {"enabled": s.cache.enabled, "entries": cache_entries,
                      "maxEntries": s.cache.max_entries},
            "vector": _no_vectors(settings, selection) if provider is None else {
                **(vector or _no_vectors(settings, selection)), "providerError": provider_error,
                "modelMissing": model_missing},
            "healthy": last_error is None and provider_error is None and model_missing is None,
            "last_error": last_error}


def _no_vectors(settings: EngineSettings, selection: Any) -> dict[str, Any]:
    """The ``vector`` view of an engine without an embedding provider (``selection``: its
    ``ProviderSelection``), on either store."""
    return {"enabled": settings.search.store.vector.enabled, "available": False, "mode": "disabled",
            "reason": selection.unavailable_reason or "no embedding provider (FTS-only mode)",
            "dims": None}


def unreached_postgres(settings: EngineSettings) -> dict[str, Any]:
    """What :func:`build_postgres_status` shows of a postgres store no connection reached: the
    target (no password), the schema, ``schemaVersion`` ``None``, nothing counted. Raises
    ``ConfigError``: the DSN cannot be parsed."""
    from fallback.store.postgres.target import resolve_target

    st = settings.search.store
    target = resolve_target(st.dsn, schema=st.schema_)
    return {"driver": "postgres", "target": target.redact(target.describe()), "schema": target.schema,
            "schemaVersion": None, "generation": None, "counts": {}, "lastSyncAtMs": None,
            "cacheEntries": 0, "vectorDims": None, "unspacedWithoutTrigrams": 0, "skipped": [],
            "sharedScopes": []}


def untrigrammed_issue(chunks: int) -> list[str]:
    """The issue of a postgres index with ``chunks`` published chunks of Thai, Lao, Khmer or
    Myanmar text written before those scripts were searched as substrings (``[]`` for none)."""
    if not chunks:
        return []
    return [f"{counted(chunks, 'chunk')} of Thai, Lao, Khmer or Myanmar text indexed before those"
            " scripts were searched as substrings: a word inside their sentences is not found"
            " until their file changes or `qmdbridge index --force` runs"]


def build_postgres_status(described: dict[str, Any], *, backend: str, settings: EngineSettings,
                          selection: Any, dirty: bool,
                          dirty_reason: str | None, last_error: str | None,
                          issues: list[str], provider_error: str | None = None,
                          sync_failure: dict[str, Any] | None = None) -> MemoryStatus:
    """The status of an engine on the postgres store from ``PostgresSearchStore.describe()``
    (``described``): counts of the published index, ``db_path`` as ``postgres <target>, schema
    <name> version <n>`` (no password), ``custom.store`` the description, ``skipped`` what the
    published sync skipped, whichever process ran it; ``issues``: what this process's last sync
    noticed; other arguments as :func:`build_status`'s (``filesWaiting`` is not counted)."""
    s = settings.search
    provider: EmbeddingProvider | None = selection.provider
    if dirty and dirty_reason == "not synced yet" and described["lastSyncAtMs"] is not None:
        dirty = False  # another process published a sync: as on SQLite, only no index is dirty
    counts = described["counts"]
    per = [SourceCount(source=src, files=counts.get(src, {}).get("files", 0),
                       chunks=counts.get(src, {}).get("chunks", 0)) for src in s.sources]
    common = _common(backend, settings, selection, described["cacheEntries"], vector=None if provider is None else {
        "enabled": True, "available": True, "mode": "pgvector", "reason": None, "dims": described["vectorDims"]},
        provider_error=provider_error, last_error=last_error, sync_failure=sync_failure)
    return MemoryStatus(
        **common, db_path=(f"postgres {described['target']}, schema {described['schema']}" + (
            " (not reached)" if described["schemaVersion"] is None else
            f" version {described['schemaVersion']}")), files=sum(c.files for c in per),
        chunks=sum(c.chunks for c in per), dirty=dirty, dirty_reason=dirty_reason if dirty else None,
        source_counts=per,
        fts={"enabled": common["search_mode"] != "vector-only", "available": True, "tokenizer": "unicode61",
             "error": None, "cjk": CJK_SCHEME, "keyword": "bm25"},
        skipped=[SkippedFile(path=f["path"], reason=f["reason"]) for f in described["skipped"]],
        issues=[*issues, *untrigrammed_issue(described["unspacedWithoutTrigrams"])],
        last_sync_at_ms=described["lastSyncAtMs"],
        custom={"store": described,
                "syncFailure": sync_failure and {**sync_failure, "filesWaiting": None}})

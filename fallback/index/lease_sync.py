"""Index sync into a store that writes through a sync lease (the postgres store): one sync of an
agent's workspace at a time across hosts, chunked and embedded as the SQLite sync does,
published at once (readers see the whole sync or nothing).
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio

from fallback.errors import MemorySearchError
from fallback.index import embedding_cache
from fallback.index.embedding_step import EmbeddingStep
from fallback.index.identity import FTS_ONLY_MODEL
from fallback.index.indexer import discover, file_chunks, read_file
from fallback.index.report import SyncReport
from fallback.settings import EngineSettings
from fallback.skipped import SkippedFile
from fallback.sources.memory_files import MemoryFile
from fallback.store.errors import IndexStoreLockedError
from fallback.store.fts_rows import note_title
from fallback.text.terms import derived_terms

if TYPE_CHECKING:
    from fallback.embeddings.base import EmbeddingProvider
    from fallback.store.postgres.seam import PostgresSearchStore
    from fallback.store.postgres.store import FileRows
    from fallback.text.chunking import Chunk

log = logging.getLogger(__name__)

__all__ = ["WRITE_BATCH_FILES", "sync_through_lease"]

# How long a sync waits for another host's sync of the same agent and workspace, ms.
LEASE_WAIT_MS = 30_000
# Files handed to the store per write_files call (the postgres lease gathers them into writes of
# store.WRITE_CHUNKS chunks, each in a fixed number of statements).
WRITE_BATCH_FILES = 25


def held_hash(content_hash: str, *, model: str, complete: bool) -> str:
    """What the lease records as a file's hash: its content hash (keyword-only), with the
    embedding ``model`` appended, or a mark no content hash equals while it is not
    ``complete``."""
    if not complete:
        return f"{content_hash} pending"
    return content_hash if model == FTS_ONLY_MODEL else f"{content_hash} {model}"


def sync_through_lease(settings: EngineSettings, store: PostgresSearchStore, *, force: bool = False,
                       wait_ms: int = LEASE_WAIT_MS, provider: EmbeddingProvider | None = None,
                       embed_deadline: float | None = None) -> SyncReport:
    """Bring the store's index of ``settings``' workspace up to date (blocking: run it in an
    anyio worker thread).

    Args:
        force: rewrite every file, whatever the lease holds.
        wait_ms: longest wait for another sync's lease, ms.
        provider: the embedding provider, or ``None`` (keyword rows only).
        embed_deadline: anyio clock time after which the provider is not called (``None``).

    Returns: The :class:`SyncReport` (every file is read: the lease compares content hashes).

    Raises:
        IndexStoreLockedError: another sync held the lease past ``wait_ms`` (named).
        PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError: the database failed
            (nothing of this sync is published).
    """
    from fallback.store.postgres.store import ChunkRow, FileRows

    s = settings.search
    report = SyncReport(full=force, full_reason="force" if force else None)
    found, transcripts, report.issues = discover(settings)
    skipped: list[SkippedFile] = list(found.skipped)
    files: list[MemoryFile] = [*found.files, *transcripts]
    report.files_total = len(files)
    model = provider.model if provider is not None else FTS_ONLY_MODEL
    if (lease := store.sync_lease(wait_ms=wait_ms)) is None:
        raise IndexStoreLockedError(store.busy_reason or "another sync holds the lease")
    # the first sync of an agent reads the cache of its SQLite store too (if it had one)
    local = settings.db_path if lease.published == 0 else None
    used: set[str] = set()  # the content hashes whose vectors came from the shared cache
    step = None if provider is None else _step(settings, store, provider, embed_deadline, local, used)
    with lease:
        held = {src: store.lease_paths(lease, src) for src in ("memory", "sessions")}
        active: set[tuple[str, str]] = set()
        batch: list[FileRows] = []
        for mf in files:
            read, line_map = read_file(mf, s.max_file_bytes, report, skipped)
            if read is None:
                continue
            active.add((mf.source, mf.rel_path))
            if not force and held[mf.source].get(mf.rel_path) == held_hash(
                    read.content_hash, model=model, complete=True):
                continue
            chunks = file_chunks(settings, mf, read.text, line_map=line_map, model=model)
            windows = _windows(step, store, [c for _, c in chunks], report)
            waiting = sum(1 for w in windows if w is None)
            report.chunks_pending += waiting
            batch.append(FileRows(
                mf.rel_path, mf.source, held_hash(read.content_hash, model=model, complete=not waiting),
                read.mtime_ms, read.size, note_title(mf.rel_path, read.text),
                tuple(ChunkRow(cid, c.start_line, c.end_line, c.content_hash, model,
                               c.text, derived_terms(c.text), windows=w or ())
                      for (cid, c), w in zip(chunks, windows, strict=True)),
                text=read.text if mf.source == "memory" else None))
            report.files_indexed += 1
            report.chunks_written += len(chunks)
            if len(batch) >= WRITE_BATCH_FILES:
                lease.write_files(batch)
                batch = []
        lease.write_files(batch)
        for source, paths in held.items():
            for path in sorted(set(paths) - {p for src, p in active if src == source}):
                lease.delete_file(path, source)
                report.files_deleted += 1
        lease.publish(skipped=[(f.path, f.reason) for f in skipped])
    if step is not None:
        if s.cache.enabled:  # bounded as the SQLite store's cache is
            try:
                store.store.prune_embedding_cache(s.cache.max_entries, used=sorted(used),
                                                  fingerprint=embedding_cache.fingerprint(step.provider))
            except MemorySearchError as exc:  # the sync is published; a cache over its cap waits
                log.warning("the shared embedding cache was not pruned: %s", exc)
        report.embedding_error = str(step.error) if step.error is not None else None
        report.embedding_exception = step.error
    report.skipped = skipped
    return report


def _step(settings: EngineSettings, store: PostgresSearchStore, provider: EmbeddingProvider,
          deadline: float | None, local: Path | None, used: set[str]) -> EmbeddingStep:
    """The SQLite sync's embedding step over the postgres store's shared cache; the cache hits
    are added to ``used`` (marked used once, when the sync prunes the cache)."""
    key = embedding_cache.fingerprint(provider)

    async def commit(pg: Any, fresh: dict[str, list[float]], hits: list[str]) -> None:
        used.update(hits)
        await anyio.to_thread.run_sync(pg.cache_embeddings, {h: v for h, v in fresh.items() if v}, key)

    async def no_write(_store: Any, _job: Any) -> None:  # the lease writes the vectors
        return None

    return EmbeddingStep(provider, write=no_write, commit=commit, on_batch=lambda _report: None,
                         cache_enabled=settings.search.cache.enabled, deadline=deadline, index_dims=None,
                         lookup=partial(embedding_cache.lookup_shared, local=local))


def _windows(step: EmbeddingStep | None, store: PostgresSearchStore, chunks: list[Chunk],
             report: SyncReport) -> list[tuple[list[float], ...] | None]:
    """Each chunk's unit window vectors: ``()`` without a provider (or when no window is a
    usable vector), ``None`` while the chunk waits for the provider."""
    if step is None or not chunks:
        return [() for _ in chunks]
    from fallback.index.windows import pack_windows
    from fallback.store.vectors import unit_windows

    out: list[tuple[list[float], ...] | None] = []
    for vectors in anyio.from_thread.run(step.window_vectors, cast(Any, store.store), chunks, report):
        packed = pack_windows(vectors)
        unit = None if packed is None else unit_windows(*packed)
        out.append(None if not vectors else () if unit is None else
                   tuple(row.tolist() for row in unit))
    return out

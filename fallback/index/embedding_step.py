"""The embedding step of one sync: cached vectors first, then the provider while it works.

The first provider error, or the sync's embedding deadline, closes the step: later chunks are
written without a vector and a later sync fills them in. Under a deadline each batch holds what
fits the time left (:meth:`EmbeddingStep._batch_size`), so a short one still embeds some. A
vector of another length than the index's raises :class:`DimensionsChanged`. The backlog is
kept in the index meta (:data:`BACKLOG_KEY`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from fallback.embeddings.base import EmbeddingProvider
from fallback.errors import EmbeddingDimensionsError, EmbeddingProviderError
from fallback.index import embedding_cache
from fallback.index.report import SyncReport
from fallback.index.windows import chunk_windows, pack_windows
from fallback.store.db import META_KEY
from fallback.text.chunking import Chunk

if TYPE_CHECKING:
    from fallback.store.db import Store

__all__ = ["BACKLOG_KEY", "DimensionsChanged", "EmbeddingStep"]

# Meta key of ``{"pending": chunks without a vector, "error": provider error or None}``.
BACKLOG_KEY = "embedding_backlog"
# Texts per embedding batch (at most, under a deadline); each finished batch is committed to
# the embedding cache (and reported to the progress callback) before the next one is sent.
EMBED_COMMIT_BATCH = 32
# Chunks embedded (and written) per transaction when filling in missing vectors.
PENDING_BATCH = 64

Writer = Callable[["Store", Callable[[], Any]], Awaitable[Any]]
Commit = Callable[["Store", dict[str, list[float]], list[str]], Awaitable[None]]
Lookup = Callable[[Any, EmbeddingProvider, list[str]], dict[str, list[float]]]


class DimensionsChanged(Exception):  # noqa: N818 - a signal between two modules, not an error
    """The provider's vectors (length ``new``) no longer have the index's length (``old``):
    the index must be rebuilt."""

    def __init__(self, old: int, new: int) -> None:
        super().__init__(f"embedding dimensions changed ({old} -> {new})")


class EmbeddingStep:
    """Vectors for the chunks of one sync.

    Args:
        provider: the embedding provider.
        write: runs a blocking write on a store under the sync's write limiter.
        commit: ``commit(store, fresh vectors by hash, cache hits)`` caches one finished batch.
        on_batch: called with the sync's report after each committed batch.
        cache_enabled: ``cache.enabled``.
        deadline: anyio clock time after which the provider is not called (``None``: none).
        index_dims: the index's vector length, or ``None`` for a new or rebuilt index.
        lookup: the blocking cache read ``lookup(store, provider, hashes) -> {hash: vector}``.

    Attributes:
        error / deferred: the provider error, or the deadline, that closed the step.
    """

    def __init__(self, provider: EmbeddingProvider, *, write: Writer, commit: Commit,
                 on_batch: Callable[[SyncReport], None], cache_enabled: bool,
                 deadline: float | None, index_dims: int | None,
                 lookup: Lookup = embedding_cache.lookup) -> None:
        self.provider = provider
        self._lookup = lookup
        self._write = write
        self._commit = commit
        self._on_batch = on_batch
        self._cache_enabled = cache_enabled
        self._deadline = deadline
        self.index_dims = index_dims
        self.error: EmbeddingProviderError | None = None
        self.deferred = False
        self._seconds_per_text: float | None = None  # of the last batch, once one finished

    @property
    def is_open(self) -> bool:
        """Whether the provider may still be called in this sync."""
        if self.error is not None or self.deferred:
            return False
        if self._deadline is not None and anyio.current_time() >= self._deadline:
            self.deferred = True
        return not self.deferred

    def _batch_size(self) -> int:
        """Texts to send next: :data:`EMBED_COMMIT_BATCH` without a deadline. Under one, 1
        until a batch has been timed, then as many as fit half the time left (to the sooner of
        the deadline and the enclosing cancel scope's, such as a search's sync budget) at the
        last batch's seconds per text, at most :data:`EMBED_COMMIT_BATCH`; 0 (the step closes)
        when not even one fits. Half, so that a slower batch still ends in time and the sync
        can record what it embedded: a batch cut off by the deadline is lost."""
        if self._deadline is None:
            return EMBED_COMMIT_BATCH
        if self._seconds_per_text is None:
            return 1
        left = min(self._deadline, anyio.current_effective_deadline()) - anyio.current_time()
        size = min(EMBED_COMMIT_BATCH, int(left / 2 / max(self._seconds_per_text, 1e-9)))
        if size < 1:
            self.deferred = True
        return max(size, 0)

    async def window_vectors(self, store: Store, chunks: Sequence[Chunk],
                             report: SyncReport) -> list[list[list[float]]]:
        """The window vectors of each chunk, cache first, then the provider a batch at a time;
        ``[]`` for a chunk any of whose windows has no vector yet (left for a later sync). A chunk
        counts in ``report.chunks_embedded`` as soon as its last window has a vector, so the
        progress of a file of many chunks moves batch by batch.

        Raises:
            DimensionsChanged: the provider's vectors no longer have the index's length.
            IndexStoreError: the store cannot be read or written.
        """
        windows = [chunk_windows(c, max_input_tokens=self.provider.max_input_tokens) for c in chunks]
        text_of = {w.content_hash: w.text for ws in windows for w in ws}
        found: dict[str, list[float]] = {}
        if self._cache_enabled:
            found = await anyio.to_thread.run_sync(self._lookup, store, self.provider, list(text_of))
            dims = self.index_dims if self.index_dims is not None else self.provider.dims
            if dims is not None:  # vectors of another size (an older model) are not reused
                found = {h: v for h, v in found.items() if len(v) == dims}
        hits = list(found)
        misses = [h for h in text_of if h not in found]
        done = start = 0  # chunks counted (windows are embedded in chunk order: a prefix), texts sent
        while start < len(misses):
            size = self._batch_size()
            batch = misses[start:start + size]
            start += len(batch)
            began = anyio.current_time()
            fresh = await self._call([text_of[h] for h in batch]) if size and self.is_open else None
            if fresh is None:
                break  # the provider failed or the deadline passed: the rest waits
            self._seconds_per_text = (anyio.current_time() - began) / len(batch)
            report.windows_embedded += len(batch)
            new = {h: (fresh[i] if i < len(fresh) else []) for i, h in enumerate(batch)}
            found.update(new)
            if self._cache_enabled:
                await self._commit(store, new, hits)
                hits = []
            while done < len(windows) and all(found.get(w.content_hash) for w in windows[done]):
                done += 1
                report.chunks_embedded += 1
            self._on_batch(report)
        if self._cache_enabled and hits:
            await self._commit(store, {}, hits)
        out = [vs if all(vs := [found.get(w.content_hash, []) for w in ws]) else [] for ws in windows]
        report.chunks_embedded += sum(1 for v in out[done:] if v)
        return out

    async def _call(self, texts: list[str]) -> list[list[float]] | None:
        """``provider.embed_batch`` within the deadline; ``None`` once the step is closed."""
        try:
            with anyio.move_on_at(math.inf if self._deadline is None else self._deadline) as scope:
                fresh = await self.provider.embed_batch(texts)
            if scope.cancelled_caught:
                self.deferred = True
                return None
        except EmbeddingDimensionsError as exc:
            raise DimensionsChanged(exc.expected, exc.got) from exc
        except EmbeddingProviderError as exc:
            self.error = exc
            return None
        size = next((len(v) for v in fresh if v), None)
        if size is not None and self.index_dims is not None and size != self.index_dims:
            raise DimensionsChanged(self.index_dims, size)
        return fresh

    async def finish(self, store: Store, report: SyncReport, *, model: str,
                     sources: Sequence[str]) -> None:
        """End of a sync: fill in missing vectors (while the provider works), set the report's
        embedding fields, record the backlog and, once known, ``vectorDims`` in the index meta.
        Under a deadline the filling ends at it, or at the enclosing cancel scope's (a
        search's sync budget), whichever is sooner, and the backlog is recorded even then.
        Raises as :meth:`window_vectors`."""
        bounded = self._deadline is not None
        if self.is_open:
            end = (math.inf if self._deadline is None
                   else min(self._deadline, anyio.current_effective_deadline()))
            with anyio.CancelScope(deadline=end, shield=bounded) as scope:
                await self.fill_pending(store, report, model=model, sources=sources)
            self.deferred = self.deferred or scope.cancelled_caught
        report.embedding_error = str(self.error) if self.error is not None else None
        report.embedding_exception = self.error
        marks = ", ".join("?" for _ in sources)
        with anyio.CancelScope(shield=bounded):  # a short write, past the budget if need be
            report.chunks_pending = int((await anyio.to_thread.run_sync(
                store.query, f"SELECT COUNT(*) FROM chunks WHERE vector IS NULL AND model = ?"
                             f" AND source IN ({marks})", [model, *sources]))[0][0])
            await self._write(store, partial(_record_backlog, store, report, self.provider.dims))

    async def fill_pending(self, store: Store, report: SyncReport, *, model: str,
                           sources: Sequence[str]) -> None:
        """Embed chunks written without a vector, :data:`PENDING_BATCH` at a time (under a
        deadline, as many as one embedding batch holds), each batch written in one transaction,
        until the step closes. Raises as :meth:`window_vectors`."""
        marks = ", ".join("?" for _ in sources)
        after = -1
        while self.is_open:
            size = PENDING_BATCH if self._deadline is None else self._batch_size()
            rows = await anyio.to_thread.run_sync(
                store.query, f"SELECT rowid, id, hash, text FROM chunks WHERE vector IS NULL"
                             f" AND model = ? AND source IN ({marks}) AND rowid > ?"
                             " ORDER BY rowid LIMIT ?", [model, *sources, after, size])
            if not rows:
                return
            after = int(rows[-1][0])
            chunks = [Chunk(text=r[3], start_line=1, end_line=1, content_hash=r[2]) for r in rows]
            vectors = await self.window_vectors(store, chunks, report)
            done = [(*packed, r[1]) for r, v in zip(rows, vectors, strict=True)
                    if (packed := pack_windows(v)) is not None]
            if done:
                await self._write(store, partial(_write_vectors, store, done))
                report.chunks_filled += len(done)


def _write_vectors(store: Store, rows: list[tuple[bytes, int, str]]) -> None:
    with store.transaction() as conn:
        conn.executemany("UPDATE chunks SET vector = ?, dims = ? WHERE id = ?", rows)


def _record_backlog(store: Store, report: SyncReport, dims: int | None) -> None:
    with store.transaction() as conn:
        store.set_meta(BACKLOG_KEY, {"pending": report.chunks_pending,
                                     "error": report.embedding_error}, conn=conn)
        meta = store.get_meta_json(META_KEY)
        if isinstance(meta, dict) and meta.get("vectorDims") is None and dims is not None:
            store.set_meta(META_KEY, {**meta, "vectorDims": dims}, conn=conn)

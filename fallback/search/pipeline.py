"""Ranking a query against one store: keyword-only (spec §8.6) and hybrid (spec §8.5) search.

Split from ``fallback/engine/builtin.py``; the engine owns the store and the sync, a :class:`Searcher`
turns candidates into ranked hits (keyword candidates from ``fallback/search/keyword.py``, vector
hits from ``fallback/store/vectors.py``, merge/decay/MMR from ``fallback/search/ranking.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio

from fallback.embeddings.base import EmbeddingProvider
from fallback.errors import EmbeddingProviderError
from fallback.models import MemorySearchResult
from fallback.search.keyword import keyword_candidates
from fallback.search.ranking import Candidate, apply_temporal_decay, merge_hybrid, mmr_rerank, select_results
from fallback.settings import EngineSettings
from fallback.store.db import Store
from fallback.text.chunking import truncate_chars

__all__ = ["SNIPPET_MAX_CHARS", "Searcher"]

log = logging.getLogger("fallback.engine.builtin")

# Snippets are cut to this many code points (spec §8.3, DESIGN.md maxSnippetChars).
SNIPPET_MAX_CHARS = 700


class Searcher:
    """Keyword-only and hybrid ranking over one store.

    Args:
        settings: the engine settings (``query.*`` knobs).
        vector_index: returns the engine's ``VectorIndex``.
        now_ms: clock in epoch ms (temporal decay).
        on_error: records a non-fatal problem (a failed query embedding) for ``status()``.
    """

    def __init__(self, settings: EngineSettings, *, vector_index: Callable[[], Any],
                 now_ms: Callable[[], int], on_error: Callable[[str], None]) -> None:
        self.settings = settings
        self._vector_index = vector_index
        self._now_ms = now_ms
        self._on_error = on_error

    async def _keyword_candidates(self, store: Store, text: str, srcs: list[str],
                                  candidates: int) -> list[Candidate]:
        return await keyword_candidates(store, text, srcs, candidates)

    async def fts_only(self, store: Store, text: str, srcs: list[str], candidates: int,
                       floor: float, limit: int) -> list[Candidate]:
        """Keyword-only ranking (spec §8.6): coverage-boosted keyword hits, temporal decay, the
        score floor (all hits when none passes), first ``limit``."""
        hits = await self._keyword_candidates(store, text, srcs, candidates)
        ranked = await self._decay(store, hits)
        strict = [c for c in ranked if c.score >= floor]
        return (strict or ranked)[:limit]

    async def hybrid(self, store: Store, provider: EmbeddingProvider, text: str,
                     srcs: list[str], candidates: int, floor: float,
                     limit: int) -> list[Candidate]:
        """Hybrid ranking (spec §8.5): vector and keyword candidates merged by weight, decay,
        MMR, relaxed floor for keyword hits; keyword-only when there is no query vector."""
        hybrid = self.settings.search.query.hybrid
        try:
            qvec = await provider.embed_query(text)
        except EmbeddingProviderError as exc:
            log.warning("query embedding failed, keyword-only results: %s", exc)
            self._on_error(f"query embedding failed: {exc}")
            qvec = []
        if not qvec or not any(v != 0 for v in qvec):
            # No usable query vector: answer as keyword-only search (spec §6.5 -> §8.6).
            return await self.fts_only(store, text, srcs, candidates, floor, limit)
        keyword_hits = (await self._keyword_candidates(store, text, srcs, candidates)
                        if hybrid.enabled else [])
        vector_hits = await self._vector_hits(store, qvec, provider.model, srcs, candidates)
        if not hybrid.enabled:
            return [c for c in vector_hits if c.score >= floor][:limit]
        # When the keyword side found nothing at all it abstains: its weight goes to the vector
        # side (the effective-weight normalisation of spec §8.5 step 2), so a purely semantic
        # match is scored by its cosine similarity instead of 0.7 x it.
        vw, tw = (hybrid.vector_weight, hybrid.text_weight) if keyword_hits else (1.0, 0.0)
        merged = merge_hybrid(vector_hits, keyword_hits, vector_weight=vw, text_weight=tw)
        merged = await self._decay(store, merged)
        if hybrid.mmr.enabled:
            merged = mmr_rerank(merged, lambda_=hybrid.mmr.lambda_)
        return select_results(merged, keyword_hits, min_score=floor,
                              text_weight=hybrid.text_weight, max_results=limit)

    async def _vector_hits(self, store: Store, qvec: list[float], model: str, srcs: list[str],
                           limit: int) -> list[Candidate]:
        index = self._vector_index()
        found = await anyio.to_thread.run_sync(partial(
            index.search, qvec, model=model, sources=srcs, limit=limit))
        if not found:
            return []
        marks = ", ".join("?" for _ in found)
        rows = await anyio.to_thread.run_sync(
            store.query, f"SELECT id, path, source, start_line, end_line, text FROM chunks"
                         f" WHERE id IN ({marks})", [cid for cid, _ in found])
        by_id = {r[0]: r for r in rows}
        out = []
        for cid, sim in found:
            r = by_id.get(cid)
            if r is not None:
                out.append(Candidate(chunk_id=cid, path=r[1], source=r[2], start_line=r[3],
                                     end_line=r[4], snippet=r[5], score=sim, vector_score=sim))
        return out

    async def _decay(self, store: Store, cands: list[Candidate]) -> list[Candidate]:
        decay = self.settings.search.query.hybrid.temporal_decay
        if not decay.enabled or not cands:
            return sorted(cands, key=lambda c: -c.score)
        paths = sorted({c.path for c in cands})
        marks = ", ".join("?" for _ in paths)
        rows = await anyio.to_thread.run_sync(
            store.query, f"SELECT source, path, mtime FROM files WHERE path IN ({marks})", paths)
        mtimes = {(r[0], r[1]): int(r[2]) for r in rows}
        return apply_temporal_decay(cands, half_life_days=decay.half_life_days,
                                    now_ms=self._now_ms(),
                                    mtime_ms=lambda source, path: mtimes.get((source, path)))

    @staticmethod
    def result(c: Candidate, *, hybrid: bool) -> MemorySearchResult:
        """A candidate as the shared result model (snippet cut to 700 code points)."""
        return MemorySearchResult(
            path=c.path, start_line=c.start_line, end_line=c.end_line,
            score=max(0.0, min(1.0, c.score)), snippet=truncate_chars(c.snippet, SNIPPET_MAX_CHARS),
            source="sessions" if c.source == "sessions" else "memory",
            vector_score=c.vector_score if hybrid else None,
            text_score=c.text_score if hybrid else None)

    # -- read, status, probes --------------------------------------------------------------


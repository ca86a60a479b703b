"""Ranking a query against one store, keyword-only (spec §8.6) or hybrid: a :class:`Searcher`
turns candidates into ranked hits with the blocking steps of ``fts_only.py`` (every other route's).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from fallback.contract import SearchOutcome
from fallback.errors import (
    BackendUnavailableError,
    EmbeddingProviderError,
    IndexStoreError,
    MemorySearchError,
)
from fallback.models import HitExplain, MemorySearchResult
from fallback.search.contrast import CONTRAST_WEIGHT, background_text, common_words, contrast_vector
from fallback.search.explain import SearchTrace
from fallback.search.fts import FtsPlan
from fallback.search.fts_only import (
    SNIPPET_MAX_CHARS,
    Hit,
    HitSnippet,
    decayed,
    hit_snippets,
    keyword_ranked,
    keyword_results,
)
from fallback.search.fusion import CosineStats, apply_floor, fuse, select_results
from fallback.search.keyword import rank_keyword_candidates, search_plan
from fallback.search.ranking import Candidate, mmr_rerank
from fallback.settings import EngineSettings
from fallback.store.seam import SearchStore

if TYPE_CHECKING:
    from fallback.search.rerank import Reranker

__all__ = ["SCOPE_FAILURES", "SNIPPET_MAX_CHARS", "Searcher", "configured_mode", "merge_scopes"]

log = logging.getLogger("fallback.engine.builtin")


class QueryEmbedder(Protocol):
    """What the ranking asks of an embedding provider: its id, its model and query vectors."""

    provider_id: str
    model: str

    async def embed_query(self, text: str) -> list[float]: ...

# A shared scope's search failing so (its rows unreadable, its statements refused or timed out)
# leaves that scope out of the reader's answer (merge_scopes), not the reader's own hits.
SCOPE_FAILURES = (BackendUnavailableError, IndexStoreError)


def merge_scopes(own: list[MemorySearchResult],
                 shared: Sequence[tuple[str, list[MemorySearchResult] | MemorySearchError]], *,
                 limit: int) -> tuple[list[MemorySearchResult], list[str]]:
    """``(hits, warnings)``: the ``own`` scope's hits and each shared scope's (``shared``:
    ``(owner agent, its hits or the error its search raised)``), each best first by its own
    statistics, merged by score (on equal scores the own hit first, then the owners' in order)
    and cut to ``limit``; a shared hit's path becomes ``shared/<owner>/<path>``
    (:func:`~fallback.sources.read_page.shared_path`). A scope whose search failed (one of
    :data:`SCOPE_FAILURES`) is left out with one warning naming its owner and the reason."""
    from fallback.sources.read_page import shared_path

    labelled = [[r.model_copy(update={"path": shared_path(owner, r.path)}) for r in hits]
                for owner, hits in shared if isinstance(hits, list)]
    left_out = [f"the memory agent {owner} shares is left out of this answer: {hits}"
                for owner, hits in shared if not isinstance(hits, list)]
    return list(itertools.islice(heapq.merge(own, *labelled, key=lambda r: -r.score), limit)), left_out


def configured_mode(*, has_provider: bool, hybrid_enabled: bool) -> str:
    """The search mode the settings ask for: ``fts-only`` without an embedding provider, else
    ``hybrid``, or ``vector-only`` when ``query.hybrid.enabled`` is false (spec §8.5 step 8)."""
    if not has_provider:
        return "fts-only"
    return "hybrid" if hybrid_enabled else "vector-only"


class Searcher:
    """Keyword-only and hybrid ranking of one search over one store, with the ``query.*``
    knobs of ``settings``, the engine's ``VectorIndex`` from ``vector_index()``, the clock
    ``now_ms()`` (epoch ms), ``on_error`` recording a non-fatal problem for ``status()``, the
    optional ``reranker`` and the ``--explain`` ``trace`` (or ``None``).

    Attributes:
        warnings: this search's non-fatal notes (a failed rerank), for the answer.
        mode: the ranking that ran (``fts-only`` also without a usable query vector).
        fts_checked / fts_error: whether the store's FTS5 state was read, and why FTS5 is
            unavailable (``None``: it is).
    """

    def __init__(self, settings: EngineSettings, *, vector_index: Callable[[], Any],
                 now_ms: Callable[[], int], on_error: Callable[[str], None],
                 reranker: Reranker | None = None, trace: SearchTrace | None = None) -> None:
        self.settings = settings
        self._plan: FtsPlan | None = None  # this search's keyword plan, shared with snippets
        self.fts_checked = False
        self.fts_error: str | None = None
        self._vector_index = vector_index
        self._now_ms = now_ms
        self._on_error = on_error
        self._reranker = reranker
        self.trace = trace
        self.warnings: list[str] = []
        self.mode: str | None = None
        # the snippets a keyword-only ranking without a reranker made in its worker-thread hop
        self._snippets: list[HitSnippet] | None = None

    async def run(self, store: SearchStore, provider: QueryEmbedder | None, text: str,
                  srcs: list[str], candidates: int, floor: float, limit: int) -> SearchOutcome:
        """Rank the stripped query ``text`` over ``srcs``: keyword-only without a ``provider``,
        else hybrid (``candidates`` per side, ``floor``: ``minScore``, ``limit`` hits); hits as
        result models."""
        if provider is None:
            hits = await self.fts_only(store, text, srcs, candidates, floor, limit)
        else:
            hits = await self.hybrid(store, provider, text, srcs, candidates, floor, limit)
        snippets = self._snippets if self._snippets is not None else await anyio.to_thread.run_sync(
            partial(hit_snippets, store, text, hits, plan=self._plan))
        explains: list[HitExplain | None] = (list(self.trace.hits) if self.trace
                                              else [None] * len(hits))
        results = [MemorySearchResult(**Hit.of(c, s)._asdict(), explain=e,
                                      vector_score=None if provider is None else c.vector_score)
                   for c, s, e in zip(hits, snippets, explains, strict=True)]
        return SearchOutcome(results=results, warnings=list(self.warnings), mode=self.mode)

    def _plan_blocking(self, store: SearchStore, text: str) -> FtsPlan | None:
        """This search's keyword plan, made once (``None`` on a store without FTS5, whose
        error :attr:`fts_error` keeps); blocking: call it in a worker thread."""
        if not self.fts_checked:
            self.fts_error = store.fts_error
            self._plan = search_plan(store, text) if self.fts_error is None else None
            self.fts_checked = True
        return self._plan

    async def fts_only(self, store: SearchStore, text: str, srcs: list[str], candidates: int,
                       floor: float, limit: int) -> list[Candidate]:
        """Keyword-only ranking (spec §8.6): :func:`~fallback.search.fts_only.keyword_ranked`,
        the optional reranker, then :func:`~fallback.search.fts_only.keyword_results`."""
        half_life_days = self.settings.search.query.hybrid.temporal_decay.effective_half_life_days
        now_ms = self._now_ms()
        self.mode = "fts-only"

        def rank() -> list[Candidate]:  # the plan, the ranking (and snippets) in one hop
            ranked = keyword_ranked(store, text, srcs, candidates=candidates, floor=floor,
                                    half_life_days=half_life_days, now_ms=now_ms,
                                    plan=self._plan_blocking(store, text), trace=self.trace)
            if self._reranker is not None:
                return ranked
            hits = keyword_results(ranked, limit=limit)
            self._snippets = hit_snippets(store, text, hits, plan=self._plan)
            return hits

        ranked = await anyio.to_thread.run_sync(rank)
        if self._reranker is None:
            return self._finish(ranked, floor)
        return self._finish(keyword_results(await self._rerank(text, ranked), limit=limit), floor)

    async def hybrid(self, store: SearchStore, provider: QueryEmbedder, text: str,
                     srcs: list[str], candidates: int, floor: float,
                     limit: int) -> list[Candidate]:
        """Hybrid ranking: vector (the query's common terms contrasted out,
        ``fallback/search/contrast.py``) and keyword candidates fused (``fusion.py``), the
        floor, temporal decay, the optional reranker and MMR, then the result slots.
        Keyword-only when there is no query vector; vector-only when ``hybrid.enabled`` is
        false."""
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
        self.mode = mode = configured_mode(has_provider=True, hybrid_enabled=hybrid.enabled)
        keyword_hits = [] if not hybrid.enabled else await anyio.to_thread.run_sync(
            lambda: rank_keyword_candidates(store, text, srcs, candidates,
                                            plan=self._plan_blocking(store, text)))  # one hop
        qvec, contrasted = await self._contrast(store, provider, text, qvec)
        vector_hits, stats = await self._vector_hits(store, qvec, provider.model, srcs, candidates)
        if self.trace:
            self.trace.mode = mode
            self.trace.keyword(keyword_hits)
            self.trace.vector(vector_hits, contrast=contrasted)
        merged = fuse(vector_hits, keyword_hits, method=hybrid.fusion, cosine_stats=stats,
                      vector_weight=hybrid.vector_weight, text_weight=hybrid.text_weight)
        if self.trace:
            self.trace.fusion(merged, method=hybrid.fusion, vector_weight=hybrid.vector_weight,
                              text_weight=hybrid.text_weight)
        ranked = await self._rerank(text, await anyio.to_thread.run_sync(partial(
            decayed, store, apply_floor(merged, floor), half_life_days=hybrid.temporal_decay.effective_half_life_days,
            now_ms=self._now_ms(), trace=self.trace)))
        if hybrid.mmr.enabled:
            diverse = mmr_rerank(ranked, lambda_=hybrid.mmr.lambda_)
            if self.trace:
                self.trace.mmr(ranked, diverse, lambda_=hybrid.mmr.lambda_)
            ranked = diverse
        return self._finish(select_results(ranked, max_results=limit), floor)

    async def _contrast(self, store: SearchStore, provider: QueryEmbedder, text: str,
                        qvec: list[float]) -> tuple[list[float], list[str]]:
        """The query vector with its common terms contrasted out, and those terms; ``(qvec,
        [])`` when the query has none or their embedding fails."""
        words = await anyio.to_thread.run_sync(common_words, store, text)
        background = background_text(words)
        if not words or background == text:
            return qvec, []
        try:
            bvec = await provider.embed_query(background)
        except EmbeddingProviderError as exc:
            log.warning("embedding the query's common terms failed, plain query vector: %s", exc)
            return qvec, []
        return contrast_vector(qvec, bvec, weight=CONTRAST_WEIGHT), words

    async def _rerank(self, text: str, cands: list[Candidate]) -> list[Candidate]:
        """The optional reranker stage (``fallback/search/rerank.py``), before MMR and the cut."""
        if self._reranker is None:
            return cands
        from fallback.search.rerank import rerank_stage

        return await rerank_stage(self._reranker, self.settings.search.query.rerank, text, cands,
                                  trace=self.trace, warnings=self.warnings)

    def _finish(self, selected: list[Candidate], floor: float) -> list[Candidate]:
        if self.trace:
            self.trace.finish(selected, min_score=floor)
        return selected

    async def _vector_hits(self, store: SearchStore, qvec: list[float], model: str, srcs: list[str],
                           limit: int) -> tuple[list[Candidate], CosineStats]:
        """The best ``limit`` chunks by best-window cosine, and the spread of that cosine over
        every chunk searched (for the vector evidence of the fusion)."""
        index = self._vector_index()
        scored = await anyio.to_thread.run_sync(partial(
            index.search_scored, qvec, model=model, sources=srcs, limit=limit))
        stats = CosineStats(scored.mean, scored.std, scored.count)
        found = scored.hits
        if not found:
            return [], stats
        rows = await anyio.to_thread.run_sync(store.chunk_rows, [cid for cid, _ in found])
        by_id = {r[0]: r for r in rows}
        return [Candidate(chunk_id=cid, path=r[1], source=r[2], start_line=r[3], end_line=r[4],
                          snippet=r[5], score=sim, vector_score=sim)
                for cid, sim in found if (r := by_id.get(cid)) is not None], stats

"""The ranking trace behind ``search --explain``: the pipeline's ranking steps record each
candidate in a :class:`SearchTrace` (which exists only when an explanation was asked for), and
:meth:`SearchTrace.finish` turns it into a :class:`~fallback.models.HitExplain` per hit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fallback.models import (
    ExplainDecay,
    ExplainFloor,
    ExplainFusion,
    ExplainKeyword,
    ExplainReorder,
    ExplainRerank,
    ExplainVector,
    HitExplain,
)
from fallback.search.ranking import (
    MS_PER_DAY,
    Candidate,
    date_from_path,
    decay_multiplier,
    decay_timestamp_ms,
)

__all__ = ["SearchTrace"]


def _ranks(cands: list[Candidate]) -> dict[str, int]:
    """1-based rank by chunk id (the first occurrence wins)."""
    ranks: dict[str, int] = {}
    for i, c in enumerate(cands):
        ranks.setdefault(c.chunk_id, i + 1)
    return ranks


@dataclass
class SearchTrace:
    """The trace of one search.

    Attributes:
        mode: ``hybrid`` | ``fts-only`` | ``vector-only`` (set by the pipeline).
        candidates: per chunk id seen, the steps recorded for it (``HitExplain`` field ->
            that step's record; a step not applied is absent).
        hits: the explanations of the returned hits, in order (set by :meth:`finish`).
    """

    mode: str = "fts-only"
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)
    hits: list[HitExplain] = field(default_factory=list)

    def _of(self, chunk_id: str) -> dict[str, Any]:
        return self.candidates.setdefault(chunk_id, {})

    def keyword(self, hits: list[Candidate]) -> None:
        """Record the keyword candidates, in the order retrieved (BM25 order)."""
        for chunk_id, rank in _ranks(hits).items():
            hit = hits[rank - 1]
            self._of(chunk_id)["keyword"] = ExplainKeyword(rank=rank, bm25=hit.bm25,
                                                        text_score=hit.text_score or hit.score)

    def vector(self, hits: list[Candidate], *, contrast: Sequence[str] = ()) -> None:
        """Record the vector candidates, in cosine order, and the query's common terms the
        search contrasted out (``fallback/search/contrast.py``)."""
        for chunk_id, rank in _ranks(hits).items():
            hit = hits[rank - 1]
            self._of(chunk_id)["vector"] = ExplainVector(rank=rank, cosine=hit.vector_score or hit.score,
                                                      contrast=list(contrast))

    def fusion(self, merged: list[Candidate], *, method: str, vector_weight: float,
               text_weight: float) -> None:
        """Record the hybrid merge (``merged`` straight from ``fallback.search.fusion.fuse``)."""
        for c in merged:
            self._of(c.chunk_id)["fusion"] = ExplainFusion(
                method=method, vector_evidence=c.vector_evidence, text_evidence=c.text_evidence,
                vector_weight=vector_weight, text_weight=text_weight, score=c.score)

    def decay(self, decayed: list[Candidate], *, half_life_days: float, now_ms: int,
              mtime_ms: Callable[[str, str], int | None]) -> None:
        """Record temporal decay (``decayed`` from ``apply_temporal_decay``, same ``mtime_ms``)."""
        for c in decayed:
            stamp = decay_timestamp_ms(c, mtime_ms)
            age = None if stamp is None else (now_ms - stamp) / MS_PER_DAY
            factor = 1.0 if age is None else decay_multiplier(age, half_life_days)
            dated_by = None if stamp is None else (
                "name" if date_from_path(c.path) is not None else "mtime")
            self._of(c.chunk_id)["decay"] = ExplainDecay(age_days=age, half_life_days=half_life_days,
                                                      factor=factor, dated_by=dated_by,
                                                      score=c.score)

    def rerank(self, before: list[Candidate], after: list[Candidate], *,
               scores: Mapping[str, float | None], provider: str, model: str) -> None:
        """Record the reranker stage (only when it ran)."""
        ranks_before, ranks_after = _ranks(before), _ranks(after)
        for chunk_id, rank in ranks_after.items():
            self._of(chunk_id)["rerank"] = ExplainRerank(
                provider=provider, model=model, relevance=scores.get(chunk_id),
                rank_before=ranks_before.get(chunk_id, rank), rank_after=rank)

    def mmr(self, before: list[Candidate], after: list[Candidate], *, lambda_: float) -> None:
        """Record MMR re-ranking (only when it is on)."""
        ranks_before = _ranks(before)
        for chunk_id, rank in _ranks(after).items():
            self._of(chunk_id)["mmr"] = ExplainReorder(
                lambda_=lambda_, rank_before=ranks_before.get(chunk_id, rank), rank_after=rank)

    def finish(self, selected: list[Candidate], *, min_score: float) -> list[HitExplain]:
        """One explanation per ``selected`` hit, in order (also kept in :attr:`hits`); the
        floor's reason quotes the score the floor saw against ``min_score`` (the calibrated
        score of :meth:`fusion`, else the keyword text score)."""
        out = []
        for rank, c in enumerate(selected, start=1):
            steps = self._of(c.chunk_id)
            fusion, keyword = steps.get("fusion"), steps.get("keyword")
            if fusion is not None:
                reason = f"calibrated score {fusion.score:.4f} >= minScore {min_score:g}"
            else:
                seen = keyword.text_score if keyword is not None else c.score
                reason = (f"score {seen:.4f} >= minScore {min_score:g}" if seen >= min_score else
                          f"no hit reached minScore {min_score:g}; the best keyword hits are kept")
            floor = ExplainFloor(min_score=min_score, relaxed_floor=None, kept=True, reason=reason)
            out.append(HitExplain(mode=self.mode, **steps, floor=floor, rank=rank))
        self.hits = out
        return out

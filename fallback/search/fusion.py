"""Hybrid fusion: keyword and vector candidates become one calibrated score, then the floor and
the result slots (pure). What the score means: docs/architecture.md ("What a hybrid score
means").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol, TypeVar

from fallback.search.ranking import Candidate, jaccard, mmr_tokens

__all__ = [
    "CosineStats",
    "FusionMethod",
    "apply_floor",
    "calibrated_score",
    "fuse",
    "rank_evidence",
    "select_results",
    "text_evidence",
    "vector_evidence",
]

# ``scores``: evidence from each side's normalised scores; ``rrf``: from each side's ranks.
FusionMethod = Literal["scores", "rrf"]

# Share of the calibrated score given by a chunk's strongest evidence on either side; the rest
# is the weighted mean of both (the best of one side alone scores at least 0.5).
MAX_EVIDENCE_SHARE = 0.5

# The rank constant of reciprocal rank fusion (Cormack, Clarke & Büttcher 2009 use 60).
RRF_K = 60

# A vector hit whose cosine stands this many standard deviations above the query's mean cosine
# over the collection has full evidence (1) (docs/benchmarks.md, "Full vector evidence at 3.5
# standard deviations").
FULL_EVIDENCE_Z = 3.5

# Session transcripts may fill at most this share of the result slots while memory hits remain.
MAX_SESSION_SHARE = 0.5


class Sourced(Protocol):
    """A ranked hit as :func:`select_results` reads it: a candidate, or a backend's hit."""

    @property
    def path(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def snippet(self) -> str: ...


_Hit = TypeVar("_Hit", bound=Sourced)

# Two chunks of one transcript whose token sets overlap at least this much (Jaccard) say the
# same thing: the lower-ranked one is dropped.
NEAR_DUPLICATE_JACCARD = 0.6


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


@dataclass(frozen=True)
class CosineStats:
    """How a query's cosine similarity is spread over the chunks searched: ``mean``, population
    standard deviation ``std`` and ``count`` (``fallback.store.vectors.VectorSearch``)."""

    mean: float
    std: float
    count: int


def _stats_of(values: Sequence[float]) -> CosineStats:
    if not values:
        return CosineStats(0.0, 0.0, 0)
    mean = sum(values) / len(values)
    return CosineStats(mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)),
                       len(values))


def text_evidence(scores: Sequence[float]) -> list[float]:
    """Keyword evidence of one query's keyword candidates: each text score divided by the best
    one (non-finite or negative scores count as 0; all 0 gives 0); max normalisation (Lee,
    SIGIR 1997)."""
    values = [max(0.0, _finite(s)) for s in scores]
    top = max(values, default=0.0)
    return [v / top if top > 0 else 0.0 for v in values]


def vector_evidence(cosines: Sequence[float], stats: CosineStats) -> list[float]:
    """Vector evidence in ``[0, 1]`` of one query's vector candidates, same order:
    ``clamp(z / full, 0, 1)`` with ``z = (cosine - stats.mean) / stats.std`` and ``full =
    min(FULL_EVIDENCE_Z, sqrt(count - 1))``, the largest standard score ``count`` values can
    reach. Without spread (``std == 0``) the cosine clamped to ``[0, 1]``; a cosine ``<= 0`` or
    non-finite has none. Source: standard-score normalisation (Montague & Aslam, CIKM 2001)."""
    spread = stats.count >= 2 and stats.std > 0 and math.isfinite(stats.std)
    full = min(FULL_EVIDENCE_Z, math.sqrt(max(1, stats.count - 1)))
    out = []
    for c in cosines:
        if not math.isfinite(c) or c <= 0:
            out.append(0.0)
        elif not spread:
            out.append(min(1.0, c))
        else:
            out.append(min(1.0, max(0.0, (c - stats.mean) / stats.std / full)))
    return out


def rank_evidence(count: int, *, k: int = RRF_K) -> list[float]:
    """Reciprocal-rank evidence of a ranked list of ``count`` candidates: ``(k + 1) / (k + r)``
    at 1-based rank ``r``, the RRF term scaled so the first rank is 1 (Cormack et al., SIGIR
    2009)."""
    return [(k + 1) / (k + r) for r in range(1, count + 1)]


def calibrated_score(vector_evidence: float, text_evidence: float, *, vector_weight: float,
                     text_weight: float) -> float:
    """The hybrid score in ``[0, 1]`` of one chunk: ``h·max(v, t) + (1 - h)·(wv·v + wt·t) /
    (wv + wt)`` with ``h`` = :data:`MAX_EVIDENCE_SHARE`, ``v`` / ``t`` each side's evidence in
    ``[0, 1]`` (0: that side did not return it), weights ``>= 0`` (both 0: equal).
    Source: CombMAX plus CombSUM (Fox & Shaw, TREC-2 1994)."""
    v = min(1.0, max(0.0, _finite(vector_evidence)))
    t = min(1.0, max(0.0, _finite(text_evidence)))
    total = vector_weight + text_weight
    mean = (vector_weight * v + text_weight * t) / total if total > 0 else (v + t) / 2
    return MAX_EVIDENCE_SHARE * max(v, t) + (1 - MAX_EVIDENCE_SHARE) * mean


def _dedupe(hits: Sequence[Candidate]) -> list[Candidate]:
    """``hits`` with each chunk id's first occurrence only, order kept."""
    first: dict[str, Candidate] = {}
    for hit in hits:
        first.setdefault(hit.chunk_id, hit)
    return list(first.values())


def fuse(vector_hits: Sequence[Candidate], keyword_hits: Sequence[Candidate], *,
         method: FusionMethod = "scores", vector_weight: float, text_weight: float,
         cosine_stats: CosineStats | None = None) -> list[Candidate]:
    """Merge vector and keyword candidates (each best first; cosine in ``vector_score`` or
    ``score``, text score in ``text_score`` or ``score``) into new candidates scored by
    :func:`calibrated_score`, one per chunk id (the first kept), best first (ties: vector order,
    then keyword order); a chunk on both sides takes the keyword hit's snippet.

    Evidence (``method``, ``query.hybrid.fusion``): :func:`text_evidence` and
    :func:`vector_evidence` over ``cosine_stats`` (``None``: of ``vector_hits``) for
    ``"scores"``, each side's ranks (:func:`rank_evidence`) for ``"rrf"``. A side with no
    candidates abstains: its weight goes to the other side.
    """
    vec = _dedupe(vector_hits)
    kw = _dedupe(keyword_hits)
    cosines = [h.vector_score or h.score for h in vec]
    texts = [h.text_score or h.score for h in kw]
    if method == "rrf":
        v_list, t_list = rank_evidence(len(vec)), rank_evidence(len(kw))
    else:
        v_list = vector_evidence(cosines, cosine_stats or _stats_of(cosines))
        t_list = text_evidence(texts)
    v_ev = dict(zip((h.chunk_id for h in vec), v_list, strict=True))
    t_ev = dict(zip((h.chunk_id for h in kw), t_list, strict=True))
    vw, tw = vector_weight, text_weight
    if not kw:
        vw, tw = 1.0, 0.0
    elif not vec:
        vw, tw = 0.0, 1.0
    merged: dict[str, Candidate] = {}
    for hit, cosine in zip(vec, cosines, strict=True):
        merged[hit.chunk_id] = replace(hit, vector_score=cosine, text_score=0.0)
    for hit, text in zip(kw, texts, strict=True):
        existing = merged.get(hit.chunk_id)
        if existing is None:
            merged[hit.chunk_id] = replace(hit, vector_score=0.0, text_score=text)
        else:
            merged[hit.chunk_id] = replace(existing, text_score=text,
                                           snippet=hit.snippet or existing.snippet)
    out = []
    for cid, c in merged.items():
        v, t = v_ev.get(cid, 0.0), t_ev.get(cid, 0.0)
        out.append(replace(c, vector_evidence=v, text_evidence=t,
                           score=calibrated_score(v, t, vector_weight=vw, text_weight=tw)))
    return sorted(out, key=lambda c: -c.score)


def apply_floor(cands: Sequence[Candidate], min_score: float) -> list[Candidate]:
    """The candidates whose score is at least ``min_score``, order kept (in a hybrid search
    before temporal decay, so decay never removes an old note that matches well)."""
    return [c for c in cands if c.score >= min_score]


def select_results(ranked: Sequence[_Hit], *, max_results: int) -> list[_Hit]:
    """How ``memory`` and ``sessions`` hits mix in every answer, whichever backend ranked them:
    at most ``max_results`` (``<= 0``: none) hits of ``ranked`` (best first), in its order,
    taken in order: a ``sessions`` hit whose tokens (:func:`~fallback.search.ranking.mmr_tokens`
    of its snippet) overlap a better one of its transcript by at least
    :data:`NEAR_DUPLICATE_JACCARD` is dropped; the others are taken while sessions hold fewer
    than ``floor(max_results · MAX_SESSION_SHARE)`` slots, and the skipped ones fill the slots
    left when the other hits run out."""
    if max_results <= 0:
        return []
    cap = math.floor(max_results * MAX_SESSION_SHARE)
    taken: list[int] = []
    skipped: list[int] = []
    sessions = 0
    kept_tokens: dict[str, list[set[str]]] = {}  # transcript path -> tokens of its kept chunks
    for i, c in enumerate(ranked):
        if len(taken) >= max_results:
            break
        if c.source == "sessions":
            if sessions >= cap and len(skipped) >= max_results:
                continue  # neither a slot nor a filler left for it
            tokens = mmr_tokens(c.snippet)
            kept = kept_tokens.setdefault(c.path, [])
            if tokens and any(jaccard(tokens, other) >= NEAR_DUPLICATE_JACCARD for other in kept):
                continue
            kept.append(tokens)
            if sessions >= cap:
                skipped.append(i)
                continue
            sessions += 1
        taken.append(i)
    taken.extend(skipped[:max_results - len(taken)])
    return [ranked[i] for i in sorted(taken)]

"""Keyword-only ranking steps, blocking and free of pydantic and anyio: the engine's
:class:`~fallback.search.pipeline.Searcher` runs them in a worker thread, and
:func:`keyword_search` chains them for every other route (one-shot search, qmd's passages)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from fallback.search.fts import FtsPlan
from fallback.search.fusion import apply_floor, select_results
from fallback.search.keyword import highlight_hits, rank_keyword_candidates, search_plan
from fallback.search.ranking import Candidate, apply_temporal_decay, drop_covered
from fallback.search.snippets import best_window

if TYPE_CHECKING:
    from fallback.search.explain import SearchTrace
    from fallback.store.seam import SearchStore

__all__ = ["MAX_CANDIDATES", "SNIPPET_MAX_CHARS", "Hit", "HitSnippet", "KeywordAnswer", "candidate_count",
           "clamp_score", "decayed", "hit_snippets", "keyword_ranked", "keyword_results",
           "keyword_search"]

# Snippets hold at most this many code points (the reference's, and memory.qmd.limits.maxSnippetChars).
SNIPPET_MAX_CHARS = 700
# Upper bound of candidates fetched per search (spec §8.1).
MAX_CANDIDATES = 200


def candidate_count(limit: int, multiplier: float) -> int:
    """Candidates fetched per side for ``limit`` hits: ``floor(limit x multiplier)`` within
    ``1..MAX_CANDIDATES`` (``query.hybrid.candidateMultiplier``, spec §8.1)."""
    return min(MAX_CANDIDATES, max(1, math.floor(limit * multiplier)))


def clamp_score(score: float) -> float:
    """A ranked score as a hit carries it: clamped to ``[0, 1]`` (decay and fusion may leave a
    candidate's score a hair outside)."""
    return max(0.0, min(1.0, score))


class Hit(NamedTuple):
    """One search hit below the edge (``MemorySearchResult`` is made from ``_asdict()``): path
    as indexed, the chunk's 1-based inclusive lines, score in ``[0, 1]``
    (:func:`clamp_score`), the snippet (:func:`hit_snippets`) and its lines, source, and the
    keyword score before temporal decay (or ``None``)."""

    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    snippet_start_line: int
    snippet_end_line: int
    source: str
    text_score: float | None = None

    @classmethod
    def of(cls, c: Candidate, snippet: HitSnippet) -> Hit:
        """A ranked candidate and its snippet as a hit."""
        # positional, in field order: a keyword call costs twice as much per hit
        return cls(c.path, c.start_line, c.end_line, clamp_score(c.score), snippet.text,
                   snippet.start_line, snippet.end_line,
                   "sessions" if c.source == "sessions" else "memory", c.text_score)


class KeywordAnswer(NamedTuple):
    """What :func:`keyword_search` found: ``hits`` (at most ``limit``, best first) and
    ``ranked_paths``, the paths of every candidate the score floor kept (before the cut)."""

    hits: list[Hit]
    ranked_paths: frozenset[str]


def keyword_search(store: SearchStore, text: str, *, sources: Sequence[str], limit: int,
                   candidates: int, floor: float, half_life_days: int | None, now_ms: int,
                   max_snippet_chars: int = SNIPPET_MAX_CHARS,
                   plan: FtsPlan | None = None) -> KeywordAnswer:
    """Keyword-only search of ``store`` without a reranker (blocking): :func:`keyword_ranked`
    (arguments as there; the plan is made here when ``None``), :func:`keyword_results` cut to
    ``limit`` (>= 1) hits, :func:`hit_snippets` of at most ``max_snippet_chars`` code points.

    Raises ``IndexStoreError``: the store cannot be read.
    """
    if plan is None and store.fts_error is None:
        plan = search_plan(store, text)
    ranked = keyword_ranked(store, text, list(sources), candidates=candidates, floor=floor,
                            half_life_days=half_life_days, now_ms=now_ms, plan=plan)
    hits = keyword_results(ranked, limit=limit)
    snippets = hit_snippets(store, text, hits, plan=plan, max_snippet_chars=max_snippet_chars)
    return KeywordAnswer([Hit.of(c, s) for c, s in zip(hits, snippets, strict=True)],
                         frozenset(c.path for c in ranked))


class HitSnippet(NamedTuple):
    """The text shown for one hit (at most ``max_snippet_chars`` code points of the chunk's
    whole lines) and its 1-based inclusive line range in the file (the hit's own range when the
    chunk's lines are not one per file line)."""

    text: str
    start_line: int
    end_line: int


def decayed(store: SearchStore, cands: list[Candidate], *, half_life_days: int | None, now_ms: int,
            trace: SearchTrace | None = None) -> list[Candidate]:
    """Temporal decay of ``cands`` by half-life (``None``: off; then only sorted), best first;
    undated files are dated by the store's ``files.mtime``. Raises ``IndexStoreError``."""
    if half_life_days is None or not cands:
        return sorted(cands, key=lambda c: -c.score)
    mtimes = store.file_mtimes(sorted({c.path for c in cands}))

    def mtime_ms(source: str, path: str) -> int | None:
        return mtimes.get((source, path))

    out = apply_temporal_decay(cands, half_life_days=half_life_days, now_ms=now_ms,
                               mtime_ms=mtime_ms)
    if trace:
        trace.decay(out, half_life_days=half_life_days, now_ms=now_ms, mtime_ms=mtime_ms)
    return out


def keyword_ranked(store: SearchStore, text: str, srcs: list[str], *, candidates: int, floor: float,
                   half_life_days: int | None, now_ms: int, plan: FtsPlan | None,
                   trace: SearchTrace | None = None) -> list[Candidate]:
    """Step 1 of keyword-only search, best first: the candidates of the stripped query
    ``text`` in ``srcs`` (``candidates`` per source; ``plan``: the query's
    :func:`~fallback.search.keyword.search_plan` or ``None``), the score floor ``floor``
    (``minScore``; all are kept when none reaches it, spec §8.6), then temporal decay
    (``half_life_days``, ``None``: off; ``now_ms``: epoch ms), recorded in ``trace``.

    Raises ``IndexStoreError``: on a SQLite failure.
    """
    hits = rank_keyword_candidates(store, text, srcs, candidates, plan=plan)
    if trace:
        trace.mode = "fts-only"
        trace.keyword(hits)
    kept = apply_floor(hits, floor) or hits
    return decayed(store, kept, half_life_days=half_life_days, now_ms=now_ms, trace=trace)


def keyword_results(ranked: list[Candidate], *, limit: int) -> list[Candidate]:
    """Step 2's end: of the ranked candidates (after the optional reranker), those whose lines
    are mostly inside a better candidate of their file are dropped, then the first ``limit``
    are taken with session transcripts held to half of them."""
    return select_results(drop_covered(ranked), max_results=limit)


def hit_snippets(store: SearchStore, text: str, hits: Sequence[Candidate], *, plan: FtsPlan | None,
                 max_snippet_chars: int = SNIPPET_MAX_CHARS) -> list[HitSnippet]:
    """The snippet of every hit: the window of its chunk's lines that best matches the query
    (:func:`~fallback.search.snippets.best_window`), the matches of the hits longer than the
    budget marked by one :func:`~fallback.search.keyword.highlight_hits` statement (a shorter
    chunk is its own snippet). Raises ``IndexStoreError``."""
    marked = highlight_hits(store, text, [c for c in hits if len(c.snippet) > max_snippet_chars],
                            plan=plan)
    out = []
    for c in hits:
        window = best_window(marked.get(c.chunk_id, c.snippet), max_chars=max_snippet_chars)
        first, last = c.start_line, c.end_line
        if last - first == c.snippet.count("\n"):  # one chunk line per file line (not a transcript)
            first, last = first + window.first_line, first + window.last_line
        out.append(HitSnippet(window.text, first, last))
    return out

"""Keyword (BM25 / LIKE) candidates of a query from the store, through the store seam.

The store ranks the OR plan of ``fallback/search/fts.py`` by BM25 (``SearchStore.keyword_rows``);
Python maps each row's BM25 to a score relative to the best row of the query
(:func:`relative_scores`): no chunk text is tokenized on the query path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from fallback.search.fts import COVERAGE_MAX_CHUNKS, MAX_QUERY_PARTS, FtsPlan, analyze_fts_query
from fallback.search.ranking import Candidate
from fallback.search.snippets import MARK_CLOSE, MARK_OPEN, mark_substrings
from fallback.search.substring import rank_substring_hits
from fallback.store.seam import row_order
from fallback.text.keywords import cjk_words, extract_keywords
from fallback.text.scripts import contains_cjk, contains_unspaced

if TYPE_CHECKING:
    from fallback.store.seam import KeywordRow, SearchStore

__all__ = ["highlight_hits", "keyword_rows",
           "rank_keyword_candidates", "rank_keyword_hits", "relative_scores", "search_plan"]

# The FTS-only fallback searches at most this many extracted keywords (spec §8.6).
MAX_FALLBACK_KEYWORDS = 6
# search_plan() counts the chunks of at most this many parts of a query (the rest count as rare).
COUNTED_PARTS = 12
# In a store of more than COVERAGE_MAX_CHUNKS chunks, a part found in at least this share of
# them joins no NEAR pair: it costs a walk of long position lists for an IDF of at most log(3)
# (docs/benchmarks.md, "Keyword search with common words").
LARGE_STORE_PAIR_SHARE = 0.25


def keyword_rows(store: SearchStore, plan: FtsPlan, *, sources: Sequence[str],
                 limit: int) -> list[KeywordRow]:
    """The best ``limit`` rows of ``sources`` for a keyword plan (``SearchStore.keyword_rows``;
    rank ``0.0`` for a LIKE-only row). Raises ``IndexStoreError``."""
    return store.keyword_rows(plan.match, sources=sources, limit=limit,
                              trigram_match=plan.trigram_match, like_patterns=plan.like_patterns,
                              fallback_like_patterns=plan.fallback_like_patterns)


def relative_scores(ranks: Sequence[float]) -> list[float]:
    """Scores in ``[0, 1]`` of one query's FTS5 ``bm25()`` ranks (any order; same order out):
    ``sqrt(bm25 / best bm25)`` (why: docs/architecture.md, "How the builtin engine searches").
    Rows without a BM25 (``LIKE``-only, rank ``0``) score 1 when no row has one, else 0;
    non-finite ranks score 0."""
    strengths = [-r if isinstance(r, (int, float)) and math.isfinite(r) and r < 0 else 0.0
                 for r in ranks]
    best = max(strengths, default=0.0)
    if best <= 0:
        return [1.0 if isinstance(r, (int, float)) and math.isfinite(r) else 0.0 for r in ranks]
    return [math.sqrt(s / best) for s in strengths]


def search_plan(store: SearchStore, text: str) -> FtsPlan | None:
    """The FTS plan of ``text`` for this store: the query cut once
    (:func:`~fallback.search.fts.analyze_fts_query`), its first :data:`COUNTED_PARTS` parts (all
    of them past ``MAX_QUERY_PARTS``, of which the rarest found in a chunk are kept) and
    its joined forms counted in one statement, and :meth:`~fallback.search.fts.FtsQuery.plan`
    given the parts in half of the chunks or more as ``common`` and those in none as ``absent``
    (the rule: docs/architecture.md, "How the builtin engine searches"). Raises ``IndexStoreError``.
    """
    query = analyze_fts_query(text, tokenizer=store.fts_tokenizer)
    if query is None or len(query.parts) < 2:
        return None if query is None else query.plan(coverage_pairs=False)
    over = len(query.parts) > MAX_QUERY_PARTS
    counted = query.parts if over else query.parts[:COUNTED_PARTS]
    exprs = [expr for _, expr in counted] + list(query.joined)
    total, found = store.part_counts(exprs)
    count = {key: n for (key, _), n in zip(counted, found[:len(counted)], strict=True)}
    if over:  # a pasted page: its rarest parts found in a chunk (a decisive word may come last)
        query = query.narrowed(frozenset(sorted(count, key=lambda k: (count[k] == 0, count[k]))[:MAX_QUERY_PARTS]))
    large = total > COVERAGE_MAX_CHUNKS
    clamped = frozenset(key for key, _ in query.parts if key in count and 2 * count[key] >= total)
    unpaired = frozenset(key for key, _ in query.parts
                         if large and key in count and count[key] >= LARGE_STORE_PAIR_SHARE * total)
    absent = frozenset(e for e, n in zip(exprs, found, strict=True) if n == 0)
    if len(clamped) == len(query.parts):
        return query.plan(coverage_pairs=not large, unpaired=unpaired, absent=absent)
    return query.plan(coverage_pairs=False, common=clamped, drop_common=large, unpaired=unpaired,
                      absent=absent)


def rank_keyword_hits(store: SearchStore, text: str, srcs: list[str], limit: int, *,
                      plan: FtsPlan | None = None) -> list[Candidate]:
    """Keyword hits for ``text`` in ``srcs``, best first (blocking): the query's plan
    (:func:`search_plan` unless ``plan`` is given) ranked by BM25 in SQL, at most ``limit`` of
    each source, scored by :func:`relative_scores`; on a SQLite without FTS5 substring hits
    (``fallback/search/substring.py``); ``[]`` when the text has nothing to search. Raises
    ``IndexStoreError``."""
    if store.fts_error is not None:
        return rank_substring_hits(store, text, srcs, limit)
    plan = plan or search_plan(store, text)
    if plan is None:
        return []
    # Each source gets its own ``limit`` rows, so one source (a long transcript that repeats the
    # query's words) cannot crowd the other out of the candidates; select_results then shares
    # the result slots between them.
    rows = (keyword_rows(store, plan, sources=srcs, limit=limit) if len(srcs) < 2 else sorted(
        (row for src in srcs for row in keyword_rows(store, plan, sources=[src], limit=limit)),
        key=lambda r: row_order(r[6], r[1], r[3])))
    scores = relative_scores([r[6] for r in rows])
    # Candidate's fields in order (positional: keywords cost more per row than the rest of the
    # step): score and text_score are the relative score, no vector score, bm25 None for a
    # LIKE-only row (rank 0.0).
    return [Candidate(cid, path, source, start, end, body, score, 0.0, score,
                      rank if rank != 0.0 else None)
            for (cid, path, source, start, end, body, rank), score in zip(rows, scores, strict=True)]


def rank_keyword_candidates(store: SearchStore, text: str, srcs: list[str], candidates: int, *,
                            plan: FtsPlan | None = None) -> list[Candidate]:
    """At most ``candidates`` keyword candidates per source of ``srcs`` (the keyword fallback:
    in all), best first (blocking): :func:`rank_keyword_hits` (``plan`` as there); when that
    finds nothing (a CJK run with no exact substring match), the query's keywords one by one
    (at most :data:`MAX_FALLBACK_KEYWORDS`: ``cjk_words`` for a CJK query, else
    ``extract_keywords``), a chunk scoring its summed keyword scores over the best sum.
    Raises ``IndexStoreError``."""
    hits = rank_keyword_hits(store, text, srcs, candidates, plan=plan)
    if hits:
        return hits
    by_id: dict[str, Candidate] = {}
    totals: dict[str, float] = {}
    whole = text.lower()
    keywords = ([k for k in cjk_words(text) if k != whole] if contains_cjk(text) else []) or [
        k for k in extract_keywords(text) if k != whole]
    for kw in keywords[:MAX_FALLBACK_KEYWORDS]:
        for hit in rank_keyword_hits(store, kw, srcs, candidates):
            by_id.setdefault(hit.chunk_id, hit)
            totals[hit.chunk_id] = totals.get(hit.chunk_id, 0.0) + hit.text_score
    best = max(totals.values(), default=0.0)
    merged = [replace(by_id[cid], score=total / best, text_score=total / best)
              for cid, total in totals.items()] if best > 0 else []
    return sorted(merged, key=lambda c: (-c.score, c.path, c.start_line))[:candidates]


def highlight_hits(store: SearchStore, text: str, hits: Sequence[Candidate], *,
                   plan: FtsPlan | None = None) -> dict[str, str]:
    """``{chunk_id: text with the query's matches marked}`` of the ``hits`` (keyword or vector
    hits of ``store``), for snippet windows: FTS5 ``highlight()`` of the ``plan``'s
    ``mark_match`` (:func:`search_plan` when ``None``); CJK tokens, matched as substrings, by
    :func:`~fallback.search.snippets.mark_substrings`. A hit left out has no keyword signal.
    Raises ``IndexStoreError``."""
    if not hits or store.fts_error is not None:
        return {}
    plan = plan or search_plan(store, text)
    if plan is None:
        return {}
    texts = {h.chunk_id: h.snippet for h in hits}
    marked = (store.highlights(plan.mark_match, texts, open_mark=MARK_OPEN, close_mark=MARK_CLOSE)
              if plan.mark_match else {})
    needles = [t for t in plan.tokens if contains_unspaced(t)] or list(plan.like_terms)
    if needles:
        for h in hits:
            marked[h.chunk_id] = mark_substrings(marked.get(h.chunk_id, h.snippet), needles)
    return marked

"""Keyword (BM25 / LIKE) candidates of a query from the store, through the store seam.

The store ranks (``fallback/store/seam.py`` ``SearchStore.keyword_rows``: FTS5's
``bm25(chunks_fts, 1.0, 2.0, 1.0)`` in SQLite, the same BM25 from postings in PostgreSQL) the
OR plan of ``fallback/search/fts.py``, which weighs the chunk text, the note's title (path and
first heading) and the derived terms (compound joins, canonical dates). Python then maps each
row's BM25 to a score relative to the best row of the query (:func:`relative_scores`): no chunk
text is tokenized on the query path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from fallback.search.fts import COVERAGE_MAX_CHUNKS, FtsPlan, analyze_fts_query
from fallback.search.ranking import Candidate
from fallback.search.snippets import MARK_CLOSE, MARK_OPEN, mark_substrings
from fallback.search.substring import rank_substring_hits
from fallback.text.keywords import cjk_words, extract_keywords
from fallback.text.scripts import contains_cjk

if TYPE_CHECKING:
    from fallback.store.seam import KeywordRow, SearchStore

__all__ = ["highlight_hits", "keyword_rows",
           "rank_keyword_candidates", "rank_keyword_hits", "relative_scores", "search_plan"]

# The FTS-only fallback searches at most this many extracted keywords (spec §8.6).
MAX_FALLBACK_KEYWORDS = 6
# search_plan() counts the chunks of at most this many parts of a query (a pasted page is not
# counted whole; parts past it are treated as rare).
COUNTED_PARTS = 12
# In a store of more than COVERAGE_MAX_CHUNKS chunks, a part found in at least this share of
# them joins no NEAR pair. A pair costs a walk of both parts' position lists, as long as their
# row lists; what it adds to bm25() is their IDF, at most log(3) ~ 1.1 for such a part
# (measured: docs/benchmarks.md, "Keyword search with common words").
LARGE_STORE_PAIR_SHARE = 0.25


def keyword_rows(store: SearchStore, plan: FtsPlan, *, sources: Sequence[str],
                 limit: int) -> list[KeywordRow]:
    """Run a keyword plan (see ``fallback/search/fts.py``) on the store and return the best
    ``limit`` rows of ``sources`` first (``SearchStore.keyword_rows``; rank ``0.0`` for a
    LIKE-only row).

    Raises:
        IndexStoreError: the store cannot be read.
    """
    return store.keyword_rows(plan.match, sources=sources, limit=limit,
                              trigram_match=plan.trigram_match, like_patterns=plan.like_patterns,
                              fallback_like_patterns=plan.fallback_like_patterns)


def relative_scores(ranks: Sequence[float]) -> list[float]:
    """Map FTS5 ``bm25()`` ranks of one query to scores in ``[0, 1]``, the best row scoring 1.

    A row's score is ``sqrt(bm25 / best bm25 of the query)`` (``bm25()`` is negative for
    matches, more negative = better). Dividing by the best row makes the scale independent of
    the corpus size (FTS5 clamps the IDF of a term found in more than half of the rows to
    ``1e-6``, so in a workspace of a few notes every absolute BM25 is nearly 0); the square root
    spreads the low end, so the default ``minScore`` 0.35 keeps a chunk holding one of a
    question's rare words (about an eighth of the best chunk's BM25) and drops chunks that only
    share words found nearly everywhere. Rows without a BM25 (``LIKE``-only matches, rank ``0``)
    score 1 when no row has one, else 0; non-finite ranks score 0.

    Args:
        ranks: ``bm25()`` values, any order.

    Returns:
        One score per rank, in the same order; the order of the ranks is kept.

    Source: max normalisation of a result list ("relative score fusion"), as hybrid search
    engines do before mixing keyword and vector scores.
    """
    strengths = [-r if isinstance(r, (int, float)) and math.isfinite(r) and r < 0 else 0.0
                 for r in ranks]
    best = max(strengths, default=0.0)
    if best <= 0:
        return [1.0 if isinstance(r, (int, float)) and math.isfinite(r) else 0.0 for r in ranks]
    return [math.sqrt(s / best) for s in strengths]


def search_plan(store: SearchStore, text: str) -> FtsPlan | None:
    """The FTS plan of ``text`` for this store (``fallback/search/fts.py``).

    One statement first counts the chunks holding each of the first :data:`COUNTED_PARTS`
    content parts. FTS5 clamps the IDF of a part found
    in at least half of the chunks to ``1e-6``: such parts (a chat's speaker names, a team's
    own jargon) join no ``NEAR`` pair and mark no snippet line. In a store of more than
    ``COVERAGE_MAX_CHUNKS`` chunks they are also left out of ``MATCH`` when the query has a
    rarer part (that changes no rank), and parts found in :data:`LARGE_STORE_PAIR_SHARE` of the
    chunks join no pair either: where many query words are that common, this halves the query
    time. When every part is like that, BM25 cannot tell a chunk
    matching all parts from one matching a single part; a small store (a workspace of a few
    notes) then gets the coverage pairs, a large one the plain OR (pairs would double its
    cost).

    Raises:
        IndexStoreError: on a SQLite failure.
    """
    query = analyze_fts_query(text, tokenizer=store.fts_tokenizer)
    if query is None or len(query.parts) < 2:
        return None if query is None else query.plan(coverage_pairs=False)
    counted = query.parts[:COUNTED_PARTS]
    total, counts = store.part_counts([expr for _, expr in counted])
    clamped = frozenset(key for (key, _), n in zip(counted, counts, strict=True) if 2 * n >= total)
    large = total > COVERAGE_MAX_CHUNKS
    unpaired = frozenset(key for (key, _), n in zip(counted, counts, strict=True)
                         if large and n >= LARGE_STORE_PAIR_SHARE * total)
    if len(clamped) == len(query.parts):
        return query.plan(coverage_pairs=not large, unpaired=unpaired)
    return query.plan(coverage_pairs=False, common=clamped, drop_common=large, unpaired=unpaired)


def rank_keyword_hits(store: SearchStore, text: str, srcs: list[str], limit: int, *,
                      plan: FtsPlan | None = None) -> list[Candidate]:
    """Keyword hits for ``text``, best first (blocking): the plan of ``fallback/search/fts.py`` ranked by BM25 in SQL, restricted to the
    sources ``srcs``, at most ``limit`` of each source, each scored by :func:`relative_scores`.

    Args:
        store: the store.
        text: the query.
        srcs: sources searched.
        limit: rows wanted of each source.
        plan: the query's :func:`search_plan`, when the caller has it already.

    Returns ``[]`` when FTS5 is unavailable or the text has nothing to search.

    Raises:
        IndexStoreError: on a SQLite failure.
    """
    if store.fts_error is not None:
        return []
    plan = plan or search_plan(store, text)
    if plan is None:
        return []
    # Each source gets its own ``limit`` rows, so one source (a long transcript that repeats the
    # query's words) cannot crowd the other out of the candidates; select_results then shares
    # the result slots between them.
    rows = (keyword_rows(store, plan, sources=srcs, limit=limit) if len(srcs) < 2 else sorted(
        (row for src in srcs for row in keyword_rows(store, plan, sources=[src], limit=limit)),
        key=lambda r: (r[6], r[1], r[3])))
    scores = relative_scores([r[6] for r in rows])
    return [Candidate(chunk_id=cid, path=path, source=source, start_line=start, end_line=end,
                      snippet=body, score=score, text_score=score,
                      bm25=rank if rank != 0.0 else None)  # 0.0: a LIKE-only row
            for (cid, path, source, start, end, body, rank), score in zip(rows, scores, strict=True)]


def _hits(store: SearchStore, text: str, srcs: list[str], limit: int, *,
          plan: FtsPlan | None = None) -> list[Candidate]:
    """:func:`rank_keyword_hits`, or on a SQLite without FTS5 substring hits
    (``fallback/search/substring.py``)."""
    if store.fts_error is not None:  # a SQLite without FTS5: scan the chunk table instead
        return rank_substring_hits(store, text, srcs, limit)
    return rank_keyword_hits(store, text, srcs, limit, plan=plan)


def rank_keyword_candidates(store: SearchStore, text: str, srcs: list[str], candidates: int, *,
                            plan: FtsPlan | None = None) -> list[Candidate]:
    """Keyword candidates for ``text``, best first (blocking): the hits of the whole query (an
    OR of its content parts, ranked by BM25; substring hits on a SQLite without FTS5), each
    scored by :func:`relative_scores`; when that finds nothing (a CJK run with no exact
    substring match), the query's keywords are searched one by one (at most
    :data:`MAX_FALLBACK_KEYWORDS`) and each chunk scores the sum of its per-keyword scores, so a
    chunk matching more keywords ranks higher; scores are then divided by the best one. The
    keywords of a query holding CJK text are its words (``fallback.text.keywords.cjk_words``:
    ideograph bigrams that take no stop word's character, Japanese and Korean words, then lone
    ideographs), so the stop words that open a question (我们什么时候) take no slot; other
    queries, and a CJK query with no such word, take
    ``fallback.text.keywords.extract_keywords`` (CJK unigrams and bigrams, Korean stems).

    Args:
        store: the store.
        text: the query.
        srcs: sources searched.
        candidates: most candidates returned of each source (:func:`rank_keyword_hits`; the
            keyword-by-keyword fallback returns at most this many in all).
        plan: the query's :func:`search_plan`, when the caller has it already.

    Returns ``[]`` when the text has nothing to search.

    Raises:
        IndexStoreError: on a SQLite failure.
    """
    hits = _hits(store, text, srcs, candidates, plan=plan)
    if hits:
        return hits
    by_id: dict[str, Candidate] = {}
    totals: dict[str, float] = {}
    whole = text.lower()
    keywords = ([k for k in cjk_words(text) if k != whole] if contains_cjk(text) else []) or [
        k for k in extract_keywords(text) if k != whole]
    for kw in keywords[:MAX_FALLBACK_KEYWORDS]:
        for hit in _hits(store, kw, srcs, candidates):
            by_id.setdefault(hit.chunk_id, hit)
            totals[hit.chunk_id] = totals.get(hit.chunk_id, 0.0) + hit.text_score
    best = max(totals.values(), default=0.0)
    merged = [replace(by_id[cid], score=total / best, text_score=total / best)
              for cid, total in totals.items()] if best > 0 else []
    return sorted(merged, key=lambda c: (-c.score, c.path, c.start_line))[:candidates]


def highlight_hits(store: SearchStore, text: str, hits: Sequence[Candidate], *,
                   plan: FtsPlan | None = None) -> dict[str, str]:
    """The text of each hit with the query's matches marked, for snippet windows.

    FTS5 ``highlight()`` wraps every token of the chunk text that matches the plan of ``text``
    (same tokenizer and stemming as the ranking) in ``\\x01`` / ``\\x02``; CJK tokens, which
    match as substrings through the trigram table or ``LIKE``, are marked with
    :func:`~fallback.search.snippets.mark_substrings`. Only the given hits are read.

    Args:
        store: the store the hits came from.
        text: the query.
        hits: the hits to mark (any mix of keyword and vector hits).
        plan: the query's :func:`search_plan`, when the caller has it already.

    Returns:
        ``{chunk_id: marked text}``; a hit absent from the map has no keyword signal.

    Raises:
        IndexStoreError: on a SQLite failure.
    """
    if not hits or store.fts_error is not None:
        return {}
    plan = plan or search_plan(store, text)
    if plan is None:
        return {}
    texts = {h.chunk_id: h.snippet for h in hits}
    marked = (store.highlights(plan.mark_match, texts, open_mark=MARK_OPEN, close_mark=MARK_CLOSE)
              if plan.mark_match else {})
    needles = [t for t in plan.tokens if contains_cjk(t)] or list(plan.like_terms)
    if needles:
        for h in hits:
            marked[h.chunk_id] = mark_substrings(marked.get(h.chunk_id, h.snippet), needles)
    return marked

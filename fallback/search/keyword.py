"""Keyword (FTS5 BM25 / LIKE) candidate rows from the store for one FTS query plan.

Kept apart from ``fallback/store/db.py`` so the store module
stays about connections, transactions and publishing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from fallback.errors import IndexStoreError
from fallback.search.fts import FtsPlan, bm25_rank_to_score, build_fts_query, fts_only_score
from fallback.search.ranking import Candidate
from fallback.search.substring import substring_hits
from fallback.text.keywords import extract_keywords

if TYPE_CHECKING:
    from fallback.store.db import Store

__all__ = ["keyword_candidates", "keyword_hits", "keyword_rows"]

# FTS5 ranks at most max(limit x INNER_OVERSAMPLE, MIN_INNER_ROWS) rows before they are joined
# with the chunks and filtered (see _keyword_rows).
INNER_OVERSAMPLE = 4
MIN_INNER_ROWS = 200
# The FTS-only fallback searches at most this many extracted keywords (spec §8.6).
MAX_FALLBACK_KEYWORDS = 6


def keyword_rows(store: Store, plan: FtsPlan, *, sources: Sequence[str],
                 limit: int) -> list[tuple[str, str, str, int, int, str, float]]:
    """Run a keyword plan (see ``fallback/search/fts.py``) and return the best rows first.

    Rows are ``(chunk_id, path, source, start_line, end_line, text, rank)`` where ``rank`` is
    the FTS5 ``bm25()`` value (negative = better; ``0.0`` for LIKE-only rows), ordered by rank
    then path and start line, at most ``limit`` rows, restricted to ``sources``. Only chunks that
    still exist in ``chunks`` are returned. When ``MATCH`` itself fails (tokenizer quirks) the
    plan is retried as a LIKE scan over every token with rank 0 (spec §8.2).

    Raises:
        IndexStoreError: on any other SQLite failure.
    """
    if limit <= 0 or not sources:
        return []
    try:
        return _keyword_rows(store, plan, sources=sources, limit=limit, like_only=False)
    except IndexStoreError as exc:
        if not isinstance(exc.__cause__, sqlite3.OperationalError) or "fts5" not in str(
                exc.__cause__).lower() and "match" not in str(exc.__cause__).lower():
            raise
        return _keyword_rows(store, plan, sources=sources, limit=limit, like_only=True)


def _keyword_rows(store: Store, plan: FtsPlan, *, sources: Sequence[str], limit: int,
                  like_only: bool) -> list[tuple[str, str, str, int, int, str, float]]:
    if not like_only and plan.match:
        # Rank inside FTS5 first and join only the best rows with ``chunks`` (whose text is
        # large): for a common word that matches most chunks this halves the query time. The
        # other filters (sources, trigram, LIKE) may drop rows, so when the cut was saturated
        # and too few rows survive, run again without it.
        inner = max(limit * INNER_OVERSAMPLE, MIN_INNER_ROWS)
        rows = _keyword_sql(store, plan, sources=sources, limit=limit, like_only=False,
                            inner_limit=inner)
        if len(rows) >= limit or not _cut_saturated(store, plan, inner):
            return rows
    return _keyword_sql(store, plan, sources=sources, limit=limit, like_only=like_only,
                        inner_limit=None)


def _cut_saturated(store: Store, plan: FtsPlan, inner: int) -> bool:
    found = store.query("SELECT COUNT(*) FROM (SELECT rowid FROM chunks_fts WHERE chunks_fts"
                        " MATCH ? LIMIT ?)", [plan.match, inner + 1])
    return int(found[0][0]) > inner


def _keyword_sql(store: Store, plan: FtsPlan, *, sources: Sequence[str], limit: int,
                 like_only: bool, inner_limit: int | None) -> list[tuple[str, str, str, int, int, str, float]]:
    joins: list[str] = []
    params: list[Any] = []
    rank = "0.0"
    likes = plan.fallback_like_patterns if like_only else plan.like_patterns
    if not like_only and plan.match:
        cut = " ORDER BY r LIMIT ?" if inner_limit is not None else ""
        joins.append("JOIN (SELECT rowid AS rid, bm25(chunks_fts) AS r FROM chunks_fts"
                     f" WHERE chunks_fts MATCH ?{cut}) m ON m.rid = c.rowid")
        params.append(plan.match)
        if inner_limit is not None:
            params.append(int(inner_limit))
        rank = "m.r"
    if not like_only and plan.trigram_match:
        joins.append("JOIN (SELECT rowid AS rid, bm25(chunks_trigram) AS r FROM chunks_trigram"
                     " WHERE chunks_trigram MATCH ?) t ON t.rid = c.rowid")
        params.append(plan.trigram_match)
        rank = rank if rank != "0.0" else "t.r"
    where = [f"c.source IN ({', '.join('?' for _ in sources)})"]
    params.extend(sources)
    for pattern in likes:
        where.append("c.text LIKE ? ESCAPE '\\'")
        params.append(pattern)
    sql = (f"SELECT c.id, c.path, c.source, c.start_line, c.end_line, c.text, {rank} AS rank"
           f" FROM chunks c {' '.join(joins)} WHERE {' AND '.join(where)}"
           " ORDER BY rank ASC, c.path ASC, c.start_line ASC LIMIT ?")
    params.append(int(limit))
    rows = store.query(sql, params)
    return [(r[0], r[1], r[2], int(r[3]), int(r[4]), r[5], float(r[6])) for r in rows]


async def keyword_hits(store: Store, text: str, srcs: list[str], limit: int) -> list[Candidate]:
    """Raw keyword hits for ``text`` (BM25 rank mapped to a score, spec §8.3), best first."""
    if store.fts_error is not None:  # a SQLite without FTS5: scan the chunk table instead
        return await substring_hits(store, text, srcs, limit)
    plan = build_fts_query(text, tokenizer=store.fts_tokenizer)
    if plan is None:
        return []
    rows = await anyio.to_thread.run_sync(partial(
        keyword_rows, store, plan, sources=srcs, limit=limit))
    out = []
    for cid, path, source, start, end, body, rank in rows:
        score = bm25_rank_to_score(rank)
        out.append(Candidate(chunk_id=cid, path=path, source=source, start_line=start,
                             end_line=end, snippet=body, score=score, text_score=score,
                             bm25=rank if rank != 0.0 else None))  # 0.0: a LIKE-only row
    return out


async def keyword_candidates(store: Store, text: str, srcs: list[str],
                             candidates: int) -> list[Candidate]:
    """Keyword hits for ``text`` with coverage-boosted scores (spec §8.6): the full query
    (AND of its tokens) first; when that finds nothing, up to six extracted keywords
    searched one by one and merged (per chunk the best text score)."""
    hits = await keyword_hits(store, text, srcs, candidates)
    if not hits:
        by_id: dict[str, Candidate] = {}
        keywords = [k for k in extract_keywords(text) if k != text.lower()]
        for kw in keywords[:MAX_FALLBACK_KEYWORDS]:
            for hit in await keyword_hits(store, kw, srcs, candidates):
                prev = by_id.get(hit.chunk_id)
                if prev is None or hit.text_score > prev.text_score:
                    by_id[hit.chunk_id] = hit
        hits = list(by_id.values())
    # BM25's IDF collapses to ~1e-6 in small corpora (a term in half the chunks), which
    # would make every keyword hit worthless in a fresh workspace; the coverage-aware
    # score keeps BM25 as its base and stays in [0, 1].
    out = []
    for h in hits:
        boosted = fts_only_score(h.text_score, query=text, text=h.snippet, path=h.path)
        out.append(replace(h, score=boosted, text_score=boosted))
    return out

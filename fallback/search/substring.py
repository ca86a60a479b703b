"""Keyword search without FTS5: a substring scan of the chunk table.

Some SQLite builds have no FTS5 (``no such module: fts5``); the store then records why in
``meta.fts_error`` (migration ``m002``) and has no ``chunks_fts``/``chunks_trigram`` tables.
Keyword search must still find ``ABC-1234`` in such a store, so :func:`rank_substring_hits` answers
it from ``chunks.text``:

- the query is cut into the same tokens as an FTS query (lower-cased NFC runs of
  ``[\\p{L}\\p{M}\\p{N}_]+``, ``fallback/search/fts.py``) and a chunk matches when it contains
  every token as a substring, case-insensitively (``str.casefold``), as the FTS plan ANDs its
  tokens; SQLite's ``LIKE`` pre-filters on the ASCII tokens (it folds ASCII case only), the
  rest is checked in Python;
- the text score is a term-frequency saturation, ``mean over tokens of tf / (tf + 1)`` (the
  ``k1 = 1`` TF part of BM25 without IDF or length normalisation, which need corpus statistics
  FTS5 would keep), in ``(0, 1)``; the pipeline then adds its usual query-coverage boosts.

It reads every chunk of the searched sources that passes the pre-filter, so it is slower than
FTS5 on a large index; the engine says so in the answer's warnings and in ``status``.

Source: the TF saturation of Okapi BM25 (Robertson & Zaragoza 2009) with ``k1 = 1``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fallback.search.fts import escape_like
from fallback.search.ranking import Candidate
from fallback.text.scripts import word_runs

if TYPE_CHECKING:
    from fallback.store.seam import SearchStore

__all__ = ["SUBSTRING_WARNING", "rank_substring_hits", "substring_score"]

# The answer's warning while keyword search runs without FTS5 ({error}: the recorded reason).
SUBSTRING_WARNING = ("FTS5 is unavailable in this SQLite ({error}): keyword search is a "
                     "substring scan of the chunks, without BM25 ranking")


def substring_score(text: str, tokens: Sequence[str]) -> float:
    """Text score of a chunk for lower-cased query ``tokens``: mean of ``tf / (tf + 1)``.

    Args:
        text: the chunk text.
        tokens: distinct lower-cased query tokens (non-empty).

    Returns:
        A score in ``[0, 1)``; ``0.0`` when a token is missing (the chunk does not match).
    """
    folded = unicodedata.normalize("NFC", text).casefold()
    total = 0.0
    for token in tokens:
        tf = folded.count(token.casefold())
        if tf == 0:
            return 0.0
        total += tf / (tf + 1)
    return total / len(tokens)


def rank_substring_hits(store: SearchStore, text: str, srcs: list[str], limit: int) -> list[Candidate]:
    """Keyword hits for ``text`` without FTS5, best first (see the module docstring); blocking.

    Args:
        store: the open store.
        text: the query.
        srcs: sources searched (``memory``, ``sessions``).
        limit: most hits returned.

    Returns:
        Candidates with ``score == text_score`` in ``(0, 1)`` and ``bm25 = None``, ordered by
        score, then path and start line; ``[]`` for a query without tokens.

    Raises:
        IndexStoreError: the store cannot be read.
    """
    tokens = list(dict.fromkeys(t.lower() for t in word_runs(text)))
    if not tokens or not srcs or limit <= 0:
        return []
    rows = store.substring_rows([escape_like(t) for t in tokens if t.isascii()], sources=srcs)
    scored = [(substring_score(row[5], tokens), row) for row in rows]
    ranked = sorted(((s, r) for s, r in scored if s > 0), key=lambda x: (-x[0], x[1][1], x[1][3]))
    return [Candidate(chunk_id=cid, path=path, source=source, start_line=start, end_line=end,
                      snippet=body, score=score, text_score=score, bm25=None)
            for score, (cid, path, source, start, end, body, _) in ranked[:limit]]


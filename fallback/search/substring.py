"""Keyword search without FTS5: a substring scan of the chunk table.

A SQLite without FTS5 records why in ``meta.fts_error`` and has no FTS tables; keyword search
must still find ``ABC-1234`` there. The query is cut into the tokens of an FTS query (lower-cased
NFC word runs) and a chunk matches when it holds every token as a case-insensitive substring
(``LIKE`` pre-filters the ASCII tokens, Python checks the rest); its score is the mean over
tokens of ``tf / (tf + 1)`` (BM25's TF saturation with ``k1 = 1``, without IDF). It reads every
chunk that passes the pre-filter; the engine says so in the answer's warnings and ``status``.
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
    """Text score in ``[0, 1)`` of chunk ``text`` for distinct lower-cased query ``tokens``
    (non-empty): mean of ``tf / (tf + 1)``; ``0.0`` when a token is missing."""
    folded = unicodedata.normalize("NFC", text).casefold()
    total = 0.0
    for token in tokens:
        tf = folded.count(token.casefold())
        if tf == 0:
            return 0.0
        total += tf / (tf + 1)
    return total / len(tokens)


def rank_substring_hits(store: SearchStore, text: str, srcs: list[str], limit: int) -> list[Candidate]:
    """At most ``limit`` keyword hits for ``text`` in ``srcs`` without FTS5 (see the module
    docstring; blocking): ``score == text_score`` in ``(0, 1)``, ``bm25 = None``, by score,
    then path and start line; ``[]`` for a query without tokens. Raises ``IndexStoreError``."""
    tokens = list(dict.fromkeys(t.lower() for t in word_runs(text)))
    if not tokens or not srcs or limit <= 0:
        return []
    rows = store.substring_rows([escape_like(t) for t in tokens if t.isascii()], sources=srcs)
    scored = [(substring_score(row[5], tokens), row) for row in rows]
    ranked = sorted(((s, r) for s, r in scored if s > 0), key=lambda x: (-x[0], x[1][1], x[1][3]))
    return [Candidate(chunk_id=cid, path=path, source=source, start_line=start, end_line=end,
                      snippet=body, score=score, text_score=score, bm25=None)
            for score, (cid, path, source, start, end, body, _) in ranked[:limit]]


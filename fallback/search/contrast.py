"""The query's common terms, contrasted out of its embedding before vector search.

The query's content words found in at least :data:`COMMON_SHARE` of the chunks (and at least
:data:`COMMON_MIN_CHUNKS` of them) are embedded on their own as a background ``b`` and the
search runs with ``q' = q - CONTRAST_WEIGHT * b`` (:func:`contrast_vector`); why, in
docs/architecture.md ("How the builtin engine searches").

Source: IDF (Sparck Jones 1972) as BM25 applies it; query-vector modification as in Rocchio
(1971), with the background taken from the query's own common terms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fallback.search.fts import TRIGRAM_MIN_CHARS, quote_term
from fallback.text.keywords import STOP_WORDS
from fallback.text.scripts import contains_cjk, word_runs

if TYPE_CHECKING:
    from fallback.store.seam import SearchStore

__all__ = [
    "CONTRAST_WEIGHT",
    "background_text",
    "common_words",
    "content_words",
    "contrast_vector",
]

# A word is common when at least this share of the chunks holds it (where BM25 gives it no weight).
COMMON_SHARE = 0.5
# ... and at least this many chunks (half of a few chunks says nothing about a word).
COMMON_MIN_CHUNKS = 10
# Weight of the background query removed from the query vector (chosen on LoCoMo:
# docs/benchmarks.md, "The contrast weight").
CONTRAST_WEIGHT = 0.5
# Content words of one query whose chunk counts are read (a pasted page is not counted whole).
MAX_COUNTED_WORDS = 8


def content_words(text: str) -> list[str]:
    """The words of ``text`` a background may hold: its lower-cased word runs without stop
    words, single characters and CJK runs (one FTS5 token each), first occurrence kept, at
    most :data:`MAX_COUNTED_WORDS`."""
    out: list[str] = []
    for word in word_runs(text):
        w = word.lower()
        if len(w) < 2 or w in STOP_WORDS or contains_cjk(w) or w in out:
            continue
        out.append(w)
        if len(out) == MAX_COUNTED_WORDS:
            break
    return out


def common_words(store: SearchStore, text: str) -> list[str]:
    """The content words of ``text`` (:func:`content_words`), in query order, held by at least
    ``max(COMMON_MIN_CHUNKS, COMMON_SHARE x chunks)`` chunks (the text column of ``chunks_fts``,
    every source; a trigram table skips words under 3 code points); ``[]`` without FTS5.
    Blocking. Raises ``IndexStoreError``."""
    if store.fts_error is not None:
        return []
    words = content_words(text)
    if store.fts_tokenizer == "trigram":
        words = [w for w in words if len(w) >= TRIGRAM_MIN_CHARS]
    if not words:
        return []
    total, counts = store.part_counts([f"text : {quote_term(w)}" for w in words])
    need = max(COMMON_MIN_CHUNKS, math.ceil(COMMON_SHARE * total))
    return [w for w, n in zip(words, counts, strict=True) if n >= need]


def background_text(words: Sequence[str]) -> str:
    """The background query embedded for ``words``: the words joined by spaces."""
    return " ".join(words)


def _unit(vector: Sequence[float]) -> list[float] | None:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if not math.isfinite(norm) or norm == 0.0:
        return None
    return [x / norm for x in vector]


def contrast_vector(query: Sequence[float], background: Sequence[float], *,
                    weight: float = CONTRAST_WEIGHT) -> list[float]:
    """``unit(query) - weight x unit(background)``, not normalised (pure): its cosine with a
    unit window ``w`` orders as ``cos(q, w) - weight x cos(b, w)``.

    ``background`` embeds the query's common terms (:func:`background_text`); ``weight`` in
    ``[0, 1)``. ``query`` comes back unchanged (as a list) when either vector is zero or not
    finite, their lengths differ, or the result would be zero.
    """
    q, b = _unit(query), _unit(background)
    if q is None or b is None or len(q) != len(b):
        return list(query)
    out = [x - weight * y for x, y in zip(q, b, strict=True)]
    return out if _unit(out) is not None else list(query)

"""FTS5 query building for keyword search (pure: no SQLite, no clock).

User text reaches ``MATCH`` only through :func:`build_fts_query`: the query is NFC-normalised,
cut into runs of Unicode letters, combining marks, digits and ``_`` (``[\\p{L}\\p{M}\\p{N}_]+``),
each run is wrapped in double quotes (so ``AND``/``OR``/``NOT``/``NEAR``, ``*``, ``:``, ``^``,
``-``, parentheses and quotes are always literal text, never FTS5 syntax) and the runs are ANDed
(spec §8.2, E2).

CJK scheme (the default ``unicode61`` tokenizer treats an unbroken CJK run as one token, so a
sub-word of a Japanese or Chinese sentence never matches by ``MATCH``):

- tokens without CJK/kana/Hangul go to ``chunks_fts`` (unicode61) and drive BM25 ranking, so
  English ranking is unchanged;
- CJK tokens of >= 3 code points go to ``chunks_trigram`` (FTS5 ``trigram case_sensitive 0``,
  same text, rowid = chunk rowid), which matches any substring of >= 3 characters;
- CJK tokens of 1-2 code points cannot be matched by a trigram index: they become
  ``text LIKE '%tok%' ESCAPE '\\'`` filters (``\\``, ``%``, ``_`` escaped) on ``chunks.text``.

All parts are ANDed. Rank: BM25 of ``chunks_fts`` when it has tokens, else BM25 of
``chunks_trigram``, else 0 (LIKE-only rows). Status reports this scheme as ``trigram+like``.

With ``store.fts.tokenizer = "trigram"`` the main table itself is trigram: every token of >= 3
code points goes to its ``MATCH`` and every shorter token (any script) becomes a LIKE filter.

Source: FTS5 BM25 (Robertson & Zaragoza 2009, as implemented by SQLite's ``bm25()``); the
rank-to-score mapping and the LIKE plan follow the reference system's builtin engine (OpenClaw
``MemoryIndexManager``).
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

from fallback.text.scripts import contains_cjk, word_runs

__all__ = [
    "FtsPlan",
    "bm25_rank_to_score",
    "build_fts_query",
    "contains_cjk",
    "escape_like",
    "fts_only_score",
    "fts_tokens",
]

# Below this many code points a CJK token cannot be found through a trigram index.
TRIGRAM_MIN_CHARS = 3

def fts_tokens(text: str) -> list[str]:
    """Return the NFC runs of ``[\\p{L}\\p{M}\\p{N}_]+`` in ``text``, in order (may repeat)."""
    return word_runs(text)


def escape_like(token: str) -> str:
    """Return the ``LIKE`` pattern ``%token%`` with ``\\``, ``%`` and ``_`` escaped by ``\\``."""
    escaped = token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _quote(token: str) -> str:
    return '"' + token.replace('"', "") + '"'


@dataclass(frozen=True)
class FtsPlan:
    """How one query runs against the store.

    Attributes:
        tokens: every query token (NFC, order kept, duplicates removed).
        match: ``MATCH`` expression for ``chunks_fts`` (quoted tokens ANDed), or ``None``.
        trigram_match: ``MATCH`` expression for ``chunks_trigram`` (CJK tokens of >= 3 code
            points, unicode61 stores only), or ``None``.
        like_terms: tokens matched by ``LIKE`` on ``chunks.text`` (short CJK tokens; with the
            trigram tokenizer every token shorter than 3 code points).
    """

    tokens: tuple[str, ...]
    match: str | None
    trigram_match: str | None
    like_terms: tuple[str, ...]

    @property
    def like_patterns(self) -> tuple[str, ...]:
        """Escaped ``%tok%`` patterns of :attr:`like_terms` (use with ``ESCAPE '\\'``)."""
        return tuple(escape_like(t) for t in self.like_terms)

    @property
    def fallback_like_patterns(self) -> tuple[str, ...]:
        """Escaped patterns of every token: the plan when ``MATCH`` itself fails."""
        return tuple(escape_like(t) for t in self.tokens)


def build_fts_query(query: str, *, tokenizer: str = "unicode61") -> FtsPlan | None:
    """Turn free text into a safe FTS plan; never raises.

    Args:
        query: any user text (operators, quotes, dates like ``2026-03-31``, emoji ...).
        tokenizer: the tokenizer of ``chunks_fts``: ``unicode61`` (default) or ``trigram``.

    Returns:
        ``None`` when the text has no token (blank, only punctuation or emoji); else a
        :class:`FtsPlan`. Examples (unicode61): ``hello world`` -> match ``"hello" AND
        "world"``; ``FOO_bar baz-1`` -> ``"FOO_bar" AND "baz" AND "1"``; ``価格 2026年`` ->
        no match, trigram ``"2026年"``, like ``価格``.
    """
    tokens = tuple(dict.fromkeys(t for t in fts_tokens(query) if t.replace('"', "")))
    if not tokens:
        # No letters or digits at all (emoji, symbols such as "→" or "★"): the tokenizers drop
        # those characters, so look for the text itself as a substring.
        symbols = " ".join(unicodedata.normalize("NFC", query).split())
        if not any(unicodedata.category(ch) in ("So", "Sm") for ch in symbols):
            return None
        return FtsPlan(tokens=(), match=None, trigram_match=None, like_terms=(symbols,))
    main: list[str] = []
    trigram: list[str] = []
    like: list[str] = []
    for tok in tokens:
        if tokenizer == "trigram":
            (main if len(tok) >= TRIGRAM_MIN_CHARS else like).append(tok)
        elif not contains_cjk(tok):
            main.append(tok)
        elif len(tok) >= TRIGRAM_MIN_CHARS:
            trigram.append(tok)
        else:
            like.append(tok)
    return FtsPlan(
        tokens=tokens,
        match=" AND ".join(_quote(t) for t in main) or None,
        trigram_match=" AND ".join(_quote(t) for t in trigram) or None,
        like_terms=tuple(like),
    )


def bm25_rank_to_score(rank: float) -> float:
    """Map an FTS5 ``bm25()`` rank to a score in ``(0, 1]``, higher is better (spec §8.3, E2).

    ``bm25()`` is negative for matches (more negative = better): ``rank < 0`` -> ``r/(1+r)``
    with ``r = -rank``; ``rank >= 0`` -> ``1/(1+rank)``; non-finite -> ``0.001``.
    So ``0`` -> 1, ``1`` -> 0.5, ``-4.2`` > ``-2.1`` > ``-0.5``.
    """
    if not isinstance(rank, (int, float)) or not math.isfinite(rank):
        return 1 / 1000
    if rank < 0:
        r = -rank
        return r / (1 + r)
    return 1 / (1 + rank)


# FTS-only score boosts (spec §8.6, E2): query coverage, chunk focus, path match, length.
_BOOST_QUERY_COVERAGE = 0.45
_BOOST_CHUNK_FOCUS = 0.2
_BOOST_PATH_TOKEN = 0.18
_BOOST_LENGTH_MAX = 0.18
_BOOST_LENGTH_CHARS = 160


def fts_only_score(text_score: float, *, query: str, text: str, path: str) -> float:
    """Boosted ranking score of a keyword hit in FTS-only mode (no embedding provider).

    ``min(1, text_score + 0.45·(matched distinct query tokens / distinct query tokens)
    + 0.2·(matched / distinct tokens in the chunk) + 0.18·(query tokens found in the lower-cased
    path) + min(len(text)/160, 0.18))``; tokens are lower-cased NFC ``[\\p{L}\\p{M}\\p{N}_]+``
    runs, and a CJK query token also counts as matched when it occurs as a substring of the
    chunk (the unicode61 tokenizer keeps whole CJK runs as one token).

    Args:
        text_score: BM25-derived score in ``[0, 1]``.
        query: the user's query.
        text: the chunk text.
        path: the chunk's workspace-relative path.

    Returns:
        A score in ``[0, 1]``.

    Source: OpenClaw ``MemoryIndexManager`` FTS-only ranking.
    """
    q_tokens = {t.lower() for t in fts_tokens(query)}
    if not q_tokens:
        return min(1.0, text_score)
    low_text = unicodedata.normalize("NFC", text).lower()
    c_tokens = {t.lower() for t in fts_tokens(text)}
    matched = sum(1 for t in q_tokens if t in c_tokens or (contains_cjk(t) and t in low_text))
    low_path = path.lower()
    in_path = sum(1 for t in q_tokens if t in low_path)
    score = (text_score
             + _BOOST_QUERY_COVERAGE * matched / len(q_tokens)
             + (_BOOST_CHUNK_FOCUS * matched / len(c_tokens) if c_tokens else 0.0)
             + _BOOST_PATH_TOKEN * in_path
             + min(len(text) / _BOOST_LENGTH_CHARS, _BOOST_LENGTH_MAX))
    return min(1.0, score)

"""FTS5 query building for keyword search (pure: no SQLite, no clock).

User text reaches ``MATCH`` only through :func:`analyze_fts_query`: every term is quoted
(:func:`quote_term`), so FTS5 syntax in a query is always literal text. The plan (an OR of the
question's parts over ``chunks_fts``, ranked by ``bm25()``; tokens of the scripts written
without spaces between words, CJK and Thai among them, through ``chunks_trigram`` and ``LIKE``)
is described in docs/architecture.md ("How the builtin engine searches").
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from fallback.text.keywords import STOP_WORDS, contraction_fragments
from fallback.text.scripts import contains_unspaced, narrow_fullwidth, word_runs
from fallback.text.terms import compounds, date_mentions

if TYPE_CHECKING:
    import regex

__all__ = [
    "COVERAGE_MAX_CHUNKS",
    "TRIGRAM_MIN_CHARS",
    "FtsPlan",
    "MAX_QUERY_PARTS",
    "FtsQuery",
    "analyze_fts_query",
    "escape_like",
    "quote_term",
]

# Below this many code points a token cannot be found through a trigram index.
TRIGRAM_MIN_CHARS = 3
# Content parts of one query that go into MATCH (a pasted page must not become a huge OR);
# a query with more keeps its rarest (fallback/search/keyword.py), of the first MAX_QUERY_PARTS * 4.
MAX_QUERY_PARTS = 32
# NEAR(a b, N): two parts count as close within this many tokens (a short sentence).
NEAR_DISTANCE = 10
# At most this many NEAR pairs and joined adjacent pairs per query.
MAX_PAIRS = 8
# Coverage pairs: pairs of the first this many content parts are ANDed (6 parts: 15 pairs).
COVERAGE_PARTS = 6
# A store of at most this many chunks is small (fallback/search/keyword.py): its queries get
# coverage pairs when every part is common, and keep common parts in their OR.
COVERAGE_MAX_CHUNKS = 1000

# Word runs: letters, marks, digits and "_". In ASCII text those are exactly [A-Za-z0-9_] (no
# ASCII character is a mark), so an ASCII query needs no Unicode property tables.
_WORD_PATTERN = r"[\p{L}\p{M}\p{N}_]+"
_ASCII_WORD_RE = re.compile(r"[A-Za-z0-9_]+")
_QUOTED_RE = re.compile(r'"([^"]+)"')


@functools.cache
def _word_re() -> regex.Pattern[str]:
    import regex  # on first use: an ASCII query never loads it

    return regex.compile(_WORD_PATTERN)


def _word_matches(text: str) -> Iterator[re.Match[str] | regex.Match[str]]:
    """The word runs of ``text`` (``[\\p{L}\\p{M}\\p{N}_]+``) with their positions."""
    return (_ASCII_WORD_RE if text.isascii() else _word_re()).finditer(text)


def escape_like(token: str) -> str:
    """Return the ``LIKE`` pattern ``%token%`` with ``\\``, ``%`` and ``_`` escaped by ``\\``."""
    escaped = token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def quote_term(token: str) -> str:
    """``token`` as one FTS5 string (double quotes removed from it): never an operator."""
    return '"' + token.replace('"', "") + '"'


class FtsPlan(NamedTuple):
    """How one query runs against the store: every query ``token`` (NFC, first occurrences),
    the ``MATCH`` of ``chunks_fts`` and of ``chunks_trigram`` (long CJK tokens; either may be
    ``None``), the short tokens matched by ``LIKE``, the content parts searched (``terms``,
    lower-case), ``mark_match`` (their OR without common parts or pairs, whose ``highlight()``
    marks a snippet window) and ``(key, MATCH expression)`` of each part (``parts``)."""

    tokens: tuple[str, ...]
    match: str | None
    trigram_match: str | None
    like_terms: tuple[str, ...]
    terms: tuple[str, ...] = ()
    mark_match: str | None = None
    parts: tuple[tuple[str, str], ...] = ()

    @property
    def like_patterns(self) -> tuple[str, ...]:
        """Escaped ``%tok%`` patterns of :attr:`like_terms` (use with ``ESCAPE '\\'``)."""
        return tuple(escape_like(t) for t in self.like_terms)

    @property
    def fallback_like_patterns(self) -> tuple[str, ...]:
        """Escaped patterns of every token: the plan when ``MATCH`` itself fails."""
        return tuple(escape_like(t) for t in self.tokens)


class _Part(NamedTuple):
    """One unit of a query: a word, a compound or a date, with its span."""

    start: int
    end: int
    kind: str            # "word" | "compound" | "date"
    key: str             # lower-case word, joined compound or canonical date
    phrase: str          # the FTS5 phrase standing for it inside NEAR ("wi fi" for Wi-Fi)
    expr: str            # its MATCH sub-expression
    fragment: bool = False  # a piece of an English contraction ("s" of "Nate's")


def _query_parts(text: str, words: list[re.Match[str] | regex.Match[str]]) -> list[_Part]:
    """Dates, then compounds, then words (``words``: the word runs of ``text``) of ``text``
    (NFC), left to right, spans disjoint."""
    parts: list[_Part] = []
    taken: list[tuple[int, int]] = []

    def free(start: int, end: int) -> bool:
        return not any(start < e and s < end for s, e in taken)

    for d in date_mentions(text):
        taken.append((d.start, d.end))
        parts.append(_Part(d.start, d.end, "date", d.terms[0], quote_term(d.terms[0]), quote_term(d.terms[0])))
    for c in compounds(text):
        if not free(c.start, c.end) or any(contains_unspaced(p) for p in c.parts):
            continue
        taken.append((c.start, c.end))
        phrase = quote_term(" ".join(c.parts))
        parts.append(_Part(c.start, c.end, "compound", c.joined, phrase,
                           f"({phrase} OR {quote_term(c.joined)})"))
    fragments = set(contraction_fragments(text))
    for m in words:
        start, end = m.span()
        if taken and not free(start, end):
            continue
        word = m.group().lower()
        narrow = narrow_fullwidth(word)
        phrase = quote_term(narrow)
        expr = phrase if narrow == word else f"({quote_term(word)} OR {phrase})"
        parts.append(_Part(start, end, "word", narrow, phrase, expr, (start, end) in fragments))
    return sorted(parts, key=lambda p: p.start)


@dataclass(frozen=True)
class FtsQuery:
    """A query cut into its parts, before the store's counts choose its plan (:meth:`plan`).

    Attributes:
        parts: ``(key, MATCH expression)`` of each content part (words, compounds, dates), for
            counting in how many chunks each occurs.
    """

    parts: tuple[tuple[str, str], ...]
    _fixed: FtsPlan | None = None  # a plan no count changes (symbols only, a trigram store)
    _tokens: tuple[str, ...] = ()
    _unique: tuple[_Part, ...] = ()
    _exprs: tuple[tuple[str, str], ...] = ()  # (key, expr) of the parts and quoted phrases
    _joined: tuple[str, ...] = ()

    @property
    def joined(self) -> tuple[str, ...]:
        """``MATCH`` expressions of the joined forms of adjacent words (``"helloworld"``)."""
        return self._joined

    def narrowed(self, keys: frozenset[str]) -> FtsQuery:
        """The query with only the parts whose key is in ``keys`` (quoted phrases kept)."""
        drop = {k for k, _ in self.parts} - keys
        return replace(self, parts=tuple(p for p in self.parts if p[0] not in drop),
                       _unique=tuple(p for p in self._unique if p.key not in drop),
                       _exprs=tuple(p for p in self._exprs if p[0] not in drop))

    def plan(self, *, coverage_pairs: bool = True, common: frozenset[str] = frozenset(),
             drop_common: bool = False, unpaired: frozenset[str] = frozenset(),
             absent: frozenset[str] = frozenset()) -> FtsPlan:
        """The :class:`FtsPlan` of the query as the store's counts choose it; never raises.
        E.g. (unicode61) ``hello world`` -> ``"hello" OR "world" OR "helloworld" OR NEAR("hello"
        "world", 10)``; ``価格 2026年`` -> no match, trigram ``"2026年"``, like ``価格``.

        Args:
            coverage_pairs: add the ``(a AND b)`` pairs of the first six parts.
            common: keys of parts found in at least half of the chunks: they join no pair and
                mark no snippet line.
            drop_common: also leave the ``common`` parts out of ``match`` when the query has a
                rarer part (a large store: there they add only cost).
            unpaired: keys of further parts that join no ``NEAR`` pair.
            absent: ``MATCH`` expressions (of :attr:`parts` and :attr:`joined`) found in no
                chunk: left out with their ``NEAR`` pairs, unless nothing else would be left.
        """
        if self._fixed is not None:
            return self._fixed
        rare = [e for k, e in self._exprs if k not in common]
        marks = " OR ".join(rare or [e for _, e in self._exprs]) or None
        exprs = rare if rare and drop_common else [e for _, e in self._exprs]
        exprs.extend(self._joined)
        if absent and any(e not in absent for e in exprs):
            exprs = [e for e in exprs if e not in absent]
        else:
            absent = frozenset()
        # Dates live in the title and terms columns, never next to words of the text: no NEAR.
        # Parts found in most chunks (a chat's speaker names) add nothing to a pair but its cost.
        paired = [p for p in self._unique if p.key not in common and p.key not in unpaired]
        spoken = [p for p in paired if p.kind != "date"]
        exprs.extend(f"NEAR({a.phrase} {b.phrase}, {NEAR_DISTANCE})"
                     for a, b in list(itertools.pairwise(spoken))[:MAX_PAIRS]
                     if a.expr not in absent and b.expr not in absent)
        if coverage_pairs:
            exprs.extend(f"({a.expr} AND {b.expr})"
                         for a, b in itertools.combinations(paired[:COVERAGE_PARTS], 2))
        cjk = [t for t in self._tokens if contains_unspaced(t)]
        return FtsPlan(
            tokens=self._tokens,
            match=" OR ".join(exprs) or None,
            trigram_match=" AND ".join(quote_term(t) for t in cjk if len(t) >= TRIGRAM_MIN_CHARS) or None,
            like_terms=tuple(t for t in cjk if len(t) < TRIGRAM_MIN_CHARS),
            terms=tuple(k for k, _ in self._exprs),
            mark_match=marks,
            parts=self.parts,
        )


def analyze_fts_query(query: str, *, tokenizer: str = "unicode61") -> FtsQuery | None:
    """Cut any user text into the parts of its FTS plan for ``chunks_fts``'s ``tokenizer``
    (``unicode61`` or ``trigram``): an :class:`FtsQuery`, or ``None`` when the text has no token
    (blank, only punctuation); never raises."""
    text = unicodedata.normalize("NFC", query)
    words = list(_word_matches(text))
    tokens = tuple(dict.fromkeys(m.group() for m in words))
    if not tokens:
        # No letters or digits at all (emoji, symbols such as "→" or "★"): the tokenizers drop
        # those characters, so look for the text itself as a substring.
        symbols = " ".join(text.split())
        if not any(unicodedata.category(ch) in ("So", "Sm") for ch in symbols):
            return None
        return FtsQuery((), FtsPlan(tokens=(), match=None, trigram_match=None, like_terms=(symbols,)))
    if tokenizer == "trigram":
        main = [t for t in tokens if len(t) >= TRIGRAM_MIN_CHARS]
        return FtsQuery((), FtsPlan(
            tokens=tokens, match=" AND ".join(quote_term(t) for t in main) or None,
            trigram_match=None, like_terms=tuple(t for t in tokens if len(t) < TRIGRAM_MIN_CHARS),
            terms=tuple(t.lower() for t in main),
            mark_match=" OR ".join(quote_term(t) for t in main) or None))
    parts = [p for p in _query_parts(text, words) if p.kind != "word" or not contains_unspaced(p.key)]
    content = [p for p in parts if p.kind != "word" or (p.key not in STOP_WORDS and not p.fragment)]
    if not content:
        content = parts  # only stop words ("AND", "the"): search them rather than nothing
    seen: dict[str, _Part] = {}
    for p in content:
        seen.setdefault(p.key, p)
    unique = tuple(seen.values())[:4 * MAX_QUERY_PARTS]
    exprs = [(p.key, p.expr) for p in unique]
    for m in _QUOTED_RE.finditer(text):
        quoted = [w.lower() for w in word_runs(m.group(1))]
        if len(quoted) >= 2 and not any(contains_unspaced(w) for w in quoted):
            exprs.append((" ".join(quoted), quote_term(" ".join(quoted))))
    joined = [quote_term(a.key + b.key) for a, b in itertools.pairwise(content)
              if a.kind == b.kind == "word" and a.key.isalpha() and b.key.isalpha()
              and not text[a.end:b.start].strip() and a.key + b.key not in seen]
    return FtsQuery(tuple((p.key, p.expr) for p in unique), None, tokens, unique, tuple(exprs),
                    tuple(dict.fromkeys(joined[:MAX_PAIRS])))

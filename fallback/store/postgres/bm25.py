"""FTS5's ``bm25()`` over a keyword plan's ``MATCH`` expression, computed from stored postings.

The keyword plan (``fallback/search/fts.py``) is an FTS5 ``MATCH`` expression: quoted phrases
joined by ``OR`` and ``AND`` with parentheses, and ``NEAR(p1 p2 ..., N)`` groups; a phrase may
carry a column filter (``text : "word"``, the common-word counts of
``fallback/search/contrast.py``). The SQLite store
hands it to FTS5; the postgres store parses it here (:func:`parse_match`) and evaluates it over
the postings of the rows holding any of its terms, with FTS5's own rules, so both stores give the
same rank to the same chunk:

- a phrase's instances are the offsets where its tokens stand one after another in one column;
- ``NEAR`` keeps the instances FTS5's sweep keeps (``fts5ExprNearIsMatch``: every phrase starts
  within ``N`` plus its own length of the last one);
- a phrase counts in a row only when every ``AND`` above it matches there (FTS5 clears the
  position lists of a branch that does not match the row);
- ``bm25`` sums, over every phrase of the expression (a word in a ``NEAR`` group or an ``AND``
  pair counts again there), ``IDF * f * (k1 + 1) / (f + k1 * (1 - b + b * D / avgdl))`` where
  ``f`` is the phrase's column-weighted hit count in the row, ``D`` the row's tokens in all
  columns, ``avgdl`` the mean over the table, ``IDF = ln((N - n + 0.5) / (n + 0.5))`` (``1e-6``
  when not positive) with ``n`` the rows holding the phrase; the rank is ``-bm25``.

Pure: no database, no clock.

Source: Okapi BM25 (Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and
Beyond", 2009) as SQLite's FTS5 ``fts5_aux.c`` (``fts5Bm25Function``) and ``fts5_expr.c``
compute it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fallback.store.fts_rows import FTS_COLUMNS
from fallback.store.postgres.migrations import POSITION_COLUMN_SHIFT

__all__ = ["BM25_B", "BM25_K1", "MatchQuery", "count_matches", "idf", "parse_match", "phrase_instances",
           "rank_rows", "required_tokens"]

# FTS5's bm25() constants.
BM25_K1 = 1.2
BM25_B = 0.75
_EOF = 1 << 62
_TOKEN_RE = re.compile(r'\s*(?:"([^"]*)"|(NEAR)\(|(\()|(\))|(OR|AND|NOT)(?=[\s("])|,\s*(\d+)\s*\)'
                       r'|(\w+)\s*:(?=\s*")|(\S+))')


@dataclass
class _Node:
    kind: str                          # "phrase" | "near" | "and" | "or"
    children: list[_Node] = field(default_factory=list)
    phrase: int = -1                   # index into MatchQuery.phrases ("phrase" nodes)
    near: int = 10                     # NEAR distance ("near" nodes)


@dataclass(frozen=True)
class MatchQuery:
    """A parsed ``MATCH`` expression.

    Attributes:
        phrases: every phrase in expression order (a word repeated in a NEAR group is a second
            phrase), each as its token list.
        columns: per phrase, the column its FTS5 column filter (``text : "word"``) restricts it
            to (an index into ``FTS_COLUMNS``), or ``None``.
        tokens: the distinct tokens of all phrases (the terms whose postings are needed).
    """

    root: _Node
    phrases: tuple[tuple[str, ...], ...]
    columns: tuple[int | None, ...] = ()

    def instances(self, postings: Mapping[str, Sequence[int]]) -> list[Sequence[int]]:
        """Each phrase's instances in one row (:func:`phrase_instances`, within its column)."""
        found = [phrase_instances(tokens, postings) for tokens in self.phrases]
        for i, col in enumerate(self.columns):
            if col is not None and found[i]:
                found[i] = [p for p in found[i] if p >> POSITION_COLUMN_SHIFT == col]
        return found

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for p in self.phrases for t in p))


def parse_match(expr: str, tokenize: Callable[[str], list[str]]) -> MatchQuery:
    """Parse the ``MATCH`` expressions ``fallback/search/fts.py`` writes.

    Args:
        expr: e.g. ``"hello" OR ("wi fi" OR "wifi") OR NEAR("hello" "world", 10) OR ("a" AND "b")``.
        tokenize: the FTS5 tokenizer of a phrase's text (``tokens.Fts5Tokenizer.phrase_tokens``).

    Returns:
        The expression tree and its phrases; a phrase with no token matches nothing.

    Raises:
        ValueError: text outside that grammar (``NOT``, bare words, a filter of another
            column than ``FTS_COLUMNS``'s or on anything but a phrase).
    """
    items: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN_RE.match(expr, pos)
        if m is None or m.end() == pos:
            if expr[pos:].strip():
                raise ValueError(f"cannot parse MATCH expression at {expr[pos:pos + 20]!r}")
            break
        pos = m.end()
        quoted, near, lpar, rpar, op, dist, column, bare = m.groups()
        if quoted is not None:
            items.append(("phrase", quoted))
        elif near:
            items.append(("near", ""))
        elif lpar:
            items.append(("(", ""))
        elif rpar:
            items.append((")", ""))
        elif op:
            if op == "NOT":
                raise ValueError("NOT is not supported")
            items.append((op, ""))
        elif dist is not None:
            items.append(("dist", dist))
        elif column is not None:
            if column not in FTS_COLUMNS:
                raise ValueError(f"no column {column!r} in MATCH expression")
            items.append(("column", column))
        elif bare is not None:
            raise ValueError(f"unquoted text {bare!r} in MATCH expression")
    phrases: list[tuple[str, ...]] = []
    columns: list[int | None] = []
    at = 0

    def peek() -> str:
        return items[at][0] if at < len(items) else ""

    def take(kind: str) -> tuple[str, str]:
        nonlocal at
        if peek() != kind:
            raise ValueError(f"expected {kind} in MATCH expression")
        at += 1
        return items[at - 1]

    def phrase_node(column: int | None = None) -> _Node:
        phrases.append(tuple(tokenize(take("phrase")[1])))
        columns.append(column)
        return _Node("phrase", phrase=len(phrases) - 1)

    def primary() -> _Node:
        if peek() == "column":
            return phrase_node(FTS_COLUMNS.index(take("column")[1]))
        if peek() == "phrase":
            return phrase_node()
        if peek() == "near":
            take("near")
            group = []
            while peek() == "phrase":
                group.append(phrase_node())
            node = _Node("near", children=group)
            if peek() == "dist":
                node.near = int(take("dist")[1])
            else:
                take(")")
            return node
        take("(")
        node = or_expr()
        take(")")
        return node

    def chain(operator: str, operand: Callable[[], _Node]) -> _Node:
        """Operands joined by ``operator`` (``AND`` binds tighter than ``OR``) as one node."""
        node = operand()
        while peek() == operator:
            take(operator)
            right = operand()
            kind = operator.lower()
            node = node if node.kind == kind else _Node(kind, children=[node])
            node.children.append(right)
        return node

    def and_expr() -> _Node:
        return chain("AND", primary)

    def or_expr() -> _Node:
        return chain("OR", and_expr)

    root = or_expr()
    if at != len(items):
        raise ValueError("trailing text in MATCH expression")
    return MatchQuery(root=root, phrases=tuple(phrases), columns=tuple(columns))


def phrase_instances(tokens: Sequence[str], postings: Mapping[str, Sequence[int]]) -> Sequence[int]:
    """Start positions (``column << 20 | offset``) where ``tokens`` stand in a row in a row's
    postings, ascending (read only: may be the postings' own list)."""
    if not tokens:
        return []
    first = postings.get(tokens[0])
    if not first:
        return []
    if len(tokens) == 1:
        return first
    rest = []
    for t in tokens[1:]:
        found = postings.get(t)
        if not found:
            return []
        rest.append(set(found))
    return [p for p in first if all(p + i + 1 in s for i, s in enumerate(rest))]


def _near(lists: list[Sequence[int]], lens: list[int], near: int) -> list[list[int]]:
    """FTS5's ``fts5ExprNearIsMatch`` sweep: the instances of each phrase it keeps."""
    k = len(lists)
    idx = [0] * k
    out: list[list[int]] = [[] for _ in range(k)]
    while True:
        i_max = lists[0][idx[0]]
        while True:
            matched = True
            for i in range(k):
                i_min = i_max - lens[i] - near
                p = lists[i][idx[i]]
                if p < i_min or p > i_max:
                    matched = False
                    while lists[i][idx[i]] < i_min:
                        idx[i] += 1
                        if idx[i] >= len(lists[i]):
                            return out
                    i_max = max(i_max, lists[i][idx[i]])
            if matched:
                break
        for i in range(k):
            p = lists[i][idx[i]]
            if not out[i] or out[i][-1] != p:
                out[i].append(p)
        adv, best = 0, _EOF
        for i in range(k):
            ahead = lists[i][idx[i] + 1] if idx[i] + 1 < len(lists[i]) else _EOF
            if ahead < best:
                adv, best = i, ahead
        idx[adv] += 1
        if idx[adv] >= len(lists[adv]):
            return out


def _hits(node: _Node, found: list[Sequence[int]], out: dict[int, Sequence[int]],
          query: MatchQuery) -> bool:
    """Whether ``node`` matches the row whose phrase instances are ``found`` (one list per
    phrase); its phrases' counted instances go into ``out``."""
    if node.kind == "phrase":
        if found[node.phrase]:
            out[node.phrase] = found[node.phrase]
            return True
        return False
    if node.kind == "near":
        lists = [found[c.phrase] for c in node.children]
        if not all(lists):
            return False
        kept = _near(lists, [len(query.phrases[c.phrase]) for c in node.children], node.near)
        if not kept[0]:
            return False
        for c, near_found in zip(node.children, kept, strict=True):
            out[c.phrase] = near_found
        return True
    if node.kind == "and":
        mine: dict[int, Sequence[int]] = {}
        if all(_hits(c, found, mine, query) for c in node.children):
            out.update(mine)
            return True
        return False
    matched = False
    for c in node.children:
        matched = _hits(c, found, out, query) or matched
    return matched


def idf(row_count: int, holding: int) -> float:
    """FTS5's IDF of a phrase held by ``holding`` of ``row_count`` rows: ``ln((N - n + 0.5) /
    (n + 0.5))``, or ``1e-6`` when that is not positive."""
    n_rows = max(row_count, 1)
    value = math.log((n_rows - holding + 0.5) / (holding + 0.5))
    return value if value > 0 else 1e-6


def required_tokens(query: MatchQuery) -> list[frozenset[str]]:
    """Per phrase (in :attr:`MatchQuery.phrases` order), the tokens a row must hold for that
    phrase to count in its ``bm25()``: its own tokens, the other phrases of its ``NEAR`` group,
    and what every ``AND`` above it needs (of an ``OR`` below an ``AND``, only the tokens all
    its branches need)."""
    out: list[frozenset[str]] = [frozenset()] * len(query.phrases)

    def needs(node: _Node) -> frozenset[str]:
        if node.kind == "phrase":
            return frozenset(query.phrases[node.phrase])
        parts = [needs(c) for c in node.children]
        if node.kind == "or":
            return frozenset.intersection(*parts) if parts else frozenset()
        return frozenset().union(*parts)

    def walk(node: _Node, inherited: frozenset[str]) -> None:
        if node.kind == "phrase":
            out[node.phrase] = inherited | needs(node)
            return
        below = inherited if node.kind == "or" else inherited | needs(node)
        for c in node.children:
            walk(c, below)

    walk(query.root, frozenset())
    return out


def rank_rows(query: MatchQuery, rows: Mapping[int, Mapping[str, Sequence[int]]],
              doc_len: Mapping[int, int], *, row_count: int, token_count: int,
              weights: Sequence[float], phrase_rows: Sequence[int] | None = None) -> dict[int, float]:
    """FTS5 ``bm25()`` of every row the expression matches.

    Args:
        query: the parsed expression.
        rows: ``{row id: {term: positions}}`` for the rows to rank; without ``phrase_rows``,
            every row holding any of ``query.tokens`` over the whole index (IDF counts rows in
            every source).
        doc_len: ``{row id: tokens in all columns}`` for those rows.
        row_count: rows in the index (FTS5's ``N``).
        token_count: tokens of all rows in all columns (``avgdl = token_count / row_count``).
        weights: one weight per column (text, title, terms), as passed to ``bm25()``.
        phrase_rows: per phrase, the rows of the whole index holding it (the ``n`` of its IDF),
            when ``rows`` is only a selection; ``None``: counted in ``rows``.

    Returns:
        ``{row id: rank}`` for the matching rows, rank = ``-bm25`` (more negative = better).
    """
    n_rows = max(row_count, 1)
    avgdl = token_count / n_rows if token_count else 1.0
    hits: dict[int, dict[int, Sequence[int]]] = {}
    holding = [0] * len(query.phrases)
    for rowid, postings in rows.items():
        found = query.instances(postings)
        for i, instances in enumerate(found):
            if instances:
                holding[i] += 1
        counted: dict[int, Sequence[int]] = {}
        if _hits(query.root, found, counted, query):
            hits[rowid] = counted
    idfs = [idf(row_count, n) for n in (holding if phrase_rows is None else phrase_rows)]
    ranks = {}
    for rowid, counted_hits in hits.items():
        norm = BM25_K1 * (1 - BM25_B + BM25_B * doc_len[rowid] / avgdl)
        score = 0.0
        for i, positions in counted_hits.items():
            freq = sum(weights[p >> POSITION_COLUMN_SHIFT] for p in positions)
            score += idfs[i] * freq * (BM25_K1 + 1) / (freq + norm)
        ranks[rowid] = -score
    return ranks


def count_matches(query: MatchQuery, rows: Mapping[int, Mapping[str, Sequence[int]]]) -> int:
    """How many of ``rows`` (``{row id: {term: positions}}``) the expression matches (what
    ``SELECT COUNT(*) ... WHERE chunks_fts MATCH ?`` counts)."""
    n = 0
    for postings in rows.values():
        found = query.instances(postings)
        n += _hits(query.root, found, {}, query)
    return n

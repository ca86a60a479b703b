"""The terms of a chunk exactly as the SQLite store's FTS5 tables index them.

SQLite itself does the tokenizing: an in-memory FTS5 table with the SQLite store's columns and
tokenizer takes a batch of rows, and its ``fts5vocab`` ``instance`` table lists every token with
its column and offset. So the postgres store's postings hold the same terms at the same offsets,
and its BM25 (``fallback/store/postgres/bm25.py``) counts what FTS5 counts. Two tokenizers:
:data:`MAIN` as ``chunks_fts`` (``fallback/store/fts_rows.py``: ``text, title, terms``,
``porter unicode61``) and :data:`TRIGRAM` as ``chunks_trigram`` (``text``, ``trigram
case_sensitive 0``, CJK substrings).

A :data:`MAIN` chunk is tokenized word by word: a ``unicode61`` token never spans whitespace
(every character ``str.split`` splits on is a separator there), so each distinct
whitespace-separated word goes through FTS5 once (a bounded cache: words repeat across chunks)
and a column's token offsets are counted over its words' cached tokens. Trigrams span
whitespace, so :data:`TRIGRAM` rows go through FTS5 whole.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from fallback.store.fts_rows import FTS_COLUMNS
from fallback.store.postgres.migrations import POSITION_COLUMN_SHIFT

__all__ = ["MAIN", "TRIGRAM", "ChunkTerms", "Fts5Tokenizer", "column_hits"]

# (columns, tokenize) of the SQLite store's chunks_fts (unicode61 stores) and chunks_trigram.
MAIN = (FTS_COLUMNS, "porter unicode61")
TRIGRAM = (("text",), "trigram case_sensitive 0")
# Most distinct words whose tokens a tokenizer keeps (cleared when full): a chat corpus of
# 15,000 chunks holds some tens of thousands, a word's entry is about 200 bytes.
WORD_CACHE_MAX = 200_000


@dataclass(frozen=True)
class ChunkTerms:
    """The postings of one chunk.

    Attributes:
        positions: ``{term: [p1, p2, ...]}`` in code point order of the terms, each ``p`` =
            ``column << 20 | offset``, ascending.
        doc_len: tokens in all columns (FTS5's row size for ``bm25()``).
    """

    positions: dict[str, list[int]]
    doc_len: int


def column_hits(positions: Sequence[int], columns: int = len(FTS_COLUMNS)) -> tuple[int, ...]:
    """A posting's hits per column (``positions`` ascending, as :class:`ChunkTerms` holds them)."""
    if positions[-1] >> POSITION_COLUMN_SHIFT == 0:
        return (len(positions),) + (0,) * (columns - 1)
    hits = [0] * columns
    for p in positions:
        hits[p >> POSITION_COLUMN_SHIFT] += 1
    return tuple(hits)


class Fts5Tokenizer:
    """FTS5 tokenization of chunk rows and query phrases (thread-safe).

    Args:
        kind: :data:`MAIN` or :data:`TRIGRAM`.
    """

    def __init__(self, kind: tuple[tuple[str, ...], str] = MAIN) -> None:
        columns, tokenize = kind
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(":memory:", check_same_thread=False)
        # Contentless, so 'delete-all' empties the index: a DELETE leaves the deleted rows'
        # terms in the index until segments merge, and fts5vocab scans them (after a sync of
        # some thousand chunks, tokenizing one query phrase took tens of ms).
        self._conn.execute(f"CREATE VIRTUAL TABLE t USING fts5({', '.join(columns)},"
                           f" tokenize='{tokenize}', content='')")
        self._clear = "INSERT INTO t(t) VALUES ('delete-all')"
        self._conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)")
        self._columns = columns
        self._by_word = not tokenize.startswith("trigram")  # trigrams span whitespace
        self._words: dict[str, tuple[str, ...]] = {}  # word -> its tokens (MAIN only)
        self._insert = (f"INSERT INTO t(rowid, {', '.join(columns)})"
                        f" VALUES (?, {', '.join('?' for _ in columns)})")
        column = " ".join(f"WHEN '{name}' THEN {i << POSITION_COLUMN_SHIFT}"
                          for i, name in enumerate(columns))
        # One sort (by the group): the rows of a group keep the order fts5vocab gives them,
        # each term's doclist in position order (ascending).
        self._grouped = (f"SELECT doc, term, group_concat(pos)"
                         f" FROM (SELECT doc, term, (CASE col {column} END) | \"offset\" AS pos FROM v)"
                         " GROUP BY term, doc")

    def chunk_terms(self, rows: Sequence[tuple[str, ...]]) -> list[ChunkTerms]:
        """The postings of chunk rows, as FTS5 indexes them.

        Args:
            rows: one value per column per chunk (:data:`MAIN`: text, title, derived terms;
                :data:`TRIGRAM`: text).

        Returns:
            One :class:`ChunkTerms` per row, in order, its terms in code point order.
        """
        with self._lock:
            return self._word_terms(rows) if self._by_word else self._row_terms(rows)

    def _word_terms(self, rows: Sequence[tuple[str, ...]]) -> list[ChunkTerms]:
        """:meth:`chunk_terms` from the tokens of each row's words (see the module docstring)."""
        split = [[value.split() for value in row] for row in rows]
        cache = self._words
        missing = list({w for cols in split for words in cols for w in words if w not in cache})
        if len(cache) + len(missing) > WORD_CACHE_MAX:
            cache.clear()
            missing = list({w for cols in split for words in cols for w in words})
        for first in range(0, len(missing), 5000):
            part = missing[first:first + 5000]
            found: dict[int, list[str]] = {}
            conn = self._conn
            conn.executemany(self._insert, [(i + 1, w, *("" for _ in self._columns[1:]))
                                            for i, w in enumerate(part)])
            for doc, term in conn.execute('SELECT doc, term FROM v ORDER BY doc, "offset"'):
                found.setdefault(doc, []).append(term)
            conn.execute(self._clear)
            cache.update((w, tuple(found.get(i + 1, ()))) for i, w in enumerate(part))
        out = []
        for cols in split:
            offsets: dict[str, list[int]] = {}
            n = 0
            for column, words in enumerate(cols):
                at = column << POSITION_COLUMN_SHIFT  # offsets count within a column
                for w in words:
                    for token in cache[w]:
                        held = offsets.get(token)
                        if held is None:
                            offsets[token] = [at]
                        else:
                            held.append(at)
                        at += 1
                n += at - (column << POSITION_COLUMN_SHIFT)
            out.append(ChunkTerms({t: offsets[t] for t in sorted(offsets)}, n))
        return out

    def _row_terms(self, rows: Sequence[tuple[str, ...]]) -> list[ChunkTerms]:
        """:meth:`chunk_terms` by FTS5 over whole rows (the lock held)."""
        out: list[dict[str, list[int]]] = [{} for _ in rows]
        conn = self._conn
        conn.executemany(self._insert, [(i + 1, *row) for i, row in enumerate(rows)])
        for doc, term, positions in conn.execute(self._grouped):
            out[doc - 1][term] = [int(p) for p in positions.split(",")]
        conn.execute(self._clear)
        return [ChunkTerms(c, sum(map(len, c.values()))) for c in out]

    def phrase_tokens(self, phrase: str) -> list[str]:
        """The tokens of one query phrase in order (``"Wi Fi"`` -> ``["wi", "fi"]``)."""
        with self._lock:
            self._conn.execute(self._insert, (1, phrase, *("" for _ in self._columns[1:])))
            tokens = [r[0] for r in self._conn.execute(
                "SELECT term FROM v WHERE doc = 1 ORDER BY \"offset\"")]
            self._conn.execute(self._clear)
        return tokens

    def close(self) -> None:
        """Close the in-memory database."""
        self._conn.close()

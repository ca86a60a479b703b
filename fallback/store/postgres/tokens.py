"""The terms of a chunk exactly as the SQLite store's FTS5 tables index them.

SQLite itself does the tokenizing: an in-memory FTS5 table with the SQLite store's columns and
tokenizer takes a batch of rows, and its ``fts5vocab`` ``instance`` table lists every token with
its column and offset. So the postgres store's postings hold the same terms at the same offsets,
and its BM25 (``fallback/store/postgres/bm25.py``) counts what FTS5 counts. Two tokenizers:
:data:`MAIN` as ``chunks_fts`` (``fallback/store/fts_rows.py``: ``text, title, terms``,
``porter unicode61``) and :data:`TRIGRAM` as ``chunks_trigram`` (``text``, ``trigram
case_sensitive 0``, CJK substrings).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from fallback.store.fts_rows import FTS_COLUMNS
from fallback.store.postgres.migrations import POSITION_COLUMN_SHIFT

__all__ = ["MAIN", "TRIGRAM", "ChunkTerms", "Fts5Tokenizer"]

# (columns, tokenize) of the SQLite store's chunks_fts (unicode61 stores) and chunks_trigram.
MAIN = (FTS_COLUMNS, "porter unicode61")
TRIGRAM = (("text",), "trigram case_sensitive 0")


@dataclass(frozen=True)
class ChunkTerms:
    """The postings of one chunk, as the PostgreSQL ``int[]`` literals they are written as.

    Attributes:
        positions: ``{term: "{p1,p2,...}"}``, each ``p`` = ``column << 20 | offset``, ascending.
        doc_len: tokens in all columns (FTS5's row size for ``bm25()``).
        tf: ``{term: "{hits in column 0,hits in column 1,...}"}``.
    """

    positions: dict[str, str]
    doc_len: int
    tf: dict[str, str]


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
        self._first_column_hits: dict[int, str] = {}  # hit count -> its literal, all in column 0
        self._insert = (f"INSERT INTO t(rowid, {', '.join(columns)})"
                        f" VALUES (?, {', '.join('?' for _ in columns)})")
        column = " ".join(f"WHEN '{name}' THEN {i << POSITION_COLUMN_SHIFT}"
                          for i, name in enumerate(columns))
        # SQLite builds each posting's positions literal: the Python loop over the result only
        # files them by chunk. One sort (by the group): the rows of a group keep the order
        # fts5vocab gives them, each term's doclist in position order (ascending). The last
        # position tells a posting whose hits are all in the first column (most of them), whose
        # hits-per-column literal is then known from the count alone (counting each column in
        # SQL took a third of the CPU).
        self._grouped = (f"SELECT doc, term, '{{' || group_concat(pos) || '}}', count(*), max(pos)"
                         f" FROM (SELECT doc, term, (CASE col {column} END) | \"offset\" AS pos FROM v)"
                         " GROUP BY term, doc")

    def chunk_terms(self, rows: Sequence[tuple[str, ...]]) -> list[ChunkTerms]:
        """The postings of chunk rows.

        Args:
            rows: one value per column per chunk (:data:`MAIN`: text, title, derived terms;
                :data:`TRIGRAM`: text).

        Returns:
            One :class:`ChunkTerms` per row, in order.
        """
        out = [ChunkTerms({}, 0, {}) for _ in rows]
        lens = [0] * len(rows)
        with self._lock:
            conn = self._conn
            conn.executemany(self._insert, [(i + 1, *row) for i, row in enumerate(rows)])
            first = self._first_column_hits
            for doc, term, positions, n, last in conn.execute(self._grouped):
                i = doc - 1
                out[i].positions[term] = positions
                if last >> POSITION_COLUMN_SHIFT:
                    out[i].tf[term] = self._hits(positions, 0)
                else:
                    out[i].tf[term] = first.get(n) or self._hits(positions, n)
                lens[i] += n
            conn.execute(self._clear)
        return [ChunkTerms(c.positions, n, c.tf) for c, n in zip(out, lens, strict=True)]

    def _hits(self, positions: str, first_column: int) -> str:
        """The hits-per-column literal of a positions literal (``first_column``: the count,
        when every hit is in the first column; 0 to count them)."""
        if first_column:
            tf = self._first_column_hits[first_column] = (
                "{" + ",".join([str(first_column)] + ["0"] * (len(self._columns) - 1)) + "}")
            return tf
        hits = [0] * len(self._columns)
        for p in positions[1:-1].split(","):
            hits[int(p) >> POSITION_COLUMN_SHIFT] += 1
        return "{" + ",".join(map(str, hits)) + "}"

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

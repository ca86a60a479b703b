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
and a column's token offsets are counted over its words' cached tokens. A :data:`TRIGRAM`
token is three consecutive characters of the text (up to a NUL, before SQLite 3.45) after FTS5's
case folding (a character folded to nothing is skipped), so each distinct character is folded by FTS5 once (cached)
and numpy cuts the trigrams of the folded text.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from fallback.store.fts_rows import FTS_COLUMNS, TRIGRAM_TOKENIZE, WORD_TOKENIZE
from fallback.store.postgres.migrations import POSITION_COLUMN_SHIFT

__all__ = ["MAIN", "TRIGRAM", "Fts5Tokenizer", "Postings"]

# (columns, tokenize) of the SQLite store's chunks_fts (unicode61 stores) and chunks_trigram.
MAIN = (FTS_COLUMNS, WORD_TOKENIZE)
TRIGRAM = (("text",), TRIGRAM_TOKENIZE)
# Most distinct words whose tokens a tokenizer keeps (cleared when full before a batch): a chat
# corpus of 15,000 chunks holds some tens of thousands.
WORD_CACHE_MAX = 200_000


@dataclass(frozen=True)
class Postings:
    """The postings of a batch of chunk rows, column-wise (one numpy array per field).

    Attributes:
        terms: the batch's distinct terms in code point order; a term's id is its index.
        doc_len: per chunk (row order), its tokens in all columns (FTS5's row size for
            ``bm25()``), int64.
        term / chunk: per posting (one term of one chunk), its term id and its chunk's row
            index, int32; the postings are ordered by term, then chunk.
        hits: per posting, its hits in each column, int32, shape ``(postings, columns)``.
        ends: per posting, the end (exclusive) of its positions in ``positions``, int64.
        positions: every posting's positions one posting after another, each ``column << 20 |
            offset``, ascending within a posting, int32.
    """

    terms: list[str]
    doc_len: Any
    term: Any
    chunk: Any
    hits: Any
    ends: Any
    positions: Any

    def chunk_terms(self) -> list[list[str]]:
        """Per chunk (row order), its distinct terms in code point order."""
        import numpy as np

        # Stable: a chunk's postings stay in term order; 16-bit keys sort by radix.
        chunk = self.chunk.astype(np.uint16) if len(self.doc_len) <= 1 << 16 else self.chunk
        terms = np.asarray(self.terms, dtype=object)[self.term[np.argsort(chunk, kind="stable")]].tolist()
        cuts = np.cumsum(np.bincount(self.chunk, minlength=len(self.doc_len))).tolist()
        return [terms[a:b] for a, b in zip([0, *cuts], cuts, strict=False)]


def _postings(names: Sequence[str], ids: Any, chunk: Any, positions: Any, doc_len: Any,
              columns: int) -> Postings:
    """:class:`Postings` of token instances given in chunk order and, within a chunk, in
    position order: ``ids`` (int ids below ``len(names)``, ``names[id]`` the token), their
    chunk indexes and positions (numpy arrays of one length), the chunks' token counts
    ``doc_len``."""
    import numpy as np

    if not len(ids):
        empty = np.zeros(0, dtype=np.int32)
        return Postings([], doc_len, empty, empty, np.zeros((0, columns), dtype=np.int32),
                        np.zeros(0, dtype=np.int64), empty)
    present = np.zeros(len(names), dtype=bool)
    present[ids] = True
    used = np.flatnonzero(present)
    found = [names[i] for i in used.tolist()]
    order = sorted(range(len(found)), key=found.__getitem__)
    rank = np.empty(len(names), dtype=np.int32)
    rank[used[order]] = np.arange(len(order), dtype=np.int32)
    term_of = rank[ids]
    # Stable: a term's instances stay in (chunk, position) order; 16-bit keys sort by radix.
    by_term = np.argsort(term_of.astype(np.uint16) if len(order) <= 1 << 16 else term_of, kind="stable")
    term_of, chunk, positions = term_of[by_term], chunk[by_term], positions[by_term]
    first = np.empty(len(term_of), dtype=bool)
    first[0] = True
    first[1:] = (term_of[1:] != term_of[:-1]) | (chunk[1:] != chunk[:-1])
    starts = np.flatnonzero(first)
    posting = np.cumsum(first) - 1
    hits = np.bincount(posting * columns + (positions >> POSITION_COLUMN_SHIFT),
                       minlength=len(starts) * columns).reshape(len(starts), columns).astype(np.int32)
    ends = np.append(starts[1:], len(term_of)).astype(np.int64)
    return Postings([found[i] for i in order], doc_len, term_of[starts], chunk[starts].astype(np.int32),
                    hits, ends, positions.astype(np.int32))


class _Words(dict[str, int]):
    """word -> the id of its token sequence; a word not seen before takes the next id and is
    listed in ``new`` until its tokens are known."""

    def __init__(self) -> None:
        super().__init__()
        self.new: list[str] = []

    def __missing__(self, word: str) -> int:
        self[word] = seq = len(self)
        self.new.append(word)
        return seq


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
        import numpy as np

        # TRIGRAM only: code point -> its FTS5 folding (-1: skipped, -2: not folded yet)
        self._fold = np.zeros(0, dtype=np.int64)

        # MAIN only: word -> the id of its token sequence, whose token ids are
        # _gtok[_gstart[id]:][:_glen[id]]; token -> its id, and id -> token
        self._words = _Words()
        self._glen = self._gtok = self._gstart = np.zeros(0, dtype=np.int32)
        self._ids: dict[str, int] = {}
        self._names: list[str] = []  # id -> token
        self._insert = (f"INSERT INTO t(rowid, {', '.join(columns)})"
                        f" VALUES (?, {', '.join('?' for _ in columns)})")
        # TRIGRAM: whether a NUL ends the text, as it does before SQLite 3.45 (else it is skipped)
        self._nul_ends = not self._by_word and not self.phrase_tokens("ab\0cd")

    def postings(self, rows: Sequence[tuple[str, ...]]) -> Postings:
        """The postings of chunk rows, as FTS5 indexes them.

        Args:
            rows: one value per column per chunk (:data:`MAIN`: text, title, derived terms;
                :data:`TRIGRAM`: text).

        Returns:
            The :class:`Postings` of the rows (chunk ``i`` is ``rows[i]``).
        """
        with self._lock:
            return self._word_postings(rows) if self._by_word else self._trigram_postings(rows)

    def _word_postings(self, rows: Sequence[tuple[str, ...]]) -> Postings:
        """:meth:`postings` from the tokens of each row's words (see the module docstring): a
        word maps to the id of its cached token sequence by one C loop over the batch's words
        (``str.split``, ``chain``, ``map``); the words not seen before are tokenized by FTS5
        afterwards, and the sequences are expanded into token ids and offsets by numpy: no
        Python step per word or token."""
        import numpy as np

        words = self._words
        if len(words) > WORD_CACHE_MAX:
            words.clear()
            self._ids.clear()
            self._names.clear()
            self._glen = self._gtok = np.zeros(0, dtype=np.int32)
        segments = [value.split() for row in rows for value in row]  # row after row, column after column
        count = np.fromiter(map(len, segments), dtype=np.int64, count=len(segments))
        group = np.fromiter(map(words.__getitem__, chain.from_iterable(segments)), dtype=np.int64,
                            count=int(count.sum()))
        if words.new:
            self._tokenize_words(words.new)
            words.new = []
            self._gstart = np.cumsum(self._glen, dtype=np.int64) - self._glen
        lens = self._glen[group]
        upto = np.concatenate(([0], np.cumsum(lens, dtype=np.int64)))
        token_ids = self._gtok[np.repeat(self._gstart[group] - upto[:-1], lens) + np.arange(upto[-1])]
        # tokens per row per column: the tokens of its words, summed over each segment's words
        last = np.cumsum(count)
        size = upto[last] - upto[last - count]
        columns = len(self._columns)
        doc_len = size.reshape(len(rows), columns).sum(axis=1)
        column = np.repeat(np.tile(np.arange(columns, dtype=np.int32), len(rows)), size)
        offset = np.arange(len(token_ids), dtype=np.int32) - np.repeat(
            (np.cumsum(size) - size).astype(np.int32), size)
        return _postings(self._names, token_ids, np.repeat(np.arange(len(rows), dtype=np.int32), doc_len),
                         (column << POSITION_COLUMN_SHIFT) | offset, doc_len, columns)

    def _tokenize_words(self, new: list[str]) -> None:
        """Tokenize the words that got the next token-sequence ids (``new``, in id order) by
        FTS5, 5,000 a statement, and append their sequences to ``_glen`` / ``_gtok``."""
        import numpy as np

        conn, ids, names = self._conn, self._ids, self._names
        lens: list[int] = []
        flat: list[int] = []
        for first in range(0, len(new), 5000):
            part = new[first:first + 5000]
            found: dict[int, list[int]] = {}
            conn.executemany(self._insert, [(i + 1, w, *("" for _ in self._columns[1:]))
                                            for i, w in enumerate(part)])
            for doc, term in conn.execute('SELECT doc, term FROM v ORDER BY doc, "offset"'):
                token = ids.get(term)
                if token is None:
                    token = ids[term] = len(names)
                    names.append(term)
                found.setdefault(doc, []).append(token)
            conn.execute(self._clear)
            for i in range(len(part)):
                tokens = found.get(i + 1, ())
                lens.append(len(tokens))
                flat += tokens
        self._glen = np.concatenate((self._glen, np.asarray(lens, dtype=np.int32)))
        self._gtok = np.concatenate((self._gtok, np.asarray(flat, dtype=np.int32)))

    def _trigram_postings(self, rows: Sequence[tuple[str, ...]]) -> Postings:
        """:meth:`postings` of :data:`TRIGRAM` rows (see the module docstring): the characters
        not folded before go through FTS5 tripled, one row each (``"ÀÀÀ"`` -> ``"ààà"``: ``à``),
        the texts' code points are folded through the cached table, and each trigram is the
        three code points of a window packed into one integer (21 bits each, so the integers
        sort as the trigrams do)."""
        import numpy as np

        texts = [row[0].partition("\0")[0] if self._nul_ends else row[0] for row in rows]
        raw = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
        if len(raw) and int(raw.max()) >= len(self._fold):  # -2: not folded yet
            self._fold = np.concatenate((self._fold, np.full(int(raw.max()) + 1 - len(self._fold), -2)))
        new = np.unique(raw[self._fold[raw] == -2]).tolist()
        if new:
            self._conn.executemany(self._insert, [(i + 1, chr(c) * 3) for i, c in enumerate(new)])
            folded_as = dict(self._conn.execute("SELECT doc, term FROM v"))
            self._conn.execute(self._clear)  # -1: folded to nothing (NUL), skipped
            self._fold[new] = [ord(folded_as[i + 1][0]) if i + 1 in folded_as else -1 for i in range(len(new))]
        codes = self._fold[raw]
        kept = codes >= 0
        row_of = np.repeat(np.arange(len(rows)), [len(t) for t in texts])
        codes, lens = codes[kept], np.bincount(row_of[kept], minlength=len(rows))
        doc_len = np.maximum(lens - 2, 0)
        offset = np.arange(doc_len.sum()) - np.repeat(np.cumsum(doc_len) - doc_len, doc_len)
        window = np.repeat(np.cumsum(lens) - lens, doc_len) + offset
        keys, ids = np.unique(codes[window] << 42 | codes[window + 1] << 21 | codes[window + 2],
                              return_inverse=True)
        chars = np.stack((keys >> 42, keys >> 21 & 0x1FFFFF, keys & 0x1FFFFF), axis=1).astype(np.uint32)
        text = chars.tobytes().decode("utf-32-le")
        return _postings([text[i:i + 3] for i in range(0, len(text), 3)], ids.reshape(-1),
                         np.repeat(np.arange(len(rows), dtype=np.int32), doc_len), offset, doc_len, 1)

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

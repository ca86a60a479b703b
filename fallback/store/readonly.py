"""Reading the SQLite store without writing it: the store seam's reads and a read-only connection.

:class:`MetaReads` implements the store seam (``fallback/store/seam.py``) in SQL over a class's
``query``: the engine's :class:`~fallback.store.db.Store` and :class:`ReadOnlyStore` (one
``query_only`` connection to an existing file: no writer, no migration, no lock).
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fallback.errors import IndexStoreError
from fallback.store.errors import (
    SQLITE_CANTOPEN,
    IndexStoreFullError,
    IndexStoreReadOnlyError,
    error_kind,
    result_code,
    translate_errors,
)
from fallback.store.files import has_wal_frames
from fallback.store.seam import COLUMN_WEIGHTS, KeywordRow, row_order

__all__ = ["BUSY_TIMEOUT_MS", "IMMUTABLE_QUERY", "MetaReads", "ReadOnlyConnection", "ReadOnlyStore",
           "connect_read_only"]

_BM25 = f"bm25(chunks_fts, {', '.join(str(w) for w in COLUMN_WEIGHTS)})"
# FTS5 ranks at most max(limit x INNER_OVERSAMPLE, MIN_INNER_ROWS) rows before they are joined
# with the chunks and filtered (see MetaReads.keyword_rows).
INNER_OVERSAMPLE = 4
MIN_INNER_ROWS = 200

# part_counts() keeps at most about this many counted expressions per store, then starts afresh.
MAX_KEPT_COUNTS = 4096

# How long a statement waits for another connection's lock (a checkpoint, a write), ms: the
# default of every connection to the store, read-only or not.
BUSY_TIMEOUT_MS = 5000


def _cannot_write(exc: sqlite3.Error) -> bool:
    """Whether opening failed only because this process may not write the store's files (or
    the disk is full)."""
    return (issubclass(error_kind(exc)[0], (IndexStoreReadOnlyError, IndexStoreFullError))
            or (result_code(exc) or 0) & 0xFF == SQLITE_CANTOPEN)


# The URI query of connect_read_only()'s last resort: the main file alone, read as immutable.
IMMUTABLE_QUERY = "mode=ro&immutable=1"


class ReadOnlyConnection(sqlite3.Connection):
    """A ``sqlite3`` connection that says whether it was opened ``immutable`` (it then never
    sees a later commit)."""

    immutable = False


def connect_read_only(path: Path, *, modes: Sequence[str] = ("rw", "ro"),
                      check_same_thread: bool = True) -> ReadOnlyConnection:
    """A connection that only reads the existing store at ``path``, also where this process may
    not write its folder: each of ``modes`` (``rw`` with ``PRAGMA query_only``, ``ro``) in turn,
    moving on only when SQLite cannot write, then ``mode=ro&immutable=1`` when no ``-wal`` with
    frames lies beside the store.

    Raises ``IndexStoreError`` (typed): the last failure when no way to read the file works.
    """
    base = path.resolve().as_uri()
    uris = [f"{base}?mode={m}" for m in modes] + (
        [] if has_wal_frames(path) else [f"{base}?{IMMUTABLE_QUERY}"])

    def probe(uri: str) -> ReadOnlyConnection:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                               isolation_level=None, check_same_thread=check_same_thread,
                               factory=ReadOnlyConnection)
        conn.immutable = uri.endswith(IMMUTABLE_QUERY)
        try:
            if "mode=rw" in uri:
                conn.execute("PRAGMA query_only=ON")
            conn.execute("PRAGMA user_version").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    with translate_errors(path):
        for uri in uris[:-1]:
            try:
                return probe(uri)
            except sqlite3.Error as exc:
                if not _cannot_write(exc):
                    raise
        return probe(uris[-1])


class MetaReads:
    """The SQLite store's reads over a class's ``query``: ``PRAGMA user_version``, ``meta``
    and the store seam's ``SearchStore`` in SQL."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One read statement's rows: each class that takes these reads defines it."""
        raise NotImplementedError(f"{type(self).__name__} defines no query()")

    def user_version(self) -> int:
        """``PRAGMA user_version``: the number of migrations applied."""
        return int(self.query("PRAGMA user_version")[0][0])

    def quick_check(self) -> str:
        """Run ``PRAGMA quick_check``; returns ``"ok"`` or SQLite's problem lines (at most 5).

        Raises ``IndexStoreCorruptError``: when the file is not a database at all.
        """
        rows = self.query("PRAGMA quick_check")
        return "ok" if rows and rows[0][0] == "ok" else "; ".join(str(r[0]) for r in rows[:5])

    def get_meta_json(self, key: str) -> Any:
        """One ``meta`` value parsed as JSON, or ``None`` when missing or unparsable."""
        rows = self.query("SELECT value FROM meta WHERE key = ?", (key,))
        try:
            return json.loads(rows[0][0]) if rows else None
        except ValueError:
            return None

    # (connection, tokenizer, error): the FTS meta rows, read once per connection
    _fts_meta: tuple[object, str, str | None] | None = None

    def _fts_state(self) -> tuple[str, str | None]:
        """``(tokenizer, error)`` of ``chunks_fts``, read once per open connection (only a
        migration writes them)."""
        conn = getattr(self, "_conn", None)
        known = self._fts_meta
        if known is None or conn is None or known[0] is not conn:
            rows = dict(self.query("SELECT key, value FROM meta"
                                   " WHERE key IN ('fts_tokenizer', 'fts_error')"))
            known = (conn, rows.get("fts_tokenizer") or "unicode61", rows.get("fts_error"))
            if conn is not None:
                self._fts_meta = known
        return known[1], known[2]

    @property
    def fts_tokenizer(self) -> str:
        """The tokenizer ``chunks_fts`` was created with (``unicode61`` or ``trigram``)."""
        return self._fts_state()[0]

    @property
    def fts_error(self) -> str | None:
        """Why FTS5 tables could not be created, or ``None`` when FTS is available."""
        return self._fts_state()[1]

    def has_chunks(self) -> bool:
        """Whether the index holds at least one chunk."""
        return bool(self.query("SELECT 1 FROM chunks LIMIT 1"))

    # (connection, its data_version, chunks, {MATCH expression: chunks}) of the counts read last
    _part_counts: tuple[object, int, int, dict[str, int]] | None = None

    def _counted_chunks(self) -> float:
        """The chunks :meth:`part_counts` counted last on this connection (``inf`` when it has
        counted none): the store's size as of that count, for a statement's plan only."""
        known = self._part_counts
        return known[2] if known is not None and known[0] is getattr(self, "_conn", None) else math.inf

    def part_counts(self, exprs: Sequence[str]) -> tuple[int, list[int]]:
        """``(chunks, [chunks matching each FTS5 MATCH expression])`` in one statement; the
        counts are kept per open connection until another connection's commit changes
        ``data_version`` (read in the same statement), so only new expressions are counted."""
        conn = getattr(self, "_conn", None)
        wanted = list(dict.fromkeys(exprs))
        known = self._part_counts
        if known is not None and known[0] is conn and len(known[3]) < MAX_KEPT_COUNTS:
            ask = [e for e in wanted if e not in known[3]]
            row = self._count_parts(ask, total=False)
            if row[0] == known[1]:
                known[3].update(zip(ask, row[2:], strict=True))
                return known[2], [known[3][e] for e in exprs]
        row = self._count_parts(wanted, total=True)
        counts = dict(zip(wanted, row[2:], strict=True))
        if conn is not None:
            self._part_counts = (conn, row[0], row[1], counts)
        return row[1], [counts[e] for e in exprs]

    def _count_parts(self, exprs: Sequence[str], *, total: bool) -> list[int]:
        """``[data_version, chunks (0 unless total), chunks matching each expression]``."""
        row = self.query("SELECT data_version, " + (
            "(SELECT COUNT(*) FROM chunks_fts_docsize)" if total else "0") + "".join(
            ", (SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH ?)" for _ in exprs)
            + " FROM pragma_data_version", exprs)[0]
        return [int(n) for n in row]

    def keyword_rows(self, match: str | None, *, sources: Sequence[str], limit: int,
                     trigram_match: str | None = None, like_patterns: Sequence[str] = (),
                     fallback_like_patterns: Sequence[str] = ()) -> list[KeywordRow]:
        """The best ``limit`` rows of a keyword plan (``SearchStore.keyword_rows``), ranked by
        ``bm25()`` with :data:`COLUMN_WEIGHTS`; when ``MATCH`` itself fails, a LIKE scan of
        ``fallback_like_patterns`` with rank 0 (spec §8.2). Raises ``IndexStoreError``."""
        if limit <= 0 or not sources:
            return []
        try:
            return self._keyword_rows(match, trigram_match, like_patterns, sources=sources,
                                      limit=limit)
        except IndexStoreError as exc:
            cause = str(exc.__cause__).lower()
            if not isinstance(exc.__cause__, sqlite3.OperationalError) or (
                    "fts5" not in cause and "match" not in cause):
                raise
            return self._keyword_sql(None, None, fallback_like_patterns, sources=sources,
                                     limit=limit, inner_limit=None)[0]

    def _keyword_rows(self, match: str | None, trigram: str | None, likes: Sequence[str], *,
                      sources: Sequence[str], limit: int) -> list[KeywordRow]:
        inner = max(limit * INNER_OVERSAMPLE, MIN_INNER_ROWS)
        if match and self._counted_chunks() > inner:
            # Rank inside FTS5 first and join only the best rows with ``chunks``; when the cut
            # was saturated and the other filters left too few rows, run again without it. (A
            # store of at most ``inner`` chunks, counted by part_counts(), has nothing to cut.)
            rows, ranked = self._keyword_sql(match, trigram, likes, sources=sources, limit=limit,
                                             inner_limit=inner)
            if ranked is None:  # nothing survived the filters: count the ranked rows apart
                ranked = int(self.query("SELECT COUNT(*) FROM (SELECT rowid FROM chunks_fts"
                                        " WHERE chunks_fts MATCH ? LIMIT ?)", [match, inner + 1])[0][0])
            if len(rows) >= limit or ranked <= inner:
                return rows
        return self._keyword_sql(match, trigram, likes, sources=sources, limit=limit,
                                 inner_limit=None)[0]

    def _keyword_sql(self, match: str | None, trigram: str | None, likes: Sequence[str], *,
                     sources: Sequence[str], limit: int, inner_limit: int | None,
                     ) -> tuple[list[KeywordRow], int | None]:
        """Rows, and with ``inner_limit`` how many rows FTS5 ranked (up to ``inner_limit + 1``;
        ``None`` when no row came back)."""
        ranking = ""
        joins: list[str] = []
        params: list[Any] = []
        rank = "0.0"
        ranked = "NULL"
        if match:
            cut = " ORDER BY r LIMIT ?" if inner_limit is not None else ""
            ranking = (f"m AS MATERIALIZED (SELECT rowid AS rid, {_BM25} AS r FROM chunks_fts"
                       f" WHERE chunks_fts MATCH ?{cut}), ")
            joins.append("JOIN m ON m.rid = c.rowid")
            params.append(match)
            if inner_limit is not None:
                params.append(int(inner_limit) + 1)
                ranked = "(SELECT COUNT(*) FROM m)"
            rank = "m.r"
        if trigram:
            joins.append("JOIN (SELECT rowid AS rid, bm25(chunks_trigram) AS r FROM chunks_trigram"
                         " WHERE chunks_trigram MATCH ?) t ON t.rid = c.rowid")
            params.append(trigram)
            rank = rank if rank != "0.0" else "t.r"
        where = [f"c.source IN ({', '.join('?' for _ in sources)})",
                 *("c.text LIKE ? ESCAPE '\\'" for _ in likes)]
        # The best rows are picked first and only they are read with their text (a sort that
        # carried every matching row's text costs more than reading the chunk twice); Python
        # puts them back in that order (SQLite's sorter would copy each text again).
        rows = self.query(f"WITH {ranking}top AS MATERIALIZED"
                          f" (SELECT c.rowid AS cid, {rank} AS rank FROM chunks c {' '.join(joins)}"
                          f" WHERE {' AND '.join(where)}"
                          " ORDER BY rank ASC, c.path ASC, c.start_line ASC LIMIT ?)"
                          " SELECT c.id, c.path, c.source, c.start_line, c.end_line, c.text, top.rank,"
                          f" {ranked} FROM top JOIN chunks c ON c.rowid = top.cid",
                          [*params, *sources, *likes, int(limit)])
        count = int(rows[0][7]) if rows and rows[0][7] is not None else None
        rows.sort(key=lambda r: row_order(r[6], r[1], r[3]))
        return [r[:7] for r in rows], count

    def substring_rows(self, like_patterns: Sequence[str], *,
                       sources: Sequence[str]) -> list[KeywordRow]:
        """Every chunk of ``sources`` whose text matches all ``like_patterns`` (rank 0)."""
        return self._keyword_sql(None, None, like_patterns, sources=sources, limit=-1,
                                 inner_limit=None)[0]  # LIMIT -1: no limit

    def chunk_rows(self, chunk_ids: Sequence[str]) -> list[KeywordRow]:
        """The chunks with these ids (rank 0), in no particular order."""
        if not chunk_ids:
            return []
        return self.query(
            "SELECT id, path, source, start_line, end_line, text, 0.0 FROM chunks"
            f" WHERE id IN ({', '.join('?' for _ in chunk_ids)})", chunk_ids)

    def file_mtimes(self, paths: Sequence[str]) -> dict[tuple[str, str], int]:
        """``{(source, path): files.mtime}`` (epoch ms) of the indexed files among ``paths``."""
        if not paths:
            return {}
        return {(r[0], r[1]): int(r[2]) for r in self.query(
            f"SELECT source, path, mtime FROM files WHERE path IN ({', '.join('?' for _ in paths)})",
            paths)}

    def file_rows(self, source: str) -> list[tuple[str, str, int, int, int | None]]:
        """``(path, content hash, mtime ms, size bytes, ctime ns or None)`` of every indexed
        file of ``source``."""
        return [(r[0], r[1], int(r[2]), int(r[3]), r[4]) for r in self.query(
            "SELECT path, hash, mtime, size, ctime FROM files WHERE source = ?", [source])]

    def skip_rows(self, source: str | None = None
                  ) -> list[tuple[str, str, int | None, int | None, int | None]]:
        """``(path, reason, mtime ms, size bytes, ctime ns)`` of the ``skipped_files`` rows of
        ``source`` (``None``: every source), by path and reason; the stamps are ``None`` for a
        file skipped without being read (a discovery skip, a caveat)."""
        where, params = ("WHERE source = ? ", [source]) if source is not None else ("", [])
        return [(r[0], r[1], r[2], r[3], r[4]) for r in self.query(
            f"SELECT path, reason, mtime, size, ctime FROM skipped_files {where}"
            "ORDER BY path, reason", params)]

    def index_counts(self) -> tuple[dict[str, int], dict[str, int], int]:
        """``({source: files}, {source: chunks}, embedding cache entries)`` in one statement."""
        files: dict[str, int] = {}
        chunks: dict[str, int] = {}
        entries = 0
        for kind, source, n in self.query(
                "SELECT 'f', source, COUNT(*) FROM files GROUP BY source UNION ALL"
                " SELECT 'c', source, COUNT(*) FROM chunks GROUP BY source UNION ALL"
                " SELECT 'e', NULL, COUNT(*) FROM embedding_cache"):
            if kind == "e":
                entries = int(n)
            else:
                (files if kind == "f" else chunks)[str(source)] = int(n)
        return files, chunks, entries

    def highlights(self, mark_match: str, texts: Mapping[str, str], *, open_mark: str,
                   close_mark: str) -> dict[str, str]:
        """FTS5 ``highlight()`` of the indexed text of the chunks ``texts`` names, for those
        matching ``mark_match`` (same tokenizer and stemming as the ranking)."""
        chunk_ids = list(texts)
        # "+rowid": one pass over the plan's matches, not the whole MATCH again per hit
        return dict(self.query(
            "SELECT (SELECT id FROM chunks WHERE rowid = chunks_fts.rowid),"
            " highlight(chunks_fts, 0, ?, ?) FROM chunks_fts WHERE chunks_fts MATCH ? AND +rowid IN"
            f" (SELECT rowid FROM chunks WHERE id IN ({', '.join('?' for _ in chunk_ids)}))",
            [open_mark, close_mark, mark_match, *chunk_ids]))


class ReadOnlyStore(MetaReads):
    """One ``query_only`` connection to an existing store file (a ``SearchStore``); use
    :meth:`open`, close with :meth:`close` or a ``with`` block."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn = conn

    @classmethod
    def open(cls, path: Path) -> ReadOnlyStore | None:
        """Open the store at ``path`` (:func:`connect_read_only`); ``None`` when there is no
        such file (it is never created). Raises ``IndexStoreError``."""
        if not path.is_file():
            return None
        return cls(path, connect_read_only(path))

    def __enter__(self) -> ReadOnlyStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; idempotent."""
        self._conn.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one read statement with bound parameters and return all rows. Raises
        ``IndexStoreError``."""
        with translate_errors(self.path):
            return self._conn.execute(sql, tuple(params)).fetchall()


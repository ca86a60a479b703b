"""Numbered schema migrations of the builtin engine's SQLite store.

Each migration is a small function ``mNNN_name(conn, *, fts_tokenizer)``; they run in order,
each inside one ``BEGIN IMMEDIATE`` transaction together with ``PRAGMA user_version = N``, so
two processes opening a new store cannot race and opening a store needs one read
(``PRAGMA user_version``). A shipped migration is never edited: add a new one after it.

Schema (the reference system's table names, so its files and ours have one layout):

- ``meta(key, value)``: the index identity under ``memory_index_meta_v1`` plus bookkeeping
  (``fts_tokenizer``: the tokenizer the FTS table was actually created with; ``fts_error``;
  ``scan_issues``; ``last_sync_at_ms``).
- ``files(path, source, hash, mtime, size, ctime)``: one row per indexed file (mtime in ms,
  size in bytes, hash = sha256 hex of the content, ctime = the status-change time in ns, NULL
  where the platform gives none and on rows written before ``m008``; see there).
- ``chunks(id, path, source, start_line, end_line, hash, model, text, embedding, vector, dims,
  updated_at)``: ``vector`` is the chunk's embedding as a float32 little-endian BLOB (NULL when
  none), ``dims`` its length; ``embedding`` is always ``'[]'`` since ``m006`` (kept for the
  reference schema, see there).
- ``chunks_fts``: FTS5 over ``text, title, terms`` (``porter unicode61`` or ``trigram
  case_sensitive 0``) since ``m007``; its rowid equals the chunk's ``chunks.rowid``. Rows are
  written only by ``fallback/store/fts_rows.py`` (see there for the columns). Until ``m007`` it
  was FTS5 over ``text`` (``unicode61``) with ``id, path, source, model, start_line, end_line``
  UNINDEXED.
- ``chunks_trigram``: FTS5 ``trigram case_sensitive 0`` over the same text, rowid = chunk rowid
  (CJK substring search, see ``fallback/search/fts.py``).
- ``embedding_cache(provider, model, provider_key, hash, embedding, dims, updated_at)``.
- ``skipped_files(path, source, reason, mtime, size, ctime)``: files the last sync skipped or
  indexed with a caveat; a file skipped after it was read (binary, unreadable, too large) keeps
  the stamps it was read at (``m009``), so the next sync does not read it again while they hold.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable

from fallback.store.fts_rows import create_fts_table, insert_chunk_fts, note_title

__all__ = ["META_KEY", "MIGRATIONS", "FTS_TOKENIZERS", "in_memory_store", "fts_tokenize_clause"]

# Meta key of the index identity JSON (spec §4.2, E1/E2 name).
META_KEY = "memory_index_meta_v1"

# The two FTS5 tokenizers the config may name (store.fts.tokenizer).
FTS_TOKENIZERS = ("unicode61", "trigram")


def fts_tokenize_clause(tokenizer: str) -> str:
    """Return the FTS5 ``tokenize=`` value for a configured tokenizer name.

    Args:
        tokenizer: ``unicode61`` or ``trigram``; anything else is treated as ``unicode61``.
    """
    return "trigram case_sensitive 0" if tokenizer == "trigram" else "unicode61"


def m001_core(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Create ``meta``, ``files`` and ``chunks`` with their indexes."""
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS files ("
        " path TEXT PRIMARY KEY,"
        " source TEXT NOT NULL DEFAULT 'memory',"
        " hash TEXT NOT NULL,"
        " mtime INTEGER NOT NULL,"
        " size INTEGER NOT NULL)")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS chunks ("
        " id TEXT PRIMARY KEY,"
        " path TEXT NOT NULL,"
        " source TEXT NOT NULL DEFAULT 'memory',"
        " start_line INTEGER NOT NULL,"
        " end_line INTEGER NOT NULL,"
        " hash TEXT NOT NULL,"
        " model TEXT NOT NULL,"
        " text TEXT NOT NULL,"
        " embedding TEXT NOT NULL DEFAULT '[]',"
        " vector BLOB,"
        " dims INTEGER,"
        " updated_at INTEGER NOT NULL)")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_chunks_path ON chunks(path)")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_chunks_source ON chunks(source)")


def m002_fts(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Create ``chunks_fts`` (configured tokenizer) and ``chunks_trigram`` (CJK substrings).

    A SQLite without FTS5 is not fatal: the error text is recorded in ``meta.fts_error`` and
    keyword search reports FTS as unavailable.
    """
    tokenize = fts_tokenize_clause(fts_tokenizer)
    try:
        conn.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5("
            " text, id UNINDEXED, path UNINDEXED, source UNINDEXED, model UNINDEXED,"
            f" start_line UNINDEXED, end_line UNINDEXED, tokenize='{tokenize}')")
        conn.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_trigram USING fts5("
            " text, tokenize='trigram case_sensitive 0')")
    except sqlite3.OperationalError as exc:
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('fts_error', ?)", (str(exc),))
        return
    conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('fts_tokenizer', ?)",
                 ("trigram" if fts_tokenizer == "trigram" else "unicode61",))


def m003_embedding_cache(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Create ``embedding_cache`` keyed by (provider, model, provider_key, hash)."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS embedding_cache ("
        " provider TEXT NOT NULL,"
        " model TEXT NOT NULL,"
        " provider_key TEXT NOT NULL,"
        " hash TEXT NOT NULL,"
        " embedding TEXT NOT NULL,"
        " dims INTEGER,"
        " updated_at INTEGER NOT NULL,"
        " PRIMARY KEY (provider, model, provider_key, hash))")
    conn.execute("CREATE INDEX IF NOT EXISTS idx_embedding_cache_updated_at"
                 " ON embedding_cache(updated_at)")


def m004_skipped_files(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Create ``skipped_files`` so every process's ``status()`` sees what a sync skipped."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS skipped_files ("
        " path TEXT NOT NULL,"
        " source TEXT NOT NULL DEFAULT 'memory',"
        " reason TEXT NOT NULL,"
        " PRIMARY KEY (path, source, reason))")


def m005_chunks_path_source(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Index ``chunks(path, source)``: rewriting one file looks its chunks up by both, and with
    only the single-column indexes SQLite picked ``source`` and read every chunk per file
    (full index time grew with the square of the file count)."""
    conn.execute("CREATE INDEX IF NOT EXISTS idx_chunks_path_source ON chunks(path, source)")


def m006_single_vector_copy(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Keep one copy of each chunk vector: ``chunks.vector``.

    Until now a chunk's embedding was stored twice in the store (``chunks.embedding`` as JSON,
    written but never read, and ``chunks.vector`` as a float32 BLOB) and a third time in the
    sqlite-vec side file ``<store>-vec``. Vector search now reads ``chunks.vector`` only: with
    sqlite-vec loaded into the store's own connection, or exact numpy brute force where Python's
    ``sqlite3`` cannot load extensions (``fallback/store/vectors.py``). So this migration:

    - sets ``chunks.embedding`` to ``'[]'`` on every row (the JSON copies go; SQLite reuses the
      freed pages). The column itself is kept: the reference schema declares
      ``chunks.embedding TEXT NOT NULL`` and writes it in every chunk upsert, and the store lives
      at the reference's path
      (``<stateDir>/memory/<agentId>.sqlite``), so a reference-schema client opening this file
      must still find the column; ``'[]'`` is that schema's own "no embedding" value, and the
      column's default, so our writes simply leave it out;
    - deletes the side file ``<store>-vec`` (and its ``-wal``/``-shm``), a cache that nothing
      reads any more. Files are not transactional: should this migration roll back, the old
      code would rebuild that cache on its next query, so nothing is lost either way.
    """
    conn.execute("UPDATE chunks SET embedding = '[]' WHERE embedding <> '[]'")
    main_file = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"),
                     "")
    if main_file:
        for suffix in ("-vec", "-vec-wal", "-vec-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{main_file}{suffix}")


def m007_fts_title_terms(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Rebuild ``chunks_fts`` as ``(text, title, terms)`` with English stemming, refilled from
    ``chunks``.

    Keyword search now ORs a question's content terms and ranks them with ``bm25()`` over three
    weighted columns (``fallback/search/fts.py``): the chunk text stemmed by ``porter``, the
    note's path and first heading (``title``), and terms derived from the text (compound joins,
    canonical dates). The old table (``unicode61``, six UNINDEXED copies of ``chunks`` columns
    nobody read) is dropped and every chunk's row is written again through
    ``fallback/store/fts_rows.py``, so an upgraded store answers at once, without a re-index.
    The title of a file comes from its first chunk (the first heading of a note is in it unless
    the note starts with more than one chunk of text before any heading). A trigram store keeps
    its tokenizer; a store without FTS5 (``meta.fts_error``) is left as it is.
    """
    if conn.execute("SELECT 1 FROM meta WHERE key = 'fts_error'").fetchone() is not None:
        return
    row = conn.execute("SELECT value FROM meta WHERE key = 'fts_tokenizer'").fetchone()
    tokenizer = "trigram" if (row[0] if row else fts_tokenizer) == "trigram" else "unicode61"
    conn.execute("DROP TABLE IF EXISTS chunks_fts")
    create_fts_table(conn, tokenizer)
    chunks = conn.execute("SELECT rowid, path, source, text FROM chunks"
                          " ORDER BY path, source, start_line, rowid")
    current: tuple[str, str] | None = None
    title = ""
    for rowid, path, source, text in chunks.fetchall():
        if (path, source) != current:
            current = (path, source)
            title = note_title(path, text)
        # chunks_trigram rows are unchanged: only chunks_fts is rebuilt.
        insert_chunk_fts(conn, [(rowid, text)], title=title, fill_trigram=False)


def m008_files_ctime(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Add ``files.ctime``: the file's status-change time in epoch ns when it was read.

    Until now a sync trusted a row without reading its file while the file's ``(mtime, size)``
    equalled the row's, so a rewrite of the same size whose mtime was put back (``touch -r``,
    ``cp -p``, ``rsync -t``, editors and sync tools that keep mtimes) kept the old text indexed
    for good. No call sets the ctime, so ``(mtime, size, ctime)`` unchanged means unchanged
    (``fallback/sources/stamps.py``). Existing rows get NULL: on a platform with a ctime the next
    sync reads each file once, and its content hash decides (an unchanged file only gets its
    row's stamps written, no chunk is rewritten or embedded); where the platform gives none,
    NULL is what the file gives too and nothing is read. No backfill here: the stamps a row
    was written from are gone, and stamping the files as they are now would trust a rewrite
    made since the last sync. The column is nullable, so a reference-schema client that writes
    ``files`` with its own five columns still can (its rows are read once by our next sync).
    """
    columns = {row[1] for row in conn.execute("PRAGMA table_info(files)")}
    if "ctime" not in columns:
        conn.execute("ALTER TABLE files ADD COLUMN ctime INTEGER")


def m009_skipped_files_stamps(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Add ``skipped_files.mtime``, ``size`` and ``ctime``: the stamps (ms, bytes, ns) of a file a
    sync read and then skipped (binary, unreadable, too large).

    Until now such a file had neither a ``files`` row nor a stamp, so every sync read it again
    and the index was never in sync with a workspace that held one. Rows written before get
    NULL (the file is read once more, then stamped); rows of files skipped by discovery alone
    (symlinks, hidden names) and caveats of indexed files keep NULL.
    """
    m004_skipped_files(conn, fts_tokenizer=fts_tokenizer)  # idempotent: a store built without it
    columns = {row[1] for row in conn.execute("PRAGMA table_info(skipped_files)")}
    for column in ("mtime", "size", "ctime"):
        if column not in columns:
            conn.execute(f"ALTER TABLE skipped_files ADD COLUMN {column} INTEGER")


# Ordered; position i (0-based) brings the store to user_version i + 1.
MIGRATIONS: tuple[Callable[..., None], ...] = (
    m001_core,
    m002_fts,
    m003_embedding_cache,
    m004_skipped_files,
    m005_chunks_path_source,
    m006_single_vector_copy,
    m007_fts_title_terms,
    m008_files_ctime,
    m009_skipped_files_stamps,
)



def _create_schema(conn: sqlite3.Connection, fts_tokenizer: str) -> None:
    for migration in MIGRATIONS:
        migration(conn, fts_tokenizer=fts_tokenizer)


@functools.lru_cache(maxsize=2)
def _schema_image(fts_tokenizer: str) -> bytes:
    """An empty database at the latest schema, serialised (Python 3.11+)."""
    conn = sqlite3.connect(":memory:")
    try:
        _create_schema(conn, fts_tokenizer)
        image: bytes = conn.serialize()  # type: ignore[attr-defined,unused-ignore]
        return image
    finally:
        conn.close()


def in_memory_store(*, fts_tokenizer: str) -> sqlite3.Connection:
    """A new in-memory database with the store's latest schema (no version recorded), for a
    throw-away index that the keyword search reads as it reads a store
    (``qmdbridge/qmd/passages.py``). Store files are opened through ``fallback/store/db.py``,
    which records each migration.

    Args:
        fts_tokenizer: ``unicode61`` or ``trigram``.

    Returns:
        A connection usable from any thread (``check_same_thread=False``); the caller closes it.
    """
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    if hasattr(conn, "deserialize"):  # a copy of the schema made once (running it costs ms)
        conn.deserialize(_schema_image(fts_tokenizer))
    else:
        _create_schema(conn, fts_tokenizer)
    return conn

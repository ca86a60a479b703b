"""Numbered schema migrations of the builtin engine's SQLite store.

Each migration is a small function ``mNNN_name(conn, *, fts_tokenizer)``, run in order, each in
one ``BEGIN IMMEDIATE`` transaction with ``PRAGMA user_version = N``. A shipped migration is
never edited: add a new one after it.

Tables (the reference system's names): ``meta``, ``files`` (mtime ms, size bytes, sha256 hex,
ctime ns or NULL), ``chunks`` (``vector``: the float32 little-endian BLOB of the window
vectors; ``embedding`` always ``'[]'``), ``chunks_fts`` (FTS5 over ``text, title, terms``,
rowid = ``chunks.rowid``, rows by ``fallback/store/fts_rows.py``), ``chunks_trigram``,
``embedding_cache`` and ``skipped_files`` (with the stamps of a file read and skipped).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable

from fallback.store.fts_rows import create_fts_table, insert_chunk_fts, insert_chunk_trigram, note_title

__all__ = ["META_KEY", "MIGRATIONS", "in_memory_store"]

# Meta key of the index identity JSON (spec §4.2, E1/E2 name).
META_KEY = "memory_index_meta_v1"


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
    """Create ``chunks_fts`` (configured tokenizer) and ``chunks_trigram`` (CJK substrings);
    a SQLite without FTS5 records its error in ``meta.fts_error``."""
    tokenize = "trigram case_sensitive 0" if fts_tokenizer == "trigram" else "unicode61"
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
    """Index ``chunks(path, source)``, by which rewriting one file looks its chunks up."""
    conn.execute("CREATE INDEX IF NOT EXISTS idx_chunks_path_source ON chunks(path, source)")


def m006_single_vector_copy(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Keep one copy of each chunk vector, ``chunks.vector``: ``chunks.embedding`` becomes
    ``'[]'`` (the reference schema's "no embedding"; the column stays for reference-schema
    clients) and the sqlite-vec side file ``<store>-vec`` is deleted."""
    conn.execute("UPDATE chunks SET embedding = '[]' WHERE embedding <> '[]'")
    main_file = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"),
                     "")
    if main_file:
        for suffix in ("-vec", "-vec-wal", "-vec-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{main_file}{suffix}")


def m007_fts_title_terms(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Rebuild ``chunks_fts`` as ``(text, title, terms)`` with English stemming, refilled from
    ``chunks`` through ``fallback/store/fts_rows.py`` (a file's title from its first chunk). A
    trigram store keeps its tokenizer; a store without FTS5 is left as it is."""
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
    """Add ``files.ctime``: the file's status-change time in epoch ns when it was read, so a
    rewrite with its size and mtime put back is read again. Existing rows get NULL (each file
    is read once more); nullable, for reference-schema clients that write five columns."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(files)")}
    if "ctime" not in columns:
        conn.execute("ALTER TABLE files ADD COLUMN ctime INTEGER")


def m009_skipped_files_stamps(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Add ``skipped_files.mtime``, ``size`` and ``ctime``: the stamps (ms, bytes, ns) of a file a
    sync read and then skipped, so it is not read again while they hold; NULL for discovery
    skips, caveats and rows written before."""
    m004_skipped_files(conn, fts_tokenizer=fts_tokenizer)  # idempotent: a store built without it
    columns = {row[1] for row in conn.execute("PRAGMA table_info(skipped_files)")}
    for column in ("mtime", "size", "ctime"):
        if column not in columns:
            conn.execute(f"ALTER TABLE skipped_files ADD COLUMN {column} INTEGER")


def m010_trigram_unspaced_scripts(conn: sqlite3.Connection, *, fts_tokenizer: str) -> None:
    """Write the ``chunks_trigram`` rows of the chunks in Thai, Lao, Khmer or Myanmar text: those
    scripts, written without spaces between words, are searched as substrings as CJK is
    (``fallback/text/scripts.py`` ``UNSPACED_SCRIPTS``), and a sync writes such rows only for
    the chunks it writes. A trigram store or one without FTS5 is left as it is."""
    if conn.execute("SELECT 1 FROM meta WHERE key = 'fts_error'").fetchone() is not None:
        return
    row = conn.execute("SELECT value FROM meta WHERE key = 'fts_tokenizer'").fetchone()
    if (row[0] if row else fts_tokenizer) == "trigram":
        return
    held = {r[0] for r in conn.execute("SELECT rowid FROM chunks_trigram")}
    insert_chunk_trigram(conn, [(rowid, text) for rowid, text in conn.execute(
        "SELECT rowid, text FROM chunks") if rowid not in held])


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
    m010_trigram_unspaced_scripts,
)


def _create_schema(conn: sqlite3.Connection, fts_tokenizer: str) -> None:
    for migration in MIGRATIONS:
        migration(conn, fts_tokenizer=fts_tokenizer)


@functools.lru_cache(maxsize=2)
def _schema_image(fts_tokenizer: str) -> bytes:
    """An empty database at the latest schema, serialised (Python 3.11+)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        _create_schema(conn, fts_tokenizer)
        image: bytes = conn.serialize()  # type: ignore[attr-defined,unused-ignore]
        return image


def in_memory_store(*, fts_tokenizer: str) -> sqlite3.Connection:
    """A new in-memory database with the store's latest schema for ``fts_tokenizer``
    (``unicode61`` or ``trigram``; no version recorded), for a throw-away index searched as a
    store; usable from any thread, the caller closes it."""
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    if hasattr(conn, "deserialize"):  # a copy of the schema made once (running it costs ms)
        conn.deserialize(_schema_image(fts_tokenizer))
    else:
        _create_schema(conn, fts_tokenizer)
    return conn

"""The one writer of full-text rows: every ``chunks_fts`` / ``chunks_trigram`` row goes through here.

``chunks_fts(text, title, terms)`` (migration ``m007``), rowid = ``chunks.rowid``: the chunk
text; the file's path, first Markdown heading and their derived terms
(:func:`fallback.text.terms.title_text`, the same on every chunk of the file); the terms derived
from the chunk text (:func:`fallback.text.terms.derived_terms`: ``wifi`` for ``Wi-Fi``,
``20230508``). Tokenizer :data:`WORD_TOKENIZE`, or :data:`TRIGRAM_TOKENIZE` on a
``store.fts.tokenizer = "trigram"`` store, where ``chunks_trigram`` (the chunks searched as
substrings, ``fallback/search/fts.py``) is not filled. Nothing here commits.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from fallback.text.scripts import contains_unspaced
from fallback.text.terms import derived_terms, first_heading, title_text

__all__ = [
    "FTS_COLUMNS",
    "TRIGRAM_TOKENIZE",
    "WORD_TOKENIZE",
    "create_fts_table",
    "delete_file_fts",
    "insert_chunk_fts",
    "insert_chunk_trigram",
    "merge_segments",
    "note_title",
]

# Indexed columns of chunks_fts, in order (bm25() takes one weight per column in this order).
FTS_COLUMNS = ("text", "title", "terms")
# FTS5 tokenize= of chunks_fts on a unicode61 store, and of chunks_trigram (m002 wrote the same
# text) and a trigram store's chunks_fts; the postgres store's postings are cut by the same two.
WORD_TOKENIZE = "porter unicode61"
TRIGRAM_TOKENIZE = "trigram case_sensitive 0"


# FTS5 'automerge': merge b-tree segments once this many accumulate at one level (FTS5's default
# is 4). Each file's commit leaves a small segment; merging at 8 halves the merge work of a full
# index for a few more segments per term lookup.
AUTOMERGE_SEGMENTS = 8


def create_fts_table(conn: sqlite3.Connection, tokenizer: str) -> None:
    """Create ``chunks_fts`` for a configured ``tokenizer`` (``unicode61``, stored as ``porter
    unicode61``, or ``trigram``) and set its merge policy, in the caller's transaction."""
    tokenize = TRIGRAM_TOKENIZE if tokenizer == "trigram" else WORD_TOKENIZE
    conn.execute(f"CREATE VIRTUAL TABLE chunks_fts USING fts5({', '.join(FTS_COLUMNS)},"
                 f" tokenize='{tokenize}')")
    conn.execute("INSERT INTO chunks_fts(chunks_fts, rank) VALUES ('automerge', ?)",
                 (AUTOMERGE_SEGMENTS,))


# After a sync that changed a few files, merge_segments() merges a store of at most this many
# chunks: FTS5 'optimize' rewrites the whole index, a few ms at this size; above it automerge
# alone keeps the segments of each file's commit in check.
MERGE_MAX_CHUNKS = 250


def merge_segments(conn: sqlite3.Connection, *, whole: bool) -> bool:
    """Merge ``chunks_fts`` and ``chunks_trigram`` into one b-tree segment each (FTS5
    ``optimize``; rows, order and ``bm25()`` unchanged) after a sync that wrote rows, in the
    caller's transaction: at any size when it wrote the ``whole`` index, else only a store of at
    most :data:`MERGE_MAX_CHUNKS` chunks. Returns whether they were merged (never without FTS5)."""
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE name IN ('chunks_fts', 'chunks_trigram')")]
    if not tables or not whole and conn.execute(
            "SELECT COUNT(*) FROM chunks").fetchone()[0] > MERGE_MAX_CHUNKS:
        return False
    for table in tables:
        conn.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")
    return True


def note_title(path: str, text: str) -> str:
    """The ``title`` column value of every chunk of the file at workspace-relative ``path``
    (path, first heading of ``text``, derived terms)."""
    return title_text(path, first_heading(text))


def insert_chunk_fts(conn: sqlite3.Connection, rows: Iterable[tuple[int, str]], *, title: str,
                     fill_trigram: bool) -> None:
    """Write the full-text rows of freshly inserted chunks of one file (``(rowid, text)``
    pairs; ``title``: the file's :func:`note_title`) in the caller's transaction, and with
    ``fill_trigram`` (unicode61 stores) their :func:`insert_chunk_trigram` rows."""
    rows = list(rows)
    conn.executemany("INSERT INTO chunks_fts(rowid, text, title, terms) VALUES (?, ?, ?, ?)",
                     [(rowid, text, title, derived_terms(text)) for rowid, text in rows])
    if fill_trigram:
        insert_chunk_trigram(conn, rows)


def insert_chunk_trigram(conn: sqlite3.Connection, rows: Iterable[tuple[int, str]]) -> None:
    """Write the ``chunks_trigram`` rows of those ``(rowid, text)`` pairs (none with a row yet)
    whose text is searched as substrings (:func:`~fallback.text.scripts.contains_unspaced`: CJK,
    Thai, Lao, Khmer, Myanmar), in the caller's transaction."""
    conn.executemany("INSERT INTO chunks_trigram(rowid, text) VALUES (?, ?)",
                     [(rowid, text) for rowid, text in rows if contains_unspaced(text)])


def delete_file_fts(conn: sqlite3.Connection, path: str, source: str) -> None:
    """Delete the full-text rows of the chunks of the file at workspace-relative ``path`` of
    ``source``, in the caller's transaction, before the chunks are deleted."""
    has_fts = conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name IN"
                           " ('chunks_fts', 'chunks_trigram')").fetchone()[0]
    if not has_fts:
        return
    sub = "SELECT rowid FROM chunks WHERE path = ? AND source = ?"
    conn.execute(f"DELETE FROM chunks_fts WHERE rowid IN ({sub})", (path, source))
    conn.execute(f"DELETE FROM chunks_trigram WHERE rowid IN ({sub})", (path, source))

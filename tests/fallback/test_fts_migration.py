"""Migration m007: an old store's chunks_fts (unicode61, UNINDEXED copies) is rebuilt as
(text, title, terms) with stemming and refilled from chunks, so it answers without a re-index."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from fallback.search.fts import analyze_fts_query
from fallback.search.keyword import keyword_rows
from fallback.store.db import Store
from fallback.store.migrations import MIGRATIONS

CHUNKS = [
    ("memory/2023-05-08.md", 1, 3, "# Standup\nThe guest Wi-Fi died.\nPainted the fence."),
    ("memory/2023-05-08.md", 4, 5, "Later that day\nthe router rebooted."),
    ("MEMORY.md", 1, 1, "Ticket ABC-1234 tracks the export bug."),
]


def _old_store(path: Path, *, tokenizer: str = "unicode61") -> None:
    """A store as the code before m007 wrote it: migrations 1-6 and its FTS row shape."""
    conn = sqlite3.connect(path, isolation_level=None)
    for number, migration in enumerate(MIGRATIONS[:6], start=1):
        migration(conn, fts_tokenizer=tokenizer)
        conn.execute(f"PRAGMA user_version={number}")
    for rowid, (rel, start, end, text) in enumerate(CHUNKS, start=1):
        conn.execute("INSERT INTO chunks(rowid, id, path, source, start_line, end_line, hash, model,"
                     " text, updated_at) VALUES (?, ?, ?, 'memory', ?, ?, 'h', 'fts-only', ?, 0)",
                     (rowid, f"c{rowid}", rel, start, end, text))
        conn.execute("INSERT INTO chunks_fts(rowid, text, id, path, source, model, start_line,"
                     " end_line) VALUES (?, ?, ?, ?, 'memory', 'fts-only', ?, ?)",
                     (rowid, text, f"c{rowid}", rel, start, end))
    conn.close()


def _found(store: Store, query: str) -> list[tuple[str, int]]:
    plan = analyze_fts_query(query, tokenizer=store.fts_tokenizer).plan()
    assert plan is not None
    return [(r[1], r[3]) for r in keyword_rows(store, plan, sources=["memory"], limit=10)]


def test_old_store_upgrades_in_place(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    _old_store(db)
    store = Store(db)
    try:
        assert store.user_version() == len(MIGRATIONS)
        cols = [r[1] for r in store.query("PRAGMA table_info(chunks_fts)")]
        assert cols == ["text", "title", "terms"]
        sql = store.query("SELECT sql FROM sqlite_master WHERE name = 'chunks_fts'")[0][0]
        assert "tokenize='porter unicode61'" in sql
        assert store.query("SELECT rowid, title, terms FROM chunks_fts ORDER BY rowid") == [
            (1, "memory/2023-05-08.md Standup 20230508 202305", "wifi"),
            (2, "memory/2023-05-08.md Standup 20230508 202305", ""),
            (3, "MEMORY.md", "abc1234"),
        ]
        assert sorted(_found(store, "8 May 2023")) == [("memory/2023-05-08.md", 1),
                                                       ("memory/2023-05-08.md", 4)]
        assert _found(store, "wifi") == [("memory/2023-05-08.md", 1)]
        assert _found(store, "painting") == [("memory/2023-05-08.md", 1)]
        assert _found(store, "ABC-1234") == [("MEMORY.md", 1)]
    finally:
        store.close()
    again = Store(db)  # applying twice changes nothing
    try:
        assert again.query("SELECT COUNT(*) FROM chunks_fts") == [(3,)]
    finally:
        again.close()


def test_trigram_store_keeps_its_tokenizer(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    _old_store(db, tokenizer="trigram")
    store = Store(db, fts_tokenizer="unicode61")
    try:
        assert store.fts_tokenizer == "trigram"
        sql = store.query("SELECT sql FROM sqlite_master WHERE name = 'chunks_fts'")[0][0]
        assert "tokenize='trigram case_sensitive 0'" in sql
        assert _found(store, "router") == [("memory/2023-05-08.md", 4)]
    finally:
        store.close()


def test_store_without_fts5_is_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    conn = sqlite3.connect(db, isolation_level=None)
    MIGRATIONS[0](conn, fts_tokenizer="unicode61")
    conn.execute("INSERT INTO meta(key, value) VALUES ('fts_error', 'no such module: fts5')")
    conn.execute("PRAGMA user_version=6")
    conn.close()
    store = Store(db)
    try:
        assert store.user_version() == len(MIGRATIONS)
        assert store.fts_error == "no such module: fts5"
        assert store.query("SELECT name FROM sqlite_master WHERE name = 'chunks_fts'") == []
    finally:
        store.close()

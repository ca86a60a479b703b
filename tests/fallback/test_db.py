"""The store: migrations, typed SQLite errors, atomic swap, keyword rows (fallback/store/db.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from fallback.errors import IndexStoreError
from fallback.request import SearchRequest
from fallback.search.fts import analyze_fts_query
from fallback.search.keyword import keyword_rows
from fallback.store.db import (
    Store,
    remove_db_files,
    swap_db_files,
    temp_db_path,
)
from fallback.store.errors import (
    IndexStoreCorruptError,
    IndexStoreLockedError,
    IndexStoreReadOnlyError,
)
from fallback.store.fts_rows import insert_chunk_fts, note_title
from fallback.store.migrations import MIGRATIONS
from tests.fallback.count_provider import CountProvider

EXPECTED_TABLES = {"meta", "files", "chunks", "chunks_fts", "chunks_trigram", "embedding_cache",
                   "skipped_files"}


def _schema(path: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(path)
    try:
        return sorted((r[0], r[1]) for r in conn.execute(
            "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            " AND name NOT LIKE 'chunks_fts_%' AND name NOT LIKE 'chunks_trigram_%'"))
    finally:
        conn.close()


def test_new_store_reaches_latest_schema(tmp_path: Path) -> None:
    db = tmp_path / "deep" / "dir" / "main.sqlite"
    store = Store(db)
    try:
        assert store.user_version() == len(MIGRATIONS) == 10
        assert {name for kind, name in _schema(db) if kind == "table"} == EXPECTED_TABLES
        assert {name for kind, name in _schema(db) if kind == "index"} == {
            "idx_chunks_path", "idx_chunks_source", "idx_chunks_path_source",
            "idx_embedding_cache_updated_at"}
        assert store.query("PRAGMA journal_mode")[0][0] == "wal"
        cols = [r[1] for r in store.query("PRAGMA table_info(chunks)")]
        assert cols == ["id", "path", "source", "start_line", "end_line", "hash", "model", "text",
                        "embedding", "vector", "dims", "updated_at"]
        assert store.fts_tokenizer == "unicode61"
        assert store.fts_error is None
        assert store.quick_check() == "ok"
    finally:
        store.close()


def test_reopen_is_idempotent_and_keeps_tokenizer(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    Store(db, fts_tokenizer="trigram").close()
    before = _schema(db)
    store = Store(db, fts_tokenizer="unicode61")
    try:
        assert _schema(db) == before
        assert store.user_version() == len(MIGRATIONS)
        assert store.fts_tokenizer == "trigram"
    finally:
        store.close()


def test_older_version_is_migrated_forward(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db, isolation_level=None)
    for number, migration in enumerate(MIGRATIONS[:2], start=1):
        migration(conn, fts_tokenizer="unicode61")
        conn.execute(f"PRAGMA user_version={number}")
    conn.close()
    store = Store(db)
    try:
        assert store.user_version() == len(MIGRATIONS)
        fresh = tmp_path / "fresh.sqlite"
        Store(fresh).close()
        assert _schema(db) == _schema(fresh)
    finally:
        store.close()


def test_not_a_database_maps_to_index_store_error(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    db.write_bytes(b"this is definitely not sqlite" * 200)
    with pytest.raises(IndexStoreCorruptError) as info:
        Store(db)
    assert str(info.value) == (f"index store is corrupt: file is not a database ({db})")
    assert info.value.db_path == str(db)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)


def test_lock_past_busy_timeout_is_locked_error(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    store = Store(db, busy_timeout_ms=50)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(IndexStoreLockedError) as info, store.transaction() as conn:
            conn.execute("DELETE FROM files")
        assert str(info.value).startswith(
            "index store is locked by another process past the busy timeout: database is locked")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        store.close()


def test_read_only_writer_and_the_reader_are_read_only_errors(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    store = Store(db)
    try:
        with pytest.raises(IndexStoreReadOnlyError) as info:
            store.query("DELETE FROM files")  # the reader never writes
        assert str(info.value) == (
            f"index store is read-only: attempt to write a readonly database ({db})")
        store.conn.execute("PRAGMA query_only=ON")  # the writer can no longer write either
        with pytest.raises(IndexStoreReadOnlyError), store.transaction() as conn:
            conn.execute("DELETE FROM files")
        store.reopen()
        with store.transaction() as conn:
            conn.execute("DELETE FROM files")
    finally:
        store.close()


def test_closed_store_raises(tmp_path: Path) -> None:
    store = Store(tmp_path / "main.sqlite")
    store.close()
    store.close()
    with pytest.raises(IndexStoreError, match="index store is closed"):
        store.query("SELECT 1")


def _put(store: Store, path: str, text: str, rowid: int) -> None:
    with store.transaction() as conn:
        conn.execute("INSERT INTO chunks(rowid, id, path, source, start_line, end_line, hash, model,"
                     " text, updated_at) VALUES (?, ?, ?, 'memory', 1, 1, 'h', 'fts-only', ?, 0)",
                     (rowid, f"id{rowid}", path, text))
        insert_chunk_fts(conn, [(rowid, text)], title=note_title(path, text), fill_trigram=True)


def test_swap_publishes_temp_and_removes_backup(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    live = Store(db)
    _put(live, "old.md", "old content", 1)
    temp = temp_db_path(db)
    assert temp.name.startswith("main.sqlite.tmp-")
    built = Store(temp)
    _put(built, "new.md", "new content", 1)
    built.close()
    live.swap_from(temp)
    try:
        assert live.query("SELECT path FROM chunks") == [("new.md",)]
        assert sorted(p.name for p in tmp_path.iterdir()
                      if ".tmp-" in p.name or ".backup-" in p.name) == []
    finally:
        live.close()


def test_swap_failure_restores_live_db(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    Store(db).close()
    original = db.read_bytes()
    other_fs = Path("/dev/shm")
    if not other_fs.is_dir() or other_fs.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs a second filesystem (rename across devices fails with EXDEV)")
    temp = other_fs / f"qmdbridge-test-{tmp_path.name}.sqlite.tmp-x"
    Store(temp).close()
    try:
        with pytest.raises(IndexStoreError, match="could not swap in the rebuilt index"):
            swap_db_files(temp, db)
        assert db.read_bytes() == original
        assert [p.name for p in tmp_path.iterdir() if ".backup-" in p.name] == []
        assert not temp.exists()
    finally:
        remove_db_files(temp)
    remove_db_files(tmp_path / "absent.sqlite")  # missing files are ignored


def test_keyword_rows_english_and_cjk_substrings(tmp_path: Path) -> None:
    store = Store(tmp_path / "main.sqlite")
    try:
        _put(store, "en.md", "The deployment strategy for the API", 1)
        _put(store, "ja.md", "昨日の戦略会議でデプロイ計画を決めた", 2)
        _put(store, "zh.md", "今天讨论了金银价格的走势", 3)
        _put(store, "ko.md", "어제 서버에서 발생한 에러를 확인했다", 4)
        _put(store, "pct.md", "50%_off sale", 5)

        def paths(q: str) -> list[str]:
            plan = analyze_fts_query(q, tokenizer=store.fts_tokenizer).plan()
            assert plan is not None
            return [r[1] for r in keyword_rows(store, plan, sources=["memory"], limit=10)]

        assert paths("deployment api") == ["en.md"]
        assert paths("戦略") == ["ja.md"]          # JA 2 chars: LIKE
        assert paths("戦略会議") == ["ja.md"]      # JA 4 chars: trigram
        assert paths("デプロイ") == ["ja.md"]
        assert paths("价格") == ["zh.md"]          # ZH 2 chars
        assert paths("金银价格") == ["zh.md"]      # ZH 4 chars
        assert paths("서버") == ["ko.md"]          # KO 2 chars
        assert paths("발생한") == ["ko.md"]        # KO 3 chars
        assert paths("会議 deployment") == []      # AND across schemes
        assert paths("50%") == ["pct.md"]
        assert keyword_rows(store, analyze_fts_query("api").plan(), sources=["sessions"], limit=10) == []
        rank = keyword_rows(store, analyze_fts_query("戦略").plan(), sources=["memory"], limit=10)[0][6]
        assert rank == 0.0
    finally:
        store.close()


def _hybrid_engine(ws: Path, provider: CountProvider):
    from fallback.embeddings import ProviderSelection
    from fallback.engine.builtin import BuiltinEngine
    from fallback.settings import EngineSettings, MemorySearchSettings

    settings = EngineSettings.for_workspace(ws, search=MemorySearchSettings(provider="openai"))
    return BuiltinEngine(settings, provider_selection=ProviderSelection(provider, "test-count"),
                         now_ms=lambda: 1_770_681_600_000)


@pytest.mark.anyio
async def test_version_5_store_with_data_upgrades_in_place_and_answers(tmp_path: Path) -> None:
    import json
    import struct

    (tmp_path / "memory").mkdir()
    (tmp_path / "MEMORY.md").write_text("Beta knowledge base entry.")
    (tmp_path / "memory" / "2026-01-12.md").write_text("# Log\nAlpha alpha memory line.\n")
    provider = CountProvider()
    engine = _hybrid_engine(tmp_path, provider)
    await engine.sync(reason="cli")
    db = engine.settings.db_path
    await engine.close()
    # Put the file back as version 5 wrote it: the same tables, every vector also as JSON in
    # chunks.embedding, and the sqlite-vec side file next to the store.
    conn = sqlite3.connect(db, isolation_level=None)
    rows = conn.execute("SELECT id, vector FROM chunks ORDER BY id").fetchall()
    for chunk_id, blob in rows:
        vector = list(struct.unpack(f"<{len(blob) // 4}f", blob))
        conn.execute("UPDATE chunks SET embedding = ? WHERE id = ?", (json.dumps(vector), chunk_id))
    conn.execute("PRAGMA user_version=5")
    before = conn.execute("SELECT id, path, start_line, end_line, vector FROM chunks ORDER BY id"
                          ).fetchall()
    assert sorted(r[0] for r in conn.execute("SELECT embedding FROM chunks")) == [
        "[0.0, 1.0]", "[2.0, 0.0]"]
    conn.close()
    mirror = sqlite3.connect(f"{db}-vec")
    mirror.execute("CREATE TABLE chunks_vec_state(id TEXT PRIMARY KEY, updated_at INTEGER)")
    mirror.commit()
    mirror.close()

    upgraded = _hybrid_engine(tmp_path, provider)
    hits = (await upgraded.search(SearchRequest.of("alpha", min_score=0.0))).results
    assert [(h.path, h.start_line, h.end_line) for h in hits][0] == ("memory/2026-01-12.md", 1, 2)
    assert hits[0].vector_score == pytest.approx(1.0)
    assert provider.texts_embedded == 2  # nothing re-embedded: the old rows answered
    await upgraded.close()
    store = Store(db)
    try:
        assert store.user_version() == len(MIGRATIONS)
        assert store.query("SELECT id, path, start_line, end_line, vector FROM chunks ORDER BY id"
                           ) == before
        assert store.query("SELECT DISTINCT embedding FROM chunks") == [("[]",)]
    finally:
        store.close()
    assert not Path(f"{db}-vec").exists()


def test_an_in_memory_store_has_the_store_files_schema(tmp_path: Path) -> None:
    from fallback.store.migrations import in_memory_store

    db = tmp_path / "main.sqlite"
    Store(db).close()
    conn = in_memory_store(fts_tokenizer="unicode61")
    try:
        schema = sorted(conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall())
        meta = conn.execute("SELECT key, value FROM meta ORDER BY key").fetchall()
    finally:
        conn.close()
    with sqlite3.connect(db) as file_conn:
        assert schema == sorted(file_conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall())
        assert meta == file_conn.execute("SELECT key, value FROM meta ORDER BY key").fetchall()


def test_a_version_9_store_gets_the_trigram_rows_of_its_thai_chunks(tmp_path: Path) -> None:
    """Version 9 wrote ``chunks_trigram`` rows for CJK chunks only; opening it writes them for
    the chunks in scripts without spaces between words (Thai here), once."""
    db = tmp_path / "main.sqlite"
    store = Store(db)
    try:
        _put(store, "th.md", "เมื่อวานเราไปกินข้าวผัดที่ร้านใกล้บ้าน", 1)
        _put(store, "ja.md", "昨日の戦略会議でデプロイ計画を決めた", 2)
        _put(store, "en.md", "We had fried rice at the shop near home", 3)
    finally:
        store.close()
    conn = sqlite3.connect(db, isolation_level=None)  # as version 9 left it
    conn.execute("DELETE FROM chunks_trigram WHERE rowid = 1")
    conn.execute("PRAGMA user_version=9")
    conn.close()
    store = Store(db)
    try:
        assert store.user_version() == len(MIGRATIONS)
        assert store.query("SELECT rowid FROM chunks_trigram ORDER BY rowid") == [(1,), (2,)]
        plan = analyze_fts_query("ข้าวผัด", tokenizer=store.fts_tokenizer).plan()
        assert plan is not None and plan.trigram_match == '"ข้าวผัด"'
        assert [r[1] for r in keyword_rows(store, plan, sources=["memory"], limit=10)] == ["th.md"]
    finally:
        store.close()

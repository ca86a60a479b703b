"""Keyword search on a SQLite without FTS5: the store records why (``meta.fts_error``), keyword
search falls back to a substring scan of the chunk table, and the answer and status say so."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.search.substring import rank_substring_hits, substring_score
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.store.db import Store

pytestmark = pytest.mark.anyio

NO_FTS5 = "no such module: fts5"
WARNING = ("FTS5 is unavailable in this SQLite (no such module: fts5): keyword search is a "
           "substring scan of the chunks, without BM25 ranking")


class Fts5LessConnection(sqlite3.Connection):
    """A connection that refuses FTS5 tables exactly as a SQLite built without FTS5 does."""

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if "USING FTS5" in sql.upper():
            raise sqlite3.OperationalError(NO_FTS5)
        return super().execute(sql, *args)


class Fts5LessStore(Store):
    def _new_connection(self, uri: str) -> sqlite3.Connection:
        conn = sqlite3.connect(uri, uri=True, timeout=5, check_same_thread=False,
                               isolation_level=None, factory=Fts5LessConnection)
        conn.execute("PRAGMA busy_timeout=5000")
        return conn


def drop_fts(db_path: Path) -> None:
    """Leave a built store as a SQLite without FTS5 leaves one: no FTS tables, the reason in
    ``meta.fts_error`` (what migration m002 records there)."""
    with sqlite3.connect(db_path) as conn:
        conn.execute("DROP TABLE chunks_fts")
        conn.execute("DROP TABLE chunks_trigram")
        conn.execute("DELETE FROM meta WHERE key = 'fts_tokenizer'")
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('fts_error', ?)", (NO_FTS5,))


def test_a_sqlite_without_fts5_opens_and_records_why(tmp_path: Path) -> None:
    store = Fts5LessStore(tmp_path / "s.sqlite")
    try:
        assert store.fts_error == NO_FTS5
        names = {r[0] for r in store.query("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "chunks_fts" not in names and "chunks" in names
    finally:
        store.close()


def test_substring_score_is_tf_saturation() -> None:
    assert substring_score("ticket ABC-1234 and abc-1234 again", ["abc", "1234"]) == pytest.approx(2 / 3)
    assert substring_score("ABC only", ["abc", "1234"]) == 0.0
    assert substring_score("ÄRGER im Büro", ["ärger"]) == 0.5  # casefold beyond ASCII


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "memory").mkdir(parents=True)
    (w / "MEMORY.md").write_text("# Tickets\nThe outage ticket is ABC-1234.\n")
    (w / "memory" / "2026-03-01.md").write_text("Ärger mit dem Router, abc-1234 again, ABC-1234.\n")
    (w / "memory" / "2026-03-02.md").write_text("Nothing about tickets here.\n")
    return w


def _engine(ws: Path) -> BuiltinEngine:
    settings = EngineSettings.for_workspace(ws, search=MemorySearchSettings(provider="none"))
    return BuiltinEngine(settings, provider_selection=ProviderSelection(None, "none"),
                         now_ms=lambda: 1_770_681_600_000)


async def test_search_without_fts5_finds_substrings_and_says_so(ws: Path) -> None:
    engine = _engine(ws)
    await engine.sync(reason="cli")
    await engine.close()
    drop_fts(engine.settings.db_path)
    engine = _engine(ws)
    try:
        outcome = await engine.search(SearchRequest.of("ABC-1234", min_score=0.0))
        assert [(h.path, h.start_line, h.end_line) for h in outcome.results] == [
            ("memory/2026-03-01.md", 1, 1), ("MEMORY.md", 1, 2)]  # two mentions rank first
        assert outcome.warnings == [WARNING]
        hits = (await engine.search(SearchRequest.of("ärger", min_score=0.0))).results
        assert [h.path for h in hits] == ["memory/2026-03-01.md"]
        # a file written while FTS5 is missing is found too (no FTS rows are written)
        (ws / "memory" / "2026-03-03.md").write_text("Follow-up on XYZ-77.\n")
        engine.mark_dirty("test")
        assert [h.path for h in (await engine.search(SearchRequest.of("xyz-77", min_score=0.0))).results] == ["memory/2026-03-03.md"]
        status = await engine.status()
        assert (status.fts["available"], status.fts["error"], status.fts["keyword"]) == (
            False, NO_FTS5, "substring")
        assert WARNING in status.issues
    finally:
        await engine.close()


async def test_substring_hits_respect_sources_and_limit(ws: Path) -> None:
    settings = EngineSettings.for_workspace(ws)
    engine = _engine(ws)
    await engine.sync(reason="cli")
    await engine.close()
    drop_fts(settings.db_path)
    store = Store(settings.db_path)
    try:
        hits = rank_substring_hits(store, "abc 1234", ["memory"], 1)
        assert [(h.path, h.bm25, h.score == h.text_score) for h in hits] == [
            ("memory/2026-03-01.md", None, True)]
        assert rank_substring_hits(store, "abc 1234", ["sessions"], 5) == []
        assert rank_substring_hits(store, "!!", ["memory"], 5) == []
    finally:
        store.close()

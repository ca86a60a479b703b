"""A file is trusted by its ``(mtime, size, ctime)`` (fallback/sources/stamps.py, migration m008):
a rewrite with its size and mtime put back is indexed again, a metadata-only change is hashed
but embeds nothing, and a store from before the ctime column keeps its chunks. Real files,
real SQLite stores, the engine with a counting embedding provider."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.engine.in_sync import InSyncSettings, stale_reason
from fallback.index.identity import index_identity
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.sources.stamps import change_time_ns
from fallback.store.db import Store
from fallback.store.migrations import MIGRATIONS
from fallback.store.readonly import ReadOnlyStore
from tests.fallback.count_provider import CountProvider
from tests.fallback.same_stamps import rewrite_keeping_size_and_mtime

pytestmark = pytest.mark.anyio

NOW_MS = 1_770_681_600_000
# Notes are stamped well before any sync reads them, so none is racily clean
# (fallback/index/racy.py) and only the stamps decide whether a file is read.
PAST_NS = 1_600_000_000_000_000_000
NOTE = "memory/2026-01-12.md"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Facts\nBeta owns the router.\n")
    (root / NOTE).write_text("# Log\nAlpha fixed the heron feeder.\nAlpha alpha.\n")
    for i, f in enumerate([root / "MEMORY.md", root / NOTE]):
        os.utime(f, ns=(PAST_NS + i * 1_000_000_000, PAST_NS + i * 1_000_000_000))
    return root


def _engine(ws: Path, provider: CountProvider) -> BuiltinEngine:
    settings = EngineSettings.for_workspace(ws, state_dir=ws.parent / "state",
                                            search=MemorySearchSettings(provider="openai"))
    return BuiltinEngine(settings, provider_selection=ProviderSelection(provider, "test-count"),
                         now_ms=lambda: NOW_MS)


def _chunks(db: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT rowid, id, path, start_line, end_line, text, vector, updated_at"
                            " FROM chunks ORDER BY rowid").fetchall()
    finally:
        conn.close()


def _ctimes(db: Path) -> dict[str, int | None]:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT path, ctime FROM files").fetchall())
    finally:
        conn.close()


def _counts(report: Any) -> tuple[int, int, int, int]:
    return (report.files_read, report.files_indexed, report.chunks_written,
            report.windows_embedded)


def test_the_change_time_is_the_ctime_but_on_windows(tmp_path: Path) -> None:
    f = tmp_path / "a.md"
    f.write_text("x")
    st = os.stat(f)
    assert change_time_ns(st, platform="posix") == st.st_ctime_ns > 0
    assert change_time_ns(st, platform="nt") is None  # the creation time there


async def test_a_rewrite_with_its_size_and_mtime_put_back_is_indexed_again(ws: Path) -> None:
    provider = CountProvider()
    engine = _engine(ws, provider)
    try:
        first = await engine.sync(reason="test")
        assert (first.full, first.files_indexed) == (True, 2)
        embedded = provider.texts_embedded
        assert _counts(await engine.sync(reason="test")) == (0, 0, 0, 0)  # trusted by its stamps
        rewrite_keeping_size_and_mtime(ws / NOTE, b"heron", b"egret")
        again = await engine.sync(reason="test")
        assert _counts(again) == (1, 1, 1, 1)
        assert provider.texts_embedded == embedded + 1  # the changed chunk only
        hits = (await engine.search(SearchRequest.of("egret feeder"))).results
        assert [(h.path, h.start_line, h.end_line) for h in hits] == [(NOTE, 1, 3)]
        assert (await engine.search(SearchRequest.of("heron"))).results == []
    finally:
        await engine.close()
    assert [r[5] for r in _chunks(engine.settings.db_path) if r[2] == NOTE] == [
        "# Log\nAlpha fixed the egret feeder.\nAlpha alpha."]


async def test_a_chmod_or_a_restored_mtime_is_hashed_but_nothing_is_rechunked_or_embedded(
        ws: Path) -> None:
    provider = CountProvider()
    engine = _engine(ws, provider)
    note = ws / NOTE
    db = engine.settings.db_path
    try:
        await engine.sync(reason="test")
        calls, embedded = provider.batch_calls, provider.texts_embedded
        before = _chunks(db)
        note.chmod(0o600)
        assert _ctimes(db)[NOTE] != note.stat().st_ctime_ns
        assert _counts(await engine.sync(reason="test")) == (1, 0, 0, 0)
        assert _ctimes(db)[NOTE] == note.stat().st_ctime_ns
        assert _counts(await engine.sync(reason="test")) == (0, 0, 0, 0)
        # the watcher's path (one changed file judged on its own) records the new stamps too
        os.utime(note, ns=(PAST_NS + 7_000_000_000, PAST_NS + 7_000_000_000))
        assert _counts(await engine.sync(reason="test", paths={str(note)})) == (1, 0, 0, 0)
        assert _ctimes(db)[NOTE] == note.stat().st_ctime_ns
        assert _counts(await engine.sync(reason="test")) == (0, 0, 0, 0)
        assert (provider.batch_calls, provider.texts_embedded) == (calls, embedded)
    finally:
        await engine.close()
    assert _chunks(db) == before  # the same rows, vectors and update times


async def test_a_store_from_before_the_ctime_column_migrates_and_keeps_its_chunks(ws: Path) -> None:
    provider = CountProvider()
    engine = _engine(ws, provider)
    await engine.sync(reason="test")
    await engine.close()
    db = engine.settings.db_path
    chunks, embedded = _chunks(db), provider.texts_embedded
    conn = sqlite3.connect(db, isolation_level=None)  # the files table as m001 created it
    conn.execute("ALTER TABLE files DROP COLUMN ctime")
    conn.execute("PRAGMA user_version = 7")  # before m008
    assert [r[1] for r in conn.execute("PRAGMA table_info(files)")] == [
        "path", "source", "hash", "mtime", "size"]
    conn.close()

    old = ReadOnlyStore.open(db)  # the one-shot path reads an old store, leaves it to the engine
    assert old is not None
    with old:
        settings = InSyncSettings(db_path=db, workspace_dir=ws, extra_paths=[],
                                  max_file_bytes=engine.settings.search.max_file_bytes,
                                  identity=index_identity(engine.settings, provider), sync_on_search=True,
                                  max_results=6, min_score=0.35, candidate_multiplier=4, half_life_days=None)
        assert stale_reason(old, settings) == "schema version 7 (latest 10)"

    upgraded = _engine(ws, provider)
    try:
        report = await upgraded.sync(reason="test")
        assert (report.full, *_counts(report)) == (False, 2, 0, 0, 0)  # each file hashed once
        assert _counts(await upgraded.sync(reason="test")) == (0, 0, 0, 0)
        assert [h.path for h in (await upgraded.search(SearchRequest.of("heron feeder"))).results] == [NOTE]
    finally:
        await upgraded.close()
    assert provider.texts_embedded == embedded
    assert _chunks(db) == chunks
    assert _ctimes(db) == {"MEMORY.md": (ws / "MEMORY.md").stat().st_ctime_ns,
                           NOTE: (ws / NOTE).stat().st_ctime_ns}
    store = Store(db)
    try:
        assert store.user_version() == len(MIGRATIONS) == 10
        assert [r[1] for r in store.query("PRAGMA table_info(files)")] == [
            "path", "source", "hash", "mtime", "size", "ctime"]
    finally:
        store.close()

"""The read-only search of an index in sync (fallback/engine/in_sync.py, fallback/store/readonly.py):
every reason an engine sync would change the index is seen, and the answer is the engine's."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.engine.in_sync import ExtraPathValue, InSyncSettings, search_in_sync, stale_reason
from fallback.index.identity import index_identity
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, ExtraPath, MemorySearchSettings
from fallback.store.errors import IndexStoreCorruptError, IndexStoreReadOnlyError
from fallback.store.readonly import ReadOnlyStore
from tests.fallback.same_stamps import rewrite_keeping_size_and_mtime

pytestmark = pytest.mark.anyio

NOW_MS = 1_770_681_600_000  # 2026-02-10 00:00 UTC
# Files are stamped well before any sync reads them: a file stamped within a few ms of the sync
# that read it (racily clean, fallback/index/racy.py) is not trusted by (mtime, size).
PAST_NS = 1_600_000_000_000_000_000

QUERIES = ["router firmware", "alpha", "Kestrel rollout", "東京", "nothing-like-this-anywhere",
           "backup 2026-01-12", "WAN link dropped twice", "router backup kestrel dns"]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "memory" / "projects").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Facts\nThe router firmware is pinned to 7.2.\nAlpha owns DNS.\n")
    (root / "memory" / "2026-01-12.md").write_text(
        "# 2026-01-12\n- WAN link dropped twice; router rebooted.\n- backup verified\n")
    (root / "memory" / "2026-02-09.md").write_text(
        "# 2026-02-09\n- Kestrel rollout paused.\n- 東京チームと打ち合わせ\n- alpha alpha\n")
    (root / "memory" / "projects" / "kestrel.md").write_text(
        "# Kestrel\nRollout plan for the router firmware, Kestrel phase two.\n" * 3)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "wan.md").write_text("# WAN\nThe WAN link has a backup LTE router.\n")
    (notes / "skip.txt").write_text("router not markdown\n")
    _backdate(tmp_path)
    return root


def _backdate(folder: Path) -> None:
    """Stamp every file below ``folder`` at :data:`PAST_NS` (one second apart, in name order)."""
    for i, f in enumerate(sorted(p for p in folder.rglob("*") if p.is_file())):
        os.utime(f, ns=(PAST_NS + i * 1_000_000_000, PAST_NS + i * 1_000_000_000))


def _settings(ws: Path, **search: Any) -> EngineSettings:
    return EngineSettings.for_workspace(ws, state_dir=ws.parent / f"state-{ws.name}",
                                        search=MemorySearchSettings(provider="none", **search))


async def _synced(settings: EngineSettings) -> None:
    engine = BuiltinEngine(settings, provider_selection=ProviderSelection(None, "none"),
                           now_ms=lambda: NOW_MS)
    try:
        await engine.sync(reason="test")
    finally:
        await engine.close()


def _in_sync(settings: EngineSettings) -> InSyncSettings:
    s = settings.search
    return InSyncSettings(
        db_path=settings.db_path, workspace_dir=settings.workspace_dir,
        extra_paths=list(s.extra_paths), max_file_bytes=s.max_file_bytes,
        identity=index_identity(settings, None), sync_on_search=s.sync.on_search,
        max_results=s.query.max_results, min_score=s.query.min_score,
        candidate_multiplier=s.query.hybrid.candidate_multiplier,
        half_life_days=s.query.hybrid.temporal_decay.effective_half_life_days)


def _stale(settings: EngineSettings) -> str | None:
    store = ReadOnlyStore.open(settings.db_path)
    assert store is not None
    with store:
        return stale_reason(store, _in_sync(settings))


@pytest.mark.parametrize("search", [
    {},
    {"extraPaths": ["../notes"], "query": {"maxResults": 3, "minScore": 0.2}},
    {"extraPaths": [{"path": "../notes", "pattern": "w*.md"}],
     "query": {"hybrid": {"temporalDecay": {"enabled": True, "halfLifeDays": 7}}}},
])
async def test_the_answer_is_the_engines(ws: Path, search: dict[str, Any]) -> None:
    settings = _settings(ws, **search)
    engine = BuiltinEngine(settings, provider_selection=ProviderSelection(None, "none"),
                           now_ms=lambda: NOW_MS)
    try:
        expected = {q: [r.model_dump() for r in (await engine.search(SearchRequest.of(q))).results] for q in QUERIES}
        one = SearchRequest.of("router", max_results=1, min_score=0.0)
        limited = [r.model_dump() for r in (await engine.search(one)).results]
    finally:
        await engine.close()
    assert any(expected.values())
    store = ReadOnlyStore.open(settings.db_path)
    assert store is not None
    with store:
        plain = _in_sync(settings)
        assert stale_reason(store, plain) is None
        for q in QUERIES:
            got = [h._asdict() for h in search_in_sync(store, plain, SearchRequest.of(q), now_ms=NOW_MS)]
            assert got == [{k: v for k, v in r.items() if k not in ("citation", "vector_score",
                                                                       "explain")}
                           for r in expected[q]], q
        got = [h._asdict() for h in search_in_sync(store, plain, one, now_ms=NOW_MS)]
        assert len(got) == 1 and got[0]["path"] == limited[0]["path"]
        assert got[0]["score"] == limited[0]["score"]


async def test_every_change_a_sync_would_write_is_seen(ws: Path) -> None:
    settings = _settings(ws, extraPaths=["../notes"])
    await _synced(settings)
    assert _stale(settings) is None

    note = ws / "memory" / "2026-01-12.md"
    st = note.stat()
    note.write_text(note.read_text() + "- router replaced\n")
    os.utime(note, ns=(st.st_atime_ns, st.st_mtime_ns + 60_000_000_000))  # saved a minute later
    assert _stale(settings) == "changed: memory/2026-01-12.md"
    await _synced(settings)
    assert _stale(settings) is None

    os.utime(note, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touched, same text
    assert _stale(settings) == "changed: memory/2026-01-12.md"
    await _synced(settings)

    (ws / "memory" / "2026-02-10.md").write_text("# new\n")
    os.utime(ws / "memory" / "2026-02-10.md", ns=(PAST_NS, PAST_NS))
    assert _stale(settings) == "new: memory/2026-02-10.md"
    await _synced(settings)

    (ws / "memory" / "projects" / "kestrel.md").unlink()
    assert _stale(settings) == "gone: memory/projects/kestrel.md"
    await _synced(settings)

    (ws / "memory" / ".draft.md").write_text("not yet\n")  # skipped (hidden): status must say so
    assert _stale(settings) == "skipped files changed"
    await _synced(settings)
    assert _stale(settings) is None

    notes = ws.parent / "notes"
    for f in notes.iterdir():
        f.unlink()
    notes.rmdir()  # its file is gone, and "extra path missing" becomes a scan issue
    assert _stale(settings) == "gone: ../notes/wan.md"
    await _synced(settings)
    assert _stale(settings) is None
    notes.mkdir()
    assert _stale(settings) == "scan issues changed"


async def test_a_caveat_of_an_unchanged_file_is_not_a_change(ws: Path) -> None:
    (ws / "memory" / "latin1.md").write_bytes(b"caf\xe9 router\n")  # indexed with a caveat
    os.utime(ws / "memory" / "latin1.md", ns=(PAST_NS, PAST_NS))
    settings = _settings(ws)
    await _synced(settings)
    with sqlite3.connect(settings.db_path) as conn:
        assert conn.execute("SELECT path, reason FROM skipped_files").fetchall() == [
            ("memory/latin1.md", "invalid UTF-8 (bytes replaced with U+FFFD)")]
    assert _stale(settings) is None


async def test_identity_schema_fts_and_leftovers_need_the_engine(ws: Path) -> None:
    settings = _settings(ws)
    await _synced(settings)
    rechunked = _settings(ws, chunking={"tokens": 200})
    assert _stale(rechunked) == "chunking changed"
    (settings.db_path.parent / f"{settings.db_path.name}.tmp-0123abcd").write_bytes(b"")
    assert _stale(settings) == "leftovers of a killed rebuild"
    (settings.db_path.parent / f"{settings.db_path.name}.tmp-0123abcd").unlink()
    with sqlite3.connect(settings.db_path) as conn:
        conn.execute("INSERT INTO meta(key, value) VALUES ('fts_error', 'no such module: fts5')")
    assert _stale(settings) == "no FTS5"
    with sqlite3.connect(settings.db_path) as conn:
        conn.execute("DELETE FROM meta WHERE key = 'fts_error'")
        conn.execute("PRAGMA user_version = 7")
    assert _stale(settings) == "schema version 7 (latest 10)"


async def test_without_sync_on_search_only_an_empty_index_needs_the_engine(ws: Path) -> None:
    bare = ws.parent / "bare"
    bare.mkdir()
    empty = _settings(bare, sync={"onSearch": False})
    await _synced(empty)  # no memory file: a store without chunks, bootstrapped by every search
    assert _stale(empty) == "index is empty"
    settings = _settings(ws, sync={"onSearch": False})
    await _synced(settings)
    (ws / "memory" / "2026-02-10.md").write_text("# changed after the sync\n")
    assert _stale(settings) is None  # the engine, too, searches such an index as it is


def test_opening_a_missing_or_foreign_file(tmp_path: Path) -> None:
    assert ReadOnlyStore.open(tmp_path / "none.sqlite") is None
    assert not (tmp_path / "none.sqlite").exists()
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database, just bytes " * 200)
    with pytest.raises(IndexStoreCorruptError):  # opening reads the header (to pick its mode)
        ReadOnlyStore.open(junk)


async def test_the_read_only_connection_writes_nothing(ws: Path) -> None:
    settings = _settings(ws)
    await _synced(settings)
    before = sorted(p.name for p in settings.db_path.parent.iterdir())
    store = ReadOnlyStore.open(settings.db_path)
    assert store is not None
    with store:
        assert search_in_sync(store, _in_sync(settings), SearchRequest.of("router"), now_ms=NOW_MS)
        with pytest.raises(IndexStoreReadOnlyError):
            store.query("DELETE FROM chunks")
    assert sorted(p.name for p in settings.db_path.parent.iterdir()) == before


def test_settings_round_trip_through_json(tmp_path: Path) -> None:
    s = InSyncSettings(db_path=tmp_path / "a.sqlite", workspace_dir=tmp_path,
                       extra_paths=["../x", ExtraPath(path="notes", pattern="*.md"),
                                    ExtraPathValue("more", None)],
                       max_file_bytes=10, identity={"model": "fts-only", "sources": ["memory"]},
                       sync_on_search=False, max_results=3, min_score=0.5, candidate_multiplier=2,
                       half_life_days=14)
    back = InSyncSettings.from_json(s.to_json())
    assert back.to_json() == s.to_json()
    assert back.extra_paths == ["../x", ExtraPathValue("notes", "*.md"), ExtraPathValue("more", None)]
    assert (back.db_path, back.half_life_days, back.sync_on_search) == (tmp_path / "a.sqlite", 14, False)


async def test_a_file_stamped_in_the_tick_the_sync_read_it_needs_the_engine(ws: Path) -> None:
    settings = _settings(ws)
    note = ws / "memory" / "2026-01-12.md"
    future = (int(time.time()) + 3600) * 1_000_000_000
    os.utime(note, ns=(future, future))  # at or after the sync's start: a save may follow unseen
    await _synced(settings)
    assert _stale(settings) == "racily clean: memory/2026-01-12.md"
    with sqlite3.connect(settings.db_path) as conn:
        started = conn.execute("SELECT value FROM meta WHERE key = 'scan_started_at_ms'").fetchone()
    assert started is not None and int(started[0]) < future // 1_000_000
    os.utime(note, ns=(PAST_NS + 5_000_000_000, PAST_NS + 5_000_000_000))
    assert _stale(settings) == "changed: memory/2026-01-12.md"
    await _synced(settings)
    assert _stale(settings) is None
    with sqlite3.connect(settings.db_path) as conn:  # an index synced before scans were timed
        conn.execute("DELETE FROM meta WHERE key = 'scan_started_at_ms'")
    assert _stale(settings) == "no scan start recorded"


async def test_a_note_the_sync_read_and_skipped_is_not_read_again_while_unchanged(ws: Path) -> None:
    blob = ws / "memory" / "blob.md"
    blob.write_bytes(b"\x00\x01\x02 not text\n")  # binary: read, then skipped
    os.utime(blob, ns=(PAST_NS, PAST_NS))
    settings = _settings(ws)
    await _synced(settings)
    with sqlite3.connect(settings.db_path) as conn:
        assert conn.execute("SELECT path, reason, mtime, size FROM skipped_files").fetchall() == [
            ("memory/blob.md", "binary file (NUL bytes)", PAST_NS // 1_000_000, 13)]
    assert _stale(settings) is None  # in sync: the next sync would not read it
    engine = BuiltinEngine(settings, provider_selection=ProviderSelection(None, "none"),
                           now_ms=lambda: NOW_MS)
    try:
        report = await engine.sync(reason="test")
        assert report.files_read == 0
        assert [(s.path, s.reason) for s in report.skipped] == [
            ("memory/blob.md", "binary file (NUL bytes)")]
        assert [(s.path, s.reason) for s in (await engine.status()).skipped] == [
            ("memory/blob.md", "binary file (NUL bytes)")]
    finally:
        await engine.close()
    blob.write_bytes(b"# now text\nrouter notes\n")
    os.utime(blob, ns=(PAST_NS + 9_000_000_000, PAST_NS + 9_000_000_000))
    assert _stale(settings) == "changed: memory/blob.md"
    await _synced(settings)
    assert _stale(settings) is None
    with sqlite3.connect(settings.db_path) as conn:
        assert conn.execute("SELECT path FROM files WHERE path = 'memory/blob.md'").fetchall() == [
            ("memory/blob.md",)]
        assert conn.execute("SELECT * FROM skipped_files").fetchall() == []
    blob.write_bytes(b"\x00\x01\x02 not text\n")
    os.utime(blob, ns=(PAST_NS, PAST_NS))
    await _synced(settings)
    assert _stale(settings) is None
    blob.unlink()
    assert _stale(settings) == "gone: memory/blob.md"
    await _synced(settings)
    assert _stale(settings) is None
    with sqlite3.connect(settings.db_path) as conn:
        assert conn.execute("SELECT * FROM skipped_files").fetchall() == []


async def test_a_rewrite_with_its_size_and_mtime_put_back_or_a_chmod_needs_the_engine(ws: Path) -> None:
    settings = _settings(ws)
    await _synced(settings)
    assert _stale(settings) is None
    note = ws / "memory" / "2026-01-12.md"
    rewrite_keeping_size_and_mtime(note, b"backup verified", b"backup restored")
    assert _stale(settings) == "changed: memory/2026-01-12.md"  # its ctime moved
    await _synced(settings)
    assert _stale(settings) is None
    store = ReadOnlyStore.open(settings.db_path)
    assert store is not None
    with store:
        hits = search_in_sync(store, _in_sync(settings), SearchRequest.of("backup restored"),
                              now_ms=NOW_MS)
    assert [(h.path, h.snippet) for h in hits][:1] == [
        ("memory/2026-01-12.md", "# 2026-01-12\n- WAN link dropped twice; router rebooted.\n"
                                 "- backup restored")]
    (ws / "MEMORY.md").chmod(0o600)
    assert _stale(settings) == "changed: MEMORY.md"
    await _synced(settings)
    assert _stale(settings) is None

"""Index sync: hash diff, ghost chunks, odd files, identity rebuilds, cache, safe swap."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import anyio
import pytest

from fallback.errors import EmbeddingProviderError
from fallback.index.indexer import Indexer, chunk_id, full_reindex_reason, index_identity
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.store.db import META_KEY, Store
from tests.fallback.count_provider import CountProvider

pytestmark = pytest.mark.anyio


def _settings(ws: Path, **search: object) -> EngineSettings:
    return EngineSettings.for_workspace(ws, search=MemorySearchSettings(provider="none", **search))


async def _sync(settings: EngineSettings, store: Store, *, provider: CountProvider | None = None,
                force: bool = False, progress: list[tuple[int, int, int, int]] | None = None):
    indexer = Indexer(settings, provider=provider, write_limiter=anyio.CapacityLimiter(1),
                      now_ms=lambda: 1_700_000_000_000,
                      on_progress=(lambda *a: progress.append(a)) if progress is not None else None)
    return await indexer.sync(store, force=force)


def _rows(store: Store) -> list[tuple[str, int, int, str]]:
    return store.query("SELECT path, start_line, end_line, text FROM chunks ORDER BY path, start_line")


def _fts_count(store: Store) -> tuple[int, int]:
    return (store.query("SELECT COUNT(*) FROM chunks_fts")[0][0],
            store.query("SELECT COUNT(*) FROM chunks_trigram")[0][0])


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "memory").mkdir()
    (tmp_path / "MEMORY.md").write_text("Beta knowledge base entry.")
    (tmp_path / "memory" / "2026-01-12.md").write_text(
        "# Log\nAlpha memory line.\nZebra memory line.\nAnother line.")
    return tmp_path


async def test_first_sync_is_full_then_incremental_skips_unchanged(ws: Path) -> None:
    settings = _settings(ws)
    store = Store(settings.db_path)
    progress: list[tuple[int, int, int, int]] = []
    report = await _sync(settings, store, progress=progress)
    assert (report.full, report.full_reason, report.files_total, report.files_indexed) == (
        True, "no index metadata", 2, 2)
    assert progress == [(1, 2, 0, 1), (2, 2, 0, 2)]  # files done, files, embedded, chunks written
    assert _rows(store) == [
        ("MEMORY.md", 1, 1, "Beta knowledge base entry."),
        ("memory/2026-01-12.md", 1, 4, "# Log\nAlpha memory line.\nZebra memory line.\nAnother line."),
    ]
    assert store.get_meta_json(META_KEY)["model"] == "fts-only"
    again = await _sync(settings, store)
    assert (again.full, again.files_indexed, again.files_deleted) == (False, 0, 0)
    ids = [r[0] for r in store.query("SELECT id FROM chunks WHERE path = 'MEMORY.md'")]
    assert ids == [chunk_id(source="memory", path="MEMORY.md", start_line=1, end_line=1,
                            content_hash=store.query("SELECT hash FROM chunks WHERE path='MEMORY.md'")[0][0],
                            model="fts-only")]
    store.close()


async def test_shrink_delete_and_rename_leave_no_ghost_chunks(ws: Path) -> None:
    settings = _settings(ws, chunking={"tokens": 8, "overlap": 0})
    long_file = ws / "memory" / "long.md"
    long_file.write_text("\n".join(f"line {i} 東京" for i in range(1, 21)))
    store = Store(settings.db_path)
    await _sync(settings, store)
    before = store.query("SELECT COUNT(*) FROM chunks WHERE path = 'memory/long.md'")[0][0]
    assert before == 16
    total = store.query("SELECT COUNT(*) FROM chunks")[0][0]
    assert _fts_count(store) == (total, 16)  # only chunks with CJK text get trigram rows
    long_file.write_text("only one line now")
    await _sync(settings, store)
    assert store.query("SELECT start_line, end_line, text FROM chunks WHERE path = 'memory/long.md'") == [
        (1, 1, "only one line now")]
    os.rename(long_file, ws / "memory" / "renamed.md")
    (ws / "memory" / "2026-01-12.md").unlink()
    report = await _sync(settings, store)
    assert report.files_deleted == 2
    assert [r[0] for r in _rows(store)] == ["MEMORY.md", "memory/renamed.md"]
    assert store.query("SELECT path FROM files ORDER BY path") == [("MEMORY.md",), ("memory/renamed.md",)]
    assert _fts_count(store) == (2, 0)
    store.close()


async def test_crlf_invalid_utf8_and_binary_files(ws: Path) -> None:
    settings = _settings(ws)
    (ws / "memory" / "crlf.md").write_bytes(b"first\r\nsecond\r\nthird\r\n")
    (ws / "memory" / "bad.md").write_bytes(b"caf\xe9 ok\nnext")
    (ws / "memory" / "blob.md").write_bytes(b"PK\x00\x01\x02binary")
    store = Store(settings.db_path)
    report = await _sync(settings, store)
    assert store.query("SELECT start_line, end_line, text FROM chunks WHERE path = 'memory/crlf.md'") == [
        (1, 3, "first\nsecond\nthird")]
    assert store.query("SELECT text FROM chunks WHERE path = 'memory/bad.md'") == [("caf\ufffd ok\nnext",)]
    assert store.query("SELECT COUNT(*) FROM chunks WHERE path = 'memory/blob.md'")[0][0] == 0
    assert sorted((s.path, s.reason) for s in report.skipped) == [
        ("memory/bad.md", "invalid UTF-8 (bytes replaced with U+FFFD)"),
        ("memory/blob.md", "binary file (NUL bytes)")]
    assert store.query("SELECT path, reason FROM skipped_files ORDER BY path") == [
        ("memory/bad.md", "invalid UTF-8 (bytes replaced with U+FFFD)"),
        ("memory/blob.md", "binary file (NUL bytes)")]
    store.close()


async def test_note_padded_with_nul_bytes_is_indexed_and_the_caveat_kept(ws: Path) -> None:
    settings = _settings(ws)
    (ws / "memory" / "padded.md").write_bytes(b"# Trip\nthe kayak is in the garage\n" + b"\x00" * 4096)
    (ws / "memory" / "bad.md").write_bytes(b"caf\xe9 ok\n")
    store = Store(settings.db_path)
    await _sync(settings, store)
    assert store.query("SELECT start_line, end_line, text FROM chunks WHERE path = 'memory/padded.md'") == [
        (1, 2, "# Trip\nthe kayak is in the garage")]
    caveats = [("memory/bad.md", "invalid UTF-8 (bytes replaced with U+FFFD)"),
               ("memory/padded.md", "NUL bytes stripped (4096 bytes)")]
    assert store.query("SELECT path, reason FROM skipped_files ORDER BY path") == caveats
    report = await _sync(settings, store)  # unchanged files are not read again: caveats stay
    assert report.files_indexed == 0
    assert sorted((s.path, s.reason) for s in report.skipped) == caveats
    assert store.query("SELECT path, reason FROM skipped_files ORDER BY path") == caveats
    (ws / "memory" / "padded.md").write_bytes(b"# Trip\nthe kayak is in the shed\n")
    await _sync(settings, store)
    assert store.query("SELECT path, reason FROM skipped_files ORDER BY path") == caveats[:1]
    store.close()


async def test_index_chunked_by_older_rules_is_rebuilt(ws: Path) -> None:
    settings = _settings(ws)
    store = Store(settings.db_path)
    await _sync(settings, store)
    meta = store.get_meta_json(META_KEY)
    assert meta["chunkingVersion"] == 2
    # an index written before long lines were cut between words records no version
    store.set_meta(META_KEY, {k: v for k, v in meta.items() if k != "chunkingVersion"})
    report = await _sync(settings, store)
    assert (report.full, report.full_reason) == (True, "chunking changed")
    assert store.get_meta_json(META_KEY)["chunkingVersion"] == 2
    store.close()


async def test_identity_change_triggers_full_rebuild(ws: Path) -> None:
    settings = _settings(ws)
    store = Store(settings.db_path)
    await _sync(settings, store)
    changed = _settings(ws, chunking={"tokens": 200, "overlap": 10})
    reason = full_reindex_reason(store.get_meta_json(META_KEY), index_identity(changed, None))
    assert reason == "chunking changed"
    report = await _sync(changed, store)
    assert (report.full, report.full_reason) == (True, "chunking changed")
    trigram = _settings(ws, chunking={"tokens": 200, "overlap": 10},
                        store={"fts": {"tokenizer": "trigram"}})
    report = await _sync(trigram, store)
    assert (report.full, report.full_reason) == (True, "FTS tokenizer changed")
    assert store.fts_tokenizer == "trigram"
    provider = CountProvider()
    report = await _sync(trigram, store, provider=provider)
    assert report.full_reason == "model changed (fts-only -> count-v1)"
    assert store.query("SELECT DISTINCT model FROM chunks") == [("count-v1",)]
    assert store.get_meta_json(META_KEY)["vectorDims"] == 2
    assert [p.name for p in settings.db_path.parent.iterdir() if ".tmp-" in p.name] == []
    store.close()


async def test_forced_rebuild_reuses_cache_and_failure_keeps_live_index(ws: Path) -> None:
    settings = _settings(ws)
    store = Store(settings.db_path)
    provider = CountProvider()
    await _sync(settings, store, provider=provider, force=True)
    assert provider.texts_embedded == 2
    assert store.query("SELECT COUNT(*) FROM embedding_cache")[0][0] == 2
    blob = store.query("SELECT vector, dims, embedding FROM chunks WHERE path = 'MEMORY.md'")[0]
    assert blob == (b"\x00\x00\x00\x00\x00\x00\x80?", 2, "[]")  # one copy: the BLOB
    await _sync(settings, store, provider=provider, force=True)
    assert provider.texts_embedded == 2  # second forced sync: zero embedding calls (case 60)
    (ws / "memory" / "new.md").write_text("alpha alpha fresh note")
    failing = CountProvider(fail_batch=True)
    with pytest.raises(EmbeddingProviderError, match="connection refused"):
        await _sync(settings, store, provider=failing, force=True)
    assert store.query("SELECT COUNT(*) FROM files")[0][0] == 2
    assert store.query("SELECT COUNT(*) FROM chunks")[0][0] == 2
    leftovers = [p.name for p in settings.db_path.parent.iterdir()
                 if re.search(r"\.(tmp|backup)-", p.name)]
    assert leftovers == []
    store.close()


async def test_cache_is_pruned_to_max_entries(ws: Path) -> None:
    settings = _settings(ws, cache={"maxEntries": 1})
    store = Store(settings.db_path)
    await _sync(settings, store, provider=CountProvider(), force=True)
    assert store.query("SELECT COUNT(*) FROM embedding_cache")[0][0] == 1
    store.close()


async def test_every_sync_prunes_the_cache_least_recently_used_first(tmp_path: Path) -> None:
    """Incremental syncs prune too, and a cache hit makes its entry the most recent one."""
    (tmp_path / "memory").mkdir()
    (tmp_path / "MEMORY.md").write_text("Beta one.")
    (tmp_path / "memory" / "a.md").write_text("alpha a")
    settings = _settings(tmp_path, cache={"maxEntries": 3})
    store = Store(settings.db_path)
    provider = CountProvider()
    clock = iter(range(1_700_000_000_000, 1_700_000_100_000, 1000))
    indexer = Indexer(settings, provider=provider, write_limiter=anyio.CapacityLimiter(1),
                      now_ms=lambda: next(clock))

    def cached() -> list[str]:
        """Paths whose chunk text is in the cache, least recently used first."""
        return [r[0] for r in store.query(
            "SELECT MIN(c.path) FROM embedding_cache e JOIN chunks c ON c.hash = e.hash"
            " GROUP BY e.hash ORDER BY MIN(e.updated_at), MIN(e.rowid)")]

    assert (await indexer.sync(store)).full is True
    assert cached() == ["MEMORY.md", "memory/a.md"]
    (tmp_path / "memory" / "b.md").write_text("alpha b")
    assert (await indexer.sync(store)).full is False
    assert cached() == ["MEMORY.md", "memory/a.md", "memory/b.md"]
    (tmp_path / "memory" / "c.md").write_text("Beta one.")  # same text as MEMORY.md: a hit
    report = await indexer.sync(store)
    # its vector came from the cache: no window went to the provider, the chunk has its vector
    assert (report.files_indexed, report.windows_embedded, report.chunks_embedded) == (1, 0, 1)
    assert cached() == ["memory/a.md", "memory/b.md", "MEMORY.md"]  # the hit is now newest
    (tmp_path / "memory" / "d.md").write_text("alpha d")
    report = await indexer.sync(store)
    assert (report.full, report.windows_embedded) == (False, 1)
    # four entries for three places: the least recently used (a.md's) went, not MEMORY.md's
    assert cached() == ["memory/b.md", "MEMORY.md", "memory/d.md"]
    assert store.query("SELECT COUNT(*) FROM embedding_cache") == [(3,)]
    assert provider.texts_embedded == 4
    (tmp_path / "memory" / "e.md").write_text("alpha e")
    (tmp_path / "memory" / "f.md").write_text("alpha f")
    await indexer.sync(store)
    assert cached() == ["memory/d.md", "memory/e.md", "memory/f.md"]
    store.close()


async def test_cache_off_writes_and_prunes_nothing(ws: Path) -> None:
    settings = _settings(ws, cache={"enabled": False, "maxEntries": 1})
    store = Store(settings.db_path)
    provider = CountProvider()
    await _sync(settings, store, provider=provider)
    await _sync(settings, store, provider=provider, force=True)
    assert provider.texts_embedded == 4  # no cache: the rebuild embedded both chunks again
    assert store.query("SELECT COUNT(*) FROM embedding_cache") == [(0,)]
    store.close()


def _rewrite_same_size(path: Path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` (same length) in the file and put its mtime back: what a second
    save in the timestamp tick of the first one looks like (the clock that stamps files moves
    in ticks of a few ms, whole seconds on FAT, HFS+ or ext3)."""
    assert len(old) == len(new)
    st = path.stat()
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


async def test_a_file_saved_again_in_the_tick_the_sync_read_it_is_read_again(ws: Path) -> None:
    note = ws / "memory" / "2026-01-12.md"
    future = (int(time.time()) + 3600) * 1_000_000_000
    os.utime(note, ns=(future, future))  # stamped at or after the sync's start: racily clean
    settings = _settings(ws)
    store = Store(settings.db_path)
    await _sync(settings, store)
    _rewrite_same_size(note, "Zebra", "Quagg")
    again = await _sync(settings, store)  # (mtime, size) unchanged, yet the row is not trusted
    assert again.files_indexed == 1
    assert [r[3] for r in _rows(store) if r[0] == "memory/2026-01-12.md"] == [
        "# Log\nAlpha memory line.\nQuagg memory line.\nAnother line."]
    past = 1_600_000_000 * 1_000_000_000  # well before the sync: clean once read again
    os.utime(note, ns=(past, past))
    await _sync(settings, store)
    _rewrite_same_size(note, "Quagg", "Okapi")
    # not racily clean now, but the rewrite moved the ctime, which no call puts back
    assert (await _sync(settings, store)).files_indexed == 1
    assert [r[3] for r in _rows(store) if r[0] == "memory/2026-01-12.md"] == [
        "# Log\nAlpha memory line.\nOkapi memory line.\nAnother line."]
    store.close()


async def test_progress_counts_embedded_chunks_batch_by_batch_inside_a_file(tmp_path: Path) -> None:
    # one note of 100 chunks: the embedded count moves with each committed batch, not only
    # when the file is done (a large note looked stuck, and an interrupted index undercounted
    # what the embedding cache kept)
    (tmp_path / "MEMORY.md").write_text("".join(f"Alpha note {i} about beta {i}.\n\n" for i in range(100)))
    settings = _settings(tmp_path, chunking={"tokens": 8, "overlap": 0})
    store = Store(settings.db_path)
    progress: list[tuple[int, int, int, int]] = []
    try:
        report = await _sync(settings, store, provider=CountProvider(), progress=progress)
    finally:
        store.close()
    inside = [embedded for files_done, _, embedded, _ in progress if files_done == 0]
    assert report.chunks_written == report.chunks_embedded == 100
    assert [e for e in inside if 0 < e < 100] and inside == sorted(inside)
    assert progress[-1][2] == 100


def _segments(store: Store, table: str = "chunks_fts") -> int:
    return store.query(f"SELECT COUNT(DISTINCT segid) FROM {table}_idx")[0][0]


async def test_a_sync_that_writes_rows_leaves_a_small_store_one_segment_per_table(
        ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each file's commit leaves an FTS5 segment; a sync that wrote rows merges a small store's
    # tables (any store's, when it wrote the whole index) into one each.
    (ws / "memory" / "2026-01-13.md").write_text("Gamma 価格改定の件 line.")
    settings = _settings(ws)
    store = Store(settings.db_path)
    try:
        report = await _sync(settings, store)
        assert report.files_indexed == 3
        assert (_segments(store), _segments(store, "chunks_trigram")) == (1, 1)
        (ws / "memory" / "2026-01-14.md").write_text("Delta line.")
        await _sync(settings, store)
        assert _segments(store) == 1
        hits = store.query("SELECT path FROM chunks_fts f JOIN chunks c ON c.rowid = f.rowid"
                           " WHERE chunks_fts MATCH 'line' ORDER BY path")
        assert [h[0] for h in hits] == ["memory/2026-01-12.md", "memory/2026-01-13.md",
                                        "memory/2026-01-14.md"]
        # above the size limit the segments of each file's commit stay, until a sync writes
        # the whole index again
        from fallback.store import fts_rows
        monkeypatch.setattr(fts_rows, "MERGE_MAX_CHUNKS", 3)
        (ws / "memory" / "2026-01-15.md").write_text("Epsilon line.")
        await _sync(settings, store)
        assert _segments(store) == 2
        with store.transaction() as conn:
            assert fts_rows.merge_segments(conn, whole=False) is False
        report = await _sync(settings, store, force=True)
        assert report.full and _segments(store) == 1
    finally:
        store.close()

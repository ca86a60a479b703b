"""The store's reader: searches never wait for the writer (fallback/store/db.py).

A publish (``Store.swap_from``) holds the store's write lock and one write transaction on the
writer connection while it replaces the index; an incremental sync does the same per file. The
holder threads below do exactly that with ``Store.transaction()`` and wait, inside it, until
the main thread has read. Were a read to wait for the write lock, it would only return after
the commit and see the new data, so the assertions on the old data would fail (they never hang:
the holder gives up waiting after 30 s and commits).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.store.db import Store

# Upper bound for a holder thread to wait for the main thread (a safety net, not a timing).
HOLD_LIMIT_S = 30.0


@contextmanager
def write_transaction_held(store: Store, write: Callable[..., object]) -> Iterator[threading.Event]:
    """Run ``write(conn)`` in another thread inside ``store.transaction()`` and keep that
    transaction open until the caller leaves the block; then it commits."""
    started, release = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def hold() -> None:
        try:
            with store.transaction() as conn:
                write(conn)
                started.set()
                release.wait(HOLD_LIMIT_S)
        except BaseException as exc:  # reported to the test below
            failure.append(exc)
            started.set()

    holder = threading.Thread(target=hold, name="store-writer")
    holder.start()
    started.wait(HOLD_LIMIT_S)
    try:
        yield release
    finally:
        release.set()
        holder.join()
    assert failure == []


def _wipe(conn) -> None:
    """What publishing a rebuild of an emptied workspace writes: every row replaced."""
    conn.execute("DELETE FROM chunks_fts")
    conn.execute("DELETE FROM chunks")
    conn.execute("DELETE FROM files")


def test_query_reads_committed_data_while_the_writer_holds_a_transaction(tmp_path: Path) -> None:
    store = Store(tmp_path / "main.sqlite")
    try:
        with store.transaction() as conn:
            conn.execute("INSERT INTO files(path, source, hash, mtime, size)"
                         " VALUES ('old.md', 'memory', 'h1', 1, 1)")
        with write_transaction_held(store, lambda c: c.execute(
                "INSERT INTO files(path, source, hash, mtime, size)"
                " VALUES ('new.md', 'memory', 'h2', 2, 2)")) as release:
            assert store.query("SELECT path FROM files ORDER BY path") == [("old.md",)]
            assert store.reopen_if_replaced() is False
            assert store.query("SELECT value FROM meta WHERE key = 'fts_tokenizer'") == [("unicode61",)]
            assert not release.is_set()  # still inside the holder's open transaction
        assert store.query("SELECT path FROM files ORDER BY path") == [("new.md",), ("old.md",)]
    finally:
        store.close()


@pytest.mark.anyio
async def test_search_answers_old_index_during_an_open_publish_transaction(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    (tmp_path / "MEMORY.md").write_text("Beta knowledge base entry.")
    (tmp_path / "memory" / "2026-01-12.md").write_text("# Log\nAlpha memory line.\n")
    settings = EngineSettings.for_workspace(tmp_path, search=MemorySearchSettings(provider="none"))
    engine = BuiltinEngine(settings, provider_selection=ProviderSelection(
        None, "none", unavailable_reason="provider set to none"), now_ms=lambda: 1_770_681_600_000)
    await engine.sync(reason="cli")
    store = engine._stores.store  # the engine's own store: its writer lock is the one held below
    assert store is not None
    with write_transaction_held(store, _wipe) as release:
        hits = (await engine.search(SearchRequest.of("Alpha"))).results
        assert [(h.path, h.start_line, h.end_line) for h in hits] == [("memory/2026-01-12.md", 1, 2)]
        status = await engine.status()
        assert (status.files, status.chunks) == (2, 2)
        assert not release.is_set()
    assert await anyio.to_thread.run_sync(store.query, "SELECT COUNT(*) FROM chunks") == [(0,)]
    assert (await engine.search(SearchRequest.of("Alpha"))).results == []  # the published (wiped) index
    await engine.close()

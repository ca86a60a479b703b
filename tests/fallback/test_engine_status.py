"""What the builtin engine's status says before a search would surprise: the roots memory is read
from, a rebuild the next sync will run, and a configured provider that cannot work."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from fallback.embeddings import ProviderSelection, select_provider
from fallback.embeddings.local_gguf import LLAMA_CPP_MISSING
from fallback.engine.builtin import BuiltinEngine
from fallback.errors import SearchUnavailableError
from fallback.settings import EngineSettings, MemorySearchSettings


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe router is an Omada ER605.\n")
    (root / "notes").mkdir()
    return root


def settings_for(ws: Path, **search: object) -> EngineSettings:
    return EngineSettings.for_workspace(ws, state_dir=ws.parent / "state",
                                        search=MemorySearchSettings.model_validate(search))


@pytest.mark.anyio
async def test_roots_and_a_pending_rebuild_after_a_provider_change(ws: Path) -> None:
    plain = settings_for(ws, extraPaths=["notes", {"path": "../journal", "pattern": "*.md"}])
    engine = BuiltinEngine(plain, provider_selection=select_provider(plain.search, env={}))
    try:
        await engine.sync(reason="test")
        st = await engine.status()
    finally:
        await engine.close()
    assert st.roots == [
        {"kind": "root", "path": str(ws / "MEMORY.md"), "pattern": "MEMORY.md", "exists": True},
        {"kind": "memory", "path": str(ws / "memory"), "pattern": "**/*.md", "exists": True},
        {"kind": "extra", "path": str(ws / "notes"), "pattern": "**/*.md", "exists": True},
        {"kind": "extra", "path": str(ws.parent / "journal"), "pattern": "*.md", "exists": False}]
    assert (st.dirty, st.dirty_reason, st.search_mode) == (False, None, "fts-only")
    remote = settings_for(ws, provider="openai-compatible", model="m",
                          remote={"baseUrl": "http://127.0.0.1:9/v1"},
                          extraPaths=["notes", {"path": "../journal", "pattern": "*.md"}])
    later = BuiltinEngine(remote, provider_selection=select_provider(remote.search, env={}))
    try:
        changed = await later.status()
    finally:
        await later.close()
    assert (changed.dirty, changed.dirty_reason) == (True, "rebuild pending: model changed (fts-only -> m)")
    assert changed.search_mode == "hybrid" and changed.files == 1


@pytest.mark.anyio
async def test_a_configured_provider_that_cannot_load_is_unavailable_not_keyword_only(ws: Path) -> None:
    local = settings_for(ws, provider="local")
    # what select_provider answers on a machine without llama-cpp-python
    selection = ProviderSelection(None, "local", unavailable_reason=LLAMA_CPP_MISSING,
                                  failure=SearchUnavailableError("local", LLAMA_CPP_MISSING))
    engine = BuiltinEngine(local, provider_selection=selection)
    try:
        st = await engine.status()
    finally:
        await engine.close()
    assert (st.search_mode, st.provider, st.requested_provider) == ("unavailable", "none", "local")
    assert st.provider_unavailable_reason == (
        "memory search unavailable: local: llama-cpp-python is not installed (pip install 'qmdbridge[local]')")


def _fill_store(engine: BuiltinEngine) -> None:
    """The store may not grow by one page: its next sync that writes fails with SQLITE_FULL."""
    conn = engine._stores.store.conn
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")


@pytest.mark.anyio
async def test_a_full_store_fails_the_sync_and_every_status_tells_it(ws: Path) -> None:
    from fallback.store.errors import IndexStoreFullError
    from qmdbridge.problems import status_problems

    plain = settings_for(ws)
    engine = BuiltinEngine(plain, provider_selection=select_provider(plain.search, env={}))
    try:
        await engine.sync(reason="cli")
        _fill_store(engine)
        for day in range(1, 31):
            (ws / "memory" / f"2026-01-{day:02d}.md").write_text(f"Heron count {day}.\n" * 200)
        with pytest.raises(IndexStoreFullError) as info:
            await engine.sync(reason="cli")
        assert str(info.value) == f"index store is full: database or disk is full ({plain.db_path})"
    finally:
        await engine.close()
    later = BuiltinEngine(plain, provider_selection=select_provider(plain.search, env={}))
    try:  # another process: only the store and the record beside it tell
        st = await later.status()
    finally:
        await later.close()
    assert (st.files, st.dirty, st.dirty_reason, st.healthy) == (1, True, "30 files wait to be indexed", False)
    assert st.custom["syncFailure"]["errorType"] == "IndexStoreFullError"
    assert status_problems(st.to_json_dict()) == [{
        "check": "index",
        "message": f"last sync (cli) failed: index store is full: database or disk is full "
                   f"({plain.db_path}); memory files waiting to be indexed: 30",
        "hint": f"free disk space for {plain.db_path}, then run `qmdbridge index`"}]


@pytest.mark.anyio
async def test_a_search_on_a_full_disk_answers_from_the_index_and_says_so(ws: Path) -> None:
    """A full disk under the store: opening it cannot grow its ``-shm`` file
    (``SQLITE_IOERR_SHMSIZE``), a full store; a search answers from the index as it was last
    written, saying so and what to free, as it does for a store it may not write."""
    from fallback.request import SearchRequest

    state = ws.parent / "state"
    state.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "none", str(state)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here to fill a disk")
    plain = settings_for(ws)
    try:
        engine = BuiltinEngine(plain, provider_selection=select_provider(plain.search, env={}))
        try:
            await engine.sync(reason="cli")
        finally:
            await engine.close()
        assert not Path(f"{plain.db_path}-shm").exists()  # the last connection removed it
        fd = os.open(state / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            with contextlib.suppress(OSError):  # until ENOSPC
                while True:
                    os.write(fd, b"\0" * 65536)
        finally:
            os.close(fd)
        (ws / "memory" / "2026-01-02.md").write_text("The router reboots weekly.\n")
        engine = BuiltinEngine(plain, provider_selection=select_provider(plain.search, env={}))
        try:
            outcome = await engine.search(SearchRequest.of("router"))
        finally:
            await engine.close()
    finally:
        subprocess.run(["umount", str(state)], check=True)
    assert [h.path for h in outcome.results] == ["MEMORY.md"]
    assert outcome.warnings == [
        f"index store is full (cannot grow its -shm file): disk I/O error ({plain.db_path}); answered "
        f"from the index as it was last written, without updating it (free disk space for {state / 'memory'})"]


@pytest.mark.anyio
async def test_a_changed_note_indexed_with_a_caveat_waits_after_a_failed_sync(ws: Path) -> None:
    from fallback.store.errors import IndexStoreFullError
    from qmdbridge.problems import status_problems

    caveat = ws / "memory" / "2026-01-01.md"  # invalid UTF-8: indexed, with a caveat
    caveat.write_bytes(b"# Herons\n\nThe heron count was \xff\xfe low.\n")
    plain = settings_for(ws)
    engine = BuiltinEngine(plain, provider_selection=select_provider(plain.search, env={}))
    try:
        await engine.sync(reason="cli")
        _fill_store(engine)
        caveat.write_bytes(caveat.read_bytes() + b"Heron count again.\n" * 400)
        with pytest.raises(IndexStoreFullError):
            await engine.sync(reason="cli")
    finally:
        await engine.close()
    later = BuiltinEngine(plain, provider_selection=select_provider(plain.search, env={}))
    try:
        st = await later.status()
    finally:
        await later.close()
    assert [s.path for s in st.skipped] == ["memory/2026-01-01.md"]  # the caveat, listed
    assert (st.dirty, st.dirty_reason, st.custom["filesWaiting"]) == (True, "1 file waits to be indexed", 1)
    assert status_problems(st.to_json_dict())[-1]["message"].endswith("memory files waiting to be indexed: 1")

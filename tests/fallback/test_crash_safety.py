"""Crash safety of the store: SIGKILL mid-sync, killed swaps, stale WAL files, readonly recovery.

Kill tests SIGKILL a real child process (``store_child.py``) at several points of a forced
rebuild and of an incremental sync, then check that the parent opens the store, that
``PRAGMA quick_check`` is ok, that searches answer, that the next sync works and that no
``.tmp-``/``.backup-`` file remains.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from fallback.errors import IndexStoreError
from fallback.request import SearchRequest
from fallback.store.db import Store
from fallback.store.files import recover_db_files, swap_db_files
from fallback.store.lock import StoreWriteLock
from tests.fallback.child_procs import DEADLINE_S, finish

pytestmark = pytest.mark.slow  # kills writer processes mid-sync

CHILD = Path(__file__).with_name("store_child.py")
_spec = importlib.util.spec_from_file_location("crash_store_child", CHILD)
assert _spec is not None and _spec.loader is not None
store_child = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(store_child)

# Deadline for any child process or wait in this module, in seconds.
# Files in the kill-test workspace besides MEMORY.md (each one progress line of a sync).
BULK_FILES = 24


def _spawn(cfg: dict[str, Any], *, stdin: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CHILD), json.dumps(cfg)], text=True,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=Path(__file__).parents[2])


def _read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        stderr = proc.stderr.read() if proc.stderr else ""
        raise AssertionError(f"child ended early: {stderr}")
    return line.strip()


def _say(proc: subprocess.Popen[str], text: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(text + "\n")
    proc.stdin.flush()


def _leftovers(db: Path) -> list[str]:
    return sorted(p.name for p in db.parent.iterdir()
                  if ".tmp-" in p.name or ".backup-" in p.name)


def _rows(db: Path) -> list[tuple[Any, ...]]:
    store = Store(db)
    try:
        return store.query("SELECT key, value FROM meta WHERE key LIKE 'row-%' ORDER BY key")
    finally:
        store.close()


# -- SIGKILL in the middle of a sync ----------------------------------------------------------


def _kill_workspace(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Root\nThe anchor word is rootanchor.\n")
    for n in range(BULK_FILES):
        (ws / "memory" / f"bulk-{n:02d}.md").write_text(
            f"# Bulk {n}\nThe old word is oldword{n} in line two.\n")
    db = tmp_path / "state" / "main.sqlite"
    return ws, db, {"ws": str(ws), "db": str(db), "provider": "hash"}


@pytest.mark.anyio
@pytest.mark.parametrize(("force", "kill_after"), [
    (True, 1), (True, BULK_FILES // 2), (True, BULK_FILES + 1),
    (False, 1), (False, BULK_FILES // 2)])
async def test_sigkill_mid_sync_leaves_an_index_that_opens_and_answers(
        tmp_path: Path, force: bool, kill_after: int) -> None:
    ws, db, base = _kill_workspace(tmp_path)
    engine = store_child.make_engine(base)
    try:
        await engine.sync(reason="cli", force=True)
    finally:
        await engine.close()
    if not force:  # the incremental sync has real work: every bulk file changed
        for n in range(BULK_FILES):
            (ws / "memory" / f"bulk-{n:02d}.md").write_text(
                f"# Bulk {n}\nThe new word is newword{n} in line two.\n")
    child = _spawn({**base, "role": "sync", "force": force, "progress_sleep_ms": 40})
    try:
        for _ in range(kill_after):
            assert _read_line(child).startswith("progress ")
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=DEADLINE_S) in (-signal.SIGKILL, 0)
        if kill_after <= BULK_FILES:
            assert child.returncode == -signal.SIGKILL  # it died inside the sync
            if force:
                assert any(".tmp-" in name for name in _leftovers(db))  # mid-rebuild
    finally:
        finish(child)

    engine = store_child.make_engine(base)
    try:
        status = await engine.status()  # opening repairs what the dead writer left
        assert status.files == BULK_FILES + 1
        assert _leftovers(db) == []
        hits = (await engine.search(SearchRequest.of("rootanchor", min_score=0.0))).results
        assert ("MEMORY.md", 1, 2) in [(h.path, h.start_line, h.end_line) for h in hits]
        store = Store(db)
        try:
            assert store.quick_check() == "ok"
        finally:
            store.close()
        report = await engine.sync(reason="cli")
        assert report.full is False
        word = "oldword7" if force else "newword7"
        hits = (await engine.search(SearchRequest.of(word, min_score=0.0))).results
        assert "memory/bulk-07.md" in [h.path for h in hits]
        assert (await engine.status()).files == BULK_FILES + 1
        await engine.sync(reason="cli", force=True)
        assert _leftovers(db) == []
    finally:
        await engine.close()


# -- killed swaps and leftovers repaired on open -------------------------------------------------


def _store_with_rows(db: Path, *rows: str) -> None:
    store = Store(db)
    try:
        for row in rows:
            store.set_meta(f"row-{row}", row)
    finally:
        store.close()


def _crash_image(db: Path, target: Path, *rows: str) -> None:
    """Copy ``db`` with WAL frames that were never checkpointed (as a killed process leaves
    it) to ``target`` (main file and ``-wal``)."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    for row in rows:
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                     (f"row-{row}", json.dumps(row)))
    assert os.path.getsize(f"{db}-wal") > 0
    shutil.copyfile(db, target)
    shutil.copyfile(f"{db}-wal", f"{target}-wal")
    conn.close()


def test_killed_swap_with_the_live_db_parked_is_restored_with_its_wal(tmp_path: Path) -> None:
    source = tmp_path / "source.sqlite"
    _store_with_rows(source, "a")
    db = tmp_path / "main.sqlite"
    backup = tmp_path / "main.sqlite.backup-0123abcd"
    # the swap moved the main file, then died: the -wal still sits at the live name
    _crash_image(source, backup, "b")
    os.replace(f"{backup}-wal", f"{db}-wal")
    (tmp_path / "main.sqlite.tmp-77aa").write_bytes(b"half a rebuild")
    (tmp_path / "main.sqlite.tmp-77aa-wal").write_bytes(b"")
    assert _rows(db) == [("row-a", '"a"'), ("row-b", '"b"')]
    assert _leftovers(db) == []


def test_recover_prefers_the_newest_backup_and_drops_the_others(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    old, new = tmp_path / "main.sqlite.backup-01", tmp_path / "main.sqlite.backup-02"
    _store_with_rows(old, "old")
    _store_with_rows(new, "new")
    os.utime(old, (1_000_000, 1_000_000))
    (tmp_path / "main.sqlite-shm").write_bytes(b"stale")
    lock = StoreWriteLock(db)
    with lock.hold_blocking():
        assert recover_db_files(db) == ["restored main.sqlite.backup-02",
                                        "removed backup main.sqlite.backup-01"]
    assert _rows(db) == [("row-new", '"new"')]
    assert _leftovers(db) == []


def test_finished_swap_with_a_backup_left_keeps_the_live_db(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    _store_with_rows(db, "live")
    _crash_image(db, tmp_path / "main.sqlite.backup-99", "parked")
    store = Store(db)
    try:
        assert store.get_meta_json("row-live") == "live"
        assert store.get_meta_json("row-parked") == "parked"  # same file's own WAL frames
    finally:
        store.close()
    assert _leftovers(db) == []
    with StoreWriteLock(db).hold_blocking():
        assert recover_db_files(db) == []


def test_leftovers_of_a_live_writer_are_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    _store_with_rows(db, "live")
    temp = tmp_path / "main.sqlite.tmp-5555"
    temp.write_bytes(b"a rebuild in progress")
    holder = _spawn({"role": "hold-lock", "db": str(db)}, stdin=True)
    try:
        assert _read_line(holder) == "held"
        store = Store(db)
        store.close()
        assert temp.exists()  # the writer is alive: its temp file is not ours to delete
    finally:
        finish(holder)
    Store(db).close()
    assert not temp.exists()


def test_reader_waits_for_another_process_to_finish_a_swap(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    _store_with_rows(db, "live")
    parked = tmp_path / "main.sqlite.backup-4242"
    os.replace(db, parked)  # mid-swap: the live file is parked, the writer holds the lock
    holder = _spawn({"role": "hold-lock", "db": str(db), "restore": str(parked)}, stdin=True)
    opened: list[object] = []
    try:
        assert _read_line(holder) == "held"
        worker = threading.Thread(target=lambda: opened.append(Store(db)))
        worker.start()
        worker.join(timeout=0.2)
        _say(holder, "restore")
        assert _read_line(holder) == "restored"
        _say(holder, "release")
        worker.join(timeout=DEADLINE_S)
        assert len(opened) == 1 and isinstance(opened[0], Store)
        store = opened[0]
        assert store.get_meta_json("row-live") == "live"  # never an empty database
        store.close()
    finally:
        finish(holder)


def test_reader_gives_up_when_the_store_stays_missing(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    holder = _spawn({"role": "hold-lock", "db": str(db)}, stdin=True)
    try:
        assert _read_line(holder) == "held"
        with pytest.raises(IndexStoreError) as info:
            Store(db, swap_wait_ms=100)
        assert str(info.value) == ("index store is missing while another process holds the"
                                   " writer lock (a swap did not finish within 100 ms)"
                                   f" ({db})")
        assert not db.exists()  # no empty database was created
    finally:
        finish(holder)


# -- the rename swap never pairs a database with a foreign WAL ------------------------------------


def test_swap_refuses_a_temp_database_with_wal_frames(tmp_path: Path) -> None:
    db, temp = tmp_path / "main.sqlite", tmp_path / "main.sqlite.tmp-1"
    _store_with_rows(db, "live")
    _store_with_rows(temp, "temp")
    Path(f"{temp}-wal").write_bytes(b"frames")
    with pytest.raises(IndexStoreError, match="main.sqlite.tmp-1 still has a write-ahead log"):
        swap_db_files(temp, db)
    assert _rows(db) == [("row-live", '"live"')]


def test_rename_swap_under_an_open_connection_never_replays_its_wal(tmp_path: Path) -> None:
    db, temp = tmp_path / "main.sqlite", tmp_path / "main.sqlite.tmp-2"
    _store_with_rows(db, "old")
    other = Store(db)  # a reader that keeps the old file open across the swap
    old = sqlite3.connect(db, isolation_level=None)
    old.execute("PRAGMA wal_autocheckpoint=0")
    old.execute("INSERT INTO meta(key, value) VALUES ('row-unflushed', '1')")
    _store_with_rows(temp, "new")
    with StoreWriteLock(db).hold_blocking():
        swap_db_files(temp, db)
    old.execute("INSERT INTO meta(key, value) VALUES ('row-late', '1')")  # old file only
    old.close()
    assert other.is_replaced()
    assert other.reopen_if_replaced() is True
    assert other.query("SELECT key FROM meta WHERE key LIKE 'row-%'") == [("row-new",)]
    assert other.quick_check() == "ok"
    other.close()
    assert _rows(db) == [("row-new", '"new"')]
    assert _leftovers(db) == []


def test_publish_keeps_the_file_and_other_stores_see_it_without_reopening(
        tmp_path: Path) -> None:
    db, temp = tmp_path / "main.sqlite", tmp_path / "main.sqlite.tmp-3"
    _store_with_rows(db, "old")
    live, reader = Store(db), Store(db)
    _store_with_rows(temp, "new")  # after opening: a free lock would let them delete it
    inode = db.stat().st_ino
    try:
        with live.writer_lock.hold_blocking():
            live.swap_from(temp)
        assert db.stat().st_ino == inode
        assert not reader.is_replaced()
        assert reader.query("SELECT key FROM meta WHERE key LIKE 'row-%'") == [("row-new",)]
        assert live.quick_check() == "ok"
        assert _leftovers(db) == []
    finally:
        live.close()
        reader.close()


# -- readonly recovery (spec §5.3 step 6) -----------------------------------------------------------


@pytest.mark.anyio
async def test_readonly_connection_is_reopened_and_the_sync_retried_once(
        tmp_path: Path) -> None:
    ws, db, base = _kill_workspace(tmp_path)
    engine = store_child.make_engine({**base, "provider": "none"})
    try:
        await engine.sync(reason="cli")
        assert (await engine.status()).custom["readonlyRecovery"] == {
            "attempts": 0, "successes": 0, "failures": 0, "lastError": None}
        store = engine._stores.store
        assert store is not None
        store.conn.execute("PRAGMA query_only=ON")  # the connection can no longer write
        (ws / "memory" / "bulk-03.md").write_text("# Bulk 3\nA fresh word: freshword.\n")
        report = await engine.sync(reason="cli")
        assert report.files_indexed == 1
        assert (await engine.status()).custom["readonlyRecovery"] == {
            "attempts": 1, "successes": 1, "failures": 0,
            "lastError": f"index store is read-only: attempt to write a readonly database ({db})"}
        hits = (await engine.search(SearchRequest.of("freshword", min_score=0.0))).results
        assert [h.path for h in hits] == ["memory/bulk-03.md"]
    finally:
        await engine.close()


@pytest.mark.anyio
async def test_engine_reopens_a_store_whose_file_another_process_renamed_over(
        tmp_path: Path) -> None:
    ws, db, base = _kill_workspace(tmp_path)
    other_db = tmp_path / "other" / "main.sqlite"
    engine = store_child.make_engine({**base, "provider": "none"})  # sync.onSearch off
    builder = store_child.make_engine({"ws": str(ws), "db": str(other_db), "provider": "none"})
    try:
        await engine.sync(reason="cli")
        assert (await engine.search(SearchRequest.of("swaptoken", min_score=0.0))).results == []
        # a note only the other store indexes (the engine does not sync before searching)
        (ws / "memory" / "swap.md").write_text("# Swap\nOnly here: swaptoken.\n")
        await builder.sync(reason="cli")
        await builder.close()  # the last connection checkpoints and drops its -wal
        with StoreWriteLock(db).hold_blocking():
            swap_db_files(other_db, db)
        hits = (await engine.search(SearchRequest.of("swaptoken", min_score=0.0))).results
        assert [(h.path, h.start_line, h.end_line) for h in hits] == [("memory/swap.md", 1, 2)]
        assert (await engine.status()).files == BULK_FILES + 2
    finally:
        await engine.close()
        await builder.close()


@pytest.mark.anyio
async def test_corrupt_store_is_moved_aside_and_rebuilt(tmp_path: Path) -> None:
    from fallback.engine.builtin import BuiltinEngine
    from fallback.settings import EngineSettings, MemorySearchSettings

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "2026-01-01.md").write_text("the quokka note\n")
    settings = EngineSettings.for_workspace(ws, state_dir=tmp_path / "state",
                                            search=MemorySearchSettings(provider="none"))
    settings.db_path.parent.mkdir(parents=True)
    settings.db_path.write_bytes(b"this is not an SQLite database" * 100)
    engine = BuiltinEngine(settings)
    try:
        hits = (await engine.search(SearchRequest.of("quokka"))).results
        assert [h.path for h in hits] == ["memory/2026-01-01.md"]
        st = await engine.status()
        moved = list(settings.db_path.parent.glob("main.sqlite.corrupt-*"))
        assert len(moved) == 1 and moved[0].read_bytes().startswith(b"this is not an SQLite database")
        assert any("index store was corrupt" in i and moved[0].name in i for i in st.issues)
    finally:
        await engine.close()


@pytest.mark.anyio
async def test_store_damaged_inside_is_rebuilt_on_search_and_forced_sync(tmp_path: Path) -> None:
    from fallback.engine.builtin import BuiltinEngine
    from fallback.settings import EngineSettings, MemorySearchSettings

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    for i in range(40):
        (ws / "memory" / f"2026-01-{i % 28 + 1:02d}-{i}.md").write_text(f"note {i} wombat {'filler ' * 200}\n")
    settings = EngineSettings.for_workspace(ws, state_dir=tmp_path / "state",
                                            search=MemorySearchSettings(provider="none"))
    engine = BuiltinEngine(settings)
    await engine.sync(reason="test")
    await engine.close()
    with open(settings.db_path, "r+b") as fh:  # garbage over pages in the middle of the file
        fh.seek(8192)
        fh.write(os.urandom(40_000))
    for op in ("search", "sync"):
        engine = BuiltinEngine(settings)
        try:
            if op == "search":
                hits = (await engine.search(SearchRequest.of("wombat", max_results=3))).results
                assert len(hits) == 3
            else:
                report = await engine.sync(reason="cli", force=True)
                assert report.full and report.files_total == 40
            assert (await engine.status()).files == 40
        finally:
            await engine.close()
        with open(settings.db_path, "r+b") as fh:
            fh.seek(8192)
            fh.write(os.urandom(40_000))
    assert len(list(settings.db_path.parent.glob("main.sqlite.corrupt-*[0-9Z]"))) >= 1


def test_prune_corrupt_backups_keeps_the_newest_by_time_then_number(tmp_path: Path) -> None:
    from fallback.store.files import prune_corrupt_backups

    db = tmp_path / "main.sqlite"
    names = ["main.sqlite.corrupt-20260101T000000Z", "main.sqlite.corrupt-20260102T000000Z",
             "main.sqlite.corrupt-20260102T000000Z-2", "main.sqlite.corrupt-20260102T000000Z-10"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
        (tmp_path / f"{name}-wal").write_bytes(b"w")
    (tmp_path / "main.sqlite").write_bytes(b"live")
    (tmp_path / "other.sqlite.corrupt-20250101T000000Z").write_bytes(b"another store's")
    removed = prune_corrupt_backups(db, keep=2)
    assert removed == ["main.sqlite.corrupt-20260101T000000Z", "main.sqlite.corrupt-20260102T000000Z"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "main.sqlite", "main.sqlite.corrupt-20260102T000000Z-10",
        "main.sqlite.corrupt-20260102T000000Z-10-wal", "main.sqlite.corrupt-20260102T000000Z-2",
        "main.sqlite.corrupt-20260102T000000Z-2-wal", "other.sqlite.corrupt-20250101T000000Z"]


def test_checking_a_store_is_writable_keeps_this_process_s_sqlite_locks(tmp_path: Path) -> None:
    """POSIX drops every lock a process holds on a file when it closes any descriptor of that
    file, so the writability check must not open the store's files: a reader of this process
    in a read transaction would lose its WAL read lock, and a checkpoint elsewhere could
    truncate the WAL under it (SQLite then answers "locking protocol", or worse)."""
    from fallback.store.files import check_writable

    db = tmp_path / "main.sqlite"
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t(x)")
    writer.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM t").fetchone() == (100,)  # holds a read mark
    writer.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    check_writable(db)
    checkpoint = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1], timeout=0);"  # busy: at once
                  " print(c.execute('PRAGMA wal_checkpoint(TRUNCATE)').fetchone()[0])")
    busy = subprocess.run([sys.executable, "-c", checkpoint, str(db)], capture_output=True,
                          timeout=60, check=True)
    assert busy.stdout == b"1\n"  # our reader still holds the WAL: the truncation must wait
    assert reader.execute("SELECT count(*) FROM t").fetchone() == (100,)
    reader.execute("COMMIT")
    reader.close()
    writer.close()

"""Several processes on one store: writer lock, busy retries, readers during syncs and rebuilds.

Real child processes (``store_child.py``) share one SQLite store; loops are bounded by counts
and every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from fallback.errors import IndexStoreError
from fallback.store.db import Store
from fallback.store.lock import StoreWriteLock, lock_path_for
from tests.fallback.child_procs import DEADLINE_S, finish

pytestmark = pytest.mark.slow  # several processes share one store

CHILD = Path(__file__).with_name("store_child.py")
# Deadline for any child process or wait in this module, in seconds.
# Planted token -> the file that holds it (never edited during a run).
TOKENS = {f"plantedtoken{n}": f"memory/stable-{n}.md" for n in range(4)}


def _spawn(cfg: dict[str, Any], *, stdin: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CHILD), json.dumps(cfg)], text=True,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=Path(__file__).parents[2])


def _expect_line(proc: subprocess.Popen[str], wanted: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == wanted, f"child said {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Root\nEvergreen notes.\n")
    for token, rel in TOKENS.items():
        (ws / rel).write_text(f"# Stable\nThe planted word is {token} here.\nMore text.\n")
    return ws


# -- the writer lock ----------------------------------------------------------------------------


def test_lock_held_by_another_process_times_out_then_frees_on_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    holder = _spawn({"role": "hold-lock", "db": str(db)}, stdin=True)
    try:
        _expect_line(holder, "held")
        lock = StoreWriteLock(db, timeout_ms=150)
        with pytest.raises(IndexStoreError) as info:
            lock.acquire_blocking()
        assert str(info.value) == (
            f"another process (pid {holder.pid}) is writing the index; waiting for the writer"
            f" lock main.sqlite.lock timed out after 150 ms ({db})")
        assert not lock.held
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=DEADLINE_S)
        lock.acquire_blocking(timeout_ms=DEADLINE_S * 1000)  # the kernel dropped the dead lock
        assert lock.held
        lock.release()
        assert lock_path_for(db).exists()  # the lock file is never deleted
    finally:
        finish(holder)


@pytest.mark.anyio
async def test_async_acquire_times_out_with_the_same_message(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    holder = _spawn({"role": "hold-lock", "db": str(db)}, stdin=True)
    try:
        _expect_line(holder, "held")
        with pytest.raises(IndexStoreError, match=r"^another process \(pid \d+\) is writing the"
                           r" index; .* timed out after 100 ms"):
            await StoreWriteLock(db).acquire(timeout_ms=100)
    finally:
        finish(holder)
    lock = StoreWriteLock(db)
    await lock.acquire(timeout_ms=DEADLINE_S * 1000)  # released with the holder's exit
    assert lock.held
    lock.release()
    assert not lock.held


def test_lock_is_reentrant_per_object_and_exclusive_between_objects(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    first, second = StoreWriteLock(db), StoreWriteLock(db)
    assert first.try_acquire() and first.try_acquire()
    assert not second.try_acquire()  # flock belongs to the open file: same process, no entry
    first.release()
    assert first.held and not second.try_acquire()
    first.release()
    assert not first.held
    assert second.try_acquire()
    assert lock_path_for(db).read_text() == f"{os.getpid()}\n"
    assert second.holder_pid() == os.getpid()
    second.close()
    assert not second.held and first.try_acquire()
    first.release()
    first.release()  # releasing an unheld lock does nothing
    assert not first.held


# -- SQLITE_BUSY never reaches a caller while retries last ---------------------------------------


def test_busy_begin_immediate_is_retried_until_the_other_writer_commits(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    store = Store(db, busy_timeout_ms=50, busy_retry_attempts=400)
    holder = _spawn({"role": "hold-write", "db": str(db)}, stdin=True)
    outcome: list[object] = []

    def write() -> None:
        try:
            store.set_meta("writer", "parent")
            outcome.append("ok")
        except IndexStoreError as exc:
            outcome.append(exc)

    try:
        _expect_line(holder, "locked")
        worker = threading.Thread(target=write)
        worker.start()
        for _ in range(DEADLINE_S * 100):
            if store.busy_retries >= 1 or not worker.is_alive():
                break
            threading.Event().wait(0.01)
        assert store.busy_retries >= 1  # it met the lock and retried instead of failing
        assert holder.stdin is not None
        holder.stdin.write("commit\n")
        holder.stdin.flush()
        worker.join(timeout=DEADLINE_S)
        assert outcome == ["ok"]
        assert store.get_meta_json("writer") == "parent"
        assert store.get_meta_json("holder") == 1
    finally:
        finish(holder)
        store.close()


def test_busy_past_all_retries_is_one_index_store_error(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    store = Store(db, busy_timeout_ms=20, busy_retry_attempts=2)
    holder = _spawn({"role": "hold-write", "db": str(db)}, stdin=True)
    try:
        _expect_line(holder, "locked")
        with pytest.raises(IndexStoreError) as info:
            store.set_meta("writer", "parent")
        assert str(info.value) == ("index store is locked by another process past the busy"
                                   f" timeout: database is locked ({db})")
        assert store.busy_retries == 1
    finally:
        finish(holder)
        store.close()


# -- real processes sharing one store ------------------------------------------------------------


@pytest.mark.parametrize("provider", ["none", "hash"])
def test_writer_and_readers_in_parallel_never_fail_or_read_half_an_index(
        tmp_path: Path, provider: str) -> None:
    ws = _workspace(tmp_path)
    db = tmp_path / "state" / "main.sqlite"
    base = {"ws": str(ws), "db": str(db), "provider": provider}
    stop = tmp_path / "stop"
    build = _spawn({**base, "role": "writer", "iterations": 1, "force_every": 1,
                    "out": str(tmp_path / "build.json")})
    finish(build)
    assert json.loads((tmp_path / "build.json").read_text())["errors"] == []
    procs = {
        "writer": _spawn({**base, "role": "writer", "iterations": 24, "force_every": 3,
                          "final_token": "finaltoken", "stop_file": str(stop),
                          "out": str(tmp_path / "writer.json")}),
        "reader": _spawn({**base, "role": "reader", "tokens": TOKENS, "max_loops": 400,
                          "final_token": "finaltoken", "final_wait_s": DEADLINE_S,
                          "stop_file": str(stop), "out": str(tmp_path / "reader.json")}),
        # searches here sync first (sync.onSearch): a second writer competing for the lock
        "searcher": _spawn({**base, "role": "reader", "tokens": TOKENS, "max_loops": 60,
                            "on_search": True, "ignore_stop": True, "stop_file": str(stop),
                            "out": str(tmp_path / "searcher.json")}),
    }
    for proc in procs.values():
        finish(proc)
    results = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in procs}
    for name, result in results.items():
        assert result["errors"] == [], name
        assert result.get("inconsistent", []) == [], name
    assert results["writer"]["forced"] == 8 and results["writer"]["incremental"] == 16
    assert results["reader"]["searches"] >= len(TOKENS)
    assert results["reader"]["statuses"] >= 1
    leftovers = sorted(p.name for p in db.parent.iterdir()
                       if ".tmp-" in p.name or ".backup-" in p.name)
    assert leftovers == []
    store = Store(db)
    try:
        assert store.quick_check() == "ok"
        assert store.query("SELECT COUNT(*) FROM files")[0][0] == len(TOKENS) + 7
    finally:
        store.close()

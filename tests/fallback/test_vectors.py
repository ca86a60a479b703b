"""VectorIndex: sqlite-vec mirror (through apsw) and numpy brute force give the same answers."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from fallback.errors import ManagerClosedError
from fallback.store.vectors import VectorIndex

SCHEMA = """CREATE TABLE chunks(
  id TEXT PRIMARY KEY, path TEXT NOT NULL, source TEXT NOT NULL DEFAULT 'memory',
  start_line INTEGER NOT NULL, end_line INTEGER NOT NULL, hash TEXT NOT NULL, model TEXT NOT NULL,
  text TEXT NOT NULL, embedding TEXT NOT NULL, vector BLOB, dims INTEGER, updated_at INTEGER NOT NULL)"""

BROKEN_EXTENSION = "/nonexistent/vec0"


def make_store(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(SCHEMA)
    return conn


def put(conn: sqlite3.Connection, chunk_id: str, vec: list[float] | None, *, model: str = "m1",
        source: str = "memory", updated_at: int = 1) -> None:
    blob = None if vec is None else np.asarray(vec, dtype="<f4").tobytes()
    conn.execute(
        "INSERT OR REPLACE INTO chunks(id, path, source, start_line, end_line, hash, model, text, "
        "embedding, vector, dims, updated_at) VALUES (?, ?, ?, 1, 2, 'h', ?, 't', ?, ?, ?, ?)",
        (chunk_id, f"memory/{chunk_id}.md", source, model, json.dumps(vec or []), blob,
         None if vec is None else len(vec), updated_at))


def apsw_mirror(db: Path):
    import apsw
    import sqlite_vec

    mirror = apsw.Connection(str(db) + "-vec")
    mirror.setbusytimeout(2000)
    mirror.enableloadextension(True)
    mirror.loadextension(sqlite_vec.loadable_path())
    return mirror


def both(db: Path) -> tuple[VectorIndex, VectorIndex]:
    fast = VectorIndex(db)
    slow = VectorIndex(db, extension_path=BROKEN_EXTENSION)
    assert fast.mode == "sqlite-vec"
    assert slow.mode == "brute-force"
    return fast, slow


@pytest.fixture
def random_store(tmp_path):
    rng = np.random.default_rng(1234)
    db = tmp_path / "agent.sqlite"
    conn = make_store(db)
    vectors: dict[str, tuple[np.ndarray, str, str]] = {}
    for i in range(400):
        vec = rng.normal(size=48).astype(np.float32)
        model = "m1" if i % 5 else "m2"
        source = "memory" if i % 3 else "sessions"
        put(conn, f"c{i:03d}", vec.tolist(), model=model, source=source)
        vectors[f"c{i:03d}"] = (vec, model, source)
    yield db, conn, vectors, rng
    conn.close()


def reference(vectors, query, *, model, sources, limit):
    q = np.asarray(query, dtype=np.float64)
    scored = []
    for cid, (vec, m, s) in vectors.items():
        if m == model and s in sources:
            v = vec.astype(np.float64)
            scored.append((cid, float(v @ q / (np.linalg.norm(v) * np.linalg.norm(q)))))
    scored.sort(key=lambda item: -item[1])
    return scored[:limit]


def test_modes_and_status(tmp_path):
    db = tmp_path / "s.sqlite"
    make_store(db).close()
    fast = VectorIndex(db)
    assert fast.reason == "python sqlite3 cannot load extensions; using apsw"
    status = fast.status()
    assert set(status) == {"enabled", "available", "mode", "reason", "dims", "extensionPath",
                           "mirrorError", "lastQueryMode"}
    assert (status["enabled"], status["available"], status["mode"]) == (True, True, "sqlite-vec")
    assert status["extensionPath"].endswith("vec0")
    slow = VectorIndex(db, extension_path=BROKEN_EXTENSION)
    assert slow.reason.startswith("sqlite-vec failed to load: ")
    assert slow.status()["available"] is True
    off = VectorIndex(db, enabled=False)
    assert (off.mode, off.status()["available"]) == ("disabled", False)
    assert off.search([1.0, 0.0], model="m1", sources=["memory"], limit=5) == []
    for index in (fast, slow, off):
        index.close()


@pytest.mark.parametrize(("model", "sources", "limit"), [
    ("m1", ["memory"], 10), ("m1", ["memory", "sessions"], 25), ("m2", ["sessions"], 7),
    ("m2", ["memory", "sessions"], 500)])
def test_sqlite_vec_and_brute_force_agree(random_store, model, sources, limit):
    db, _conn, vectors, rng = random_store
    fast, slow = both(db)
    for _ in range(5):
        query = rng.normal(size=48).tolist()
        expected = reference(vectors, query, model=model, sources=sources, limit=limit)
        got_fast = fast.search(query, model=model, sources=sources, limit=limit)
        got_slow = slow.search(query, model=model, sources=sources, limit=limit)
        assert [cid for cid, _ in got_fast] == [cid for cid, _ in expected]
        assert [cid for cid, _ in got_slow] == [cid for cid, _ in expected]
        for (_, a), (_, b), (_, e) in zip(got_fast, got_slow, expected, strict=True):
            assert abs(a - b) < 1e-5
            assert abs(a - e) < 1e-5
    assert fast.status()["lastQueryMode"] == "sqlite-vec"
    assert slow.status()["lastQueryMode"] == "brute-force"
    assert fast.dims == 48 and slow.dims == 48
    fast.close()
    slow.close()


def test_incremental_changes_seen_by_both(tmp_path):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "a", [1.0, 0.0, 0.0])
    put(conn, "b", [0.0, 1.0, 0.0])
    fast, slow = both(db)
    q = [1.0, 0.2, 0.0]
    for index in (fast, slow):
        assert [c for c, _ in index.search(q, model="m1", sources=["memory"], limit=5)] == ["a", "b"]
    put(conn, "c", [1.0, 0.2, 0.0])                      # new chunk, exact match
    conn.execute("DELETE FROM chunks WHERE id = 'b'")      # removed chunk
    put(conn, "a", [0.0, 0.0, 1.0], updated_at=2)          # rewritten vector
    for index in (fast, slow):
        hits = index.search(q, model="m1", sources=["memory"], limit=5)
        assert [c for c, _ in hits] == ["c", "a"]
        assert hits[0][1] == pytest.approx(1.0, abs=1e-6)
        assert hits[1][1] == pytest.approx(0.0, abs=1e-6)
    mirror = apsw_mirror(db)
    state = mirror.execute("SELECT id, updated_at FROM chunks_vec_state ORDER BY id").fetchall()
    assert state == [("a", 2), ("c", 1)]
    mirror.close()
    fast.close()
    slow.close()
    conn.close()


def test_dims_change_recreates_mirror_and_never_mixes(tmp_path):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "small", [1.0, 0.0, 0.0])
    put(conn, "big", [1.0, 0.0, 0.0, 0.0, 0.0], model="m1")
    fast, slow = both(db)
    for index in (fast, slow):
        assert index.search([1.0, 0.0, 0.0], model="m1", sources=["memory"], limit=5)[0][0] == "small"
        assert [c for c, _ in index.search([1.0, 0.0, 0.0, 0.0, 0.0], model="m1",
                                           sources=["memory"], limit=5)] == ["big"]
        assert index.dims == 5
    mirror = apsw_mirror(db)
    ddl = mirror.execute("SELECT sql FROM sqlite_master WHERE name = 'chunks_vec'").fetchall()[0][0]
    assert "float[5]" in ddl
    mirror.close()
    fast.close()
    slow.close()
    conn.close()


def test_zero_vectors_and_degenerate_queries(tmp_path):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "zero", [0.0, 0.0])
    put(conn, "none", None)
    put(conn, "a", [0.5, 0.5])
    fast, slow = both(db)
    for index in (fast, slow):
        assert [c for c, _ in index.search([1.0, 1.0], model="m1", sources=["memory"], limit=5)] == ["a"]
        assert index.search([0.0, 0.0], model="m1", sources=["memory"], limit=5) == []
        assert index.search([], model="m1", sources=["memory"], limit=5) == []
        assert index.search([1.0, 1.0], model="m1", sources=[], limit=5) == []
        assert index.search([1.0, 1.0], model="m1", sources=["memory"], limit=0) == []
        assert index.search([1.0, 1.0], model="other", sources=["memory"], limit=5) == []
    fast.close()
    slow.close()
    conn.close()


def test_missing_store_then_atomic_swap(tmp_path):
    db = tmp_path / "s.sqlite"
    fast, slow = both(db)
    for index in (fast, slow):
        assert index.search([1.0, 0.0], model="m1", sources=["memory"], limit=3) == []
    assert not db.exists()
    conn = make_store(db)
    put(conn, "old", [1.0, 0.0])
    conn.close()
    for index in (fast, slow):
        assert [c for c, _ in index.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["old"]
    tmp_db = tmp_path / "s.sqlite.tmp-1"
    conn = make_store(tmp_db)
    put(conn, "new", [0.0, 1.0])
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    os.replace(tmp_db, db)
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    for index in (fast, slow):
        assert [c for c, _ in index.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["new"]
    fast.close()
    slow.close()


def test_store_is_never_opened_by_apsw_and_writers_do_not_block(tmp_path):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "a", [1.0, 0.0])
    fast = VectorIndex(db)
    assert fast.search([1.0, 0.0], model="m1", sources=["memory"], limit=3) == [("a", pytest.approx(1.0))]
    # The store holds only the engine's tables: the mirror lives in its own file.
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert names == {"chunks", "sqlite_autoindex_chunks_1"}
    assert (tmp_path / "s.sqlite-vec").is_file()
    writer = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    put(writer, "w", [0.9, 0.1])
    # An open write transaction on the store: the search still answers from committed data.
    assert [c for c, _ in fast.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["a"]
    writer.execute("COMMIT")
    assert [c for c, _ in fast.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["a", "w"]
    assert fast.status()["lastQueryMode"] == "sqlite-vec"
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    writer.close()
    fast.close()
    conn.close()


def test_locked_mirror_falls_back_to_brute_force(tmp_path):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "a", [1.0, 0.0])
    fast = VectorIndex(db)
    fast.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)
    other = apsw_mirror(db)          # another process refreshing the same mirror
    other.execute("BEGIN IMMEDIATE")
    put(conn, "b", [0.0, 1.0])
    hits = fast.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)
    assert [c for c, _ in hits] == ["a", "b"]
    status = fast.status()
    assert status["lastQueryMode"] == "brute-force"
    assert status["mirrorError"] == ("sqlite-vec mirror busy (locked by another process); "
                                     "answered by brute force")
    other.execute("COMMIT")
    hits = fast.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)
    assert [c for c, _ in hits] == ["a", "b"]
    assert fast.status()["lastQueryMode"] == "sqlite-vec"
    assert fast.status()["mirrorError"] is None
    other.close()
    fast.close()
    conn.close()


def test_mirror_deleted_is_rebuilt(tmp_path):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "a", [1.0, 0.0])
    fast = VectorIndex(db)
    fast.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + "-vec" + suffix).unlink(missing_ok=True)
    put(conn, "b", [0.5, 0.5])
    assert [c for c, _ in fast.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["a", "b"]
    assert fast.status()["lastQueryMode"] == "sqlite-vec"
    fast.close()
    conn.close()


def test_invalidate_and_close(tmp_path):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "a", [1.0, 0.0])
    fast, slow = both(db)
    for index in (fast, slow):
        index.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)
        index.invalidate()
        assert [c for c, _ in index.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["a"]
        index.close()
        index.close()
        with pytest.raises(ManagerClosedError, match="vector index is closed"):
            index.search([1.0, 0.0], model="m1", sources=["memory"], limit=3)
    conn.close()

"""VectorIndex: sqlite-vec inside the store and numpy brute force give the same answers.

Every test runs in both modes. Python's ``sqlite3`` on this machine may not load extensions (then
the ``sqlite-vec`` cases skip here), so the last test runs this module again under an interpreter
whose ``sqlite3`` does, where none of them skips.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fallback.errors import ManagerClosedError
from fallback.store.vectors import NO_EXTENSION_LOADING, VectorIndex, probe_sqlite_vec

SCHEMA = """CREATE TABLE chunks(
  id TEXT PRIMARY KEY, path TEXT NOT NULL, source TEXT NOT NULL DEFAULT 'memory',
  start_line INTEGER NOT NULL, end_line INTEGER NOT NULL, hash TEXT NOT NULL, model TEXT NOT NULL,
  text TEXT NOT NULL, embedding TEXT NOT NULL DEFAULT '[]', vector BLOB, dims INTEGER,
  updated_at INTEGER NOT NULL)"""

BROKEN_EXTENSION = "/nonexistent/vec0"
ROOT = Path(__file__).resolve().parents[2]
LOADS_HERE = probe_sqlite_vec()[0] is not None


def _hits(index: VectorIndex, query: list[float], **kw: Any) -> list[tuple[str, float]]:
    """The hits of :meth:`VectorIndex.search_scored`."""
    return index.search_scored(query, **kw).hits


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
        "vector, dims, updated_at) VALUES (?, ?, ?, 1, 2, 'h', ?, 't', ?, ?, ?)",
        (chunk_id, f"memory/{chunk_id}.md", source, model, blob,
         None if vec is None else len(vec), updated_at))


@pytest.fixture(params=["sqlite-vec", "brute-force"])
def mode(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite-vec" and not LOADS_HERE:
        pytest.skip("this Python's sqlite3 cannot load extensions (the child-process test covers it)")
    return str(request.param)


def index_for(db: Path, mode: str) -> VectorIndex:
    """A VectorIndex in ``mode``: no memory budget forces sqlite-vec, a loadable that does not
    exist forces brute force."""
    index = (VectorIndex(db, matrix_max_bytes=0) if mode == "sqlite-vec"
             else VectorIndex(db, extension_path=BROKEN_EXTENSION))
    assert index.status()["mode"] == mode
    return index


@pytest.fixture
def random_store(tmp_path):
    rng = np.random.default_rng(1234)
    db = tmp_path / "agent.sqlite"
    conn = make_store(db)
    vectors: dict[str, tuple[np.ndarray, str, str]] = {}
    with conn:  # one transaction: one commit instead of 400
        conn.execute("BEGIN")
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
    default = VectorIndex(db)
    status = default.status()
    assert set(status) == {"enabled", "available", "mode", "reason", "dims", "extensionPath",
                           "lastQueryMode"}
    # The window matrix in memory answers by default; sqlite-vec (when it loads) takes over
    # above the memory budget, or always with no budget.
    if LOADS_HERE:
        assert (status["mode"], status["reason"]) == ("brute-force", None)
        assert status["extensionPath"].endswith("vec0")
        assert VectorIndex(db, matrix_max_bytes=0).status()["mode"] == "sqlite-vec"
    else:
        assert (status["mode"], status["reason"]) == ("brute-force", NO_EXTENSION_LOADING)
        assert VectorIndex(db, matrix_max_bytes=0).status()["mode"] == "brute-force"
    assert (status["enabled"], status["available"], status["lastQueryMode"]) == (True, True, None)
    broken = VectorIndex(db, extension_path=BROKEN_EXTENSION)
    assert broken.status()["mode"] == "brute-force"
    if LOADS_HERE:
        assert broken.status()["reason"].startswith("sqlite-vec failed to load: index store error: ")
        assert broken.status()["reason"].endswith("; exact brute-force cosine")
    assert broken.status()["available"] is True
    off = VectorIndex(db, enabled=False)
    assert (off.status()["mode"], off.status()["available"]) == ("disabled", False)
    assert _hits(off, [1.0, 0.0], model="m1", sources=["memory"], limit=5) == []
    for index in (default, broken, off):
        index.close()


@pytest.mark.parametrize(("model", "sources", "limit"), [
    ("m1", ["memory"], 10), ("m1", ["memory", "sessions"], 25), ("m2", ["sessions"], 7),
    ("m2", ["memory", "sessions"], 500)])
def test_search_matches_exact_cosine(random_store, mode, model, sources, limit):
    db, _conn, vectors, rng = random_store
    index = index_for(db, mode)
    for _ in range(5):
        query = rng.normal(size=48).tolist()
        expected = reference(vectors, query, model=model, sources=sources, limit=limit)
        got = _hits(index, query, model=model, sources=sources, limit=limit)
        assert [cid for cid, _ in got] == [cid for cid, _ in expected]
        for (_, a), (_, e) in zip(got, expected, strict=True):
            assert abs(a - e) < 1e-5
    assert index.status()["lastQueryMode"] == mode
    assert index.status()["dims"] == 48
    index.close()


def test_incremental_changes_are_seen(tmp_path, mode):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "a", [1.0, 0.0, 0.0])
    put(conn, "b", [0.0, 1.0, 0.0])
    index = index_for(db, mode)
    q = [1.0, 0.2, 0.0]
    assert [c for c, _ in _hits(index, q, model="m1", sources=["memory"], limit=5)] == ["a", "b"]
    put(conn, "c", [1.0, 0.2, 0.0])                      # new chunk, exact match
    conn.execute("DELETE FROM chunks WHERE id = 'b'")      # removed chunk
    put(conn, "a", [0.0, 0.0, 1.0], updated_at=2)          # rewritten vector
    hits = _hits(index, q, model="m1", sources=["memory"], limit=5)
    assert [c for c, _ in hits] == ["c", "a"]
    assert hits[0][1] == pytest.approx(1.0, abs=1e-6)
    assert hits[1][1] == pytest.approx(0.0, abs=1e-6)
    index.close()
    conn.close()


def test_dims_are_never_mixed(tmp_path, mode):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "small", [1.0, 0.0, 0.0])
    put(conn, "big", [1.0, 0.0, 0.0, 0.0, 0.0], model="m1")
    index = index_for(db, mode)
    assert [c for c, _ in _hits(index, [1.0, 0.0, 0.0], model="m1", sources=["memory"],
                                       limit=5)] == ["small"]
    assert index.status()["dims"] == 3
    assert [c for c, _ in _hits(index, [1.0, 0.0, 0.0, 0.0, 0.0], model="m1",
                                       sources=["memory"], limit=5)] == ["big"]
    assert index.status()["dims"] == 5
    index.close()
    conn.close()


def test_zero_vectors_and_degenerate_queries(tmp_path, mode):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "zero", [0.0, 0.0])
    put(conn, "none", None)
    put(conn, "a", [0.5, 0.5])
    index = index_for(db, mode)
    assert [c for c, _ in _hits(index, [1.0, 1.0], model="m1", sources=["memory"], limit=5)] == ["a"]
    assert _hits(index, [0.0, 0.0], model="m1", sources=["memory"], limit=5) == []
    assert _hits(index, [], model="m1", sources=["memory"], limit=5) == []
    assert _hits(index, [1.0, 1.0], model="m1", sources=[], limit=5) == []
    assert _hits(index, [1.0, 1.0], model="m1", sources=["memory"], limit=0) == []
    assert _hits(index, [1.0, 1.0], model="other", sources=["memory"], limit=5) == []
    index.close()
    conn.close()


def test_missing_store_then_atomic_swap(tmp_path, mode):
    db = tmp_path / "s.sqlite"
    index = index_for(db, mode)
    assert _hits(index, [1.0, 0.0], model="m1", sources=["memory"], limit=3) == []
    assert not db.exists()
    conn = make_store(db)
    put(conn, "old", [1.0, 0.0])
    conn.close()
    assert [c for c, _ in _hits(index, [1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["old"]
    tmp_db = tmp_path / "s.sqlite.tmp-1"
    conn = make_store(tmp_db)
    put(conn, "new", [0.0, 1.0])
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    os.replace(tmp_db, db)
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    assert [c for c, _ in _hits(index, [1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["new"]
    index.close()


def test_no_vector_copies_and_writers_do_not_block(tmp_path, mode):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "a", [1.0, 0.0])
    index = index_for(db, mode)
    assert _hits(index, [1.0, 0.0], model="m1", sources=["memory"], limit=3) == [("a", pytest.approx(1.0))]
    # The vectors live in chunks.vector only: no vec0 table, no side file.
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert names == {"chunks", "sqlite_autoindex_chunks_1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.sqlite", "s.sqlite-shm", "s.sqlite-wal"]
    writer = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    put(writer, "w", [0.9, 0.1])
    # An open write transaction on the store: the search still answers from committed data.
    assert [c for c, _ in _hits(index, [1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["a"]
    writer.execute("COMMIT")
    assert [c for c, _ in _hits(index, [1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["a", "w"]
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    writer.close()
    index.close()
    conn.close()


def test_invalidate_and_close(tmp_path, mode):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put(conn, "a", [1.0, 0.0])
    index = index_for(db, mode)
    _hits(index, [1.0, 0.0], model="m1", sources=["memory"], limit=3)
    index.invalidate()
    assert [c for c, _ in _hits(index, [1.0, 0.0], model="m1", sources=["memory"], limit=3)] == ["a"]
    index.close()
    index.close()
    with pytest.raises(ManagerClosedError, match="vector index is closed"):
        _hits(index, [1.0, 0.0], model="m1", sources=["memory"], limit=3)
    conn.close()


def put_windows(conn: sqlite3.Connection, chunk_id: str, windows: list[list[float]], *,
                dims: int | None = None) -> None:
    """A chunk embedded as several windows: their float32 vectors one after the other."""
    blob = np.asarray(windows, dtype="<f4").tobytes()
    conn.execute(
        "INSERT OR REPLACE INTO chunks(id, path, source, start_line, end_line, hash, model, text, "
        "vector, dims, updated_at) VALUES (?, ?, 'memory', 1, 2, 'h', 'm1', 't', ?, ?, 1)",
        (chunk_id, f"memory/{chunk_id}.md", blob, dims or len(windows[0])))


def test_a_chunk_scores_its_best_window(tmp_path, mode):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    put_windows(conn, "two", [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    put_windows(conn, "one", [[0.8, 0.6, 0.0]])
    put_windows(conn, "zero-and-z", [[0.0, 0.0, 0.0], [0.0, 0.0, 5.0]])  # the zero window is skipped
    put_windows(conn, "ragged", [[1.0, 0.0, 0.0]], dims=2)  # 3 floats are not whole 2-d windows
    index = index_for(db, mode)
    assert _hits(index, [0.0, 1.0, 0.0], model="m1", sources=["memory"], limit=5) == [
        ("two", pytest.approx(1.0)), ("one", pytest.approx(0.6)), ("zero-and-z", pytest.approx(0.0))]
    assert _hits(index, [1.0, 0.0, 0.0], model="m1", sources=["memory"], limit=2) == [
        ("two", pytest.approx(1.0)), ("one", pytest.approx(0.8))]
    assert _hits(index, [0.0, 0.0, -1.0], model="m1", sources=["memory"], limit=5) == [
        ("one", pytest.approx(0.0)), ("two", pytest.approx(0.0)), ("zero-and-z", pytest.approx(-1.0))]
    assert _hits(index, [1.0, 0.0], model="m1", sources=["memory"], limit=5) == []
    # statistics of the best-window cosine over every chunk searched, not only the hits
    scored = index.search_scored([0.0, 1.0, 0.0], model="m1", sources=["memory"], limit=1)
    assert scored.hits == [("two", pytest.approx(1.0))] and scored.count == 3
    assert (scored.mean, scored.std) == (pytest.approx(1.6 / 3), pytest.approx(float(np.std([1.0, 0.6, 0.0]))))
    assert index.status()["lastQueryMode"] == mode
    index.close()
    conn.close()


def test_a_refresh_reads_only_the_chunks_that_changed(tmp_path):
    db = tmp_path / "s.sqlite"
    conn = make_store(db)
    for i in range(6):
        put_windows(conn, f"c{i}", [[1.0, float(i), 0.0], [0.0, 1.0, float(i)]])
    index = index_for(db, "brute-force")
    hits = _hits(index, [1.0, 0.0, 0.0], model="m1", sources=["memory"], limit=2)
    assert [c for c, _ in hits] == ["c0", "c1"]
    statements: list[str] = []
    index._conn.set_trace_callback(statements.append)  # type: ignore[union-attr]
    assert _hits(index, [1.0, 0.0, 0.0], model="m1", sources=["memory"], limit=2)[0][0] == "c0"
    assert not any("rowid IN" in sql for sql in statements)  # nothing changed: nothing read
    put_windows(conn, "c3", [[1.0, 0.0, 0.0]])  # rewritten: a new row
    conn.execute("DELETE FROM chunks WHERE id = 'c0'")
    statements.clear()
    assert _hits(index, [1.0, 0.0, 0.0], model="m1", sources=["memory"], limit=3) == [
        ("c3", pytest.approx(1.0)), ("c1", pytest.approx(1 / math.sqrt(2))),
        ("c2", pytest.approx(1 / math.sqrt(5)))]
    new_rowid = conn.execute("SELECT rowid FROM chunks WHERE id = 'c3'").fetchone()[0]
    assert [sql for sql in statements if "rowid IN" in sql] == [
        f"SELECT rowid, id, model, source, vector, dims FROM chunks WHERE rowid IN ({new_rowid})"]
    index.close()
    conn.close()


def _extension_loading_python() -> str | None:
    """Another interpreter of this Python version whose ``sqlite3`` loads extensions (the
    compiled packages of this environment must fit it, hence the same major.minor)."""
    wanted = f"({sys.version_info[0]}, {sys.version_info[1]})"
    names = ["python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"]
    candidates = [shutil.which(n) for n in names] + ["/usr/bin/python3", "/usr/local/bin/python3"]
    seen: set[str] = set()
    for exe in candidates:
        if not exe or not os.path.isfile(exe) or os.path.realpath(exe) in seen:
            continue
        seen.add(os.path.realpath(exe))
        probe = subprocess.run(
            [exe, "-c", "import sqlite3, sys; print(hasattr(sqlite3.Connection, "
             "'enable_load_extension'), tuple(sys.version_info[:2]))"],
            capture_output=True, text=True, timeout=60, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == f"True {wanted}":
            return exe
    return None


@pytest.mark.skipif(LOADS_HERE, reason="this Python loads sqlite-vec itself: covered above")
def test_sqlite_vec_cases_under_an_interpreter_that_loads_extensions():
    exe = _extension_loading_python()
    if exe is None:
        problem = "no interpreter of this Python version whose sqlite3 loads extensions"
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    paths = dict.fromkeys([str(ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    run = subprocess.run(
        [exe, "-m", "pytest", str(Path(__file__)), "-q", "-p", "no:cacheprovider", "-rs",
         "-k", "not under_an_interpreter"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300, check=False)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.fullmatch(r"\d+ passed, 1 deselected in [\d.]+s( \(\d+:\d\d:\d\d\))?", summary), summary  # none skipped

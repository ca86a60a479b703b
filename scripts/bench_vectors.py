"""Benchmark VectorIndex: sqlite-vec in the store (exact scan in SQL) vs numpy brute force.

Builds a store of N chunks x D dims (deterministic random unit vectors, 80% model ``m1``,
two sources) in a temporary directory, then times, per mode: the first search (connection,
extension load or matrix load), warm searches (p50/p95 over many queries), and the first
search after one chunk changed (brute force reloads its matrix). Prints a table in ms. The
sqlite-vec row needs a Python whose ``sqlite3`` loads extensions; elsewhere both rows are
brute force (the ``mode`` column says which).

Usage: python3 scripts/bench_vectors.py [--chunks 10000] [--dims 384] [--queries 200] [--limit 24]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from fallback.store.vectors import VectorIndex

SCHEMA = """CREATE TABLE chunks(
  id TEXT PRIMARY KEY, path TEXT NOT NULL, source TEXT NOT NULL DEFAULT 'memory',
  start_line INTEGER NOT NULL, end_line INTEGER NOT NULL, hash TEXT NOT NULL, model TEXT NOT NULL,
  text TEXT NOT NULL, embedding TEXT NOT NULL, vector BLOB, dims INTEGER, updated_at INTEGER NOT NULL)"""


def build_store(db: Path, *, chunks: int, dims: int, seed: int) -> sqlite3.Connection:
    """Create the chunks table and fill it; returns the open writer connection."""
    rng = np.random.default_rng(seed)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(SCHEMA)
    vectors = rng.normal(size=(chunks, dims)).astype("<f4")
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO chunks VALUES (?, ?, ?, 1, 20, 'h', ?, 'text', '[]', ?, ?, 1)",
        [(f"c{i:06d}", f"memory/2026-01-{i % 28 + 1:02d}.md",
          "memory" if i % 4 else "sessions", "m1" if i % 5 else "m2",
          vectors[i].tobytes(), dims) for i in range(chunks)])
    conn.execute("COMMIT")
    return conn


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def bench_mode(db: Path, writer: sqlite3.Connection, *, extension_path: str | None,
               queries: np.ndarray, limit: int) -> dict[str, object]:
    index = VectorIndex(db, extension_path=extension_path)
    sources = ["memory", "sessions"]
    start = time.perf_counter()
    first = index.search(queries[0].tolist(), model="m1", sources=sources, limit=limit)
    cold_ms = ms_since(start)
    warm: list[float] = []
    for q in queries[1:]:
        start = time.perf_counter()
        index.search(q.tolist(), model="m1", sources=sources, limit=limit)
        warm.append(ms_since(start))
    writer.execute("UPDATE chunks SET updated_at = updated_at + 1 WHERE id = 'c000001'")
    start = time.perf_counter()
    index.search(queries[0].tolist(), model="m1", sources=sources, limit=limit)
    changed_ms = ms_since(start)
    mode = index.status()["lastQueryMode"]
    index.close()
    warm.sort()
    return {"mode": mode, "cold": cold_ms, "p50": statistics.median(warm),
            "p95": warm[int(len(warm) * 0.95) - 1], "changed": changed_ms, "top": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.sqlite"
        start = time.perf_counter()
        writer = build_store(db, chunks=args.chunks, dims=args.dims, seed=args.seed)
        build_ms = ms_since(start)
        queries = np.random.default_rng(args.seed + 1).normal(size=(args.queries, args.dims))
        vec = bench_mode(db, writer, extension_path=None, queries=queries, limit=args.limit)
        brute = bench_mode(db, writer, extension_path="/nonexistent/vec0", queries=queries,
                           limit=args.limit)
        writer.close()
    same = [c for c, _ in vec["top"]] == [c for c, _ in brute["top"]]
    print(f"store: {args.chunks} chunks x {args.dims} dims, built in {build_ms:.0f} ms; "
          f"limit {args.limit}; {args.queries - 1} warm queries; same top-{args.limit}: {same}")
    print(f"{'mode':<12} {'first (ms)':>11} {'p50 (ms)':>9} {'p95 (ms)':>9} {'after 1 change (ms)':>20}")
    for row in (vec, brute):
        print(f"{row['mode']!s:<12} {row['cold']:>11.1f} {row['p50']:>9.2f} {row['p95']:>9.2f} "
              f"{row['changed']:>20.1f}")
    ratio = float(vec["p50"]) / float(brute["p50"]) if brute["p50"] else float("nan")
    print(f"p50 ratio sqlite-vec / brute-force: {ratio:.2f}")


if __name__ == "__main__":
    main()

"""Benchmark the postgres store side by side with the SQLite store on the same chunks.

Corpus: LoCoMo conversations (``--data``, converted as its README says) copied until one agent
holds about ``--chunks / --agents`` chunks (12,500 by default), chunked as the engine chunks
notes (400 tokens, 80 overlap, sections); every agent of the postgres database gets the same
workspace, so the database holds ``--chunks`` chunks (100,000 by default) over ``--agents``
agents (8), and each search is filtered to one agent. Vectors come from a hashing embedder
(``--dims`` components, unit length), so no model is needed.

Measured, for both stores (the SQLite store: one file per agent, FTS5 + the engine's vector
index; postgres: one database, ``fallback/store/postgres``):

- **index**: chunks written per second (pre-chunked rows: chunk rows, FTS tokenization and
  postings, vectors; one transaction per file on SQLite; on postgres ``WRITE_BATCH_FILES`` (25)
  files a ``write_files`` call, as the engine hands them over, which the sync lease writes
  ``WRITE_CHUNKS`` (1,000) chunks a transaction); the SQLite store indexes one agent; postgres
  indexes agent 0 alone (the like-for-like figure, target: at least SQLite's), then the other
  agents four at a time (one sync per agent, as separate hosts would);
- **keyword search** p50/p95: the keyword rows of a question's plan (``search_plan`` on the
  SQLite store, the same plan for both), 40 candidates; and how many questions got the same
  top 10 from both stores;
- **hybrid search** p50/p95: keyword rows plus the vector side the engine runs (best-window
  cosine of every chunk with its mean and spread: ``search_scored`` / ``window_search``), 40
  hits, query vector computed before the clock starts;
- **under load**: 4 writer threads (each re-syncing one agent: 10 files per sync, each file's
  first chunk gets a new marker) and 8 searcher threads at once: search p50/p95, errors, and
  lost rows (chunks missing from a published index, or a marker of the last sync not found).

The postgres server is a ``pgserver`` instance in a temporary folder unless ``--dsn`` names one.
Targets at 100,000 chunks / 8 agents: postgres keyword p50 <= 20 ms, hybrid p50 <= 40 ms, search
p95 under load <= 4x its p50, no error, no lost row, and one agent indexed at least as fast as
SQLite indexes one.

Usage: ``python3 scripts/bench_postgres.py [--quick] [--json] [--chunks N] [--agents N]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(SCRIPTS.parent))

from bench_keyword import locomo_at_scale  # noqa: E402
from benchlib import Row, check, emit, median, percentile  # noqa: E402

from fallback.index.lease_sync import WRITE_BATCH_FILES  # noqa: E402

DEFAULT_DATA = "/work/shared/bench/locomo-dev"
KEYWORD_P50_MS = 20.0
HYBRID_P50_MS = 40.0
LOAD_P95_RATIO = 4.0  # search p95 under writers and searchers, as a multiple of its p50
CANDIDATES = 40
WRITERS = 4
SEARCHERS = 8
_WORD_RE = re.compile(r"\w+")

File = tuple[str, str, list[tuple[str, int, int, str, str]]]  # path, title, chunks


def hash_embed(text: str, dims: int) -> list[float]:
    """A deterministic bag-of-words vector: each word adds +-1 to a bucket (crc32), unit length."""
    v = [0.0] * dims
    for w in _WORD_RE.findall(text.lower()):
        h = zlib.crc32(w.encode())
        v[h % dims] += 1.0 if h & 0x80000000 else -1.0
    norm = sum(x * x for x in v) ** 0.5 or 1.0
    return [x / norm for x in v]


def chunk_files(ws: Path) -> list[File]:
    """The workspace's notes as ``(path, title, [(chunk_id, start, end, text, hash)])``."""
    from fallback.store.fts_rows import note_title
    from fallback.text.chunking import chunk_markdown

    out = []
    for path in sorted(ws.rglob("*.md")):
        rel = path.relative_to(ws).as_posix()
        text = path.read_text(encoding="utf-8")
        chunks = [(hashlib.sha256(f"{rel}:{c.start_line}:{c.content_hash}".encode()).hexdigest()[:32],
                   c.start_line, c.end_line, c.text, c.content_hash)
                  for c in chunk_markdown(text, tokens=400, overlap=80, sections=True)]
        out.append((rel, note_title(rel, text), chunks))
    return out


def sqlite_write_file(store: Any, f: File, vectors: dict[str, bytes], dims: int) -> None:
    """One file into a SQLite store as the indexer writes it (one transaction)."""
    from fallback.store.fts_rows import delete_file_fts, insert_chunk_fts

    rel, title, chunks = f
    with store.transaction() as conn:
        delete_file_fts(conn, rel, "memory")
        conn.execute("DELETE FROM chunks WHERE path = ? AND source = 'memory'", (rel,))
        written = []
        for cid, start, end, text, h in chunks:
            cur = conn.execute(
                "INSERT INTO chunks (id, path, source, start_line, end_line, hash, model, text,"
                " vector, dims, updated_at) VALUES (?, ?, 'memory', ?, ?, ?, 'hash', ?, ?, ?, 0)",
                (cid, rel, start, end, h, text, vectors[cid], dims))
            written.append((cur.lastrowid, text))
        insert_chunk_fts(conn, written, title=title, fill_trigram=True)


def pg_sync(store: Any, files: list[File], embed: Callable[[str], list[float]]) -> None:
    """Write ``files`` into a postgres store in one sync and publish it."""
    from fallback.store.postgres.store import ChunkRow, FileRows
    from fallback.text.terms import derived_terms

    lease = store.sync_lease(wait_ms=60_000)
    if lease is None:
        raise RuntimeError(store.busy_reason)
    rows = [FileRows(rel, "memory", rel, 0, 0, title,
                     tuple(ChunkRow(cid, s, e, h, "hash", t, derived_terms(t), embed(t))
                           for cid, s, e, t, h in chunks)) for rel, title, chunks in files]
    for first in range(0, len(rows), WRITE_BATCH_FILES):
        lease.write_files(rows[first:first + WRITE_BATCH_FILES])
    lease.publish()


def timed_ms(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def under_load(search: Callable[[int, int], object], write: Callable[[int, int], None], *,
               agents: int, searches: int, syncs: int) -> dict[str, Any]:
    """4 writer threads (agents 0-3, ``syncs`` each) and 8 searcher threads (``searches``
    each, random agents and questions) at once; search latencies (ms) and errors."""
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def searcher(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(searches):
            try:
                ms = timed_ms(lambda: search(rng.randrange(agents), rng.randrange(1 << 30)))
                with lock:
                    lat.append(ms)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"search: {exc}")

    def writer(agent: int) -> None:
        for n in range(syncs):
            try:
                write(agent, n)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"write: {exc}")

    threads = [threading.Thread(target=writer, args=(a,), daemon=True) for a in range(WRITERS)]
    threads += [threading.Thread(target=searcher, args=(s,), daemon=True) for s in range(SEARCHERS)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"lat": lat, "errors": errors, "wall_s": time.perf_counter() - t}


def marked(files: list[File], agent: int, n: int) -> list[File]:
    """The first ten files with a marker word in their first chunk (writer ``agent``, sync ``n``)."""
    word = marker(agent, n)
    return [(rel, title, [(c[0] + word, c[1], c[2], c[3] + f"\n{word}", c[4]) if i == 0 else c
                          for i, c in enumerate(chunks)]) for rel, title, chunks in files[:10]]


def marker(agent: int, n: int) -> str:
    return f"zqmark{chr(97 + agent)}{chr(97 + n % 26)}{chr(97 + n // 26)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--quick", action="store_true", help="2,000 chunks over 4 agents, few queries")
    p.add_argument("--data", default=DEFAULT_DATA, help="LoCoMo folder (conv-*.json)")
    p.add_argument("--chunks", type=int, default=100_000, help="chunks in the database, all agents")
    p.add_argument("--agents", type=int, default=8, help="agents in the database")
    p.add_argument("--dims", type=int, default=64, help="hashing embedder dimensions")
    p.add_argument("--questions", type=int, default=100, help="LoCoMo questions asked")
    p.add_argument("--dsn", default=None, help="an existing PostgreSQL (+pgvector) to use")
    args = p.parse_args(argv)
    if args.quick:
        args.chunks, args.agents, args.questions = 2000, 4, 20
    agents = max(args.agents, WRITERS)
    per_agent = args.chunks // agents
    convs = sorted(Path(args.data).glob("conv-*.json"))
    if not convs:
        emit("bench_postgres", [Row("setup", "LoCoMo", None, "", note=f"skipped: no {args.data}/conv-*.json")],
             as_json=args.json, meta={})
        return 0
    from fallback.search.keyword import keyword_rows, search_plan
    from fallback.store.db import Store
    from fallback.store.postgres.store import PostgresStore
    from fallback.store.postgres.target import resolve_target
    from fallback.store.vectors import VectorIndex

    rows: list[Row] = []
    load_start = os.getloadavg()[0]
    # SIGTERM (a timeout's kill) ends the run as SIGINT does: through the finally below, which
    # stops the server this run started.
    signal.signal(signal.SIGTERM, _terminated)
    root = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    server = None
    try:
        ws = root / "ws"
        questions = locomo_at_scale(convs, ws, chunks=per_agent, questions=args.questions)
        files = chunk_files(ws)
        n_chunks = sum(len(f[2]) for f in files)
        vec_cache: dict[str, list[float]] = {}

        def embed(text: str) -> list[float]:
            v = vec_cache.get(text)
            if v is None:
                v = vec_cache[text] = hash_embed(text, args.dims)
            return v

        import numpy as np

        blobs = {c[0]: np.asarray(embed(c[3]), dtype="<f4").tobytes() for f in files for c in f[2]}
        # -- SQLite: one store per agent; index agent 0, copy it for the writers' agents.
        lite_paths = [root / f"agent-{a}.sqlite" for a in range(agents)]
        lite0 = Store(lite_paths[0])
        t = time.perf_counter()
        for f in files:
            sqlite_write_file(lite0, f, blobs, args.dims)
        lite_index_s = time.perf_counter() - t
        lite0.close()
        for path in lite_paths[1:WRITERS]:
            shutil.copy(lite_paths[0], path)
        lites = [Store(path) for path in lite_paths[:WRITERS]]
        vindex = [VectorIndex(path) for path in lite_paths[:WRITERS]]
        # -- postgres: every agent in one database.
        if args.dsn:
            dsn = args.dsn
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import pgserver
                server = pgserver.get_server(Path(tempfile.mkdtemp(prefix="qmdbridge-pg-")), cleanup_mode="stop")
            print(f"postgres server running in {server.pgdata}", file=sys.stderr, flush=True)
            from psycopg.conninfo import make_conninfo
            dsn = make_conninfo(host=str(server.pgdata), dbname="postgres", user="postgres")
        target = resolve_target(dsn)
        pgs = [PostgresStore(target, agent_id=f"agent-{a}", workspace="/ws", pool_size=3)
               for a in range(agents)]
        # Agent 0 alone (like with like: the SQLite store indexed one agent), then the others
        # WRITERS at a time (one sync per agent, as separate hosts would).
        t = time.perf_counter()
        pg_sync(pgs[0], files, embed)
        pg_one_s = time.perf_counter() - t
        t = time.perf_counter()
        for first in range(1, agents, WRITERS):
            batch = [threading.Thread(target=pg_sync, args=(store, files, embed), daemon=True)
                     for store in pgs[first:first + WRITERS]]
            for th in batch:
                th.start()
            for th in batch:
                th.join()
        pg_index_s = time.perf_counter() - t
        pg_one = n_chunks / pg_one_s
        rows += [
            Row("index", "SQLite store, one agent", n_chunks / lite_index_s, "chunks/s",
                note=f"{n_chunks} chunks in {lite_index_s:.1f} s"),
            Row("index", "postgres store, one agent", pg_one, "chunks/s",
                f">= {n_chunks / lite_index_s:.0f}", pg_one >= n_chunks / lite_index_s,
                f"{n_chunks} chunks in {pg_one_s:.1f} s"),
            Row("index", f"postgres store, {agents - 1} more agents ({WRITERS} syncing at once)",
                n_chunks * (agents - 1) / pg_index_s, "chunks/s",
                note=f"{n_chunks * (agents - 1)} chunks in {pg_index_s:.1f} s"),
        ]
        # -- searches, one at a time.
        plans = [(q, search_plan(lites[0], q)) for q in questions]
        plans = [(q, pl) for q, pl in plans if pl is not None]
        qvecs = {q: embed(q) for q, _ in plans}
        lite_kw, pg_kw, lite_hy, pg_hy = [], [], [], []
        same = 0
        for q, plan in plans:
            def lite_keyword(plan: Any = plan) -> Any:
                return keyword_rows(lites[0], plan, sources=["memory"], limit=CANDIDATES)

            def pg_keyword(plan: Any = plan, a: int = 0) -> Any:
                return pgs[a].keyword_rows(plan.match, sources=["memory"], limit=CANDIDATES,
                                           trigram_match=plan.trigram_match,
                                           like_patterns=plan.like_patterns)

            want, got = lite_keyword(), pg_keyword()
            same += [r[0] for r in want[:10]] == [r[0] for r in got[:10]]
            lite_kw.append(min(timed_ms(lite_keyword) for _ in range(2)))
            pg_kw.append(min(timed_ms(pg_keyword) for _ in range(2)))
            qv = qvecs[q]
            # The vector side the engine's hybrid search runs: best-window cosine with its
            # statistics over every chunk searched.
            lite_hy.append(min(timed_ms(lambda qv=qv: (lite_keyword(), vindex[0].search_scored(  # type: ignore[misc]
                qv, model="hash", sources=["memory"], limit=CANDIDATES))) for _ in range(2)))
            pg_hy.append(min(timed_ms(lambda qv=qv: (pg_keyword(), pgs[0].window_search(  # type: ignore[misc]
                qv, model="hash", sources=["memory"], limit=CANDIDATES))) for _ in range(2)))
        note = f"{len(plans)} questions"
        rows += [
            Row("keyword search", "SQLite store p50", median(lite_kw), "ms", note=f"{n_chunks} chunks, {note}"),
            Row("keyword search", "SQLite store p95", percentile(lite_kw, 95), "ms"),
            Row("keyword search", "postgres store p50", median(pg_kw), "ms", f"<= {KEYWORD_P50_MS:g}",
                check(median(pg_kw), KEYWORD_P50_MS), f"{n_chunks * agents} chunks, {agents} agents"),
            Row("keyword search", "postgres store p95", percentile(pg_kw, 95), "ms"),
            Row("keyword search", "same top 10 as SQLite", same, "questions", note=f"of {len(plans)}"),
            Row("hybrid search", "SQLite store p50", median(lite_hy), "ms"),
            Row("hybrid search", "SQLite store p95", percentile(lite_hy, 95), "ms"),
            Row("hybrid search", "postgres store p50", median(pg_hy), "ms", f"<= {HYBRID_P50_MS:g}",
                check(median(pg_hy), HYBRID_P50_MS)),
            Row("hybrid search", "postgres store p95", percentile(pg_hy, 95), "ms"),
        ]
        # -- under load.
        searches = 10 if args.quick else 40
        syncs = 2 if args.quick else 5

        def pg_search(agent: int, r: int) -> None:
            q, plan = plans[r % len(plans)]
            pgs[agent].keyword_rows(plan.match, sources=["memory"], limit=CANDIDATES,
                                    trigram_match=plan.trigram_match, like_patterns=plan.like_patterns)

        def lite_search(agent: int, r: int) -> None:
            q, plan = plans[r % len(plans)]
            keyword_rows(lites[agent % WRITERS], plan, sources=["memory"], limit=CANDIDATES)

        def pg_write(agent: int, n: int) -> None:
            pg_sync(pgs[agent], marked(files, agent, n), embed)

        def lite_write(agent: int, n: int) -> None:
            for f in marked(files, agent, n):
                for c in f[2]:
                    blobs.setdefault(c[0], blobs[c[0][:32]])
                sqlite_write_file(lites[agent], f, blobs, args.dims)

        for name, search, write, lost in (
                ("SQLite store", lite_search, lite_write,
                 lambda a: _lite_lost(lites[a], n_chunks, marker(a, syncs - 1))),
                ("postgres store", pg_search, pg_write,
                 lambda a: _pg_lost(pgs[a], n_chunks, marker(a, syncs - 1)))):
            m = under_load(search, write, agents=agents if name.startswith("postgres") else WRITERS,
                           searches=searches, syncs=syncs)
            missing = sum(lost(a) for a in range(WRITERS))
            p50, p95 = median(m["lat"]), percentile(m["lat"], 95)
            rows += [
                Row(f"under load ({WRITERS} writers + {SEARCHERS} searchers)", f"{name} search p50",
                    p50, "ms", note=f"{len(m['lat'])} searches, {WRITERS * syncs} syncs,"
                    f" {m['wall_s']:.1f} s"),
                Row(f"under load ({WRITERS} writers + {SEARCHERS} searchers)", f"{name} search p95",
                    p95, "ms", *((f"<= {LOAD_P95_RATIO:g}x p50", p95 <= LOAD_P95_RATIO * p50)
                                 if name.startswith("postgres") else ("", None)),
                    f"{p95 / p50:.1f}x p50" if p50 else ""),
                Row(f"under load ({WRITERS} writers + {SEARCHERS} searchers)", f"{name} errors",
                    len(m["errors"]), "", "0", len(m["errors"]) == 0, "; ".join(m["errors"][:2])),
                Row(f"under load ({WRITERS} writers + {SEARCHERS} searchers)", f"{name} lost rows",
                    missing, "", "0", missing == 0),
            ]
        for s in pgs:
            s.close()
        for s in lites:
            s.close()
        for v in vindex:
            v.close()
    finally:
        if server is not None:
            server.cleanup()
            shutil.rmtree(server.pgdata, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    rows.append(Row("machine", "load average (1 min) at start / end", os.getloadavg()[0], "",
                    note=f"{load_start:.1f} at the start, on {os.cpu_count()} cores"))
    emit("bench_postgres", rows, as_json=args.json,
         meta={"chunks": args.chunks, "agents": agents, "dims": args.dims, "questions": args.questions})
    return 0


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _pg_lost(store: Any, expected: int, word: str) -> int:
    """Chunks missing from the published index plus marked files whose marker is not found."""
    missing = max(0, expected - store.stats().chunk_count)
    found = store.keyword_rows(f'"{word}"', sources=["memory"], limit=100)
    return missing + max(0, 10 - len(found))


def _lite_lost(store: Any, expected: int, word: str) -> int:
    count = int(store.query("SELECT COUNT(*) FROM chunks")[0][0])
    found = store.query("SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH ?", [f'"{word}"'])
    return max(0, expected - count) + max(0, 10 - int(found[0][0]))


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark keyword search side by side with a bare FTS5 query, in-process.

For each workspace it builds the builtin engine's index (keyword-only, provider ``none``) and
times, per query, warm, in one process:

- **bare FTS5**: ``SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH <OR of the query's
  non-stop-words> ORDER BY bm25(chunks_fts) LIMIT 10`` on the same store: the floor any keyword
  search pays;
- **bare FTS5 search with hits**: the reference system's keyword statement over this store
  (``SELECT id, path, source, start_line, end_line, text, bm25(chunks_fts)`` of the chunks whose
  ``chunks_fts`` row matches the same OR, ``source IN ('memory')``, ``ORDER BY rank LIMIT 10``),
  rows fetched: a search that returns hits (paths, line ranges, their text) with nothing around it;
- **its statements**: the SQL statements that search runs for the query, alone (the chunk
  counts of its parts, its ranked rows, ``highlight()`` of its 10 hits): what the plan costs
  before any Python;
- **keyword search**: the engine's one keyword-only search without the engine around it,
  ``fallback.search.fts_only.keyword_search`` (plan, BM25 ranking of 40 candidates, floor,
  snippet windows of the first 10);
- **engine search**: ``BuiltinEngine.search`` end to end (its worker-thread hop, the store
  checks before a search), ``maxResults`` 10;
- **manager search**: ``BlockingMemoryManager.search`` (mode ``full``: the request checks, scope,
  the engine's freshness check, snippets, citations; answered in the caller's thread when
  nothing is due), ``maxResults`` 10.

Each search row also gives its p50 as a multiple of the bare FTS5 query's p50 and of the bare
search with hits' p50 (floors: keyword search 1.2x, manager search 3x on a LoCoMo conversation).

Workspaces: each LoCoMo conversation of ``--data`` converted as its README says (read from
there, never copied; skipped when the folder is missing); all of them copied side by side
(``memory/copy-NN/...``) until the workspace holds about 10,000 chunks, asked a sample of their
questions (real chat vocabulary at scale); and a ``scripts/corpus.py`` workspace of about
10,000 chunks (``--files`` x ``--file-bytes``), whose vocabulary is a few hundred words, so
every query word is in thousands of chunks (a worst case: the bare FTS5 query itself is slow
there). Targets: keyword search p50 <= 2 ms on a LoCoMo conversation and <= 10 ms at 10,000
chunks. Also printed: full index time per workspace.

Times are wall times (best of ``--repeats``), or with ``--cpu`` the process's CPU time
(``time.process_time``: steadier on a loaded machine; the engine search's worker thread is
counted, its wait for the event loop is not).

Usage: ``python3 scripts/bench_keyword.py [--quick] [--json] [--cpu] [--data DIR] [--files N]``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(SCRIPTS.parent))

from benchlib import Row, check, emit, median, percentile  # noqa: E402
from corpus import generate_workspace  # noqa: E402

DEFAULT_DATA = "/work/shared/bench/locomo-dev"
# Targets (ms): keyword search p50 on one LoCoMo conversation and at ~10,000 chunks.
LOCOMO_P50_MS = 2.0
SCALE_P50_MS = 10.0
# Questions over the corpus.py vocabulary (people, verbs, objects, dates of its notes).
SCALE_QUESTIONS = (
    "When did Priya fix the webhook timeout?",
    "What happened to the nightly revenue report after the standup?",
    "Who rebooted the router without downtime?",
    "Did the billing team ship the invoice export?",
    "How was the SQLite lock debugged on the staging cluster?",
    "What did ops do with the backup job at 02:00?",
    "When was the Parquet feed migrated?",
    "Which dashboard did Kenji benchmark for the quarterly report?",
    "What did we note on 2020-03-15?",
    "notes from March 2021",
    "Why did the alerts keep firing for the payment gateway?",
    "Who archived the grocery list?",
    "Wi-Fi VLAN config",
    "embedding cache index rebuild",
    "nonexistentword",
)


def locomo_workspace(conv: dict[str, Any], ws: Path) -> list[str]:
    """Write one LoCoMo conversation as daily notes (the README's conversion); its questions."""
    mem = ws / "memory"
    mem.mkdir(parents=True)
    used: dict[str, int] = {}
    n = 1
    while f"session_{n}_date_time" in conv:
        turns, when = conv.get(f"session_{n}") or [], conv[f"session_{n}_date_time"]
        n += 1
        if not turns:
            continue
        day = datetime.strptime(when.strip(), "%I:%M %p on %d %B, %Y").date().isoformat()
        used[day] = used.get(day, 0) + 1
        name = f"{day}.md" if used[day] == 1 else f"{day}-{used[day]}.md"
        lines = [f"# Conversation on {when}", ""]
        for t in turns:
            line = f"{t['speaker']}: {str(t['text']).replace(chr(10), ' ').strip()}"
            if t.get("blip_caption"):
                line += f" [shares a photo: {t['blip_caption']}]"
            lines.append(line)
        (mem / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [qa["question"] for qa in conv["qa"] if qa.get("category") in (1, 2, 3, 4)]


def locomo_at_scale(convs: list[Path], ws: Path, *, chunks: int,
                    questions: int) -> list[str]:
    """Copies of every conversation under ``memory/copy-NN/`` until about ``chunks`` chunks
    (one copy of the five dev conversations makes ~360); every n-th of their questions."""
    docs = [json.loads(p.read_text(encoding="utf-8")) for p in convs]
    asked: list[str] = []
    one = ws / "one"
    for doc in docs:
        asked.extend(locomo_workspace(doc, one / str(len(asked))))
    files = sorted((one).rglob("*.md"))
    per_copy = max(1, sum(len(f.read_text(encoding="utf-8")) for f in files) // 1320)
    for n in range(max(1, chunks // per_copy)):
        for f in files:
            dest = ws / "memory" / f"copy-{n:02d}" / f.relative_to(one).as_posix().replace("/", "-")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.read_bytes())
    import shutil
    shutil.rmtree(one)
    step = max(1, len(asked) // questions)
    return asked[::step][:questions]


def bare_match(query: str) -> str | None:
    """The bare baseline's MATCH: an OR of the query's non-stop-words, each quoted."""
    from fallback.text.keywords import STOP_WORDS

    words = [w.lower() for w in re.findall(r"\w+", query)]
    keep = [w for w in dict.fromkeys(words) if w not in STOP_WORDS] or list(dict.fromkeys(words))
    return " OR ".join(f'"{w}"' for w in keep) or None


def timed(fn: Callable[[], object], repeats: int, clock: Callable[[], float]) -> float:
    """Best of ``repeats`` times of ``fn()`` by ``clock`` (seconds: wall or the process's
    CPU), in ms."""
    best = float("inf")
    for _ in range(repeats):
        t = clock()
        fn()
        best = min(best, (clock() - t) * 1000)
    return best


async def measure(ws: Path, state: Path, queries: list[str], repeats: int,
                  clock: Callable[[], float]) -> dict[str, Any]:
    """Index ``ws`` (wall seconds) and time the searches of every query by ``clock``; ms lists
    and index seconds."""
    from fallback.embeddings import select_provider
    from fallback.engine.builtin import BuiltinEngine
    from fallback.request import SearchRequest
    from fallback.search.fts_only import candidate_count, keyword_search
    from fallback.search.keyword import COUNTED_PARTS, keyword_rows, search_plan
    from fallback.search.snippets import MARK_CLOSE, MARK_OPEN
    from fallback.settings import EngineSettings, MemorySearchSettings

    search = MemorySearchSettings.model_validate({"provider": "none"})
    engine = BuiltinEngine(EngineSettings.for_workspace(ws, state_dir=state, search=search),
                           provider_selection=select_provider(search, env={}))
    out: dict[str, Any] = {"bare": [], "bare_hits": [], "statements": [], "keyword": [],
                           "engine": []}
    try:
        t = time.perf_counter()
        await engine.sync(reason="bench")
        out["index_s"] = time.perf_counter() - t
        store = await engine._stores.open()
        out["chunks"] = int(store.query("SELECT COUNT(*) FROM chunks")[0][0])
        q_cfg = search.query

        def keyword(q: str) -> None:
            keyword_search(store, q, sources=["memory"], limit=10,
                           candidates=candidate_count(10, q_cfg.hybrid.candidate_multiplier),
                           floor=q_cfg.min_score, half_life_days=None, now_ms=int(time.time() * 1000))

        for q in queries:
            match = bare_match(q)
            if match is not None:
                out["bare"].append(timed(lambda m=match: store.query(  # type: ignore[misc]
                    "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ?"
                    " ORDER BY bm25(chunks_fts) LIMIT 10", [m]), repeats, clock))
                out["bare_hits"].append(timed(lambda m=match: store.query(  # type: ignore[misc]
                    "SELECT c.id, c.path, c.source, c.start_line, c.end_line, c.text,"
                    " bm25(chunks_fts) AS rank FROM chunks_fts JOIN chunks c"
                    " ON c.rowid = chunks_fts.rowid WHERE chunks_fts MATCH ?"
                    " AND c.source IN ('memory') ORDER BY rank LIMIT 10", [m]), repeats, clock))
            plan = search_plan(store, q)
            if plan is not None and plan.match and plan.mark_match:
                cands = candidate_count(10, q_cfg.hybrid.candidate_multiplier)
                texts = {r[0]: r[5] for r in keyword_rows(store, plan, sources=["memory"],
                                                           limit=cands)[:10]}

                def statements(p: Any = plan, n: int = cands, t: Any = texts) -> None:
                    if len(p.parts) > 1:
                        store.part_counts([e for _, e in p.parts[:COUNTED_PARTS]])
                    keyword_rows(store, p, sources=["memory"], limit=n)
                    store.highlights(p.mark_match, t, open_mark=MARK_OPEN, close_mark=MARK_CLOSE)

                out["statements"].append(timed(statements, repeats, clock))
            out["keyword"].append(timed(lambda q=q: keyword(q), repeats, clock))  # type: ignore[misc]
            best = float("inf")
            for _ in range(repeats):
                t = clock()
                await engine.search(SearchRequest.of(q, max_results=10))
                best = min(best, (clock() - t) * 1000)
            out["engine"].append(best)
    finally:
        await engine.close()
    return out


def measure_manager(ws: Path, state: Path, queries: list[str], repeats: int,
                    clock: Callable[[], float]) -> list[float]:
    """Best-of-``repeats`` ms (by ``clock``) of ``BlockingMemoryManager.search`` per query
    (keyword-only, mode ``full``; one untimed search first indexes the workspace)."""
    from qmdbridge.config import parse_config, resolve_agent
    from qmdbridge.manager import BlockingMemoryManager

    cfg = parse_config({"agents": {"defaults": {"memorySearch": {"provider": "none"}}}})
    agent = resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(state)})
    out: list[float] = []
    with BlockingMemoryManager(agent, backend="builtin", mode="full", env={}) as m:
        m.search(queries[0], max_results=10)
        for q in queries:
            out.append(timed(lambda q=q: m.search(q, max_results=10), repeats, clock))  # type: ignore[misc]
    return out


def rows_for(section: str, m: dict[str, Any], target_ms: float | None, unit: str) -> list[Row]:
    """Table rows for one workspace's measurements (search times in ``unit``: ``ms`` wall or
    ``ms CPU``)."""
    bare, kw, eng, mgr = m["bare"], m["keyword"], m["engine"], m.get("manager", [])
    note = f"{m['chunks']} chunks, {len(kw)} queries"

    def ratio(ms: list[float]) -> str:
        """The p50 as multiples of the bare query's and of the bare search with hits' p50."""
        out = [f"x{median(ms) / median(base):.1f} {name}"
               for name, base in (("bare", bare), ("bare hits", m["bare_hits"]))
               if ms and base and median(base) > 0 and base is not ms]
        return ", ".join(out)

    return [
        Row(section, "full index (keyword-only)", m["index_s"], "s", note=note),
        Row(section, "bare FTS5 query p50", median(bare) if bare else None, unit),
        Row(section, "bare FTS5 search with hits p50",
            median(m["bare_hits"]) if m["bare_hits"] else None, unit, note=ratio(m["bare_hits"])),
        Row(section, "its SQL statements p50", median(m["statements"]) if m["statements"] else None,
            unit, note=ratio(m["statements"])),
        Row(section, "keyword search p50", median(kw), unit,
            f"<= {target_ms:g}" if target_ms else "", check(median(kw), target_ms), ratio(kw)),
        Row(section, "keyword search p95", percentile(kw, 95), unit),
        Row(section, "engine search p50 (end to end)", median(eng), unit, note=ratio(eng)),
        Row(section, "engine search p95 (end to end)", percentile(eng, 95), unit),
        *([Row(section, "manager search p50 (BlockingMemoryManager)", median(mgr), unit,
               note=ratio(mgr)),
           Row(section, "manager search p95 (BlockingMemoryManager)", percentile(mgr, 95), unit)]
          if mgr else []),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table (or JSON)."""
    import anyio

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--quick", action="store_true",
                   help="one LoCoMo conversation, a small corpus, 1 repeat (smoke run)")
    p.add_argument("--data", default=DEFAULT_DATA, help="LoCoMo folder (conv-*.json)")
    p.add_argument("--files", type=int, default=470, help="corpus notes (470 x 20 KB: ~10,000 chunks)")
    p.add_argument("--file-bytes", type=int, default=20_000, help="bytes per corpus note")
    p.add_argument("--repeats", type=int, default=3, help="timings per query (best kept)")
    p.add_argument("--cpu", action="store_true",
                   help="time searches by the process's CPU time, not wall time (a loaded machine)")
    p.add_argument("--conversations", type=int, default=None,
                   help="LoCoMo conversations measured (default all); with 1, nothing at scale")
    args = p.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    clock, unit = (time.process_time, "ms CPU") if args.cpu else (time.perf_counter, "ms")
    files = min(args.files, 40) if args.quick else args.files
    rows: list[Row] = []
    data = Path(args.data)
    convs = sorted(data.glob("conv-*.json"))[: 1 if args.quick else args.conversations]
    with tempfile.TemporaryDirectory(prefix="bench-keyword-") as tmp:
        root = Path(tmp)
        if not convs:
            rows.append(Row("locomo", "conversations", None, "", note=f"skipped: no {data}/conv-*.json"))
        for conv_path in convs:
            ws = root / conv_path.stem
            questions = locomo_workspace(json.loads(conv_path.read_text(encoding="utf-8")), ws)
            m = anyio.run(measure, ws, root / f"state-{conv_path.stem}", questions, repeats, clock)
            m["manager"] = measure_manager(ws, root / f"mgr-{conv_path.stem}", questions, repeats,
                                           clock)
            rows.extend(rows_for(f"locomo {conv_path.stem}", m, LOCOMO_P50_MS, unit))
        if convs and not args.quick and args.conversations != 1:
            ws = root / "locomo-scale"
            questions = locomo_at_scale(convs, ws, chunks=10_000, questions=150)
            m = anyio.run(measure, ws, root / "state-locomo-scale", questions, repeats, clock)
            rows.extend(rows_for("locomo copies ~10k chunks", m,
                                 SCALE_P50_MS if m["chunks"] >= 9000 else None, unit))
        ws = root / "corpus"
        generate_workspace(ws, files=files, file_bytes=args.file_bytes)
        m = anyio.run(measure, ws, root / "state-corpus", list(SCALE_QUESTIONS), repeats, clock)
        rows.extend(rows_for(f"corpus {files}x{args.file_bytes}", m,
                             SCALE_P50_MS if m["chunks"] >= 9000 else None, unit))
    emit("bench_keyword", rows, as_json=args.json,
         meta={"repeats": repeats, "data": str(data), "files": files})
    return 0


if __name__ == "__main__":
    sys.exit(main())

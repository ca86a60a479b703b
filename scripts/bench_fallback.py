"""Benchmark the builtin engine: indexing, re-sync, search, CLI wall time, RSS, embeddings, live mode.

Sections (each measured in its own child process, peak RSS from that child's rusage):

1. scale (issue 2): for each ``FILESxBYTES`` workspace from ``scripts/corpus.py``: full FTS index,
   no-op re-sync, re-sync after one changed file, in-process keyword search p50/p95 (English and
   CJK), ``qmdbridge search`` CLI wall time and the peak RSS of both processes. Targets apply to
   the 2,000 files / 40 MB workspace (``2000x20000``).
2. embeddings (issue 3): index + embed throughput with the local GGUF model (chunks/s) and the
   embedding alone; hybrid search p50/p95 at ~10,000 chunks excluding the query embedding (best
   window of each chunk in the numpy matrix). The 10,000-chunk index is filled by a synthetic 384-d
   provider by default (``--hybrid-vectors local`` embeds it with the GGUF model: ~25 min).
3. live (issue 5): file save -> searchable latency through the watcher (``MemoryManager`` in
   ``full`` mode, ``watchDebounceMs`` 1500), and keyword search p95 while another process runs
   forced full re-syncs of the same store.

Usage: ``python3 scripts/bench_fallback.py [--quick] [--json] [--sizes 100x2000,2000x20000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

from benchlib import Row, check, cli_argv, emit, median, run_child  # noqa: E402
from corpus import BENCH_QUERIES, CJK_QUERIES, generate_workspace, planted_token  # noqa: E402

MODEL_PATH = "/work/shared/models/all-MiniLM-L6-v2.Q8_0.gguf"
# The size the targets are stated for: 2,000 files of ~20 KB (40 MB).
TARGET_SIZE = (2000, 20_000)
DEFAULT_SIZES = "100x2000,1000x2000,10000x2000,2000x20000"
# Targets (issue 2, 3, 5): ms unless named otherwise.
FULL_INDEX_S = 12.0
NOOP_SYNC_MS = 200.0
KEYWORD_P50_MS = 2.0
CLI_SEARCH_MS = 100.0
PEAK_RSS_MB = 150.0
HYBRID_P50_MS = 20.0
WATCH_LATENCY_MS = 2000.0
WATCH_OURS_MS = 50.0
DEBOUNCE_MS = 1500


def worker(task: str, spec: dict[str, Any], *, timeout_s: float = 3600) -> tuple[dict[str, Any], float]:
    """Run one worker task in a child; returns its JSON result and its peak RSS in MB."""
    run = run_child([sys.executable, str(SCRIPTS / "bench_fallback_worker.py"), task,
                     json.dumps(spec)], timeout_s=timeout_s)
    result = run.json()
    assert isinstance(result, dict)
    return result, run.peak_rss_mb


def write_config(state: Path, memory_search: dict[str, Any]) -> None:
    """``<state>/openclaw.json``: the config the CLI loads with ``OPENCLAW_STATE_DIR=<state>``."""
    state.mkdir(parents=True, exist_ok=True)
    doc = {"agents": {"defaults": {"memorySearch": memory_search}}}
    (state / "openclaw.json").write_text(json.dumps(doc), encoding="utf-8")


def cli_search(ws: Path, state: Path, query: str, *, runs: int) -> tuple[float, float, int]:
    """Run ``qmdbridge search QUERY --json`` ``runs`` times: (median wall ms, peak RSS MB, hits)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["OPENCLAW_STATE_DIR"] = str(state)
    walls, rss, hits = [], 0.0, 0
    for _ in range(runs):
        r = run_child([*cli_argv(), "search", query, "--workspace", str(ws), "--json"], env=env)
        doc = r.json()
        assert isinstance(doc, dict)
        hits = len(doc["results"])
        walls.append(r.wall_ms)
        rss = max(rss, r.peak_rss_mb)
    return median(walls), rss, hits


def bench_scale(tmp: Path, sizes: list[tuple[int, int]], *, repeats: int,
                cli_runs: int) -> list[Row]:
    """Section 1: one block of rows per workspace size."""
    rows: list[Row] = []
    for files, file_bytes in sizes:
        base = tmp / f"scale-{files}x{file_bytes}"
        info = generate_workspace(base / "ws", files=files, file_bytes=file_bytes)
        ms = {"provider": "none"}
        write_config(base / "state", ms)
        spec = {"ws": str(base / "ws"), "state": str(base / "state"), "memorySearch": ms,
                "files": files, "queries": list(BENCH_QUERIES), "cjk_queries": list(CJK_QUERIES),
                "repeats": repeats}
        res, rss = worker("index", spec)
        target = (files, file_bytes) == TARGET_SIZE
        sec = f"scale: {files} files x {file_bytes // 1000} KB = {info.total_bytes / 1e6:.1f} MB"
        note = f"{res['files']} files, {res['chunks']} chunks"

        def lim(x: float, on: bool = target) -> float | None:
            return x if on else None

        def tgt(text: str, on: bool = target) -> str:
            return text if on else ""

        full_s = res["full_ms"] / 1000
        cli_ms, cli_rss, hits = cli_search(base / "ws", base / "state", planted_token(files // 3),
                                           runs=cli_runs)
        rows += [
            Row(sec, "full FTS index", full_s, "s", tgt(f"<= {FULL_INDEX_S:g} s"),
                check(full_s, lim(FULL_INDEX_S)), note),
            Row(sec, "no-op re-sync", res["noop_ms"], "ms", tgt(f"<= {NOOP_SYNC_MS:g} ms"),
                check(res["noop_ms"], lim(NOOP_SYNC_MS)), "median of 5"),
            Row(sec, "re-sync after 1 changed file", res["changed_ms"], "ms", "", None,
                "median of 3"),
            Row(sec, "keyword search p50 (in-process)", res["search_p50"], "ms",
                tgt(f"<= {KEYWORD_P50_MS:g} ms"), check(res["search_p50"], lim(KEYWORD_P50_MS)),
                f"{res['searches']} searches, {len(BENCH_QUERIES)} queries"),
            Row(sec, "keyword search p95 (in-process)", res["search_p95"], "ms", "", None),
            Row(sec, "rare-term search p50 / p95 (1 matching chunk)", res["rare_p50"], "ms", "",
                None, f"p95 {res['rare_p95']:.2f} ms"),
            Row(sec, "CJK search p50 / p95", res["cjk_p50"], "ms", "", None,
                f"p95 {res['cjk_p95']:.2f} ms"),
            Row(sec, "planted token found in its note", 1.0 if res["planted_found"] else 0.0,
                "bool", "= 1", res["planted_found"]),
            Row(sec, "qmdbridge search CLI wall (median)", cli_ms, "ms",
                tgt(f"<= {CLI_SEARCH_MS:g} ms"), check(cli_ms, lim(CLI_SEARCH_MS)),
                f"{cli_runs} runs, {hits} hit(s); includes the search-time no-op re-sync"),
            Row(sec, "peak RSS: index + search process", rss, "MB",
                tgt(f"<= {PEAK_RSS_MB:g} MB"), check(rss, lim(PEAK_RSS_MB))),
            Row(sec, "peak RSS: CLI search process", cli_rss, "MB",
                tgt(f"<= {PEAK_RSS_MB:g} MB"), check(cli_rss, lim(PEAK_RSS_MB))),
        ]
    return rows


def bench_embeddings(tmp: Path, *, embed_files: int, hybrid_files: int, vectors: str,
                     repeats: int) -> list[Row]:
    """Section 2: local-model throughput, hybrid search at ~10,000 chunks."""
    sec = "embeddings and hybrid search"
    if not Path(MODEL_PATH).is_file():
        return [Row(sec, "local GGUF model", None, "", note=f"skipped: {MODEL_PATH} missing")]
    local = {"provider": "local", "local": {"modelPath": MODEL_PATH}}
    base = tmp / "embed"
    generate_workspace(base / "ws", files=embed_files, file_bytes=2000)
    res, rss = worker("embed", {"ws": str(base / "ws"), "state": str(base / "state"),
                                "memorySearch": local})
    sync_rate = res["chunks_embedded"] / (res["sync_ms"] / 1000)
    embed_rate = res["embedded_texts"] / (res["embed_ms"] / 1000)
    rows = [
        Row(sec, "index + embed throughput (local GGUF)", sync_rate, "chunks/s", "", None,
            f"{res['chunks_embedded']} chunks of ~{res['mean_chars']:.0f} chars, "
            f"{res['sync_ms'] / 1000:.1f} s"),
        Row(sec, "embedding alone (local GGUF)", embed_rate, "chunks/s", "", None,
            f"{res['embedded_texts']} chunks, {res['embed_ms'] / 1000:.1f} s"),
        Row(sec, "peak RSS: local-model index process", rss, "MB", "", None),
    ]
    base = tmp / "hybrid"
    generate_workspace(base / "ws", files=hybrid_files, file_bytes=2000)
    ms = local if vectors == "local" else {"provider": "none"}
    res, rss = worker("hybrid", {"ws": str(base / "ws"), "state": str(base / "state"),
                                 "memorySearch": ms, "vectors": vectors,
                                 "queries": list(BENCH_QUERIES), "repeats": repeats})
    note = f"{res['chunks']} chunks, {vectors} index vectors; query embedding excluded"
    rows += [
        Row(sec, f"hybrid search p50 ({res['vec']['mode']})", res["vec"]["p50"], "ms",
            f"<= {HYBRID_P50_MS:g} ms", check(res["vec"]["p50"], HYBRID_P50_MS), note),
        Row(sec, f"hybrid search p95 ({res['vec']['mode']})", res["vec"]["p95"], "ms", "", None),
        Row(sec, "query embedding (excluded above)", res["query_embed_ms"], "ms", "", None,
            "mean per query, " + ("local GGUF" if vectors == "local" else "synthetic")),
        Row(sec, "index build with vectors", res["sync_ms"] / 1000, "s", "", None),
        Row(sec, "peak RSS: hybrid process", rss, "MB", "", None),
    ]
    return rows


def bench_live(tmp: Path, *, files: int, changes: int, seconds: float) -> list[Row]:
    """Section 3: watcher latency and search p95 while another process re-syncs."""
    sec = "live mode and concurrent sync"
    base = tmp / "live"
    generate_workspace(base / "ws", files=files, file_bytes=2000)
    watch_ms = {"provider": "none", "sync": {"onSearch": False, "watch": True,
                                             "watchDebounceMs": DEBOUNCE_MS}}
    spec = {"ws": str(base / "ws"), "state": str(base / "state"), "memorySearch": watch_ms,
            "files": files, "changes": changes}
    res, _ = worker("watch", spec)
    rows: list[Row] = []
    if "skipped" in res:
        rows += [Row(sec, "save -> searchable (watcher)", None, "ms",
                     f"<= {WATCH_LATENCY_MS:g} ms", None, f"skipped: {res['skipped']}"),
                 Row(sec, "our work (latency - debounce)", None, "ms",
                     f"<= {WATCH_OURS_MS:g} ms", None, "skipped")]
    else:
        ours = res["p50"] - DEBOUNCE_MS
        rows += [Row(sec, "save -> searchable p50 (watcher)", res["p50"], "ms",
                     f"<= {WATCH_LATENCY_MS:g} ms", check(res["p50"], WATCH_LATENCY_MS),
                     f"{changes} saves, max {res['max']:.0f} ms, debounce {DEBOUNCE_MS} ms"),
                 Row(sec, "our work (p50 latency - debounce)", ours, "ms",
                     f"<= {WATCH_OURS_MS:g} ms", check(ours, WATCH_OURS_MS),
                     "includes <= 10 ms polling granularity")]
    probe_ms = {"provider": "none", "sync": {"onSearch": False}}
    spec = {"ws": str(base / "ws"), "state": str(base / "state"), "memorySearch": probe_ms,
            "queries": list(BENCH_QUERIES), "seconds": seconds}
    worker("sync-loop", {**spec, "seconds": 0})  # make sure the index exists
    idle, _ = worker("search-probe", spec)
    loop = subprocess.Popen([sys.executable, str(SCRIPTS / "bench_fallback_worker.py"),
                             "sync-loop", json.dumps({**spec, "seconds": seconds + 2})],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.5)
    busy, _ = worker("search-probe", spec)
    out, err = loop.communicate(timeout=600)
    syncs = json.loads(out)["runs"] if loop.returncode == 0 else 0
    rows += [
        Row(sec, "keyword search p95, idle", idle["p95"], "ms", "", None,
            f"{files} files, {idle['searches']} searches"),
        Row(sec, "keyword search p95, during forced re-syncs", busy["p95"], "ms", "", None,
            f"{busy['searches']} searches, {syncs} full re-syncs in the other process, "
            f"{busy['errors']} errors" + (f" ({busy['first_error']})" if busy["errors"] else "")
            + ("" if loop.returncode == 0 else f"; sync process failed: {err.decode()[-200:]}")),
        Row(sec, "search errors during re-syncs", float(busy["errors"]), "", "= 0",
            busy["errors"] == 0),
    ]
    return rows


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"100x2000,2000x20000"`` -> ``[(100, 2000), (2000, 20000)]`` (files x bytes per file)."""
    out = []
    for part in text.split(","):
        files, _, size = part.strip().partition("x")
        out.append((int(files), int(size or 2000)))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit status 0 (failed targets are reported, not raised)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke run, ~15 s)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--sizes", help=f"FILESxBYTES list (default {DEFAULT_SIZES})")
    p.add_argument("--repeats", type=int, help="passes over the query set per search timing")
    p.add_argument("--cli-runs", type=int, help="qmdbridge search CLI runs per size")
    p.add_argument("--embed-files", type=int, help="notes embedded with the local model")
    p.add_argument("--hybrid-files", type=int, help="notes in the hybrid index (~2 chunks each)")
    p.add_argument("--hybrid-vectors", choices=["synthetic", "local"], default="synthetic")
    p.add_argument("--live-files", type=int, help="notes in the live-mode workspace")
    p.add_argument("--sections", default="scale,embeddings,live",
                   help="comma list of scale, embeddings, live")
    args = p.parse_args(argv)
    q = args.quick
    sizes = parse_sizes(args.sizes or ("50x2000" if q else DEFAULT_SIZES))
    repeats = args.repeats or (2 if q else 20)
    sections = set(args.sections.split(","))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-fallback-") as tmp_name:
        tmp = Path(tmp_name)
        if "scale" in sections:
            rows += bench_scale(tmp, sizes, repeats=repeats, cli_runs=args.cli_runs or (2 if q else 5))
        if "embeddings" in sections:
            rows += bench_embeddings(tmp, embed_files=args.embed_files or (5 if q else 60),
                                     hybrid_files=args.hybrid_files or (50 if q else 5000),
                                     vectors=args.hybrid_vectors, repeats=repeats)
        if "live" in sections:
            rows += bench_live(tmp, files=args.live_files or (30 if q else 1000),
                               changes=1 if q else 5, seconds=1.0 if q else 8)
    emit("bench_fallback", rows, as_json=args.json,
         meta={"quick": q, "python": sys.version.split()[0], "cpus": os.cpu_count()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

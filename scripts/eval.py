"""Retrieval-quality eval: Hit@1, Hit@3 and MRR of the builtin engine over a labelled query set.

The queries (``scripts/eval_queries.json``) are written over ``examples/workspace/``: keyword
queries, paraphrases that share no keyword with their answer line, and CJK queries. Each is run
in keyword-only mode (no embedding provider) and in hybrid mode (the local GGUF model), with
``minScore`` 0 and 10 results; a hit counts when its path is expected and its line range holds
the expected line. MRR is over the top 10 (0 when no correct hit).

The workspace is copied to a temporary folder, so nothing is written into the repository.
Before scoring, every paraphrase is checked against its expected lines with the engine's own
keyword extraction (``fallback.text.keywords.extract_keywords``); overlaps are printed as notes.

Usage: ``python3 scripts/eval.py [--json] [--quick] [--modes keyword,hybrid]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))

from benchlib import Row, emit  # noqa: E402

MODEL_PATH = "/work/shared/models/all-MiniLM-L6-v2.Q8_0.gguf"
QUERIES = SCRIPTS / "eval_queries.json"
TOP_K = 10
KINDS = ("keyword", "paraphrase", "cjk")


def is_correct(hit: Any, expect: list[dict[str, Any]]) -> bool:
    """True when ``hit`` (a ``MemorySearchResult``) is at one of the expected paths and lines."""
    for e in expect:
        line = e.get("line")
        if hit.path == e["path"] and (line is None or hit.start_line <= line <= hit.end_line):
            return True
    return False


def rank_of(hits: list[Any], expect: list[dict[str, Any]]) -> int | None:
    """1-based rank of the first correct hit, or None."""
    for i, hit in enumerate(hits, start=1):
        if is_correct(hit, expect):
            return i
    return None


def paraphrase_overlaps(queries: list[dict[str, Any]], ws: Path) -> list[str]:
    """Paraphrase queries sharing a keyword with an expected line: ``["p01: boss", ...]``."""
    from fallback.text.keywords import extract_keywords

    out = []
    for q in queries:
        if q["kind"] != "paraphrase":
            continue
        words = set(extract_keywords(q["query"]))
        for e in q["expect"]:
            lines = (ws / e["path"]).read_text(encoding="utf-8").splitlines()
            line_words = set(extract_keywords(lines[e["line"] - 1]))
            shared = words & line_words
            if shared:
                out.append(f"{q['id']}: {', '.join(sorted(shared))}")
    return out


async def run_mode(ws: Path, state: Path, queries: list[dict[str, Any]],
                   memory_search: dict[str, Any]) -> dict[str, int | None]:
    """Search every query with a fresh engine; returns ``{query id: rank or None}``."""
    from fallback.embeddings import select_provider
    from fallback.engine.builtin import BuiltinEngine
    from fallback.request import SearchRequest
    from fallback.settings import EngineSettings, MemorySearchSettings

    search = MemorySearchSettings.model_validate(memory_search)
    settings = EngineSettings.for_workspace(ws, state_dir=state, search=search)
    engine = BuiltinEngine(settings, provider_selection=select_provider(search, env={}))
    ranks: dict[str, int | None] = {}
    try:
        await engine.sync(reason="eval")
        for q in queries:
            hits = (await engine.search(SearchRequest.of(q["query"], max_results=TOP_K,
                                                         min_score=0.0))).results
            ranks[q["id"]] = rank_of(hits, q["expect"])
    finally:
        await engine.close()
    return ranks


def score(ranks: dict[str, int | None], ids: list[str]) -> tuple[float, float, float]:
    """(Hit@1, Hit@3, MRR) over ``ids``."""
    n = max(1, len(ids))
    r = [ranks[i] for i in ids]
    return (sum(1 for x in r if x == 1) / n, sum(1 for x in r if x is not None and x <= 3) / n,
            sum(1 / x for x in r if x is not None) / n)


def main(argv: list[str] | None = None) -> int:
    """Run the eval and print the table (or JSON)."""
    import anyio

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--quick", action="store_true", help="keyword mode only (smoke run)")
    p.add_argument("--modes", help="comma list of keyword, hybrid (default both)")
    p.add_argument("--queries", default=str(QUERIES), help="labelled query file")
    args = p.parse_args(argv)
    doc = json.loads(Path(args.queries).read_text(encoding="utf-8"))
    queries: list[dict[str, Any]] = doc["queries"]
    modes = (args.modes or ("keyword" if args.quick else "keyword,hybrid")).split(",")
    configs = {"keyword": {"provider": "none"},
               "hybrid": {"provider": "local", "local": {"modelPath": MODEL_PATH}}}
    rows: list[Row] = []
    misses: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="eval-") as tmp:
        ws = Path(tmp) / "ws"
        shutil.copytree(REPO / doc["workspace"], ws)
        overlaps = paraphrase_overlaps(queries, ws)
        for mode in modes:
            if mode == "hybrid" and not Path(MODEL_PATH).is_file():
                rows.append(Row("hybrid", "all", None, "", note=f"skipped: {MODEL_PATH} missing"))
                continue
            ranks = anyio.run(run_mode, ws, Path(tmp) / f"state-{mode}", queries, configs[mode])
            misses[mode] = [i for i, r in ranks.items() if r is None or r > 3]
            for kind in (*KINDS, "all"):
                ids = [q["id"] for q in queries if kind in ("all", q["kind"])]
                h1, h3, mrr = score(ranks, ids)
                for name, value in (("Hit@1", h1), ("Hit@3", h3), ("MRR", mrr)):
                    rows.append(Row(f"{mode} mode", f"{kind} ({len(ids)} queries) {name}",
                                    value, "", "", None))
            rows.append(Row(f"{mode} mode", "queries missing from the top 3",
                            float(len(misses[mode])), "", "", None,
                            " ".join(misses[mode]) or "none"))
    rows.append(Row("query set", "paraphrases sharing a keyword with their answer",
                    float(len(overlaps)), "", "= 0", not overlaps, "; ".join(overlaps)))
    emit("eval", rows, as_json=args.json,
         meta={"queries": len(queries), "modes": ",".join(modes), "topK": TOP_K})
    return 0


if __name__ == "__main__":
    sys.exit(main())

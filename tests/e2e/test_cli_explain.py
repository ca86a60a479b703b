"""``qmdbridge search --explain`` and the reranker (the command run in this process): the ``explain`` object in
``--json``, the indented block in plain output, and a failing rerank server that leaves the
answer whole with a warning."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.cli_proc import run_cli_in_process
from tests.fallback.embeddings_fake_server import Reply, serve


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Facts\nThe router is an ER605.\n")
    (root / "memory" / "2026-01-12.md").write_text("# Log\nRebooted the router twice.\n")
    return root


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return run_cli_in_process(args, env)


def test_explain_json_and_plain_block(ws: Path, env: dict[str, str]) -> None:
    p = run(["search", "router", "--workspace", str(ws), "--explain", "--json"], env)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    assert doc["mode"] == "fts-only" and doc["warnings"] == []
    hits = doc["results"]
    assert sorted(h["path"] for h in hits) == ["MEMORY.md", "memory/2026-01-12.md"]
    for rank, h in enumerate(hits, start=1):
        e = h["explain"]
        assert set(e) == {"mode", "keyword", "vector", "fusion", "decay", "rerank", "mmr", "floor",
                          "rank"}
        assert (e["mode"], e["rank"], e["vector"], e["fusion"], e["decay"], e["rerank"], e["mmr"]) == (
            "fts-only", rank, None, None, None, None, None)
        assert e["keyword"]["textScore"] == h["score"] and e["keyword"]["bm25"] < 0
        assert e["floor"] == {"minScore": 0.35, "relaxedFloor": None, "kept": True,
                              "reason": f"score {h['score']:.4f} >= minScore 0.35"}
    text = run(["search", "router", "--workspace", str(ws), "--explain"], env)
    assert text.returncode == 0, text.stderr
    first = hits[0]["explain"]
    block = ["  explain: fts-only, rank 1",
             f"    keyword: rank {first['keyword']['rank']}, bm25 {first['keyword']['bm25']:.4g}, "
             f"text score {first['keyword']['textScore']:.4f}",
             f"    floor: kept (score {hits[0]['score']:.4f} >= minScore 0.35)"]
    lines = text.stdout.decode().splitlines()
    assert lines[0] == f"{hits[0]['score']:.3f} {hits[0]['path']}:1-2"
    at = lines.index("  explain: fts-only, rank 1")
    assert lines[at:at + 3] == block
    assert "  explain: fts-only, rank 2" in lines
    plain = run(["search", "router", "--workspace", str(ws)], env)
    assert b"explain" not in plain.stdout


def test_a_failing_rerank_server_leaves_the_answer_whole(ws: Path, env: dict[str, str],
                                                         tmp_path: Path) -> None:
    baseline = orjson.loads(run(["search", "router", "--workspace", str(ws), "--json"], env).stdout)
    with serve(lambda req: Reply(500, {"error": {"message": "no GPU left"}})) as srv:
        cfg = tmp_path / "openclaw.json5"
        cfg.write_text("{ agents: { defaults: { memorySearch: { query: { rerank: "
                       f"{{ provider: 'http', model: 'rr', baseUrl: '{srv.url}' }} }} }} }} }} }}")
        p = run(["search", "router", "--workspace", str(ws), "--config", str(cfg), "--json"], env)
        text = run(["search", "router", "--workspace", str(ws), "--config", str(cfg)], env)
    assert p.returncode == 0, p.stderr
    doc = orjson.loads(p.stdout)
    warning = "rerank skipped, fused order kept: http reranker failed: HTTP 500: no GPU left"
    assert doc["warnings"] == [warning]
    assert [(h["path"], h["score"]) for h in doc["results"]] == [
        (h["path"], h["score"]) for h in baseline["results"]]
    assert len(srv.requests) == 4  # two searches, one retry each
    assert text.returncode == 0 and f"warning: {warning}\n".encode() in text.stderr
    assert text.stdout.decode().splitlines()[0].endswith(f" {baseline['results'][0]['path']}:1-2")


def test_explain_of_a_hybrid_search_with_every_step(ws: Path, env: dict[str, str], tmp_path: Path,
                                                    local_model_path: Path) -> None:
    """A hybrid search with the real GGUF embedding model, temporal decay, a reranker (an HTTP
    server on 127.0.0.1 speaking the Cohere shape) and MMR: each hit's ``explain`` has every
    step, and the plain block prints one line per step from those same values."""
    def rerank(req: Any) -> Reply:
        docs = orjson.loads(req.body)["documents"]
        return Reply(200, {"results": [{"index": i, "relevance_score": 0.9 - 0.1 * i}
                                       for i in range(len(docs))]})

    with serve(rerank) as srv:
        cfg = tmp_path / "openclaw.json"
        cfg.write_text(orjson.dumps({"agents": {"defaults": {"memorySearch": {
            "provider": "local", "local": {"modelPath": str(local_model_path)},
            # deadlines a loaded machine cannot pass (the model's load and both embeddings run
            # within query.timeoutMs; a chunk left for later would be said in a warning)
            "query": {"minScore": 0, "timeoutMs": 120_000,
                      "rerank": {"provider": "http", "model": "rr", "baseUrl": srv.url, "timeoutMs": 120_000},
                      "hybrid": {"mmr": {"enabled": True, "lambda": 0.7},
                                 "temporalDecay": {"enabled": True, "halfLifeDays": 30}}}}}}}).decode())
        args = ["search", "router", "--workspace", str(ws), "--config", str(cfg), "--explain"]
        p = run([*args, "--json"], env)
        text = run(args, env)
    assert (p.returncode, text.returncode) == (0, 0), (p.stderr, text.stderr)
    doc = orjson.loads(p.stdout)
    assert (doc["mode"], doc["warnings"]) == ("hybrid", [])
    hits = doc["results"]
    assert sorted(h["path"] for h in hits) == ["MEMORY.md", "memory/2026-01-12.md"]
    want: list[str] = []
    for rank, h in enumerate(hits, start=1):
        e = h["explain"]
        v, f, d, rr, m = e["vector"], e["fusion"], e["decay"], e["rerank"], e["mmr"]
        k = e["keyword"]
        assert (e["mode"], e["rank"], f["method"], rr["provider"], rr["model"], m["lambda"]) == (
            "hybrid", rank, "scores", "http", "rr", 0.7)
        dated = h["path"] == "memory/2026-01-12.md"
        assert (d["ageDays"] is None, d["halfLifeDays"]) == (not dated, 30)
        age = f"age {d['ageDays']:.1f} days (by {d['datedBy']})" if dated else "evergreen"
        want += [f"{h['score']:.3f} {h['path']}:{h['startLine']}-{h['endLine']}",
                 *h["snippet"].rstrip().splitlines(),
                 f"  explain: hybrid, rank {rank}",
                 f"    keyword: rank {k['rank']}, bm25 {k['bm25']:.4g}, text score {k['textScore']:.4f}",
                 f"    vector: rank {v['rank']}, cosine {v['cosine']:.4f}",
                 f"    fusion (scores): evidence vector {f['vectorEvidence']:.4f}, text "
                 f"{f['textEvidence']:.4f}; 0.5 x max + 0.5 x ({f['vectorWeight']:g} x vector + "
                 f"{f['textWeight']:g} x text) = {f['score']:.4f}",
                 f"    decay: {age}, half-life 30 days, factor {d['factor']:.4f} -> {d['score']:.4f}",
                 f"    rerank: http rr, relevance {rr['relevance']:.4f}, rank {rr['rankBefore']} -> "
                 f"{rr['rankAfter']}",
                 f"    mmr: lambda 0.7, rank {m['rankBefore']} -> {m['rankAfter']}",
                 f"    floor: kept ({e['floor']['reason']})", ""]
    assert text.stdout.decode().splitlines() == want[:-1]

"""The search mode an answer reports is the one that ran, as a real ``qmdbridge`` process tells
it: ``search --json`` (its ``mode`` and every hit's ``explain.mode``), ``serve``'s and ``mcp``'s
``memory_search`` and ``status`` answers, and ``status``. ``query.hybrid.enabled: false`` with an
embedding provider ranks by the vector side alone (``vector-only``); without a provider, or when
the query could not be embedded, the keyword side alone answers (``fts-only``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import orjson
import pytest

from tests.e2e.cli_proc import cli_argv, run_cli
from tests.e2e.cli_proc import run_cli_in_process as run
from tests.fallback.embeddings_fake_server import Recorded, Reply, serve

pytestmark = pytest.mark.slow  # each test starts qmdbridge serve (and mcp)


def _vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [b / 255 + 0.01 for b in digest[:8]]


def _embeddings(req: Recorded) -> Reply:
    texts = req.json["input"]
    return Reply(200, {"data": [{"index": i, "embedding": _vector(t)} for i, t in enumerate(texts)]})


def _limited(req: Recorded) -> Reply:
    return Reply(429, {"error": {"message": "Rate limit reached for requests"}}, {"Retry-After": "3600"})


def _config(tmp_path: Path, memory_search: dict[str, object]) -> Path:
    cfg = tmp_path / "openclaw.json"
    cfg.write_bytes(orjson.dumps({"agents": {"defaults": {"memorySearch": memory_search}}}))
    return cfg


def _modes(ws: Path, cfg: Path, env: dict[str, str]) -> dict[str, object]:
    """The mode as every surface reports it: CLI answer, its hits' explain, status, and serve's
    answers to ``memory_search`` and ``status``."""
    args = ["--workspace", str(ws), "--config", str(cfg)]
    found = run(["search", "router dropped the WAN link", *args, "--explain", "--json"], env)
    assert found.returncode == 0, found.stderr
    doc = orjson.loads(found.stdout)
    assert doc["results"], doc
    status = run(["status", *args, "--json"], env)
    assert status.returncode == 0, status.stderr
    human = run(["status", *args], env).stdout.decode()
    lines = [b'{"id": 1, "tool": "memory_search", "params": {"query": "router dropped the WAN link"}}',
             b'{"id": 2, "tool": "status"}']
    served = run_cli(["serve", *args], env, stdin=b"\n".join(lines) + b"\n")
    assert served.returncode == 0, served.stderr
    replies = {r["id"]: r["result"] for r in map(orjson.loads, served.stdout.splitlines())}
    return {"search": doc["mode"], "explain": sorted({h["explain"]["mode"] for h in doc["results"]}),
            "status": orjson.loads(status.stdout)["searchMode"],
            "statusLine": next(ln for ln in human.splitlines() if ln.startswith("Mode: ")),
            "serveSearch": replies[1]["mode"], "serveStatus": replies[2]["searchMode"],
            "warnings": doc["warnings"]}


def test_hybrid_disabled_with_a_provider_reports_vector_only(tmp_path: Path, ws: Path,
                                                             env: dict[str, str]) -> None:
    with serve(_embeddings, max_requests=1000) as srv:
        cfg = _config(tmp_path, {"provider": "openai-compatible", "model": "stand-in",
                                 "remote": {"baseUrl": srv.url},
                                 "query": {"minScore": 0, "hybrid": {"enabled": False}}})
        assert _modes(ws, cfg, env) == {
            "search": "vector-only", "explain": ["vector-only"], "status": "vector-only",
            "statusLine": "Mode: vector-only", "serveSearch": "vector-only",
            "serveStatus": "vector-only", "warnings": []}


def test_hybrid_enabled_with_a_provider_reports_hybrid(tmp_path: Path, ws: Path,
                                                       env: dict[str, str]) -> None:
    with serve(_embeddings, max_requests=1000) as srv:
        cfg = _config(tmp_path, {"provider": "openai-compatible", "model": "stand-in",
                                 "remote": {"baseUrl": srv.url}, "query": {"minScore": 0}})
        assert _modes(ws, cfg, env) == {
            "search": "hybrid", "explain": ["hybrid"], "status": "hybrid", "statusLine": "Mode: hybrid",
            "serveSearch": "hybrid", "serveStatus": "hybrid", "warnings": []}


def test_hybrid_disabled_without_a_provider_reports_fts_only(tmp_path: Path, ws: Path,
                                                             env: dict[str, str]) -> None:
    cfg = _config(tmp_path, {"provider": "none", "query": {"hybrid": {"enabled": False}}})
    assert _modes(ws, cfg, env) == {
        "search": "fts-only", "explain": ["fts-only"], "status": "fts-only",
        "statusLine": "Mode: fts-only (keyword-only)", "serveSearch": "fts-only",
        "serveStatus": "fts-only", "warnings": []}


def test_a_query_answered_by_keywords_only_says_fts_only(tmp_path: Path, ws: Path,
                                                         env: dict[str, str]) -> None:
    """A provider that cannot embed the query (keywordFallback on): the keyword side answered,
    so the answer says ``fts-only``; status keeps the configured mode."""
    with serve(_limited, max_requests=1000) as srv:
        cfg = _config(tmp_path, {"provider": "openai-compatible", "model": "stand-in",
                                 "remote": {"baseUrl": srv.url},
                                 "query": {"keywordFallback": True, "hybrid": {"enabled": False}}})
        modes = _modes(ws, cfg, env)
    assert (modes["search"], modes["explain"], modes["serveSearch"]) == ("fts-only", ["fts-only"], "fts-only")
    assert (modes["status"], modes["serveStatus"]) == ("vector-only", "vector-only")
    assert modes["warnings"] == ["query embedding failed: openai-compatible embedding failed (HTTP 429): "
                                 "Rate limit reached for requests; results come from keyword search only"]


@pytest.mark.anyio
async def test_mcp_answers_report_the_mode_that_ran(tmp_path: Path, ws: Path, env: dict[str, str]) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    with serve(_embeddings, max_requests=1000) as srv:
        cfg = _config(tmp_path, {"provider": "openai-compatible", "model": "stand-in",
                                 "remote": {"baseUrl": srv.url},
                                 "query": {"minScore": 0, "hybrid": {"enabled": False}}})
        argv = cli_argv(["mcp", "--workspace", str(ws), "--config", str(cfg)])
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                found = await session.call_tool("memory_search", {"query": "router dropped the WAN link"})
                status = await session.call_tool("status", {})
    doc = found.structuredContent or {}
    assert found.isError is False and doc["results"]
    assert (doc["mode"], (status.structuredContent or {})["searchMode"]) == ("vector-only", "vector-only")

"""The reranker stage: settings, the pure reorder, the Cohere-compatible wire against a real HTTP
server on 127.0.0.1 (through the engine), failures that keep the fused order with a warning, and
the local GGUF provider's refusals."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from fallback.engine.builtin import BuiltinEngine
from fallback.errors import ConfigError, RerankerError
from fallback.request import SearchRequest
from fallback.search.ranking import Candidate
from fallback.search.rerank import (
    HttpReranker,
    LocalGgufReranker,
    apply_rerank_scores,
    parse_rerank_response,
    rerank_stage,
    reranker_from_settings,
)
from fallback.settings import EngineSettings, MemorySearchSettings, RerankSettings
from qmdbridge.config import parse_config
from qmdbridge.config_env import substitute_env
from tests.fallback.embeddings_fake_server import Recorded, Reply, serve

KEY = "sk-rerank-test-123456"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- settings -----------------------------------------------------------------------------------


def _config_error(rerank: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config({"agents": {"defaults": {"memorySearch": {"query": {"rerank": rerank}}}}},
                     file="cfg.json5")
    return str(info.value)


def test_rerank_is_off_by_default_and_on_with_a_provider() -> None:
    off = MemorySearchSettings().query.rerank
    assert off.enabled is False and off.provider is None and off.top_n == 20
    assert reranker_from_settings(off) is None
    http = RerankSettings.model_validate({"provider": "http", "model": "rerank-v3.5",
                                          "baseUrl": "https://api.example.test/", "topN": 8,
                                          "apiKey": KEY})
    assert (http.enabled, http.base_url, http.top_n, http.effective_timeout_ms) == (
        True, "https://api.example.test", 8, 5000)
    local = RerankSettings.model_validate({"provider": "local", "model": "~/m/r.gguf",
                                           "timeoutMs": 1234})
    assert (local.enabled, local.model, local.effective_timeout_ms) == (True, "~/m/r.gguf", 1234)
    assert RerankSettings.model_validate({"provider": "local", "model": "x"}).effective_timeout_ms == 30000
    made = reranker_from_settings(local)
    assert isinstance(made, LocalGgufReranker) and made.model_path == Path("~/m/r.gguf").expanduser()
    assert isinstance(reranker_from_settings(http), HttpReranker)


def test_bad_rerank_settings_name_the_key() -> None:
    prefix = "cfg.json5: agents.defaults.memorySearch.query.rerank"
    assert _config_error({"provider": "cohere"}) == (
        f"{prefix}.provider: invalid value 'cohere' (expected 'http' or 'local')")
    assert _config_error({"provider": "http", "baseUrl": "http://x"}) == (
        f"{prefix}.model: invalid value '' (expected the reranker model name (required when "
        "provider is 'http'))")
    assert _config_error({"provider": "local"}) == (
        f"{prefix}.model: invalid value '' (expected the GGUF reranker file path (required when "
        "provider is 'local'))")
    assert _config_error({"provider": "http", "model": "m"}) == (
        f"{prefix}.baseUrl: invalid value None (expected an http:// or https:// URL (required "
        'when provider is "http"))')
    assert _config_error({"provider": "http", "model": "m", "baseUrl": "api.cohere.com"}) == (
        f"{prefix}.baseUrl: invalid value 'api.cohere.com' (expected an http:// or https:// URL "
        '(required when provider is "http"))')
    assert _config_error({"provider": "local", "model": "r.gguf", "topN": 0}) == (
        f"{prefix}.topN: invalid value 0 (expected an integer from 1 to 200)")
    assert _config_error({"provider": "local", "model": "r.gguf", "timeoutMs": 0}) == (
        f"{prefix}.timeoutMs: invalid value 0 (expected milliseconds from 1 to 600000)")
    assert _config_error("on") == (
        f"{prefix}: invalid value 'on' (expected an object)")


# -- the pure stage -------------------------------------------------------------------------------


def _cand(chunk_id: str, score: float) -> Candidate:
    return Candidate(chunk_id=chunk_id, path=f"memory/{chunk_id}.md", source="memory",
                     start_line=1, end_line=2, snippet=f"text of {chunk_id}", score=score)


def test_apply_rerank_scores_reorders_the_head_and_keeps_the_score_slots() -> None:
    cands = [_cand("a", 0.9), _cand("b", 0.8), _cand("c", 0.7), _cand("d", 0.6)]
    out = apply_rerank_scores(cands, [0.1, 3.5, None], top_n=3)
    assert [(c.chunk_id, c.score) for c in out] == [("b", 0.9), ("a", 0.8), ("c", 0.7), ("d", 0.6)]
    ties = apply_rerank_scores(cands, [1.0, 1.0, 2.0, float("nan")], top_n=4)
    assert [(c.chunk_id, c.score) for c in ties] == [("c", 0.9), ("a", 0.8), ("b", 0.7), ("d", 0.6)]
    assert [c.score for c in cands] == [0.9, 0.8, 0.7, 0.6]  # inputs untouched
    with pytest.raises(ValueError, match="2 reranker scores for 3 candidates"):
        apply_rerank_scores(cands, [1.0, 2.0], top_n=3)


def test_parse_rerank_response_shapes_and_refusals() -> None:
    body = {"results": [{"index": 2, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}]}
    assert parse_rerank_response(body, 3) == [0.1, None, 0.9]
    assert parse_rerank_response({"data": [{"index": 0, "relevance_score": 2}]}, 1) == [2.0]
    for bad, message in [
        ({"results": "x"}, "http reranker failed: response has no results list"),
        ([], "http reranker failed: response has no results list"),
        ({"results": [{"index": 3, "relevance_score": 1.0}]},
         "http reranker failed: result index 3 is not one of 0..2"),
        ({"results": [{"index": 1, "relevance_score": "high"}]},
         "http reranker failed: result 1 has no finite relevance_score"),
        ({"results": [{"index": 1, "relevance_score": 1}, {"index": 1, "relevance_score": 2}]},
         "http reranker failed: result index 1 appears twice"),
    ]:
        with pytest.raises(RerankerError) as info:
            parse_rerank_response(bad, 3)
        assert str(info.value) == message


@pytest.mark.anyio
async def test_rerank_stage_keeps_the_order_on_a_wrong_number_of_scores() -> None:
    class Short:
        provider_id, model = "http", "m"

        async def score(self, query: str, documents: list[str]) -> list[float | None]:
            return [1.0]

        async def aclose(self) -> None:
            return None

    cands = [_cand("a", 0.9), _cand("b", 0.8)]
    settings = RerankSettings(provider="http", model="m", base_url="http://127.0.0.1:9", top_n=5,
                              timeout_ms=1000)
    warnings: list[str] = []
    assert await rerank_stage(Short(), settings, "q", cands, trace=None, warnings=warnings) == cands
    assert warnings == ["rerank skipped, fused order kept: http reranker failed: 1 scores for 2 documents"]


# -- the HTTP wire, through the engine -------------------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "memory").mkdir()
    (tmp_path / "MEMORY.md").write_text("# Facts\nBeta alpha knowledge base entry.\n")
    (tmp_path / "memory" / "2026-01-12.md").write_text("# Log\nAlpha memory line.\n")
    (tmp_path / "memory" / "2026-02-09.md").write_text("# Log\nAlpha alpha beta notes.\n")
    return tmp_path


def _engine(ws: Path, rerank: dict[str, Any] | None = None) -> BuiltinEngine:
    search = MemorySearchSettings.model_validate(
        {"provider": "none", "query": {"minScore": 0.1, **({"rerank": rerank} if rerank else {})}})
    return BuiltinEngine(EngineSettings.for_workspace(ws, search=search),
                         now_ms=lambda: 1_770_681_600_000)


async def _baseline(ws: Path) -> list[tuple[str, float, str]]:
    engine = _engine(ws)
    try:
        return [(r.path, r.score, r.snippet) for r in (await engine.search(SearchRequest.of("alpha"))).results]
    finally:
        await engine.close()


def by_text(req: Recorded) -> Reply:
    """Relevance by content: the oldest note first, the newest last."""
    ranks = {"Alpha memory line.": 0.93, "Beta alpha": 0.42, "Alpha alpha beta": -1.5}
    docs = req.json["documents"]
    results = [{"index": i, "relevance_score": next(v for k, v in ranks.items() if k in d)}
               for i, d in enumerate(docs)]
    return Reply(200, {"id": "r-1", "results": sorted(results, key=lambda r: -r["relevance_score"])})


@pytest.mark.anyio
async def test_http_rerank_wire_and_the_reordering_it_causes(ws: Path) -> None:
    base = await _baseline(ws)
    assert [p for p, _, _ in base] == ["memory/2026-02-09.md", "MEMORY.md", "memory/2026-01-12.md"]
    with serve(by_text) as srv:
        engine = _engine(ws, {"provider": "http", "model": "rerank-test", "baseUrl": srv.url + "/",
                              "apiKey": KEY, "topN": 20})
        try:
            outcome = await engine.search(SearchRequest.of("alpha", explain=True))
        finally:
            await engine.close()
    assert srv.paths() == ["/v1/rerank"]
    req = srv.requests[0]
    assert req.method == "POST"
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.headers["content-type"] == "application/json"
    assert req.json == {"model": "rerank-test", "query": "alpha",
                        "documents": [s for _, _, s in base], "top_n": 3}
    assert outcome.warnings == []
    got = [(r.path, r.score) for r in outcome.results]
    # the reranker's order, holding the fused scores best-first
    assert got == [("memory/2026-01-12.md", base[0][1]), ("MEMORY.md", base[1][1]),
                   ("memory/2026-02-09.md", base[2][1])]
    explained = [r.explain.rerank for r in outcome.results if r.explain is not None]
    assert [(e.provider, e.model, e.relevance, e.rank_before, e.rank_after) for e in explained if e] == [
        ("http", "rerank-test", 0.93, 3, 1), ("http", "rerank-test", 0.42, 2, 2),
        ("http", "rerank-test", -1.5, 1, 3)]


@pytest.mark.anyio
async def test_top_n_limits_the_documents_sent_and_the_tail_keeps_its_place(ws: Path) -> None:
    base = await _baseline(ws)

    def reverse(req: Recorded) -> Reply:
        n = len(req.json["documents"])
        return Reply(200, {"results": [{"index": i, "relevance_score": float(i)} for i in range(n)]})

    with serve(reverse) as srv:
        engine = _engine(ws, {"provider": "http", "model": "m", "baseUrl": srv.url, "topN": 2})
        try:
            hits = (await engine.search(SearchRequest.of("alpha"))).results
        finally:
            await engine.close()
    assert srv.requests[0].json["documents"] == [base[0][2], base[1][2]]
    assert srv.requests[0].json["top_n"] == 2
    assert [(h.path, h.score) for h in hits] == [(base[1][0], base[0][1]), (base[0][0], base[1][1]),
                                                 (base[2][0], base[2][1])]


@pytest.mark.anyio
async def test_a_500_keeps_the_fused_order_with_a_warning_after_one_retry(ws: Path) -> None:
    base = await _baseline(ws)
    with serve(lambda req: Reply(500, {"error": {"message": "model overloaded"}})) as srv:
        engine = _engine(ws, {"provider": "http", "model": "m", "baseUrl": srv.url})
        try:
            outcome = await engine.search(SearchRequest.of("alpha", explain=True))
        finally:
            await engine.close()
    assert len(srv.requests) == 2
    assert [(r.path, r.score) for r in outcome.results] == [(p, s) for p, s, _ in base]
    assert outcome.warnings == [
        "rerank skipped, fused order kept: http reranker failed: HTTP 500: model overloaded"]
    assert all(r.explain is not None and r.explain.rerank is None for r in outcome.results)


@pytest.mark.anyio
async def test_a_4xx_is_not_retried_and_the_key_never_shows(ws: Path) -> None:
    reply = Reply(401, {"message": f"invalid api key {KEY}"})
    with serve(lambda req: reply) as srv:
        engine = _engine(ws, {"provider": "http", "model": "m", "baseUrl": srv.url, "apiKey": KEY})
        try:
            outcome = await engine.search(SearchRequest.of("alpha"))
        finally:
            await engine.close()
    assert len(srv.requests) == 1
    assert outcome.warnings == [
        "rerank skipped, fused order kept: http reranker failed: HTTP 401: invalid api key ***"]
    assert len(outcome.results) == 3


@pytest.mark.anyio
async def test_a_server_past_the_deadline_keeps_the_fused_order(ws: Path) -> None:
    base = await _baseline(ws)
    with serve(lambda req: Reply(200, {"results": []}, delay_s=30)) as srv:
        engine = _engine(ws, {"provider": "http", "model": "m", "baseUrl": srv.url, "timeoutMs": 300})
        try:
            outcome = await engine.search(SearchRequest.of("alpha"))
        finally:
            await engine.close()
    assert [(r.path, r.score) for r in outcome.results] == [(p, s) for p, s, _ in base]
    assert outcome.warnings == ["rerank skipped, fused order kept: http reranker timed out after 300ms"]


@pytest.mark.anyio
async def test_retry_after_is_honoured_then_the_answer_is_used(ws: Path) -> None:
    def flaky(req: Recorded) -> Reply:
        if len(srv.requests) == 1:
            return Reply(503, {"error": "warming up"}, headers={"retry-after": "0"})
        return by_text(req)

    with serve(flaky) as srv:
        engine = _engine(ws, {"provider": "http", "model": "m", "baseUrl": srv.url})
        try:
            outcome = await engine.search(SearchRequest.of("alpha"))
        finally:
            await engine.close()
    assert len(srv.requests) == 2 and outcome.warnings == []
    assert [r.path for r in outcome.results] == ["memory/2026-01-12.md", "MEMORY.md",
                                                 "memory/2026-02-09.md"]


# -- the local GGUF provider --------------------------------------------------------------------


@pytest.mark.anyio
async def test_local_missing_file_is_a_warning_and_the_order_stays(ws: Path, tmp_path: Path) -> None:
    base = await _baseline(ws)
    missing = tmp_path / "models" / "bge-reranker.gguf"
    engine = _engine(ws, {"provider": "local", "model": str(missing)})
    try:
        outcome = await engine.search(SearchRequest.of("alpha"))
    finally:
        await engine.close()
    assert [(r.path, r.score) for r in outcome.results] == [(p, s) for p, s, _ in base]
    assert outcome.warnings == [
        f"rerank skipped, fused order kept: local reranker failed: reranker model file not found: {missing}"]


@pytest.mark.anyio
async def test_local_without_llama_cpp_says_how_to_install_it(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "r.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # what an environment without it sees
    reranker = LocalGgufReranker(model_path=str(model))
    with pytest.raises(RerankerError) as info:
        await reranker.score("q", ["d"])
    assert str(info.value) == ("local reranker failed: llama-cpp-python is not installed "
                               "(pip install 'qmdbridge[local]')")
    await reranker.aclose()


@pytest.mark.local_model
@pytest.mark.anyio
async def test_local_refuses_an_embedding_model(local_model_path: Path) -> None:
    reranker = LocalGgufReranker(model_path=str(local_model_path))
    try:
        with pytest.raises(RerankerError) as info:
            await reranker.score("router", ["the router dropped the WAN link", "lunch"])
    finally:
        await reranker.aclose()
    assert str(info.value) == (
        f"local reranker failed: {local_model_path.name} is not a reranker model "
        "(bert.pooling_type is 1, a reranker GGUF declares 4 = rank); set query.rerank.model to "
        "a cross-encoder GGUF such as bge-reranker-v2-m3")
    assert info.value.provider == "local" and info.value.status is None


@pytest.mark.anyio
async def test_an_api_key_naming_an_unset_variable_is_not_sent_and_the_warning_names_it(
        ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fallback.settings import SecretRef
    from qmdbridge.config import resolve_agent

    monkeypatch.delenv("QB_RERANK_KEY", raising=False)
    base = await _baseline(ws)
    with serve(by_text) as srv:
        cfg = parse_config(substitute_env({"agents": {"defaults": {"memorySearch": {
            "provider": "none", "query": {"minScore": 0.1, "rerank": {
                "provider": "http", "model": "m", "baseUrl": srv.url, "apiKey": "${QB_RERANK_KEY}"}}}}}},
            {})[0])
        search = resolve_agent(cfg, workspace=str(ws)).memory_search
        assert search.query.rerank.api_key == SecretRef(source="env", id="QB_RERANK_KEY")
        engine = BuiltinEngine(EngineSettings.for_workspace(ws, search=search), now_ms=lambda: 1_770_681_600_000)
        try:
            outcome = await engine.search(SearchRequest.of("alpha"))
            monkeypatch.setenv("QB_RERANK_KEY", KEY)  # read when the reranker is made: the next engine
            engine2 = BuiltinEngine(EngineSettings.for_workspace(ws, search=search),
                                    now_ms=lambda: 1_770_681_600_000)
            try:
                assert (await engine2.search(SearchRequest.of("alpha"))).warnings == []
            finally:
                await engine2.close()
        finally:
            await engine.close()
    assert [(r.path, r.score) for r in outcome.results] == [(p, s) for p, s, _ in base]
    assert outcome.warnings == ["rerank skipped, fused order kept: http reranker failed: "
                                "query.rerank.apiKey names $QB_RERANK_KEY, which is not set"]
    assert [r.headers["authorization"] for r in srv.requests] == [f"Bearer {KEY}"]  # none as written

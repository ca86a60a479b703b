"""The builtin engine with an embedding provider that rate-limits, hangs or changes its vector
size, against a real HTTP server on 127.0.0.1 speaking the OpenAI wire: a search answers or
fails within ``query.timeoutMs``; keyword rows are written whatever the provider does and the
vectors are filled in by a later sync; status shows the backlog; a new vector size rebuilds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from fallback.embeddings import select_provider
from fallback.engine.builtin import BuiltinEngine
from fallback.errors import BackendUnavailableError
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.store.db import Store
from qmdbridge.problems import status_problems
from tests.fallback.embeddings_fake_server import Recorded, Reply, serve

pytestmark = pytest.mark.anyio

# A bound no healthy run comes near; the deadlines themselves are asserted through the answers.
GENEROUS_S = 30.0  # a hang guard, far above the 1 s query deadline the answers name
# A healthy provider's deadlines: a loaded machine can take over a second to answer a call to the
# server in this process, which the 1 s deadlines of the hang test would tell as the provider failing.
HEALTHY_TIMEOUT_S = 120
RATE_LIMITED = {"error": {"message": "Rate limit reached for requests"}}


class Upstream:
    """What the fake embedding server does now: ``ok`` (vectors of ``dims``), ``limited``
    (429 with Retry-After: 3600) or ``hang`` (no answer until the server stops)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.dims = 3

    def __call__(self, req: Recorded) -> Reply:
        if self.mode == "limited":
            return Reply(429, RATE_LIMITED, {"Retry-After": "3600"})
        if self.mode == "hang":
            return Reply(200, {"data": []}, delay_s=600)
        texts = req.json["input"]
        data = [{"index": i, "embedding": [1.0 + t.lower().count("kayak"), 1.0] + [0.5] * (self.dims - 2)}
                for i, t in enumerate(texts)]
        return Reply(200, {"data": data})


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "memory").mkdir(parents=True)
    (w / "MEMORY.md").write_text("# Boats\nThe kayak lives in the garage.\n")
    (w / "memory" / "2026-04-01.md").write_text("Router firmware updated.\n")
    return w


def _engine(ws: Path, url: str, *, batch_timeout_s: int = HEALTHY_TIMEOUT_S,
            timeout_ms: int = HEALTHY_TIMEOUT_S * 1000, **query: Any) -> BuiltinEngine:
    cfg = MemorySearchSettings.model_validate({
        "provider": "openai-compatible", "model": "mini-embed", "remote": {"baseUrl": url},
        "sync": {"embeddingBatchTimeoutSeconds": batch_timeout_s},
        "query": {"timeoutMs": timeout_ms, **query}})
    settings = EngineSettings.for_workspace(ws, search=cfg)
    return BuiltinEngine(settings, provider_selection=select_provider(cfg, env={}),
                         now_ms=lambda: 1_770_681_600_000)


async def _built(ws: Path, url: str) -> None:
    engine = _engine(ws, url)
    try:
        report = await engine.sync(reason="cli")
    finally:
        await engine.close()
    assert (report.chunks_pending, report.embedding_error) == (0, None)


async def test_rate_limited_provider_fails_fast_and_new_files_still_get_keyword_rows(ws: Path) -> None:
    upstream = Upstream()
    with serve(upstream, max_requests=1000) as srv:
        await _built(ws, srv.url)
        upstream.mode = "limited"
        (ws / "memory" / "2026-04-02.md").write_text("Paddle for the kayak ordered.\n")
        engine = _engine(ws, srv.url, keywordFallback=False)
        try:
            with anyio.fail_after(GENEROUS_S), pytest.raises(BackendUnavailableError) as info:
                await engine.search(SearchRequest.of("kayak paddle"))
            assert str(info.value) == (
                "memory search unavailable: openai-compatible: query embedding failed: "
                "openai-compatible embedding failed (HTTP 429): Rate limit reached for requests")
            calls = len(srv.requests)
            report = await engine.sync(reason="cli")  # what `qmdbridge index` runs
            assert len(srv.requests) == calls  # Retry-After is honoured: no call for an hour
            assert (report.files_indexed, report.chunks_written, report.chunks_pending) == (1, 1, 1)
            assert report.embedding_error is not None and "Retry-After asks to wait" in report.embedding_error
            status = await engine.status()
            assert status.dirty is True and status.healthy is False
            assert status.dirty_reason is not None
            assert status.dirty_reason.startswith("1 chunk waits for embeddings (openai-compatible "
                                                  "embedding failed (HTTP 429): Rate limit reached")
            assert (status.vector["pending"], status.vector["providerError"]) == (1, report.embedding_error)
            problems = status_problems(status.to_json_dict())
            assert [(p["check"], p["message"]) for p in problems] == [(
                "embedding provider", f"openai-compatible is failing: {report.embedding_error}; "
                "searches answer from keyword search only and 1 chunks wait for vectors")]
        finally:
            await engine.close()
        default = _engine(ws, srv.url)  # query.keywordFallback is on by default
        try:
            outcome = await default.search(SearchRequest.of("kayak paddle"))
            assert [h.path for h in outcome.results] == ["memory/2026-04-02.md"]
            assert outcome.warnings == [
                "query embedding failed: openai-compatible embedding failed (HTTP 429): Rate limit "
                "reached for requests; results come from keyword search only"]
        finally:
            await default.close()
        upstream.mode = "ok"  # the provider is back: the next sync fills the vector in
        engine = _engine(ws, srv.url)
        try:
            seen: list[tuple[int, int, int, int]] = []
            report = await engine.sync(reason="cli", progress=lambda *a: seen.append(a))
            assert (report.files_indexed, report.chunks_filled, report.chunks_pending) == (0, 1, 0)
            # the filled chunk is in the last progress report (`indexing: done, ... 1 embedded`)
            assert seen[-1] == (3, 3, 1, 0)  # files done, files, embedded, chunks written
            status = await engine.status()  # the last search's query embedding failed
            assert (status.dirty, status.healthy, status.vector["pending"]) == (False, False, 0)
            assert status.vector["providerError"] == (
                "query embedding failed: openai-compatible embedding failed (HTTP 429): Rate limit "
                "reached for requests")
            outcome = await engine.search(SearchRequest.of("kayak paddle", min_score=0.0))
            assert outcome.warnings == []
            status = await engine.status()
            assert (status.healthy, status.vector["providerError"]) == (True, None)
            assert outcome.results[0].path == "memory/2026-04-02.md"
            assert outcome.results[0].vector_score is not None and outcome.results[0].vector_score > 0
        finally:
            await engine.close()


async def test_a_provider_that_never_answers_costs_a_search_its_deadline_only(ws: Path) -> None:
    upstream = Upstream()
    upstream.mode = "hang"
    with serve(upstream, max_requests=1000) as srv:
        engine = _engine(ws, srv.url, batch_timeout_s=1, timeout_ms=1000,
                         keywordFallback=False)  # an empty index: the first
        try:  # search bootstraps it
            with anyio.fail_after(GENEROUS_S), pytest.raises(BackendUnavailableError) as info:
                await engine.search(SearchRequest.of("kayak"))
            assert str(info.value) == (
                "memory search unavailable: openai-compatible: query embedding failed: "
                "openai-compatible embedding failed: query embedding timed out after 1000 ms "
                "(query.timeoutMs)")
        finally:
            await engine.close()
        opted = _engine(ws, srv.url, batch_timeout_s=1, timeout_ms=1000)  # the default: keyword-only
        try:
            with anyio.fail_after(GENEROUS_S):
                outcome = await opted.search(SearchRequest.of("kayak"))
            assert [h.path for h in outcome.results] == ["MEMORY.md"]  # bootstrapped, keyword rows
            assert outcome.warnings == [
                "query embedding failed: openai-compatible embedding failed: query embedding timed "
                "out after 1000 ms (query.timeoutMs); results come from keyword search only"]
            status = await opted.status()
            assert (status.files, status.chunks, status.dirty, status.vector["pending"]) == (2, 2, True, 2)
            assert status.dirty_reason == "2 chunks wait for embeddings"  # the deadline, no error
            hang = ("query embedding failed: openai-compatible embedding failed: query embedding "
                    "timed out after 1000 ms (query.timeoutMs)")
            assert (status.healthy, status.vector["providerError"]) == (False, hang)
            assert [(p["check"], p["message"]) for p in status_problems(status.to_json_dict())] == [
                ("embedding provider", f"openai-compatible is failing: {hang}; searches answer "
                 "from keyword search only and 2 chunks wait for vectors")]
        finally:
            await opted.close()
        upstream.mode = "ok"  # the query is embedded; the backlog waits for a sync
        back = _engine(ws, srv.url)
        try:
            outcome = await back.search(SearchRequest.of("kayak"), sync_budget_ms=0)
            assert outcome.warnings == ["2 chunks wait for embeddings: they are found by keyword "
                                        "search only until a sync embeds them (run `qmdbridge index`)"]
        finally:
            await back.close()


async def test_new_vector_size_under_the_same_model_rebuilds_the_index(ws: Path) -> None:
    upstream = Upstream()
    with serve(upstream, max_requests=1000) as srv:
        await _built(ws, srv.url)
        upstream.dims = 5  # the server now runs another model under the same id
        engine = _engine(ws, srv.url)
        try:
            outcome = await engine.search(SearchRequest.of("kayak", min_score=0.0), sync_budget_ms=0)
            assert [h.path for h in outcome.results] == ["MEMORY.md"]  # the old index, keywords
            assert outcome.warnings == [
                "embedding dimensions changed (3 -> 5, model mini-embed): results come from "
                "keyword search only until the index is rebuilt"]
            status = await engine.status()
            assert (status.dirty, status.dirty_reason) == (
                True, "rebuild pending: embedding dimensions changed (3 -> 5)")
            report = await engine.sync(reason="cli")
            assert (report.full, report.full_reason) == (True, "embedding dimensions changed (3 -> 5)")
            outcome = await engine.search(SearchRequest.of("kayak", min_score=0.0))
            assert outcome.warnings == []
            assert outcome.results[0].path == "MEMORY.md" and outcome.results[0].vector_score
        finally:
            await engine.close()
        store = Store(engine.settings.db_path)
        try:  # no vector of the old size survives (the embedding cache had them too)
            assert store.query("SELECT DISTINCT dims FROM chunks") == [(5,)]
            assert store.get_meta_json("memory_index_meta_v1")["vectorDims"] == 5
        finally:
            store.close()


async def test_vector_size_change_seen_by_a_sync_rebuilds(ws: Path) -> None:
    upstream = Upstream()
    with serve(upstream, max_requests=1000) as srv:
        await _built(ws, srv.url)
        upstream.dims = 4
        (ws / "memory" / "2026-04-03.md").write_text("New kayak trailer.\n")
        engine = _engine(ws, srv.url)  # `qmdbridge index`: no query embedding comes first
        try:
            report = await engine.sync(reason="cli")
            assert (report.full, report.full_reason) == (True, "embedding dimensions changed (3 -> 4)")
            assert (report.files_total, report.chunks_pending) == (3, 0)
        finally:
            await engine.close()

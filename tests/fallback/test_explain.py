"""``search --explain``: the ranking trace of the builtin engine on a tiny synthetic workspace,
with exact values for every step (keyword BM25, vector cosine, fusion, decay, MMR, floor)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.search.fts import analyze_fts_query
from fallback.search.keyword import keyword_rows
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.store.db import Store
from tests.fallback.count_provider import CountProvider

pytestmark = pytest.mark.anyio

# 2026-02-10T00:00:00Z: memory/2026-02-09.md is 1 day old, memory/2026-01-12.md 29 days.
NOW_MS = 1_770_681_600_000


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "memory").mkdir()
    (tmp_path / "MEMORY.md").write_text("# Facts\nBeta alpha knowledge base entry.\n")
    (tmp_path / "memory" / "2026-01-12.md").write_text("# Log\nAlpha memory line.\n")
    (tmp_path / "memory" / "2026-02-09.md").write_text("# Log\nAlpha alpha beta notes.\n")
    return tmp_path


def _engine(ws: Path, *, embeddings: bool, **query: Any) -> BuiltinEngine:
    search = MemorySearchSettings.model_validate(
        {"provider": "openai" if embeddings else "none", "query": {"minScore": 0.1, **query}})
    sel = (ProviderSelection(CountProvider(), "test-count", unavailable_reason=None) if embeddings
           else ProviderSelection(None, "none", unavailable_reason="provider set to none"))
    return BuiltinEngine(EngineSettings.for_workspace(ws, search=search), provider_selection=sel,
                         now_ms=lambda: NOW_MS)


def _bm25(engine: BuiltinEngine, query: str) -> dict[str, float]:
    """The raw FTS5 bm25() of each keyword hit, straight from the store, by path."""
    store = Store(engine.settings.db_path)
    try:
        plan = analyze_fts_query(query).plan()
        assert plan is not None
        return {r[1]: r[6] for r in keyword_rows(store, plan, sources=["memory"], limit=10)}
    finally:
        store.close()


async def test_hybrid_explain_with_decay_and_mmr(ws: Path) -> None:
    engine = _engine(ws, embeddings=True, hybrid={"mmr": {"enabled": True, "lambda": 0.7},
                                              "temporalDecay": {"enabled": True}})
    try:
        outcome = await engine.search(SearchRequest.of("alpha", explain=True))
        bm25 = _bm25(engine, "alpha")
    finally:
        await engine.close()
    assert outcome.warnings == []
    paths = [r.path for r in outcome.results]
    assert paths == ["memory/2026-02-09.md", "MEMORY.md", "memory/2026-01-12.md"]
    ex = {r.path: r.explain for r in outcome.results}
    assert all(e is not None and e.mode == "hybrid" for e in ex.values())
    newest, facts, oldest = ex["memory/2026-02-09.md"], ex["MEMORY.md"], ex["memory/2026-01-12.md"]
    assert newest and facts and oldest
    # vector side: cosine of [2,1], [1,1], [1,0] with the query [1,0], ranked by cosine
    assert (oldest.vector and oldest.vector.rank, newest.vector and newest.vector.rank,
            facts.vector and facts.vector.rank) == (1, 2, 3)
    assert oldest.vector and oldest.vector.cosine == pytest.approx(1.0, abs=1e-6)
    assert newest.vector and newest.vector.cosine == pytest.approx(2 / math.sqrt(5), abs=1e-6)
    assert facts.vector and facts.vector.cosine == pytest.approx(1 / math.sqrt(2), abs=1e-6)
    # keyword side: the store's own bm25() values, in BM25 order
    for path, e in ex.items():
        assert e and e.keyword and e.keyword.bm25 == bm25[path]
    assert [ex[p].keyword.rank for p in sorted(bm25, key=bm25.__getitem__)] == [1, 2, 3]  # type: ignore[union-attr]
    # fusion evidence: the cosine's standard score over the three chunks, divided by the
    # sqrt(2) that three values allow at most; text scores divided by the best keyword hit's
    cosines = [1.0, 2 / math.sqrt(5), 1 / math.sqrt(2)]
    mean = sum(cosines) / 3
    std = math.sqrt(sum((c - mean) ** 2 for c in cosines) / 3)
    best_text = max(e.keyword.text_score for e in ex.values())  # type: ignore[union-attr]
    for path, r in zip(paths, outcome.results, strict=True):
        e = ex[path]
        assert e and e.fusion and e.vector and e.keyword and e.decay and e.mmr
        assert (e.fusion.method, e.fusion.vector_weight, e.fusion.text_weight) == ("scores", 0.7, 0.3)
        v, t = e.fusion.vector_evidence, e.fusion.text_evidence
        assert v == pytest.approx(max(0.0, min(1.0, (e.vector.cosine - mean) / std / math.sqrt(2))), abs=1e-6)
        assert t == pytest.approx(e.keyword.text_score / best_text)
        # calibrated score: 0.5 x max(v, t) + 0.5 x (0.7 v + 0.3 t); decay multiplies; MMR keeps scores
        assert e.fusion.score == pytest.approx(0.5 * max(v, t) + 0.5 * (0.7 * v + 0.3 * t))
        assert e.decay.score == pytest.approx(e.fusion.score * e.decay.factor)
        assert r.score == pytest.approx(e.decay.score)
        assert (r.vector_score, r.text_score) == (pytest.approx(e.vector.cosine), e.keyword.text_score)
        assert e.rerank is None
        assert e.mmr.lambda_ == 0.7 and e.mmr.rank_after == e.rank
        assert e.floor.kept and e.floor.min_score == 0.1 and e.floor.relaxed_floor is None
        assert e.floor.reason == f"calibrated score {e.fusion.score:.4f} >= minScore 0.1"
    # decay: dated by the file name, age in days at NOW_MS; MEMORY.md is evergreen
    assert (newest.decay and newest.decay.age_days, newest.decay and newest.decay.dated_by) == (1.0, "name")
    assert newest.decay and newest.decay.factor == pytest.approx(0.5 ** (1 / 30), rel=1e-12)
    assert oldest.decay and (oldest.decay.age_days, oldest.decay.half_life_days) == (29.0, 30.0)
    assert oldest.decay.factor == pytest.approx(0.5 ** (29 / 30), rel=1e-12)
    assert facts.decay and (facts.decay.age_days, facts.decay.factor, facts.decay.dated_by) == (None, 1.0, None)
    # the oldest note had the best fusion score and fell to last through decay
    assert oldest.fusion and newest.fusion and oldest.fusion.score > newest.fusion.score
    assert [ex[p].rank for p in paths] == [1, 2, 3]  # type: ignore[union-attr]


async def test_fts_only_explain_and_the_floor_fallback(ws: Path) -> None:
    # Keyword scores are relative to the best hit (fallback/search/keyword.py), so the best one
    # scores 1 and passes any minScore; the floor runs before decay, so with decay that hit
    # still passes (and nothing else does), its returned score decayed below minScore.
    engine = _engine(ws, embeddings=False)
    decayed = _engine(ws, embeddings=False,
                      hybrid={"temporalDecay": {"enabled": True, "halfLifeDays": 30}})
    try:
        outcome = await engine.search(SearchRequest.of("alpha", explain=True, min_score=0.99))
        plain = await engine.search(SearchRequest.of("alpha", min_score=0.99))
        fallback = await decayed.search(SearchRequest.of("alpha", explain=True, min_score=0.99))
        bm25 = _bm25(engine, "alpha")
    finally:
        await engine.close()
        await decayed.close()
    assert [r.path for r in outcome.results] == [r.path for r in plain.results]
    assert all(r.explain is None for r in plain.results)
    first = outcome.results[0].explain
    assert first is not None
    assert first.model_dump(by_alias=True) == {
        "mode": "fts-only",
        "keyword": {"rank": first.keyword and first.keyword.rank,
                    "bm25": bm25[outcome.results[0].path],
                    "textScore": outcome.results[0].score},
        "vector": None, "fusion": None, "decay": None, "rerank": None, "mmr": None,
        "floor": {"minScore": 0.99, "relaxedFloor": None, "kept": True,
                  "reason": "score 1.0000 >= minScore 0.99"},
        "rank": 1,
    }
    [kept] = fallback.results
    assert kept.path == outcome.results[0].path and kept.explain is not None and kept.explain.decay
    assert kept.score == pytest.approx(kept.explain.decay.factor) and kept.score < 0.99
    assert kept.explain.floor.reason == "score 1.0000 >= minScore 0.99"


async def test_hybrid_floor_is_on_the_calibrated_score(ws: Path) -> None:
    # A minScore between the two best calibrated scores keeps exactly the best hit: the floor
    # needs no relaxed keyword floor, and the reason quotes the calibrated score.
    engine = _engine(ws, embeddings=True)
    try:
        wide = await engine.search(SearchRequest.of("alpha", explain=True, min_score=0.0))
        scores = [r.score for r in wide.results]
        floor = (scores[0] + scores[1]) / 2
        outcome = await engine.search(SearchRequest.of("alpha", explain=True, min_score=floor))
    finally:
        await engine.close()
    assert len(scores) == 3 and scores == sorted(scores, reverse=True) and scores[0] > scores[1]
    assert [r.path for r in outcome.results] == [wide.results[0].path]
    [hit] = outcome.results
    e = hit.explain
    assert e is not None and e.mode == "hybrid" and e.fusion and e.decay is None and e.mmr is None
    v, t = e.fusion.vector_evidence, e.fusion.text_evidence
    assert hit.score == e.fusion.score == pytest.approx(0.5 * max(v, t) + 0.5 * (0.7 * v + 0.3 * t))
    assert (e.floor.min_score, e.floor.relaxed_floor, e.floor.kept) == (floor, None, True)
    assert e.floor.reason == f"calibrated score {hit.score:.4f} >= minScore {floor:g}"

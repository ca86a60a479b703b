"""Hybrid fusion (``fallback/search/fusion.py``): evidence per side, the calibrated score, the floor
before decay and the session share of the result slots, with hand-computed values."""

from __future__ import annotations

import datetime as dt

import pytest

from fallback.search.fusion import (
    CosineStats,
    apply_floor,
    calibrated_score,
    fuse,
    rank_evidence,
    select_results,
    text_evidence,
    vector_evidence,
)
from fallback.search.ranking import Candidate, apply_temporal_decay


def cand(chunk_id: str, score: float, *, snippet: str = "", path: str = "memory/a.md",
         start: int = 1, end: int = 5, source: str = "memory", vector: float = 0.0,
         text: float = 0.0) -> Candidate:
    return Candidate(chunk_id=chunk_id, path=path, source=source, start_line=start, end_line=end,
                     snippet=snippet, score=score, vector_score=vector, text_score=text)


def test_text_evidence_is_relative_to_the_best_keyword_hit():
    assert text_evidence([0.8, 0.4, 0.0]) == pytest.approx([1.0, 0.5, 0.0])
    assert text_evidence([float("nan"), 0.5, -1.0]) == [0.0, 1.0, 0.0]
    assert text_evidence([0.0, 0.0]) == [0.0, 0.0]
    assert text_evidence([]) == []


def test_vector_evidence_is_the_standard_score_over_the_collection():
    # z = (cos - 0.1) / 0.1: 3.5, 1.75, 0, -1, 8 -> evidence z / 3.5, clamped to [0, 1]
    stats = CosineStats(mean=0.1, std=0.1, count=100)
    assert vector_evidence([0.45, 0.275, 0.1, 0.0, 0.9], stats) == pytest.approx([1.0, 0.5, 0.0, 0.0, 1.0])
    # the same spread on a large model's scale gives the same evidence
    assert vector_evidence([0.8525, 0.82625], CosineStats(mean=0.8, std=0.015, count=100)) == pytest.approx(
        [1.0, 0.5])
    # five chunks: no value can stand more than sqrt(4) = 2 deviations out, so 2 is full evidence
    assert vector_evidence([0.3, 0.2], CosineStats(mean=0.1, std=0.1, count=5)) == pytest.approx([1.0, 0.5])
    # no spread, or a single chunk: no standard score, the cosine itself is the evidence
    assert vector_evidence([0.3, 1.2], CosineStats(mean=0.3, std=0.0, count=10)) == [0.3, 1.0]
    assert vector_evidence([0.3], CosineStats(mean=0.3, std=0.0, count=1)) == [0.3]
    # a cosine of 0 or less is never evidence, however far it stands above the others
    assert vector_evidence([0.0, -0.1], CosineStats(mean=-0.5, std=0.1, count=100)) == [0.0, 0.0]
    assert vector_evidence([0.0], CosineStats(mean=0.0, std=0.0, count=1)) == [0.0]
    assert vector_evidence([float("nan")], stats) == [0.0]


def test_rank_evidence_is_scaled_reciprocal_rank():
    assert rank_evidence(3, k=60) == pytest.approx([1.0, 61 / 62, 61 / 63])
    assert rank_evidence(2, k=1) == pytest.approx([1.0, 2 / 3])
    assert rank_evidence(0) == []


def test_calibrated_score_formula():
    # 0.5 * max(v, t) + 0.5 * (0.7 v + 0.3 t)
    assert calibrated_score(1.0, 0.0, vector_weight=0.7, text_weight=0.3) == pytest.approx(0.85)
    assert calibrated_score(0.0, 1.0, vector_weight=0.7, text_weight=0.3) == pytest.approx(0.65)
    assert calibrated_score(1.0, 1.0, vector_weight=0.7, text_weight=0.3) == pytest.approx(1.0)
    assert calibrated_score(0.5, 0.5, vector_weight=0.7, text_weight=0.3) == pytest.approx(0.5)
    assert calibrated_score(0.0, 0.0, vector_weight=0.7, text_weight=0.3) == 0.0
    # both weights 0 count as equal weights; out-of-range evidence is clamped
    assert calibrated_score(1.0, 0.0, vector_weight=0.0, text_weight=0.0) == pytest.approx(0.75)
    assert calibrated_score(1.5, -2.0, vector_weight=0.5, text_weight=0.5) == pytest.approx(0.75)


def test_fuse_two_lists_by_scores():
    vec = [cand("a", 0.5), cand("b", 0.3), cand("c", 0.1)]
    kw = [cand("b", 1.0, snippet="kw-b"), cand("d", 0.5)]
    # std 0.4 / 3.5: a stands 3.5 deviations above the mean (full evidence), b half as far
    fused = fuse(vec, kw, method="scores", vector_weight=0.7, text_weight=0.3,
                 cosine_stats=CosineStats(mean=0.1, std=0.4 / 3.5, count=100))
    assert [c.chunk_id for c in fused] == ["a", "b", "d", "c"]
    # a: v 1, t 0 -> 0.85; b: v 0.5, t 1 -> 0.5 + 0.5 * 0.65; d: v 0, t 0.5 -> 0.25 + 0.075; c: 0
    assert [c.score for c in fused] == pytest.approx([0.85, 0.825, 0.325, 0.0])
    assert [c.vector_evidence for c in fused] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert [c.text_evidence for c in fused] == [0.0, 1.0, 0.5, 0.0]
    assert [(c.vector_score, c.text_score) for c in fused] == [(0.5, 0.0), (0.3, 1.0), (0.0, 0.5), (0.1, 0.0)]
    assert fused[1].snippet == "kw-b"
    assert vec[0].score == 0.5 and vec[0].vector_evidence == 0.0  # inputs untouched


def test_fuse_two_lists_by_ranks():
    vec = [cand("a", 0.5), cand("b", 0.3), cand("c", 0.1)]
    kw = [cand("b", 1.0), cand("d", 0.5)]
    fused = fuse(vec, kw, method="rrf", vector_weight=0.7, text_weight=0.3)
    e2, e3 = 61 / 62, 61 / 63
    expected = {"a": 0.5 + 0.5 * 0.7,
                "b": 0.5 * 1.0 + 0.5 * (0.7 * e2 + 0.3),
                "c": 0.5 * e3 + 0.5 * 0.7 * e3,
                "d": 0.5 * e2 + 0.5 * 0.3 * e2}
    assert [c.chunk_id for c in fused] == ["b", "a", "c", "d"]
    assert [c.score for c in fused] == pytest.approx([expected[c.chunk_id] for c in fused])


def test_fuse_specific_fields_win_and_duplicates_keep_the_first():
    vec = [cand("a", 0.0, vector=0.6), cand("a", 0.9), cand("b", 0.0, vector=0.2)]
    kw = [cand("b", 0.0, text=0.4), cand("b", 1.0)]
    # without collection statistics they come from the candidates: mean 0.4, std 0.2, two
    # values (full evidence at sqrt(1) = 1 deviation)
    fused = fuse(vec, kw, method="scores", vector_weight=0.5, text_weight=0.5)
    by_id = {c.chunk_id: c for c in fused}
    assert (by_id["a"].vector_score, by_id["b"].vector_score, by_id["b"].text_score) == (0.6, 0.2, 0.4)
    assert (by_id["a"].vector_evidence, by_id["b"].vector_evidence, by_id["b"].text_evidence) == (
        pytest.approx(1.0), 0.0, 1.0)


def test_floor_keeps_a_strong_one_sided_hit():
    # A small local model: the true match has cosine 0.42, the collection's mean is 0.05; an
    # exact keyword hit elsewhere has a cosine of 0.02. The reference's weighted sum
    # (0.7 x cosine + 0.3 x text score) scored them 0.294 and 0.284, and minScore 0.35 lost both.
    vec = [cand("para", 0.42), cand("x", 0.21), cand("y", 0.12), cand("z", 0.05), cand("exact", 0.02)]
    kw = [cand("exact", 0.9)]
    fused = fuse(vec, kw, method="scores", vector_weight=0.7, text_weight=0.3,
                 cosine_stats=CosineStats(mean=0.05, std=0.08, count=500))
    # v = (cos - 0.05) / 0.08 / 3.5: para 1 (clamped), x 2/3.5, y 0.875/3.5, z and exact 0;
    # t(exact) 1; a hit on the vector side alone scores 0.5 v + 0.5 x 0.7 v = 0.85 v
    assert {c.chunk_id: c.score for c in fused} == pytest.approx(
        {"para": 0.85, "exact": 0.65, "x": 0.85 * 2 / 3.5, "y": 0.85 * 0.875 / 3.5, "z": 0.0})
    kept = apply_floor(fused, 0.35)
    assert [c.chunk_id for c in kept] == ["para", "exact", "x"]


def test_keyword_side_abstaining_gives_its_weight_to_the_vector_side():
    fused = fuse([cand("p", 0.31), cand("q", 0.11)], [], method="scores", vector_weight=0.7,
                 text_weight=0.3)
    assert [(c.chunk_id, c.score) for c in fused] == [("p", 1.0), ("q", 0.0)]
    fused = fuse([], [cand("k", 0.4)], method="scores", vector_weight=0.7, text_weight=0.3)
    assert [(c.chunk_id, c.score) for c in fused] == [("k", 1.0)]


def test_decay_after_the_floor_keeps_an_old_full_match():
    now = int(dt.datetime(2026, 6, 1, tzinfo=dt.timezone.utc).timestamp() * 1000)
    kw = [cand("old", 1.0, path="memory/2026-01-01.md"), cand("new", 0.5, path="memory/2026-05-31.md")]
    kept = apply_floor(fuse([], kw, method="scores", vector_weight=0.7, text_weight=0.3), 0.35)
    assert [(c.chunk_id, c.score) for c in kept] == [("old", 1.0), ("new", 0.5)]
    decayed = apply_temporal_decay(kept, half_life_days=30, now_ms=now, mtime_ms=lambda s, p: None)
    # 151 and 1 days old: the old full match drops to 0.03 (under minScore) and stays
    assert [c.chunk_id for c in decayed] == ["new", "old"]
    assert [c.score for c in decayed] == pytest.approx([0.5 * 0.5 ** (1 / 30), 0.5 ** (151 / 30)])


def test_select_holds_sessions_to_half_the_slots():
    ranked = [cand("s1", 0.9, source="sessions"), cand("s2", 0.8, source="sessions"),
              cand("s3", 0.7, source="sessions"), cand("m1", 0.6), cand("s4", 0.5, source="sessions"),
              cand("m2", 0.4), cand("m3", 0.3)]
    assert [c.chunk_id for c in select_results(ranked, max_results=4)] == ["s1", "s2", "m1", "m2"]
    assert [c.chunk_id for c in select_results(ranked, max_results=6)] == ["s1", "s2", "s3", "m1", "m2", "m3"]
    assert [c.chunk_id for c in select_results(ranked, max_results=1)] == ["m1"]


def test_select_sessions_fill_the_slots_when_nothing_else_matches():
    ranked = [cand("s1", 0.9, source="sessions"), cand("s2", 0.8, source="sessions"),
              cand("s3", 0.7, source="sessions"), cand("m1", 0.6)]
    # cap floor(5 / 2) = 2; only one memory hit, so s3 takes a remaining slot, order kept
    assert [c.chunk_id for c in select_results(ranked, max_results=5)] == ["s1", "s2", "s3", "m1"]
    only = [cand("s1", 0.9, source="sessions"), cand("s2", 0.8, source="sessions")]
    assert [c.chunk_id for c in select_results(only, max_results=1)] == ["s1"]
    assert select_results(ranked, max_results=0) == []


def test_select_collapses_near_duplicate_chunks_of_one_transcript():
    repeat = "the garage door code is in your notes, the garage door code again"
    ranked = [cand("t1", 0.9, source="sessions", path="sessions/t.jsonl", snippet=repeat + " 1"),
              cand("t2", 0.8, source="sessions", path="sessions/t.jsonl", snippet=repeat + " 2"),
              cand("u1", 0.7, source="sessions", path="sessions/u.jsonl", snippet=repeat + " 3"),
              cand("t3", 0.6, source="sessions", path="sessions/t.jsonl",
                   snippet="we fixed the garage door opener battery on Sunday"),
              cand("m1", 0.5, path="MEMORY.md", snippet=repeat),
              cand("m2", 0.4, path="MEMORY.md", snippet=repeat)]
    # t2 repeats t1 (same transcript): dropped; u1 is another transcript and t3 says something
    # else; memory chunks are never collapsed
    assert [c.chunk_id for c in select_results(ranked, max_results=6)] == [
        "t1", "u1", "t3", "m1", "m2"]
    assert [c.chunk_id for c in select_results(ranked, max_results=2)] == ["t1", "m1"]

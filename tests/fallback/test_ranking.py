"""Hybrid merge and result selection (spec §8.5, §12 cases 24-25)."""

from __future__ import annotations

import pytest

from fallback.search.ranking import Candidate, merge_hybrid, select_results


def cand(chunk_id: str, score: float, *, snippet: str = "", path: str = "memory/a.md",
         start: int = 1, end: int = 5, source: str = "memory") -> Candidate:
    return Candidate(chunk_id=chunk_id, path=path, source=source, start_line=start, end_line=end,
                     snippet=snippet, score=score)


def test_merge_disjoint_hits_weighted():
    merged = merge_hybrid([cand("a", 0.9)], [cand("b", 1.0)], vector_weight=0.7, text_weight=0.3)
    assert [c.chunk_id for c in merged] == ["a", "b"]
    assert merged[0].score == pytest.approx(0.63, abs=1e-12)
    assert merged[1].score == pytest.approx(0.3, abs=1e-12)
    assert (merged[0].vector_score, merged[0].text_score) == (0.9, 0.0)
    assert (merged[1].vector_score, merged[1].text_score) == (0.0, 1.0)


def test_merge_same_id_keyword_snippet_wins():
    merged = merge_hybrid([cand("a", 0.2, snippet="vec-a")], [cand("a", 1.0, snippet="kw-a")],
                          vector_weight=0.5, text_weight=0.5)
    assert len(merged) == 1
    assert merged[0].snippet == "kw-a"
    assert merged[0].score == pytest.approx(0.6, abs=1e-12)


def test_merge_empty_keyword_snippet_keeps_vector_snippet():
    merged = merge_hybrid([cand("a", 0.4, snippet="vec-a")], [cand("a", 0.5, snippet="")],
                          vector_weight=0.5, text_weight=0.5)
    assert merged[0].snippet == "vec-a"
    assert merged[0].score == pytest.approx(0.45, abs=1e-12)


def test_merge_sorted_desc_and_inputs_untouched():
    vec = [cand("a", 0.1), cand("b", 0.8)]
    kw = [cand("c", 0.9), cand("b", 0.2)]
    merged = merge_hybrid(vec, kw, vector_weight=0.7, text_weight=0.3)
    assert [c.chunk_id for c in merged] == ["b", "c", "a"]
    assert [c.score for c in merged] == pytest.approx([0.62, 0.27, 0.07])
    assert vec[1].score == 0.8 and vec[1].text_score == 0.0
    assert kw[0].vector_score == 0.0 and kw[0].text_score == 0.0


def test_merge_specific_fields_win_over_score():
    v = Candidate("a", "p.md", "memory", 1, 2, "", score=0.0, vector_score=0.5)
    k = Candidate("a", "p.md", "memory", 1, 2, "", score=0.0, text_score=0.25)
    merged = merge_hybrid([v], [k], vector_weight=0.5, text_weight=0.5)
    assert merged[0].score == pytest.approx(0.375)


def test_select_strict_threshold_and_limit():
    merged = [cand("a", 0.9), cand("b", 0.5), cand("c", 0.4), cand("d", 0.1)]
    out = select_results(merged, [], min_score=0.35, text_weight=0.3, max_results=2)
    assert [c.chunk_id for c in out] == ["a", "b"]


def test_select_relaxed_for_keyword_hits_when_nothing_passes():
    kw = [cand("k", 1.0, path="memory/2026-01-12.md", start=1, end=4)]
    merged = [cand("v", 0.2, path="memory/other.md"),
              cand("k", 0.3, path="memory/2026-01-12.md", start=1, end=4),
              cand("k2", 0.29, path="memory/2026-01-12.md", start=5, end=9)]
    out = select_results(merged, kw, min_score=0.35, text_weight=0.3, max_results=6)
    assert [c.chunk_id for c in out] == ["k"]


def test_select_relaxed_floor_respects_text_weight():
    kw = [cand("k", 1.0)]
    merged = [cand("k", 0.29)]
    assert select_results(merged, kw, min_score=0.35, text_weight=0.3, max_results=6) == []


def test_select_no_keyword_hits_means_nothing_relaxed():
    merged = [cand("v", 0.2)]
    assert select_results(merged, [], min_score=0.35, text_weight=0.3, max_results=6) == []


def test_select_non_positive_limit():
    assert select_results([cand("a", 1.0)], [], min_score=0.0, text_weight=0.3,
                          max_results=0) == []

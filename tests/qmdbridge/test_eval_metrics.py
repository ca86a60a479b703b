"""The pure metric functions of ``qmdbridge.evaluation.metrics`` on hand-built hits."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fallback.models import MemorySearchResult
from qmdbridge.evaluation.metrics import (
    EvalQuestion,
    Evidence,
    EvidenceOutcome,
    QuestionOutcome,
    collapse_whitespace,
    covers_evidence,
    first_rank,
    judge,
    names_evidence_file,
    percentile,
    recall_at,
    snippet_holds_evidence,
    summarize,
)


@dataclass(frozen=True)
class Hit:
    path: str
    start_line: int
    end_line: int
    snippet: str = ""


def test_covers_evidence_needs_the_same_path_and_the_line_inside_the_range() -> None:
    hit = Hit("memory/2024-01-02.md", 4, 9)
    assert covers_evidence(hit, Evidence("memory/2024-01-02.md", 4))
    assert covers_evidence(hit, Evidence("memory/2024-01-02.md", 9))
    assert not covers_evidence(hit, Evidence("memory/2024-01-02.md", 3))
    assert not covers_evidence(hit, Evidence("memory/2024-01-02.md", 10))
    assert not covers_evidence(hit, Evidence("memory/2024-01-03.md", 5))
    assert covers_evidence(hit, Evidence("memory/2024-01-02.md", None))  # no line: the path is enough
    assert names_evidence_file(hit, Evidence("memory/2024-01-02.md", 100))
    assert not names_evidence_file(hit, Evidence("MEMORY.md", 5))


def test_snippet_match_collapses_whitespace_and_keeps_case() -> None:
    hit = Hit("a.md", 1, 3, "Ana:  went to\nthe   lighthouse\ttour")
    assert snippet_holds_evidence(hit, Evidence("a.md", 1, "went to the lighthouse tour"))
    assert snippet_holds_evidence(hit, Evidence("a.md", 1, "  went\n to  the "))
    assert not snippet_holds_evidence(hit, Evidence("a.md", 1, "Went to the lighthouse"))
    assert not snippet_holds_evidence(hit, Evidence("a.md", 1, "lighthouse tours"))
    assert not snippet_holds_evidence(hit, Evidence("a.md", 1, None))
    assert not snippet_holds_evidence(hit, Evidence("a.md", 1, " \n "))
    assert collapse_whitespace("  a \t b\n\nc ") == "a b c"


def test_first_rank_is_one_based() -> None:
    hits = [Hit("a.md", 1, 2), Hit("b.md", 5, 8), Hit("b.md", 1, 4)]
    assert first_rank(hits, Evidence("b.md", 3), covers_evidence) == 3
    assert first_rank(hits, Evidence("b.md", 3), names_evidence_file) == 2
    assert first_rank(hits, Evidence("c.md", 3), names_evidence_file) is None
    assert first_rank([], Evidence("a.md", 1), covers_evidence) is None


def test_judge_ranks_every_evidence_item_and_counts_lines() -> None:
    question = EvalQuestion("when was the tour?", (
        Evidence("b.md", 6, "lighthouse tour"),   # file at rank 2, line at rank 2, text at rank 3
        Evidence("a.md", 9, "never written"),     # file at rank 1, line nowhere, text nowhere
        Evidence("c.md", None, None)),            # nowhere; no text
        category="temporal")
    hits = [Hit("a.md", 1, 4, "intro"), Hit("b.md", 5, 8, "lighthouse"),
            Hit("b.md", 1, 1, "the lighthouse  tour")]
    out = judge(question, hits, latency_ms=12.5)
    assert out == QuestionOutcome(
        category="temporal",
        evidence=(EvidenceOutcome(line_rank=2, file_rank=2, snippet_rank=3, has_text=True),
                  EvidenceOutcome(line_rank=None, file_rank=1, snippet_rank=None, has_text=True),
                  EvidenceOutcome(line_rank=None, file_rank=None, snippet_rank=None, has_text=False)),
        hit_lines=(4, 4, 1), latency_ms=12.5)


def test_judge_accepts_the_shared_result_model() -> None:
    hit = MemorySearchResult(path="memory/x.md", start_line=2, end_line=6, score=0.5, snippet="Bo: hi there")
    out = judge(EvalQuestion("hi", (Evidence("memory/x.md", 6, "hi there"),)), [hit], latency_ms=1.0)
    assert out.evidence[0] == EvidenceOutcome(line_rank=1, file_rank=1, snippet_rank=1, has_text=True)
    assert out.hit_lines == (5,)


def _item(line_rank: int | None) -> EvidenceOutcome:
    return EvidenceOutcome(line_rank=line_rank, file_rank=line_rank, snippet_rank=None, has_text=False)


def test_recall_at_counts_ranks_up_to_k() -> None:
    items = [_item(1), _item(3), _item(6), _item(None)]
    assert recall_at(items, 1, lambda e: e.line_rank) == 0.25
    assert recall_at(items, 3, lambda e: e.line_rank) == 0.5
    assert recall_at(items, 5, lambda e: e.line_rank) == 0.5
    assert recall_at(items, 10, lambda e: e.line_rank) == 0.75
    assert recall_at([], 5, lambda e: e.line_rank) is None
    with pytest.raises(ValueError, match="k must be >= 1, not 0"):
        recall_at(items, 0, lambda e: e.line_rank)


def test_percentile_interpolates_linearly() -> None:
    assert percentile([40.0, 10.0, 30.0, 20.0], 50) == 25.0
    assert percentile([10.0, 20.0, 30.0, 40.0], 95) == pytest.approx(38.5)
    assert percentile([10.0, 20.0, 30.0, 40.0], 0) == 10.0
    assert percentile([10.0, 20.0, 30.0, 40.0], 100) == 40.0
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match="within \\[0, 100\\]"):
        percentile([1.0], 101)


def test_summarize_hand_checked_run() -> None:
    q1 = QuestionOutcome("single-hop", (
        EvidenceOutcome(line_rank=1, file_rank=1, snippet_rank=1, has_text=True),), (10, 10), 4.0)
    q2 = QuestionOutcome("multi-hop", (
        EvidenceOutcome(line_rank=4, file_rank=2, snippet_rank=6, has_text=True),
        EvidenceOutcome(line_rank=None, file_rank=7, snippet_rank=None, has_text=False)), (5,), 8.0)
    q3 = QuestionOutcome(None, (
        EvidenceOutcome(line_rank=None, file_rank=None, snippet_rank=None, has_text=True),), (), 6.0)
    m = summarize([q1, q2, q3], categories=["multi-hop", "temporal", "single-hop"])
    doc = m.model_dump(by_alias=True)
    assert doc == {
        "questions": 3, "evidence": 4, "hits": 3,
        "recallAt1": 0.25, "recallAt3": 0.25, "recallAt5": 0.5, "recallAt10": 0.5,
        "fileRecallAt5": 0.5, "fileRecallAt10": 0.75,
        "snippetRecallAt5": 1 / 3, "snippetEvidence": 3,
        "linesPerHit": 25 / 3, "searchP50Ms": 6.0, "searchP95Ms": pytest.approx(7.8),
        "perCategory": {
            "multi-hop": {"questions": 1, "evidence": 2, "recallAt5": 0.5},
            "temporal": {"questions": 0, "evidence": 0, "recallAt5": None},
            "single-hop": {"questions": 1, "evidence": 1, "recallAt5": 1.0},
        },
    }
    assert list(doc["perCategory"]) == ["multi-hop", "temporal", "single-hop"]


def test_summarize_without_texts_or_hits_reports_null() -> None:
    q = QuestionOutcome("x", (EvidenceOutcome(line_rank=None, file_rank=None, snippet_rank=None,
                                              has_text=False),), (), 2.0)
    m = summarize([q])
    assert (m.snippet_recall_at5, m.snippet_evidence, m.lines_per_hit, m.recall_at10) == (None, 0, None, 0.0)
    assert list(m.per_category) == ["x"]
    empty = summarize([])
    assert (empty.recall_at1, empty.search_p50_ms, empty.per_category) == (None, None, {})

"""Retrieval metrics of an eval run: pure functions from labelled questions and ranked hits to recall.

The unit of recall is the evidence item, not the question; what each figure means:
docs/benchmarks.md, "What the numbers mean".

Source: the metric definitions of ``bench/locomo-dev``'s README; LoCoMo is Maharana et al.,
"Evaluating Very Long-Term Conversational Memory of LLM Agents", ACL 2024.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

__all__ = [
    "EvalModel",
    "CategoryRecall",
    "EvalMetrics",
    "EvalQuestion",
    "Evidence",
    "EvidenceOutcome",
    "Miss",
    "MissedEvidence",
    "RECALL_KS",
    "RankedHit",
    "QuestionOutcome",
    "ReturnedHit",
    "collapse_whitespace",
    "covers_evidence",
    "find_miss",
    "first_rank",
    "judge",
    "names_evidence_file",
    "percentile",
    "recall_at",
    "snippet_holds_evidence",
    "summarize",
]

# The cut-offs R@k is reported at; 10 is also the eval's default maxResults.
RECALL_KS = (1, 3, 5, 10)
# Snippet recall looks at the first five snippets: what an agent reads before deciding.
SNIPPET_K = 5
# The per-category breakdown is at k = 5, the headline cut-off of agent-memory papers.
CATEGORY_K = 5


class RankedHit(Protocol):
    """What a metric needs of one search hit (``MemorySearchResult`` fits): the workspace-relative
    ``path``, the 1-based inclusive ``start_line``/``end_line`` and the ``snippet``."""

    @property
    def path(self) -> str: ...
    @property
    def start_line(self) -> int: ...
    @property
    def end_line(self) -> int: ...
    @property
    def snippet(self) -> str: ...


@dataclass(frozen=True)
class Evidence:
    """One labelled evidence item of a question.

    Attributes:
        path: workspace-relative path of the file that holds it.
        line: its 1-based line, or ``None`` when any hit naming the file counts.
        text: text a snippet should hold (whitespace collapsed), or ``None`` (no snippet recall).
        ref: the dataset's id for it (LoCoMo ``dia_id`` such as ``D4:1``).
    """

    path: str
    line: int | None = None
    text: str | None = None
    ref: str | None = None


@dataclass(frozen=True)
class EvalQuestion:
    """A query (passed to ``memory_search`` as is) with its evidence items, optional
    category label and the dataset's id for it."""

    query: str
    evidence: tuple[Evidence, ...]
    category: str | None = None
    ref: str | None = None


@dataclass(frozen=True)
class EvidenceOutcome:
    """The 1-based ranks of the first hit that holds one evidence item by line range,
    names its file, and holds its text in the snippet (each ``None`` when none does);
    ``has_text``: whether the item counts for snippet recall."""

    line_rank: int | None
    file_rank: int | None
    snippet_rank: int | None
    has_text: bool


@dataclass(frozen=True)
class QuestionOutcome:
    """One judged question: its category, one outcome per evidence item, ``endLine -
    startLine + 1`` of every hit returned (best first) and the search time in ms."""

    category: str | None
    evidence: tuple[EvidenceOutcome, ...]
    hit_lines: tuple[int, ...]
    latency_ms: float


def collapse_whitespace(text: str) -> str:
    """``text`` with every run of whitespace replaced by one space and the ends stripped."""
    return " ".join(text.split())


def covers_evidence(hit: RankedHit, evidence: Evidence) -> bool:
    """True when ``hit`` names ``evidence.path`` and (when the item has a line) its range holds it."""
    if hit.path != evidence.path:
        return False
    return evidence.line is None or hit.start_line <= evidence.line <= hit.end_line


def names_evidence_file(hit: RankedHit, evidence: Evidence) -> bool:
    """True when ``hit`` names the file of ``evidence``."""
    return hit.path == evidence.path


def snippet_holds_evidence(hit: RankedHit, evidence: Evidence) -> bool:
    """True when the evidence text (not blank) is in the hit's snippet, both whitespace-collapsed."""
    needle = collapse_whitespace(evidence.text or "")
    return bool(needle) and needle in collapse_whitespace(hit.snippet)


def first_rank(hits: Sequence[RankedHit], evidence: Evidence,
               match: Callable[[RankedHit, Evidence], bool]) -> int | None:
    """1-based rank of the first hit for which ``match(hit, evidence)`` holds, else ``None``."""
    return next((rank for rank, hit in enumerate(hits, start=1) if match(hit, evidence)), None)


def judge(question: EvalQuestion, hits: Sequence[RankedHit], *, latency_ms: float) -> QuestionOutcome:
    """Judge one question's hits (all of them, best first; ``k`` is applied later) against
    its evidence items; ``latency_ms``: the search call's duration."""
    outcomes = tuple(
        EvidenceOutcome(line_rank=first_rank(hits, ev, covers_evidence),
                        file_rank=first_rank(hits, ev, names_evidence_file),
                        snippet_rank=first_rank(hits, ev, snippet_holds_evidence),
                        has_text=bool(collapse_whitespace(ev.text or "")))
        for ev in question.evidence)
    return QuestionOutcome(category=question.category, evidence=outcomes,
                           hit_lines=tuple(h.end_line - h.start_line + 1 for h in hits),
                           latency_ms=latency_ms)


def recall_at(items: Sequence[EvidenceOutcome], k: int,
              rank_of: Callable[[EvidenceOutcome], int | None]) -> float | None:
    """Share of ``items`` whose ``rank_of(item)`` is at most ``k``; ``None`` for no items.

    Raises:
        ValueError: ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, not {k}")
    if not items:
        return None
    ranks = [rank_of(item) for item in items]
    return sum(rank is not None and rank <= k for rank in ranks) / len(items)


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The ``pct``-th percentile (0..100) of ``values``, linear between the closest ranks
    (numpy's default); ``None`` for no values.

    Raises:
        ValueError: ``pct`` outside [0, 100].
    """
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile must be within [0, 100], not {pct}")
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * pct / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class EvalModel(BaseModel):
    """The eval's report models: frozen, camelCase JSON names."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, alias_generator=to_camel)

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON-ready dict: camelCase keys, every key present."""
        return self.model_dump(by_alias=True, mode="json")


class CategoryRecall(EvalModel):
    """R@5 of one question category, over its ``questions`` and ``evidence`` items."""

    questions: int
    evidence: int
    recall_at5: float | None


class EvalMetrics(EvalModel):
    """Every metric of one eval run (see the module docstring); ``None`` where there is
    nothing to count. ``snippet_evidence``: items with a text; ``search_p50_ms`` /
    ``search_p95_ms``: search latency; ``per_category``: R@5 per label, in the order
    :func:`summarize` was given."""

    questions: int
    evidence: int
    hits: int
    recall_at1: float | None
    recall_at3: float | None
    recall_at5: float | None
    recall_at10: float | None
    file_recall_at5: float | None
    file_recall_at10: float | None
    snippet_recall_at5: float | None
    snippet_evidence: int
    lines_per_hit: float | None
    search_p50_ms: float | None
    search_p95_ms: float | None
    per_category: dict[str, CategoryRecall]


class MissedEvidence(EvalModel):
    """An evidence item outside the first five hits (``line`` ``None``: the file counts)."""

    path: str
    line: int | None
    ref: str | None


class ReturnedHit(EvalModel):
    """A hit as a miss shows it: ``path``, ``start_line``-``end_line`` (1-based inclusive), ``score``."""

    path: str
    start_line: int
    end_line: int
    score: float | None


class Miss(EvalModel):
    """A question R@5 missed: where it was asked, the question, the evidence items it missed
    (in the dataset's order) and every hit that came back, best first."""

    workspace: str
    query: str
    ref: str | None
    category: str | None
    expected: list[MissedEvidence]
    returned: list[ReturnedHit]


def find_miss(question: EvalQuestion, hits: Sequence[RankedHit], *, workspace: str) -> Miss | None:
    """The :class:`Miss` of ``question`` when one of its evidence items is not inside the
    first :data:`CATEGORY_K` hits (best first; their ``score`` is read when they have one), else ``None``;
    ``workspace`` names where it was asked."""
    missed = [MissedEvidence(path=ev.path, line=ev.line, ref=ev.ref) for ev in question.evidence
              if (rank := first_rank(hits, ev, covers_evidence)) is None or rank > CATEGORY_K]
    if not missed:
        return None
    returned = [ReturnedHit(path=h.path, start_line=h.start_line, end_line=h.end_line,
                            score=getattr(h, "score", None)) for h in hits]
    return Miss(workspace=workspace, query=question.query, ref=question.ref,
                category=question.category, expected=missed, returned=returned)


def summarize(outcomes: Sequence[QuestionOutcome], *, categories: Sequence[str] = ()) -> EvalMetrics:
    """Aggregate judged questions (one outcome each) into :class:`EvalMetrics`; ``categories``
    are always in ``per_category`` (in this order, zero counts allowed), other labels follow in
    order of first appearance, questions without one are in none."""
    items = [ev for q in outcomes for ev in q.evidence]
    with_text = [ev for ev in items if ev.has_text]
    lines = [n for q in outcomes for n in q.hit_lines]
    labels = list(dict.fromkeys([*categories, *(q.category for q in outcomes if q.category is not None)]))
    per_category = {}
    for label in labels:
        group = [q for q in outcomes if q.category == label]
        group_items = [ev for q in group for ev in q.evidence]
        per_category[label] = CategoryRecall(questions=len(group), evidence=len(group_items),
                                             recall_at5=recall_at(group_items, CATEGORY_K, attrgetter("line_rank")))
    latencies = [q.latency_ms for q in outcomes]
    r = {k: recall_at(items, k, attrgetter("line_rank")) for k in RECALL_KS}
    return EvalMetrics(
        questions=len(outcomes), evidence=len(items), hits=len(lines),
        recall_at1=r[1], recall_at3=r[3], recall_at5=r[5], recall_at10=r[10],
        file_recall_at5=recall_at(items, 5, attrgetter("file_rank")),
        file_recall_at10=recall_at(items, 10, attrgetter("file_rank")),
        snippet_recall_at5=recall_at(with_text, SNIPPET_K, attrgetter("snippet_rank")),
        snippet_evidence=len(with_text),
        lines_per_hit=sum(lines) / len(lines) if lines else None,
        search_p50_ms=percentile(latencies, 50), search_p95_ms=percentile(latencies, 95),
        per_category=per_category)

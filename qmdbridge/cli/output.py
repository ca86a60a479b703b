"""Human-readable output of the CLI from the pydantic models: search hits, status (rich on a TTY).

The text itself is rendered from the JSON documents by ``qmdbridge/cli/render.py`` (which the
daemon client shares); index progress lives in ``qmdbridge/cli/progress.py``.
"""

from __future__ import annotations

from typing import Any

from fallback.models import HitExplain, MemoryStatus, SearchResponse
from qmdbridge.cli.render import print_search_doc, print_status_doc

__all__ = ["explain_lines", "print_search", "print_status"]


def print_search(response: SearchResponse, *, keyword_notice: bool = False) -> None:
    """Print hits as ``<score> <path>:<start>-<end>`` plus the snippet (a table on a TTY), each
    followed by its indented ``explain`` block when the search asked for one; notes go to
    stderr, one line each (``keyword_notice``: say so when the answer is keyword-only). See
    :func:`qmdbridge.cli.render.print_search_doc`."""
    explained = any(r.explain is not None for r in response.results)

    def explain_of(i: int) -> list[str]:
        e = response.results[i].explain
        return [] if e is None else explain_lines(e)

    print_search_doc(response.to_json_dict(), explain=explain_of if explained else None,
                     keyword_notice=keyword_notice)


def explain_lines(e: HitExplain) -> list[str]:
    """The ``--explain`` block of one hit as lines (no indent): mode and rank, then one line per
    ranking step that applied. Numbers: scores to 4 decimals, BM25 to 4 significant digits, ages to 1."""
    lines = [f"explain: {e.mode}, rank {e.rank}"]
    if e.keyword is not None:
        bm25 = "-" if e.keyword.bm25 is None else f"{e.keyword.bm25:.4g}"
        lines.append(f"  keyword: rank {e.keyword.rank}, bm25 {bm25}, text score {e.keyword.text_score:.4f}")
    if e.vector is not None:
        lines.append(f"  vector: rank {e.vector.rank}, cosine {e.vector.cosine:.4f}")
    if e.fusion is not None:
        f = e.fusion
        lines.append(f"  fusion ({f.method}): evidence vector {f.vector_evidence:.4f}, text "
                     f"{f.text_evidence:.4f}; 0.5 x max + 0.5 x ({f.vector_weight:g} x vector + "
                     f"{f.text_weight:g} x text) = {f.score:.4f}")
    if e.decay is not None:
        d = e.decay
        age = "evergreen" if d.age_days is None else f"age {d.age_days:.1f} days (by {d.dated_by})"
        lines.append(f"  decay: {age}, half-life {d.half_life_days:g} days, factor {d.factor:.4f}"
                     f" -> {d.score:.4f}")
    if e.rerank is not None:
        rr = e.rerank
        rel = "-" if rr.relevance is None else f"{rr.relevance:.4f}"
        lines.append(f"  rerank: {rr.provider} {rr.model}, relevance {rel}, rank {rr.rank_before}"
                     f" -> {rr.rank_after}")
    if e.mmr is not None:
        lines.append(f"  mmr: lambda {e.mmr.lambda_:g}, rank {e.mmr.rank_before} -> {e.mmr.rank_after}")
    lines.append(f"  floor: {'kept' if e.floor.kept else 'dropped'} ({e.floor.reason})")
    return lines


def print_status(st: MemoryStatus, *, problems: list[dict[str, Any]] | None = None) -> None:
    """Print the status as ``Key: value`` lines (spec 11.1 layout), the indexed roots and the
    ``problems`` (:func:`qmdbridge.problems.status_problems`); see
    :func:`qmdbridge.cli.render.print_status_doc`."""
    print_status_doc(st.to_json_dict(), problems=problems)

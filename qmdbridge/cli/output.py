"""Human-readable output of the CLI: search hits, status, index progress (rich on a TTY)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fallback.models import HitExplain, MemoryStatus, SearchResponse
from qmdbridge.cli.render import print_search_doc, print_status_doc

__all__ = ["explain_lines", "print_search", "print_status", "progress_reporter"]


def print_search(response: SearchResponse) -> None:
    """Print hits as ``<score> <path>:<start>-<end>`` plus the snippet (a table on a TTY), each
    followed by its indented ``explain`` block when the search asked for one; warnings go to
    stderr. See :func:`qmdbridge.cli.render.print_search_doc`."""
    explained = any(r.explain is not None for r in response.results)

    def explain_of(i: int) -> list[str]:
        e = response.results[i].explain
        return [] if e is None else explain_lines(e)

    print_search_doc(response.to_json_dict(), explain=explain_of if explained else None)


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
        lines.append(f"  fusion: {f.vector_weight:g} x vector + {f.text_weight:g} x text = {f.score:.4f}")
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


def print_status(st: MemoryStatus) -> None:
    """Print the status as ``Key: value`` lines (spec 11.1 layout); see
    :func:`qmdbridge.cli.render.print_status_doc`."""
    print_status_doc(st.to_json_dict())


@contextmanager
def progress_reporter(*, enabled: bool) -> Iterator[Callable[[int, int, int], None] | None]:
    """Yield an ``on_progress(files_done, files_total, chunks_embedded)`` callback that drives a
    rich progress bar on stderr when stderr is a terminal; ``None`` otherwise."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("indexing"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("files · {task.fields[chunks]} chunks embedded"),
                  console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("index", total=None, chunks=0)

        def on_progress(files_done: int, files_total: int, chunks_embedded: int) -> None:
            progress.update(task, completed=files_done, total=files_total, chunks=chunks_embedded)

        yield on_progress

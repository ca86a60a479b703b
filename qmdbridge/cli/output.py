"""Human-readable output of the CLI: search hits, status, index progress (rich on a TTY)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fallback.models import HitExplain, MemoryStatus, SearchResponse

__all__ = ["explain_lines", "print_search", "print_status", "progress_reporter"]


def print_search(response: SearchResponse) -> None:
    """Print hits as ``<score> <path>:<start>-<end>`` plus the snippet (a table on a TTY), each
    followed by its indented ``explain`` block when the search asked for one; warnings go to
    stderr."""
    out = sys.stdout
    if response.fallback is not None:
        sys.stderr.write(f"note: answered by {response.backend} (qmd unavailable: {response.fallback.reason})\n")
    for warning in response.warnings:
        sys.stderr.write(f"warning: {warning}\n")
    if response.denied is not None:
        out.write(f"Search denied by scope: {response.denied.reason}\n")
        return
    if not response.results:
        out.write("No matches.\n")
        return
    explained = any(r.explain is not None for r in response.results)
    if out.isatty() and not explained:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"memory search ({response.backend}, {response.mode})", show_lines=True)
        table.add_column("score", justify="right")
        table.add_column("location")
        table.add_column("snippet")
        for r in response.results:
            table.add_row(f"{r.score:.3f}", f"{r.path}:{r.start_line}-{r.end_line}", r.snippet)
        Console().print(table)
        return
    for i, r in enumerate(response.results):
        if i:
            out.write("\n")
        out.write(f"{r.score:.3f} {r.path}:{r.start_line}-{r.end_line}\n{r.snippet.rstrip()}\n")
        if r.explain is not None:
            out.write("".join(f"  {line}\n" for line in explain_lines(r.explain)))


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
    """Print the status as ``Key: value`` lines (spec 11.1 layout)."""
    w = sys.stdout.write
    w(f"Memory Search ({st.agent_id})\n")
    w(f"Backend: {st.backend}\n")
    if st.fallback:
        w(f"Fallback: from {st.fallback.from_backend}: {st.fallback.reason}\n")
    w(f"Provider: {st.provider} (requested: {st.requested_provider or st.provider})\n")
    w(f"Model: {st.model or '-'}\n")
    w(f"Mode: {st.search_mode or '-'}\n")
    if st.provider_unavailable_reason:
        w(f"Provider note: {st.provider_unavailable_reason}\n")
    w(f"Sources: {', '.join(st.sources)}\n")
    w(f"Indexed: {st.files} files · {st.chunks} chunks\n")
    w(f"Dirty: {'yes' if st.dirty else 'no'}{' (' + st.dirty_reason + ')' if st.dirty_reason else ''}\n")
    w(f"Store: {st.db_path or '-'}\n")
    w(f"Workspace: {st.workspace_dir}\n")
    if st.fts:
        w(f"FTS: {'ready' if st.fts.get('available') else 'unavailable'} {st.fts.get('tokenizer', '')}\n")
    if st.vector:
        w(f"Vector: {st.vector.get('mode', '-')}"
          f"{' (' + str(st.vector.get('reason')) + ')' if st.vector.get('reason') else ''}"
          f"{', dims ' + str(st.vector.get('dims')) if st.vector.get('dims') else ''}\n")
    if st.cache:
        w(f"Embedding cache: {'enabled' if st.cache.get('enabled') else 'disabled'}"
          f" ({st.cache.get('entries', 0)} entries, cap {st.cache.get('maxEntries')})\n")
    for name, view in st.backends.items():
        if name == "builtin" and st.backend != "builtin":
            w(f"Builtin index: {view.get('files', 0)} files · {view.get('chunks', 0)} chunks\n")
        if name == "qmd":
            colls = view.get("collections") or []
            w(f"qmd collections: {len(colls)}"
              f"{' (' + ', '.join(c['name'] + ': ' + c['path'] + ' ' + c['pattern'] for c in colls) + ')' if colls else ''}\n")
            breaker = view.get("breaker", {})
            w(f"qmd: {'healthy' if view.get('healthy', True) and breaker.get('state') == 'closed' else 'unhealthy'}"
              f"; breaker {breaker.get('state', '-')}; last error: {view.get('lastError') or breaker.get('lastFailure') or '-'}\n")
    for s in st.skipped:
        w(f"Skipped: {s.path}: {s.reason}\n")
    for issue in st.issues:
        w(f"Issue: {issue}\n")


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

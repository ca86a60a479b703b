"""The ``qmdbridge eval`` command: recall of memory_search on LoCoMo or a JSONL query set, as a table or JSON."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fallback.errors import UsageError
from qmdbridge.cli.common import EXIT_FAILURE, EXIT_OK, emit_json
from qmdbridge.evaluation.runner import EvalOptions, EvalReport, ProgressCallback

__all__ = ["all_fell_back_message", "answered_line", "format_misses", "format_report", "run_eval"]


@contextmanager
def eval_progress(*, enabled: bool) -> Iterator[ProgressCallback | None]:
    """Yield an ``on_progress(workspace, done, total)`` callback drawing a rich progress bar on
    stderr when ``enabled`` and stderr is a terminal; ``None`` otherwise."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("eval {task.fields[workspace]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("questions"), console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("eval", total=None, workspace="")

        def on_progress(workspace: str, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, workspace=workspace)

        yield on_progress


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def all_fell_back_message(report: EvalReport) -> str:
    """The loud line of a qmd run that qmd never answered (``report.all_fell_back``)."""
    n = report.answered_by.get("builtin", 0)
    return (f"NOT MEASURED: every search ({n} of {n}) fell back to the builtin engine, so these "
            f"figures are the builtin engine's, not qmd's; first reason: "
            f"{report.first_fallback_reason or '-'}")


def answered_line(report: EvalReport) -> str:
    """``answered: qmd 5, builtin 0`` plus the fallbacks and the first reason, when any."""
    qmd, builtin = report.answered_by.get("qmd", 0), report.answered_by.get("builtin", 0)
    line = f"answered: qmd {qmd}, builtin {builtin}"
    if report.fallbacks:
        line += f" ({report.fallbacks} fell back; first reason: {report.first_fallback_reason or '-'})"
    return line


def long_lived_line(report: EvalReport) -> str:
    """``long-lived (as serve and mcp): the warm qmd child answered 751 collection searches, 0
    spawned`` (the child's part only with the qmd backend and a child)."""
    line = "long-lived (as serve and mcp)"
    if report.warm_calls is not None:
        line += (f": the warm qmd child answered {report.warm_calls['answered']} collection "
                 f"searches, {report.warm_calls['spawned']} spawned")
    return line


def format_misses(report: EvalReport, limit: int) -> str:
    """The first ``limit`` misses (``--misses N``), one block each::

        [conv-1 D4:2] when did Mel paint the sunrise?
          expected memory/2023-05-08.md:12 (D1:3)
          got 1. memory/2023-05-08.md:1-10 0.812
    """
    shown = report.misses[:max(0, limit)]
    lines = [f"misses: {len(shown)} of {len(report.misses)} questions shown (R@5 missed them)"]
    for miss in shown:
        label = " ".join(x for x in (miss.workspace, miss.ref) if x)
        lines.append(f"[{label}] {miss.query}")
        for ev in miss.expected:
            where = ev.path if ev.line is None else f"{ev.path}:{ev.line}"
            lines.append(f"  expected {where}{f' ({ev.ref})' if ev.ref else ''}")
        if not miss.returned:
            lines.append("  got nothing")
        for rank, hit in enumerate(miss.returned, start=1):
            score = "" if hit.score is None else f" {hit.score:.3f}"
            lines.append(f"  {'got' if rank == 1 else '   '} {rank}. {hit.path}:{hit.start_line}-"
                         f"{hit.end_line}{score}")
    return "\n".join(lines) + "\n"


def format_report(report: EvalReport) -> str:
    """The human-readable report: what ran, then one ``metric  value`` line per metric
    (``-`` without data), with the backend tally of a qmd run."""
    m = report.metrics
    what = "LoCoMo" if report.dataset == "locomo" else "queries"
    lines = [all_fell_back_message(report), ""] if report.all_fell_back else []
    lines += [
        f"{what} eval: {len(report.workspaces)} workspace(s), {m.questions} questions, "
        f"{m.evidence} evidence items",
        f"backend {report.backend}, mode {report.mode or '-'}, provider {report.provider or '-'}"
        f"{', model ' + report.model if report.model else ''}; maxResults {report.max_results}, "
        f"minScore {report.min_score:g}",
        *([answered_line(report)] if report.backend == "qmd" else []),
        *([long_lived_line(report)] if report.long_lived else []),
        "",
        f"R@1           {_num(m.recall_at1)}",
        f"R@3           {_num(m.recall_at3)}",
        f"R@5           {_num(m.recall_at5)}",
        f"R@10          {_num(m.recall_at10)}",
        f"file R@5      {_num(m.file_recall_at5)}",
        f"file R@10     {_num(m.file_recall_at10)}",
        f"snippet R@5   {_num(m.snippet_recall_at5)}"
        f"{'' if m.snippet_recall_at5 is None else f' ({m.snippet_evidence} items with text)'}",
        f"lines/hit     {_num(m.lines_per_hit, 1)}",
        f"search p50    {_num(m.search_p50_ms, 1)} ms",
        f"search p95    {_num(m.search_p95_ms, 1)} ms",
    ]
    if m.per_category:
        lines += ["", "R@5 by category:"]
        for label, cat in m.per_category.items():
            lines.append(f"  {label:<14}{_num(cat.recall_at5):<5}  ({cat.questions} questions, "
                         f"{cat.evidence} evidence items)")
    for warning in report.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines) + "\n"


async def run_eval(agent: Any, args: argparse.Namespace, *, cfg: Any) -> int:
    """Run ``qmdbridge eval`` with the loaded config ``cfg`` (each workspace gets its own agent
    from it, not ``agent``); prints the report and returns 0, or 1 when ``--backend qmd`` was
    asked and every search fell back.

    Raises:
        UsageError: ``--queries`` without ``--workspace`` or ``--workspace`` with ``--locomo``,
            and what :func:`~qmdbridge.evaluation.runner.run_locomo` / ``run_queries`` raise.
    """
    from qmdbridge.evaluation.runner import check_options, run_locomo, run_queries

    options = EvalOptions(max_results=args.max_results, min_score=args.min_score,
                          provider=args.provider, model_path=args.model,
                          cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                          backend=args.backend, qmd_search_mode=args.qmd_search_mode,
                          long_lived=args.long_lived)
    check_options(options)  # before any LoCoMo or queries file is read
    with eval_progress(enabled=not args.json) as on_progress:
        if args.locomo is not None:
            if args.workspace is not None:
                raise UsageError("--workspace applies to --queries; --locomo builds its own workspaces")
            report = await run_locomo(args.locomo, cfg=cfg, agent_id=args.agent, options=options,
                                      on_progress=on_progress)
        else:
            if args.workspace is None:
                raise UsageError("--queries needs --workspace (the folder its paths are relative to)")
            report = await run_queries(args.queries, args.workspace, cfg=cfg, agent_id=args.agent,
                                       options=options, on_progress=on_progress)
    if args.json:
        emit_json(report.to_json_dict())
    else:
        sys.stdout.write(format_report(report))
        if args.misses:
            sys.stdout.write("\n" + format_misses(report, args.misses))
    if report.all_fell_back:
        sys.stderr.write(f"qmdbridge eval: {all_fell_back_message(report)}\n")
        return EXIT_FAILURE
    return EXIT_OK

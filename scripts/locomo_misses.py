"""Failure analysis of keyword-only search on LoCoMo: why each evidence turn missed at R@5.

Runs the builtin engine (provider ``none``) over each conversation exactly as ``qmdbridge eval``
does (same conversion, same ``MemoryManager`` path), then sorts every evidence turn that is not
inside one of the first five hits into buckets, printed with counts:

- **no shared term**: the turn shares no content word with its question (porter stemming, the
  engine's stop words; tested with FTS5 itself on a one-row table), so no keyword ranking can
  find it from the question alone;
- **in a hit's file, outside its lines**: a top-5 hit names the turn's file but its line range
  does not hold the turn;
- **rank 6-10 / 11-30 / not retrieved**: where the first hit holding the turn stands in a
  30-hit search with ``minScore`` 0;
- **pushed out by overlap**: the turn ranks 6-30 and two of the first five hits overlap on more
  than half of the smaller one's lines (chunks overlap 80 tokens);
- **other turns took the slots**: a question with two or more evidence turns, at least one of
  them found in the top 5, and this one's file named by none of the top 5 hits.

Buckets overlap (a turn can be ranked 11-30 and share no term); each line says how many missed
turns fall in it. It also prints the metrics of the tune conversations (26, 30, 41) and the check
conversations (42, 43) apart, so a change can be tuned on one split and checked on the other.

Usage: ``python3 scripts/locomo_misses.py [DATA] [--examples N] [--json]``. ``DATA`` defaults to
``/work/shared/bench/locomo-dev``. The data is only read; workspaces and stores live in
temporary folders.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(REPO))

from fallback.search.fts import analyze_fts_query  # noqa: E402
from qmdbridge.evaluation.locomo import (  # noqa: E402
    CATEGORY_NAMES,
    LocomoConversation,
    load_locomo,
    locomo_files,
    write_workspace,
)
from qmdbridge.evaluation.metrics import (  # noqa: E402
    EvalMetrics,
    EvalQuestion,
    Evidence,
    QuestionOutcome,
    covers_evidence,
    first_rank,
    judge,
    summarize,
)

DEFAULT_DATA = Path("/work/shared/bench/locomo-dev")
# The conversations changes are tuned on, and those they are checked on (then the reverse).
TUNE = ("conv-26", "conv-30", "conv-41")
CHECK = ("conv-42", "conv-43")
# The headline cut-off, and how deep the rank buckets look.
K = 5
DEEP = 30
# Two hits overlap "mostly" when they share more than this share of the smaller one's lines.
OVERLAP_SHARE = 0.5
BUCKETS = ("no shared term", "in a hit's file, outside its lines", "rank 6-10", "rank 11-30",
           "not retrieved (30)", "pushed out by overlap", "other turns took the slots")


@dataclass
class Searched:
    """One question with its hits: the eval's (``maxResults`` 10) and a deep search's (30, floor 0)."""

    conversation: str
    question: EvalQuestion
    hits: list[Any]
    deep: list[Any]
    latency_ms: float
    lines: dict[str, list[str]] = field(default_factory=dict)


def search_conversation(conversation: LocomoConversation, max_results: int, *,
                        deep: bool = True) -> list[Searched]:
    """Index one conversation into a temporary store and search each of its questions (twice
    with ``deep``: also 30 hits with ``minScore`` 0)."""
    import anyio

    from qmdbridge.config import load_config
    from qmdbridge.evaluation.runner import EvalOptions, eval_agent
    from qmdbridge.manager import MemoryManager

    async def run(ws: Path, state: Path) -> list[Searched]:
        agent = eval_agent(load_config(os.devnull), agent_id=None, workspace=ws, state_dir=state,
                           options=EvalOptions(max_results=max_results, provider="none"))
        lines = {p: t.split("\n") for p, t in conversation.files.items()}
        out = []
        async with MemoryManager(agent, backend="builtin") as manager:
            await manager.sync(reason="eval")
            for q in conversation.questions:
                start = time.perf_counter()
                resp = await manager.search(q.query, max_results=max_results)
                latency_ms = (time.perf_counter() - start) * 1000
                more = (await manager.search(q.query, max_results=DEEP, min_score=0.0)).results \
                    if deep else []
                out.append(Searched(conversation.name, q, list(resp.results), list(more),
                                    latency_ms, lines))
        return out

    with tempfile.TemporaryDirectory(prefix="locomo-misses-") as tmp:
        ws = write_workspace(conversation, Path(tmp) / "workspace")
        return anyio.run(run, ws, Path(tmp) / "state")


def shares_term(question: str, line: str) -> bool:
    """True when ``line`` matches the OR of the question's content parts (FTS5, porter)."""
    analyzed = analyze_fts_query(question)
    plan = None if analyzed is None else analyzed.plan(coverage_pairs=False)
    if plan is None or not plan.parts:
        return False
    db = sqlite3.connect(":memory:")
    try:
        db.execute("CREATE VIRTUAL TABLE t USING fts5(body, tokenize='porter unicode61')")
        db.execute("INSERT INTO t VALUES (?)", (line,))
        match = " OR ".join(expr for _, expr in plan.parts)
        return bool(db.execute("SELECT COUNT(*) FROM t WHERE t MATCH ?", (match,)).fetchone()[0])
    finally:
        db.close()


def _overlapping(hits: Sequence[Any]) -> bool:
    for i, a in enumerate(hits):
        for b in hits[i + 1:]:
            if a.path != b.path:
                continue
            shared = min(a.end_line, b.end_line) - max(a.start_line, b.start_line) + 1
            smaller = min(a.end_line - a.start_line, b.end_line - b.start_line) + 1
            if shared > OVERLAP_SHARE * smaller:
                return True
    return False


def buckets_of(s: Searched, ev: Evidence) -> list[str]:
    """The buckets of one evidence turn missed at R@5 (see the module docstring)."""
    top = s.hits[:K]
    line = s.lines[ev.path][(ev.line or 1) - 1]
    text = line.split(": ", 1)[1] if ": " in line else line
    out = []
    if not shares_term(s.question.query, text):
        out.append("no shared term")
    if any(h.path == ev.path for h in top):
        out.append("in a hit's file, outside its lines")
    rank = first_rank(s.deep, ev, covers_evidence)
    out.append("rank 6-10" if rank is not None and rank <= 10 else
               "rank 11-30" if rank is not None else "not retrieved (30)")
    if rank is not None and _overlapping(top):
        out.append("pushed out by overlap")
    found = [e for e in s.question.evidence if any(covers_evidence(h, e) for h in top)]
    if len(s.question.evidence) > 1 and found and not any(h.path == ev.path for h in top):
        out.append("other turns took the slots")
    return out


def metrics(searched: Sequence[Searched]) -> EvalMetrics:
    """The eval's metrics over these questions."""
    outcomes: list[QuestionOutcome] = [judge(s.question, s.hits, latency_ms=s.latency_ms)
                                       for s in searched]
    return summarize(outcomes, categories=list(CATEGORY_NAMES.values()))


def row(name: str, m: EvalMetrics) -> str:
    """One Markdown table row of the headline metrics."""
    def f(x: float | None, d: int = 3) -> str:
        return "-" if x is None else f"{x:.{d}f}"
    return (f"| {name} | {m.evidence} | {f(m.recall_at1)} | {f(m.recall_at5)} | {f(m.recall_at10)}"
            f" | {f(m.file_recall_at5)} | {f(m.snippet_recall_at5)} | {f(m.lines_per_hit, 1)}"
            f" | {f(m.search_p50_ms, 2)} |")


def main(argv: list[str] | None = None) -> int:
    """Search, bucket the misses, print the report (or JSON); returns the exit code."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("data", nargs="?", default=str(DEFAULT_DATA), help="LoCoMo folder or file")
    p.add_argument("--max-results", type=int, default=10, help="hits per question (default 10)")
    p.add_argument("--examples", type=int, default=0, help="print this many missed turns per bucket")
    p.add_argument("--metrics", action="store_true", help="only the metrics table (no deep search)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    args = p.parse_args(argv)
    conversations = [c for f in locomo_files(args.data) for c in load_locomo(f)]
    searched = [s for c in conversations
                for s in search_conversation(c, args.max_results, deep=not args.metrics)]
    counts: Counter[str] = Counter()
    examples: dict[str, list[str]] = {b: [] for b in BUCKETS}
    missed = 0
    for s in searched if not args.metrics else []:
        for ev in s.question.evidence:
            if any(covers_evidence(h, ev) for h in s.hits[:K]):
                continue
            missed += 1
            for b in buckets_of(s, ev):
                counts[b] += 1
                if len(examples[b]) < args.examples:
                    line = s.lines[ev.path][(ev.line or 1) - 1]
                    examples[b].append(f"{s.conversation} {ev.ref}: {s.question.query!r} -> {line[:140]!r}")
    splits = {"tune (26/30/41)": [s for s in searched if s.conversation in TUNE],
              "check (42/43)": [s for s in searched if s.conversation in CHECK],
              "all": searched}
    table = {name: metrics(group) for name, group in splits.items() if group}
    if args.json:
        doc = {"missed": missed, "buckets": {b: counts[b] for b in BUCKETS},
               "metrics": {n: m.model_dump(by_alias=True) for n, m in table.items()}}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    out = ["| split | evidence | R@1 | R@5 | R@10 | file R@5 | snippet R@5 | lines/hit | p50 ms |",
           "|---|---|---|---|---|---|---|---|---|"]
    out += [row(n, m) for n, m in table.items()]
    total = sum(len(s.question.evidence) for s in searched)
    out += ["", f"evidence turns missed at R@{K}: {missed} of {total}", ""]
    for b in BUCKETS:
        out.append(f"  {b:<36} {counts[b]:>4}  ({counts[b] / max(missed, 1):.0%})")
        out += [f"      {e}" for e in examples[b]]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

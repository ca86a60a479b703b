"""LoCoMo retrieval benchmark: qmdbridge keyword-only, hybrid and on qmd, a bare FTS5 floor and the real qmd, side by side.

Every system answers the same questions over the same converted conversations (one workspace
per conversation, converted by ``qmdbridge.evaluation.locomo`` exactly as the data's README
fixes it) and is scored by the same metric functions (``qmdbridge.evaluation.metrics``):

- ``keyword``: qmdbridge's builtin engine through ``MemoryManager``, provider ``none``;
- ``hybrid``: the same with the local GGUF model (``--model``, default all-MiniLM-L6-v2), when
  llama-cpp-python and the model are available;
- ``fts5``: the floor, a bare SQLite FTS5 table of 10-line windows per file (``porter
  unicode61``), queried with BM25 over an OR of the question's words minus stop words
  (``fallback.text.keywords.STOP_WORDS``); the snippet is the window's text;
- ``qmd``: the real ``qmd search`` (BM25) with a per-conversation qmd home in a temporary
  folder, line ranges from its snippet window; its latency is the whole process (spawn to exit);
- ``bridge-qmd``: qmdbridge on that qmd in ``search`` mode (qmd's default) through a long-lived
  ``MemoryManager``, as ``serve`` and ``mcp`` keep one (``qmdbridge eval --backend qmd
  --long-lived``): the warm ``qmd mcp`` child finds the notes, the bridge ranks their passages;
  qmd caps the hits at ``memory.qmd.limits.maxResults`` (6), so its R@10 counts six.

Latency is per question in ms (p50 / p95): around ``MemoryManager.search`` for qmdbridge, around
the SQL query for the floor. Nothing is written outside temporary folders (but with
``--cache-dir``, which keeps the qmdbridge rows' indexes, embeddings included, for the next
run), and the data is only read from the given path.

Usage: ``python3 scripts/bench_locomo.py [DATA] [--systems keyword,hybrid,fts5,qmd] [--json]
[--out FILE] [--model PATH] [--qmd PATH] [--max-results 10] [--cache-dir DIR]``. ``DATA`` (a folder of LoCoMo
``*.json`` files, or one file) defaults to ``/work/shared/bench/locomo-dev`` when it exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
REPO = SCRIPTS.parent
sys.path.insert(0, str(REPO))

from fallback.text.keywords import STOP_WORDS  # noqa: E402
from qmdbridge.evaluation.locomo import (  # noqa: E402
    CATEGORY_NAMES,
    LocomoConversation,
    load_locomo,
    locomo_files,
    write_workspace,
)
from qmdbridge.evaluation.metrics import EvalMetrics, QuestionOutcome, judge, summarize  # noqa: E402

DEFAULT_DATA = Path("/work/shared/bench/locomo-dev")
DEFAULT_MODEL = Path("/work/shared/models/all-MiniLM-L6-v2.Q8_0.gguf")
SYSTEMS = ("keyword", "hybrid", "fts5", "qmd", "bridge-qmd")
# The floor's retrieval unit: fixed windows of this many lines per file.
WINDOW_LINES = 10
# Deadline of one qmd process (collection add or search), ms.
QMD_TIMEOUT_MS = 60_000
LABELS = {
    "keyword": "qmdbridge builtin, keyword-only (provider none)",
    "hybrid": "qmdbridge builtin, hybrid, local all-MiniLM-L6-v2",
    "fts5": "SQLite FTS5 floor: BM25, OR of non-stop-words, porter, 10-line windows",
    "qmd": "qmd 2.8.3 `qmd search` (BM25), its snippet window",
    "bridge-qmd": "qmdbridge on qmd 2.8.3, `search` mode, long-lived (warm qmd child)",
}


@dataclass(frozen=True)
class WindowHit:
    """One hit of the floor or of qmd (the fields the metrics read)."""

    path: str
    start_line: int
    end_line: int
    snippet: str


@dataclass
class Result:
    """One system's row: metrics, or ``None`` with the reason it was skipped."""

    system: str
    metrics: EvalMetrics | None
    note: str


def fts5_floor(conversation: LocomoConversation, max_results: int) -> list[QuestionOutcome]:
    """The floor: BM25 over 10-line windows with an OR of the question's non-stop-words."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE w USING fts5(path UNINDEXED, first UNINDEXED, last UNINDEXED, "
               "body, tokenize='porter unicode61')")
    for path, text in conversation.files.items():
        lines = text.split("\n")[:-1]  # every file ends with "\n"
        for i in range(0, len(lines), WINDOW_LINES):
            db.execute("INSERT INTO w VALUES (?, ?, ?, ?)", (path, i + 1, min(i + WINDOW_LINES, len(lines)),
                                                            "\n".join(lines[i:i + WINDOW_LINES])))
    outcomes = []
    for question in conversation.questions:
        words = dict.fromkeys(w for w in re.findall(r"\w+", question.query.lower()) if w not in STOP_WORDS)
        match = " OR ".join(f'"{w}"' for w in words)
        start = time.perf_counter()
        rows = db.execute("SELECT path, first, last, body FROM w WHERE w MATCH ? ORDER BY bm25(w) LIMIT ?",
                          (match, max_results)).fetchall() if match else []
        latency_ms = (time.perf_counter() - start) * 1000
        outcomes.append(judge(question, [WindowHit(*row) for row in rows], latency_ms=latency_ms))
    db.close()
    return outcomes


async def qmd_search(conversation: LocomoConversation, qmd: Path, max_results: int) -> list[QuestionOutcome]:
    """The real ``qmd search`` over the conversation's notes, in a throw-away qmd home.

    Raises:
        RuntimeError: ``qmd collection add`` or a search failed (stderr tail in the message).
    """
    from qmdbridge.paths import child_env, ensure_home, qmd_home
    from qmdbridge.qmd.parse import line_range, parse_qmd_uri
    from qmdbridge.qmd.results_json import parse_qmd_json
    from qmdbridge.qmd.runner import run_command

    outcomes = []
    with tempfile.TemporaryDirectory(prefix="bench-locomo-qmd-") as tmp:
        ws = write_workspace(conversation, Path(tmp) / "workspace")
        home = qmd_home(Path(tmp) / "state", "main")
        ensure_home(home, parent_env={})
        parent = {k: v for k, v in os.environ.items() if k != "CI"}
        env = child_env(home, parent_env=parent, path_env=parent.get("PATH", ""))
        add = await run_command([str(qmd), "--index", "index", "collection", "add", "--name", "memory",
                                 "--mask", "**/*.md", str(ws / "memory")], env=env, cwd=ws,
                                timeout_ms=QMD_TIMEOUT_MS)
        if add.returncode != 0:
            raise RuntimeError(f"qmd collection add failed: {add.stderr[-1000:]}")
        for question in conversation.questions:
            start = time.perf_counter()
            run = await run_command([str(qmd), "search", "--json", "-n", str(max_results), "-c", "memory",
                                     "--index", "index", "--", question.query], env=env, cwd=ws,
                                    timeout_ms=QMD_TIMEOUT_MS)
            latency_ms = (time.perf_counter() - start) * 1000
            if run.returncode != 0:
                raise RuntimeError(f"qmd search failed: {run.stderr[-1000:]}")
            hits = []
            for entry in parse_qmd_json(run.stdout, run.stderr, command="search"):
                where = parse_qmd_uri(entry.file or "")
                snippet = entry.snippet or entry.body or ""
                if where is None:
                    continue
                first, last = line_range(entry, snippet)
                body = snippet.split("\n", 1)[1] if snippet.startswith("@@") and "\n" in snippet else snippet
                hits.append(WindowHit(f"memory/{where[1]}", first, last, body))
            outcomes.append(judge(question, hits, latency_ms=latency_ms))
    return outcomes


def run_system(system: str, data: Path, conversations: list[LocomoConversation], args: argparse.Namespace) -> Result:
    """Run one system over every conversation; a missing optional part gives a skipped row."""
    import anyio

    from qmdbridge.config import load_config
    from qmdbridge.evaluation.runner import EvalOptions, run_locomo

    categories = list(CATEGORY_NAMES.values())
    if system in ("keyword", "hybrid"):
        if system == "hybrid":
            from fallback.embeddings.local_gguf import is_llama_cpp_installed

            if not is_llama_cpp_installed():
                return Result(system, None, "skipped: llama-cpp-python is not installed")
            if not Path(args.model).is_file():
                return Result(system, None, f"skipped: model {args.model} not found")
        options = EvalOptions(max_results=args.max_results, provider="none" if system == "keyword" else "local",
                              model_path=None if system == "keyword" else str(args.model),
                              cache_dir=Path(args.cache_dir) / system if args.cache_dir else None)
        report = anyio.run(lambda: run_locomo(data, cfg=load_config(args.config), options=options))
        return Result(system, report.metrics, f"mode {report.mode}, minScore {report.min_score:g}")
    if system == "fts5":
        outcomes = [o for c in conversations for o in fts5_floor(c, args.max_results)]
        return Result(system, summarize(outcomes, categories=categories), f"sqlite {sqlite3.sqlite_version}")
    qmd = Path(args.qmd)
    if not os.access(qmd, os.X_OK):
        return Result(system, None, f"skipped: qmd not found at {qmd} (bash scripts/install-qmd.sh)")
    if system == "bridge-qmd":  # what an agent on serve or mcp gets in qmd's default mode
        cfg = load_config(args.config)
        qmd_cfg = cfg.memory.qmd.model_copy(update={"command": str(qmd), "search_mode": "search"})
        cfg = cfg.model_copy(update={"memory": cfg.memory.model_copy(update={"qmd": qmd_cfg})})
        options = EvalOptions(max_results=args.max_results, backend="qmd", long_lived=True)
        report = anyio.run(lambda: run_locomo(data, cfg=cfg, options=options))
        return Result(system, report.metrics,
                      f"maxResults {report.max_results} (qmd's cap), answered {report.answered_by}, "
                      f"warm calls {report.warm_calls}")

    async def all_conversations() -> list[QuestionOutcome]:
        return [o for c in conversations for o in await qmd_search(c, qmd, args.max_results)]

    return Result(system, summarize(anyio.run(all_conversations), categories=categories),
                  "latency: whole qmd process")


def _cell(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(results: list[Result]) -> str:
    """The comparison as one Markdown table (one row per system)."""
    head = "| system | R@1 | R@5 | R@10 | file R@5 | snippet R@5 | lines/hit | search p50 ms | search p95 ms | note |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        m = r.metrics
        cells = ["-"] * 8 if m is None else [
            _cell(m.recall_at1), _cell(m.recall_at5), _cell(m.recall_at10), _cell(m.file_recall_at5),
            _cell(m.snippet_recall_at5), _cell(m.lines_per_hit, 1), _cell(m.search_p50_ms, 2),
            _cell(m.search_p95_ms, 2)]
        out.append(f"| {LABELS[r.system]} | " + " | ".join(cells) + f" | {r.note} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the systems, print the table (or JSON); returns the exit code."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("data", nargs="?", help=f"LoCoMo folder or file (default {DEFAULT_DATA} when it exists)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {', '.join(SYSTEMS)}")
    p.add_argument("--max-results", type=int, default=10, help="hits per question (default 10)")
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="GGUF model of the hybrid row")
    p.add_argument("--qmd", default=str(REPO / ".tools" / "bin" / "qmd"), help="the qmd launcher")
    p.add_argument("--config", help="OpenClaw config for the qmdbridge rows (default: none)")
    p.add_argument("--cache-dir", help="keep the qmdbridge rows' indexes (and embedding caches) in "
                   "DIR/<system>/<conversation> for the next run (default: throw-away folders)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--out", help="also write the JSON document to this file")
    args = p.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        p.error(f"unknown system {unknown[0] if unknown else '(none)'}; choose from {', '.join(SYSTEMS)}")
    data = Path(args.data) if args.data else DEFAULT_DATA
    if not args.data and not data.exists():
        p.error(f"no data folder given and {DEFAULT_DATA} does not exist")
    if args.config is None:  # a config of the caller's must not change the figures by accident
        args.config = os.devnull
    from fallback.errors import UsageError

    try:
        conversations = [c for f in locomo_files(data) for c in load_locomo(f)]
    except UsageError as exc:
        p.error(str(exc))
    results = []
    for system in systems:
        if sys.stderr.isatty():
            sys.stderr.write(f"running {system} ...\n")
        results.append(run_system(system, data, conversations, args))
    doc: dict[str, Any] = {
        "title": "bench_locomo", "data": str(data), "maxResults": args.max_results,
        "conversations": len(conversations),
        "questions": sum(len(c.questions) for c in conversations),
        "results": [{"system": r.system, "label": LABELS[r.system], "note": r.note,
                     "metrics": r.metrics.model_dump(by_alias=True) if r.metrics else None} for r in results],
    }
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(f"LoCoMo: {doc['conversations']} conversations, {doc['questions']} questions, "
                         f"maxResults {args.max_results}\n\n" + markdown_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``qmdbridge`` command line: the parser and the entry point (search, get, status, index, qmd operations, warmup, serve, doctor, eval).

A thin layer: parse arguments, load config, call the manager, print. With ``--json`` exactly
one JSON document goes to stdout (errors too, as ``{"error": ..., "exitCode": ...}``); logs and
progress go to stderr.

Exit codes:
    0  success
    1  a backend or the index failed (message on stderr)
    2  usage or config error (bad flag, blank query, malformed config file)
    3  refused path (``get`` of something that is not a memory file)
    4  no such memory file (``get`` of a memory path where no file is, or a file that vanished)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from qmdbridge.cli.common import EXIT_USAGE, emit_json

__all__ = ["main", "build_parser"]


EPILOG = """exit codes: 0 ok, 1 backend/index failure, 2 usage or config error, 3 refused path,
4 no such memory file.
config: --config FILE, else $OPENCLAW_STATE_DIR/openclaw.json (or ~/.openclaw/openclaw.json) when it exists."""


class _Parser(argparse.ArgumentParser):
    """argparse with our exit code for usage errors, and a JSON error when ``--json`` was asked."""

    json_requested = False

    def error(self, message: str) -> NoReturn:  # exit 2 with one line, like argparse, no traceback
        if _Parser.json_requested:
            emit_json({"error": f"{self.prog}: {message}", "errorType": "UsageError",
                       "exitCode": EXIT_USAGE})
        else:
            self.print_usage(sys.stderr)
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workspace", metavar="DIR", help="agent workspace (default: from config)")
    p.add_argument("--agent", metavar="ID", help="agent id (default: the config's default agent, else 'main')")
    p.add_argument("--config", metavar="FILE", help="OpenClaw JSON5 config file")
    p.add_argument("--backend", choices=["builtin", "qmd"], help="override memory.backend")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = _Parser(prog="qmdbridge", description="Memory search for AI agents over Markdown "
                     "memory files: qmd sidecar with a builtin SQLite fallback.", epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("search", help="search memory (memory_search)", epilog=EPILOG)
    p.add_argument("query", help="what to look for")
    p.add_argument("--max-results", type=int, metavar="N", help="hits wanted (default 6)")
    p.add_argument("--min-score", type=float, metavar="X", help="score floor 0..1 (default 0.35)")
    p.add_argument("--session-key", metavar="KEY", help="session key of the caller (scope rules, citations)")
    p.add_argument("--explain", action="store_true",
                   help="show how each hit was ranked: keyword (BM25) and vector (cosine) sides, "
                        "fusion, decay, rerank, MMR, floor (builtin engine)")
    _common(p)

    p = sub.add_parser("get", help="read a memory file or a line range (memory_get)", epilog=EPILOG)
    p.add_argument("path", help="workspace-relative path, e.g. memory/2026-03-01.md")
    p.add_argument("--from", dest="from_line", type=int, metavar="N", help="first line (1-based)")
    p.add_argument("--lines", type=int, metavar="N", help="number of lines (default 120)")
    _common(p)

    p = sub.add_parser("status", help="index and backend health", epilog=EPILOG)
    _common(p)

    p = sub.add_parser("index", help="sync the index (--force: full rebuild, swapped in atomically)",
                       epilog=EPILOG)
    p.add_argument("--force", action="store_true", help="rebuild from scratch")
    _common(p)

    p = sub.add_parser("qmd", help="operate the agent's qmd sidecar", epilog=EPILOG)
    p.add_argument("action", choices=["update", "embed", "collections"],
                   help="update: re-index files; embed: compute vectors; collections: reconcile and list")
    _common(p)

    p = sub.add_parser("warmup", help="pre-warm qmd's GGUF models in the agent's qmd home", epilog=EPILOG)
    _common(p)

    p = sub.add_parser("serve", help="run the long-lived sidecar (timers, watchers, JSON-lines tool calls on stdin)",
                       epilog=EPILOG)
    p.add_argument("--no-stdin", action="store_true", help="do not read tool calls from stdin; run until a signal")
    _common(p)

    p = sub.add_parser("doctor", help="check the workspace, qmd, SQLite features, the provider and the index",
                       epilog=EPILOG)
    p.add_argument("--fix", action="store_true", help="repair what can be repaired (legacy memory.md split)")
    _common(p)

    p = sub.add_parser("eval", help="measure recall of memory_search (LoCoMo or a JSONL query set)",
                       description="Index into a throw-away store (nothing is left behind), search "
                       "every question through the builtin engine and print R@1/3/5/10, file R@5/10, "
                       "snippet R@5, R@5 per category, lines per hit and search latency p50/p95.",
                       epilog=EPILOG)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--locomo", metavar="PATH",
                     help="a LoCoMo *.json file or a folder of them (one workspace per conversation)")
    src.add_argument("--queries", metavar="FILE",
                     help='JSONL, one {"query", "path", "line"?, "text"?, "category"?, "id"?} per line '
                     "(needs --workspace)")
    p.add_argument("--max-results", type=int, default=10, metavar="N", help="hits per question (default 10)")
    p.add_argument("--min-score", type=float, metavar="X", help="score floor 0..1 (default: config, 0.35)")
    p.add_argument("--provider", metavar="NAME",
                   help="embedding provider: none (keyword-only), local, auto, openai, openai-compatible, "
                   "gemini, voyage, mistral, ollama (default: config)")
    p.add_argument("--model", metavar="PATH", help="local GGUF embedding model (implies --provider local)")
    p.add_argument("--workspace", metavar="DIR", help="the workspace of --queries")
    p.add_argument("--agent", metavar="ID", help="whose memorySearch settings (default: the config's default agent)")
    p.add_argument("--config", metavar="FILE", help="OpenClaw JSON5 config file")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``qmdbridge`` console script; returns the exit code."""
    raw = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_requested = "--json" in raw[: raw.index("--")] if "--" in raw else "--json" in raw
    args = build_parser().parse_args(raw)
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")
    from qmdbridge.cli.commands import run_command

    if args.command != "serve":  # serve handles its signals itself
        import signal

        def on_term(signum: int, frame: object) -> None:
            raise KeyboardInterrupt  # unwinds the event loop: running qmd children are killed

        signal.signal(signal.SIGTERM, on_term)
    try:
        code = run_command(args)
    except KeyboardInterrupt:
        code = 130
    return code



if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

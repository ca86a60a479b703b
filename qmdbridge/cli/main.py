"""The ``qmdbridge`` command line: the parser and the entry point.

Standard library only until a command runs in-process: ``search``, ``get`` and ``status`` try
the daemon and the fast path first (docs/cli.md, "One-shot or daemon"); exit codes: :data:`EPILOG`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from qmdbridge.cli.common import EXIT_USAGE, print_error, verbose_note
from qmdbridge.cli.daemon_client import DAEMON_COMMANDS, try_daemon

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a served `qmdbridge search` skips it)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

__all__ = ["main", "build_parser"]


# Exit code when stdout's reader is gone: 128 + SIGPIPE, as a shell reports a program it ended.
EXIT_BROKEN_PIPE = 141
# Streamable HTTP port of `qmdbridge mcp --http` (qmd's own MCP server defaults to 8181).
DEFAULT_MCP_PORT = 8191

MCP_EPILOG = """mcp --http: every request needs 'Authorization: Bearer <token>'; the token is
$QMDBRIDGE_MCP_TOKEN, else the file <stateDir>/mcp/token (created 0600, path printed to stderr).
Only loopback Host/Origin headers are accepted (DNS-rebinding protection)."""

EPILOG = """exit codes: 0 ok, 1 backend/index failure, 2 usage or config error, 3 refused path,
4 no such memory file, 130 interrupted (Ctrl-C, SIGTERM), 141 stdout's reader went away (| head).
config: --config FILE, else $OPENCLAW_STATE_DIR/openclaw.json (or ~/.openclaw/openclaw.json) when it exists."""

EVAL_EPILOG = EPILOG + """
eval --backend qmd exits 1 (after printing the report) when not one search was answered by qmd:
every answer fell back to the builtin engine, so the figures are not qmd's."""


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns`` without ``shutil``: ``$COLUMNS``, stdout's terminal, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    stdout = sys.__stdout__
    if columns <= 0 and stdout is not None:
        try:
            columns = os.get_terminal_size(stdout.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _config_defaults() -> dict[str, object]:
    """The settings models' defaults help texts name as ``%(config_<name>)s`` (hits, score 0..1,
    lines of a ``get`` page), imported only when help is printed."""
    from fallback.settings import QuerySettings
    from fallback.sources.read_page import DEFAULT_READ_LINES
    from qmdbridge.config import QmdLimits

    query = QuerySettings.model_fields
    return {"config_query_max_results": query["max_results"].default,
            "config_query_min_score": query["min_score"].default,
            "config_qmd_max_results": QmdLimits.model_fields["max_results"].default,
            "config_read_lines": DEFAULT_READ_LINES}


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter at argparse's width (the terminal's minus 2), computed without
    ``shutil``; a help text's ``%(config_<name>)s`` is :func:`_config_defaults`' value."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _terminal_columns() - 2 if width is None else width)

    def _expand_help(self, action: argparse.Action) -> str:
        if "%(config_" in str(action.help):
            vars(action).update(_config_defaults())
        return super()._expand_help(action)


class _RawDescriptionFormatter(argparse.RawDescriptionHelpFormatter, _HelpFormatter):
    """``RawDescriptionHelpFormatter`` sized by :class:`_HelpFormatter`."""


# argparse takes a query or path starting with '-' for an option: these errors say how to pass it.
_DASH_SYMPTOMS = ("the following arguments are required: query", "the following arguments are required: path",
                  "unrecognized arguments: -")
DASH_HINT = (" (a query or path that starts with '-' goes after '--', and the options before it: "
             "qmdbridge search --json -- -flag)")


class _Parser(argparse.ArgumentParser):
    """argparse with our exit code for usage errors, and a JSON error when ``--json`` was asked
    (``json_errors``, given to the root parser and each sub-parser it builds)."""

    def __init__(self, *args: Any, json_errors: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        self.json_errors = json_errors

    def error(self, message: str) -> NoReturn:  # exit 2 with one line, like argparse, no traceback
        if message.startswith(_DASH_SYMPTOMS):
            message += DASH_HINT
        if self.json_errors:
            print_error(True, f"{self.prog}: {message}", "UsageError", EXIT_USAGE)
        else:
            self.print_usage(sys.stderr)
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


PROGRESS_HELP = "show sync progress on stderr even with --json (it shows anyway otherwise)"


class _VersionAction(argparse.Action):
    """``--version``: print ``qmdbridge <version>`` (looked up only when asked for) and exit 0."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("qmdbridge")
        except PackageNotFoundError:
            found = "unknown (not installed)"
        sys.stdout.write(f"qmdbridge {found}\n")
        parser.exit(0)


def _path_arg(value: str) -> str:
    """A ``--workspace`` or ``--config`` value: any path but a blank one (``ArgumentTypeError``)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


class _JoinWords(argparse.Action):
    """A positional of ``nargs="+"`` stored as one string: its words joined by single spaces."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, " ".join(values) if isinstance(values, list) else values)


def _command_first(raw: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``raw`` with the options typed before the command (``qmdbridge --json search x``) moved
    after it, where the command's parser reads them (an option that takes a value keeps the
    token after it); ``raw`` itself when it starts with the command, ``-h``/``--help``/``--version``
    or when no command follows the options."""
    if not raw or not raw[0].startswith("-") or raw[0] in ("-h", "--help", "--version"):
        return raw
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    takes_value = {flag for command in sub.choices.values()
                   for flag, action in command._option_string_actions.items() if action.nargs != 0}
    i = 0
    while i < len(raw) and raw[i].startswith("-") and raw[i] != "--":
        i += 2 if raw[i] in takes_value else 1
    if i < len(raw) and raw[i] in sub.choices:
        return [raw[i], *raw[:i], *raw[i + 1:]]
    return raw


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workspace", metavar="DIR", type=_path_arg, help="agent workspace (default: from config)")
    p.add_argument("--agent", metavar="ID", help="agent id (default: the config's default agent, else 'main')")
    p.add_argument("--config", metavar="FILE", type=_path_arg, help="OpenClaw JSON5 config file")
    p.add_argument("--backend", choices=["builtin", "qmd"], help="override memory.backend")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")


def build_parser(only: str | None = None, *, json_errors: bool = False) -> argparse.ArgumentParser:
    """The argument parser, with only the sub-parser of command ``only`` (``None``: all); with
    ``json_errors`` a usage error prints ``{"error", "errorType", "exitCode"}`` on stdout."""
    parser = _Parser(prog="qmdbridge", description="Memory search for AI agents over Markdown "
                     "memory files: qmd sidecar with a builtin SQLite fallback.", epilog=EPILOG,
                     formatter_class=_RawDescriptionFormatter, json_errors=json_errors)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser | None:
        """Command ``name``'s sub-parser (epilog :data:`EPILOG` unless given), or ``None``: not ``only``."""
        return sub.add_parser(name, **{"epilog": EPILOG, **kwargs}) if only in (None, name) else None

    if p := add("search", help="search memory (memory_search)"):
        p.add_argument("query", nargs="+", action=_JoinWords,
                       help="what to look for; several words are one query (qmdbridge search what did we "
                            "decide); one that starts with '-' goes after '--': qmdbridge search -- -flag")
        p.add_argument("--max-results", type=int, metavar="N",
                       help="hits wanted (default query.maxResults, %(config_query_max_results)s; on qmd "
                            "memory.qmd.limits.maxResults, %(config_qmd_max_results)s)")
        p.add_argument("--min-score", type=float, metavar="X",
                       help="score floor 0..1 (default query.minScore, %(config_query_min_score)s; qmd applies none)")
        p.add_argument("--session-key", metavar="KEY", help="session key of the caller (scope rules, citations)")
        p.add_argument("--corpus", choices=["memory", "sessions", "all", "wiki"],
                       help="what to search: memory files, session transcripts, all (default) or wiki "
                            "(none is configured: no hits, with a note)")
        p.add_argument("--explain", action="store_true",
                       help="show how each hit was ranked: keyword (BM25) and vector (cosine) sides, "
                            "fusion, decay, rerank, MMR, floor (builtin engine)")
        p.add_argument("--progress", action="store_true", help=PROGRESS_HELP)

    if p := add("get", help="read a memory file or a line range (memory_get)"):
        p.add_argument("path", help="workspace-relative path, e.g. memory/2026-03-01.md (one that starts "
                                    "with '-' goes after '--')")
        p.add_argument("--from", dest="from_line", type=int, metavar="N", help="first line (1-based)")
        p.add_argument("--lines", type=int, metavar="N", help="number of lines (default %(config_read_lines)s)")
        p.add_argument("--from-char", dest="from_char", type=int, metavar="N",
                       help="first character of the --from line (1-based): reads on a line cut at "
                            "the page's char budget")
        p.add_argument("--corpus", choices=["memory", "wiki", "all"],
                       help="all (default) reads memory files and session transcripts, memory only memory "
                            "files; no wiki corpus is configured")

    add("status", help="index and backend health")
    if p := add("index", help="sync the index (--force: full rebuild, swapped in atomically)"):
        p.add_argument("--force", action="store_true", help="rebuild from scratch")
        p.add_argument("--progress", action="store_true", help=PROGRESS_HELP)

    if p := add("qmd", help="operate the agent's qmd sidecar"):
        p.add_argument("action", choices=["update", "embed", "collections"],
                       help="update: re-index files; embed: compute vectors; collections: reconcile and list")

    add("warmup", help="pre-warm qmd's GGUF models in the agent's qmd home")
    if p := add("serve", help="run the long-lived sidecar (timers, watchers, JSON-lines tool calls on stdin)",
                description="Answer memory_search, memory_get, status and sync requests: one JSON\n"
                "object per line on stdin, one answer per line on stdout.\n"
                "Protocol (shapes, errors, ready signal, ordering, concurrency):\n"
                "  docs/serve-protocol.md, JSON Schema docs/serve-protocol.schema.json",
                formatter_class=_RawDescriptionFormatter):
        p.add_argument("--no-stdin", action="store_true", help="do not read tool calls from stdin; run until a signal")
        p.add_argument("--no-socket", action="store_true",
                       help="do not listen on the daemon socket (<stateDir>/daemon/<agentId>.sock)")

    if p := add("mcp", help="serve memory_search / memory_get / status over MCP (stdio, or --http)",
                epilog=EPILOG + "\n" + MCP_EPILOG, formatter_class=_RawDescriptionFormatter):
        p.add_argument("--http", action="store_true", help="Streamable HTTP at http://HOST:PORT/mcp instead of stdio")
        p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default %(default)s)")
        p.add_argument("--port", type=int, default=DEFAULT_MCP_PORT, metavar="N",
                       help="HTTP port (default %(default)s; 0 picks a free one)")
        p.add_argument("--request-timeout", type=float, default=300.0, metavar="SECONDS",
                       help="HTTP: cancel a request not answered within SECONDS (default %(default)g)")
        p.add_argument("--session-idle", type=float, default=1800.0, metavar="SECONDS",
                       help="HTTP: close a session with no request for SECONDS (default %(default)g; 0: never)")

    if p := add("doctor", help="check the workspace, qmd, SQLite features, the provider and the index"):
        p.add_argument("--fix", action="store_true", help="repair what can be repaired (legacy memory.md split)")

    if p := add("models", help="download (pull) or list the local embedding models",
                description="pull: download a GGUF embedding model into the model cache "
                "(<stateDir>/models) ahead of first use, checksum-verified; NAME is a known model "
                "(bge-small-en-v1.5, the default) or hf:<owner>/<repo>/<file>.gguf (default: "
                "local.modelPath when it is an hf: URI, else the default model). list: the cached "
                "models and partial downloads."):
        p.add_argument("action", choices=["pull", "list"], help="pull: download; list: show the cache")
        p.add_argument("name", nargs="?", metavar="NAME", help="model name or hf: URI (pull)")

    if p := add("eval", help="measure recall of memory_search (LoCoMo or a JSONL query set)",
                description="Index into a throw-away store (nothing is left behind), search "
                "every question through the builtin engine (or qmd, --backend qmd) and print "
                "R@1/3/5/10, file R@5/10, snippet R@5, R@5 per category, lines per hit and search "
                "latency p50/p95.", epilog=EVAL_EPILOG):
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--locomo", metavar="PATH",
                         help="a LoCoMo *.json file or a folder of them (one workspace per conversation)")
        src.add_argument("--queries", metavar="FILE",
                         help='JSONL, one {"query", "path", "line"?, "text"?, "category"?, "id"?} per line '
                         "(needs --workspace)")
        p.add_argument("--max-results", type=int, default=10, metavar="N", help="hits per question (default %(default)s)")
        p.add_argument("--min-score", type=float, metavar="X",
                       help="score floor 0..1 (default query.minScore, %(config_query_min_score)s)")
        p.add_argument("--provider", metavar="NAME",
                       help="embedding provider: none (keyword-only), local, auto, openai, openai-compatible, "
                       "gemini, voyage, mistral, ollama (default: config)")
        p.add_argument("--model", metavar="PATH", help="local GGUF embedding model (implies --provider local)")
        p.add_argument("--backend", choices=["builtin", "qmd"], default="builtin",
                       help="what answers: builtin (default, whatever memory.backend says) or qmd (the qmd "
                       "sidecar with its home and index in the throw-away state dir; --provider/--model "
                       "do not apply)")
        p.add_argument("--qmd-search-mode", choices=["search", "vsearch", "query"],
                       help="override memory.qmd.searchMode for the run (--backend qmd)")
        p.add_argument("--long-lived", action="store_true",
                       help="search through a long-lived manager, as serve and mcp keep one (with "
                       "--backend qmd: its warm qmd mcp child, waited for before the first search)")
        p.add_argument("--misses", type=int, default=0, metavar="N",
                       help="after the figures, list the first N questions R@5 missed: the question, "
                       "the expected path and line, and what came back (--json always has them all "
                       "under misses)")
        p.add_argument("--workspace", metavar="DIR", type=_path_arg, help="the workspace of --queries")
        p.add_argument("--cache-dir", metavar="DIR",
                       help="keep each workspace's index (with its embedding cache; with --backend qmd also "
                       "the qmd home and index) in DIR/<name> for the next run, which then embeds only new "
                       "text (default: a throw-away folder)")
        p.add_argument("--agent", metavar="ID", help="whose memorySearch settings (default: the config's default agent)")
        p.add_argument("--config", metavar="FILE", type=_path_arg, help="OpenClaw JSON5 config file")
        p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")

    for name, command_parser in sub.choices.items():
        if name != "eval":  # its own options (above)
            _common(command_parser)
        command_parser.json_errors = json_errors
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``qmdbridge`` console script; returns the exit code."""
    early: Any = None
    restore_sigterm: Any = None
    try:
        raw = list(sys.argv[1:] if argv is None else argv)
        json_errors = "--json" in raw[: raw.index("--")] if "--" in raw else "--json" in raw
        only = raw[0] if raw and raw[0] in DAEMON_COMMANDS else None
        parser = build_parser(only, json_errors=json_errors)
        raw = _command_first(raw, parser)
        args = parser.parse_args(raw)
        served = try_daemon(args)  # a running `qmdbridge serve` for this agent answers without any heavy import
        if served is not None:
            return served
        if args.command == "search":
            # No daemon: an index in sync is searched read-only with the recorded settings,
            # without loading the config models, anyio or the engine (cli/fast_search.py); in qmd
            # mode the search's qmd calls start now, while the rest loads (cli/qmd_prefetch.py).
            from qmdbridge.cli.fast_search import answer_recorded, recorded_search

            recorded = recorded_search(args)
            if recorded is not None and recorded["backend"] == "qmd":
                from qmdbridge.cli.qmd_prefetch import start_prefetch
                from qmdbridge.qmd.early import EarlyCalls

                restore_sigterm = _stop_on_sigterm()  # from now on qmd children run: killed on the way out
                # owned (closed below) before anything starts: a signal that lands while the
                # thread starting them starts still finds every call
                early = EarlyCalls()
                if start_prefetch(args, recorded, calls=early) is None:
                    early = None
            elif recorded is not None:
                answered = answer_recorded(args, recorded)
                if answered is not None:
                    return answered
        if restore_sigterm is None and args.command not in ("serve", "mcp"):  # these handle their signals
            restore_sigterm = _stop_on_sigterm()
        from qmdbridge.cli.commands import run_command  # the config loaded; `early` the qmd calls started

        return run_command(args, qmd_runner=early.run_command if early is not None else None)
    except BaseException as exc:  # the CLI edge: Ctrl-C or SIGTERM is exit 130, anything else raises
        if _matches(exc, KeyboardInterrupt):
            return 130
        if _matches(exc, BrokenPipeError):  # the reader of stdout is gone (`| head -c1`)
            _stdout_to_devnull()
            return EXIT_BROKEN_PIPE
        raise
    finally:
        if early is not None:
            early.close()
            verbose_note(args, f"qmd calls started ahead of the config: {early.started}, taken by the "
                               f"search: {early.used}")
        if restore_sigterm is not None:
            restore_sigterm()


def _matches(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``exc`` is a ``kind``, or an exception group holding one (raised inside a task
    of an anyio task group, it leaves ``anyio.run`` wrapped in a ``BaseExceptionGroup``)."""
    if isinstance(exc, kind):
        return True
    inner = getattr(exc, "exceptions", None)
    return isinstance(inner, tuple) and any(isinstance(e, BaseException) and _matches(e, kind) for e in inner)


def _stdout_to_devnull() -> None:
    """Point stdout's descriptor at ``/dev/null``: what is still buffered would otherwise fail
    again when Python flushes it on the way out (``Exception ignored ... BrokenPipeError``)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, sys.stdout.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError):  # no descriptor (a test's stand-in stream): nothing to flush
        pass


def _stop_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM raise ``KeyboardInterrupt`` (exit 130) so running qmd children are
    killed; returns the function that puts the previous handler back."""
    import signal

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

    return restore


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

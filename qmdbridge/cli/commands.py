"""Command implementations of the ``qmdbridge`` CLI and the one error-to-exit-code mapping."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import anyio

from fallback.errors import (
    ConfigError,
    IndexStoreError,
    MemoryFileNotFoundError,
    MemorySearchError,
    PathRefusedError,
    UsageError,
)
from qmdbridge.cli.common import (
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    emit_json,
    print_config_warnings,
    print_error,
)
from qmdbridge.cli.progress import sync_progress
from qmdbridge.cli.render import keyword_notice, print_answer
from qmdbridge.manager import MemoryManager, require_workspace
from qmdbridge.problems import is_indexed_caveat, store_failure_hint

__all__ = ["exit_code_for", "run_command"]


def exit_code_for(exc: BaseException) -> int:
    """Map our exception classes to CLI exit codes (see ``qmdbridge --help``)."""
    if isinstance(exc, PathRefusedError):
        return EXIT_REFUSED
    if isinstance(exc, MemoryFileNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(exc, (ConfigError, UsageError)):
        return EXIT_USAGE
    return EXIT_FAILURE


def _resolve(args: argparse.Namespace) -> tuple[Any, Any]:
    """The loaded config and the agent the command runs for."""
    from qmdbridge.config import load_config, normalize_agent_id, resolve_agent

    cfg = load_config(args.config)
    if args.agent is not None:
        known = [normalize_agent_id(a.id) for a in cfg.agents] or ["main"]
        try:
            wanted = normalize_agent_id(args.agent)
        except ConfigError as exc:  # a bad argument, not a config value
            raise UsageError(f"--agent: invalid agent id {args.agent!r} (expected {exc.expected})") from None
        if wanted not in known:
            raise UsageError(f"unknown agent {args.agent!r} (known: {', '.join(known)})")
    return cfg, resolve_agent(cfg, args.agent, workspace=args.workspace)


@contextmanager
def _logs_to_stderr(args: argparse.Namespace) -> Iterator[None]:
    """For the command's duration: with ``-v`` every record from INFO to stderr as ``LEVEL logger:
    message`` (but the config's, which the command prints itself); else only errors, as
    ``qmdbridge: message`` (a command prints what matters itself), unless a handler is set up;
    ``serve`` and ``mcp`` keep logging's default then, less the postgres pool's retries."""
    import logging

    root, serving = logging.getLogger(), args.command in ("serve", "mcp")
    if not args.verbose and (serving or root.handlers):
        if serving:
            logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        yield
        return
    if args.verbose and not serving:  # run_command prints the config warnings
        logging.getLogger("qmdbridge.config").setLevel(logging.ERROR)
    handler, level = logging.StreamHandler(sys.stderr), root.level
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s" if args.verbose
                                           else "qmdbridge: %(message)s"))
    if args.verbose:
        root.setLevel(logging.INFO)
    else:
        handler.setLevel(logging.ERROR)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def run_command(args: argparse.Namespace, *, qmd_runner: Any = None) -> int:
    """Run one parsed command; prints results and errors, returns the exit code.
    ``qmd_runner``: runs a ``search``'s qmd processes (the calls it started ahead), or ``None``."""
    with _logs_to_stderr(args):
        try:
            key, key_taken_ms = None, None
            if args.command == "search":  # what the config is read from, before it is read
                from fallback.index.racy import wall_clock_ms
                from qmdbridge.cli.fast_search import settings_key

                key_taken_ms = wall_clock_ms()
                key = settings_key(args, os.environ)
            cfg, agent = _resolve(args)
            if args.command not in ("serve", "mcp"):  # these log them (logging's default)
                print_config_warnings(agent.config_warning_lines())
            handler = partial(_search, qmd_runner=qmd_runner) if qmd_runner else _handler(args.command)
            if args.command == "eval":  # each eval workspace gets its own agent from the config
                handler = partial(handler, cfg=cfg)
            code = anyio.run(handler if args.command in ("serve", "mcp") else partial(_until_interrupted, handler),
                             agent, args)  # serve and mcp stop on their signals themselves
            if key is not None and code == EXIT_OK:
                from qmdbridge.cli.search_cache import record_search_settings

                # the next one-shot search skips all this
                record_search_settings(args, cfg, agent, key=key, key_taken_ms=key_taken_ms)
            return code
        except MemorySearchError as exc:
            code = print_error(args.json, str(exc), type(exc).__name__, exit_code_for(exc))
            if not args.json and isinstance(exc, IndexStoreError):
                hint = store_failure_hint(type(exc).__name__, exc.db_path)
                if hint is not None:
                    sys.stderr.write(f"  fix: {hint}\n")
            return code


async def _until_interrupted(handler: Callable[..., Any], *args: Any) -> int:
    """``await handler(*args)`` (a command's exit code), cancelled by SIGINT or SIGTERM through the
    event loop's own signal handlers: the signal wakes the loop. A Python-level handler runs only
    once the main thread runs again, and a signal that lands on another thread, or just before the
    loop's wait, left the loop asleep (an index held by an embedding request ignored Ctrl-C).

    Raises:
        KeyboardInterrupt: SIGINT or SIGTERM arrived (the CLI's exit 130).
    """
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in stops}
    interrupted: list[int] = []

    def stop(signum: int) -> None:
        interrupted.append(signum)
        task.cancel()

    try:
        for s in stops:
            loop.add_signal_handler(s, stop, s)
    except (NotImplementedError, RuntimeError):  # Windows' loop, or not the main thread: Python's handlers
        return int(await handler(*args))
    try:
        return int(await handler(*args))
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        for s in stops:
            loop.remove_signal_handler(s)
            if previous[s] is not None:
                signal.signal(s, previous[s])


def _index_writer(agent: Any) -> Callable[[], int | None]:
    """``() -> pid`` of the process holding the agent's index writer lock, or ``None``."""
    from fallback.store.lock import StoreWriteLock

    return StoreWriteLock(agent.engine.db_path).holder_pid


async def _search(agent: Any, args: argparse.Namespace, *, qmd_runner: Any = None) -> int:
    async with MemoryManager(agent, backend=args.backend, qmd_runner=qmd_runner) as m:
        with sync_progress(enabled=args.progress or not args.json,
                           index_writer=_index_writer(agent)) as on_progress:
            # the first search of a workspace indexes it first
            response = await m.search(args.query, max_results=args.max_results,
                                      min_score=args.min_score, session_key=args.session_key,
                                      explain=args.explain, corpus=args.corpus,
                                      progress=on_progress)
    return print_answer(args, response.to_json_dict(), served_by="process",
                        keyword_notice=keyword_notice(agent.memory_search.provider))


async def _get(agent: Any, args: argparse.Namespace) -> int:
    async with MemoryManager(agent, backend=args.backend) as m:
        result = await m.read_file(args.path, from_line=args.from_line, lines=args.lines,
                                   corpus=args.corpus, from_char=args.from_char)
    if result.missing:  # the tool answers empty text; a command says so with its exit code
        raise MemoryFileNotFoundError(result.path)
    return print_answer(args, result.to_json_dict(), served_by="process")


async def _status(agent: Any, args: argparse.Namespace) -> int:
    require_workspace(agent.workspace_dir)  # without one, status must not create an index store
    async with MemoryManager(agent, backend=args.backend) as m:
        st = await m.status()
    return print_answer(args, st.to_json_dict(), served_by="process")


# Full rebuilds the index line does not explain: none, one asked for, the first build of a store.
_UNTOLD_REBUILDS = (None, "force", "no index metadata")


async def _index(agent: Any, args: argparse.Namespace) -> int:
    async with MemoryManager(agent, backend=args.backend) as m:
        with sync_progress(enabled=args.progress or not args.json,
                           index_writer=_index_writer(agent)) as on_progress:
            report = await m.sync(reason="cli", force=args.force, progress=on_progress)
        st = await m.status()
        notices = (await m.builtin()).take_notices()  # a corrupt store moved aside ...
    if args.json:
        emit_json({"ok": True, "forced": args.force, "rebuilt": report.full_reason, "status": st.to_json_dict()})
    else:
        # a status that failed to read the index (a postgres statement timeout) shows no counts
        sys.stderr.write("".join(f"warning: {n}\n" for n in [*notices, *filter(None, [st.last_error])]))
        pending = st.vector.get("pending") or 0
        caveats = sum(is_indexed_caveat(s.reason) for s in st.skipped)
        skipped = len(st.skipped) - caveats
        sys.stdout.write(f"Memory index updated ({agent.agent_id}): {st.files} files, {st.chunks} chunks"
                         f"{', ' + str(skipped) + ' skipped' if skipped else ''}"
                         f"{', ' + str(caveats) + ' indexed with a caveat' if caveats else ''}"
                         f"{'; ' + str(st.dirty_reason) if pending else ''}"
                         f"{f'; rebuilt in full ({report.full_reason})' if report.full_reason not in _UNTOLD_REBUILDS else ''}.\n")
    return EXIT_OK


# The commands whose code lives in a module of its own: ``module:function``, imported when run.
_HANDLERS: dict[str, Any] = {
    "search": _search, "get": _get, "status": _status, "index": _index,
    "qmd": "qmdbridge.cli.ops:qmd_action", "warmup": "qmdbridge.cli.ops:warmup",
    "serve": "qmdbridge.cli.serve:serve", "mcp": "qmdbridge.server.mcp_server:run_mcp",
    "doctor": "qmdbridge.cli.doctor:doctor", "models": "qmdbridge.cli.models:models",
    "eval": "qmdbridge.cli.evaluate:run_eval",
}


def _handler(command: str) -> Any:
    """The ``async (agent, args) -> exit code`` of ``command`` (its module imported now)."""
    handler = _HANDLERS[command]
    if isinstance(handler, str):
        from importlib import import_module

        module, _, name = handler.partition(":")
        handler = getattr(import_module(module), name)
    return handler

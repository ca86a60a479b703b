"""Command implementations of the ``qmdbridge`` CLI and the one error-to-exit-code mapping."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio

from fallback.errors import (
    ConfigError,
    MemoryFileNotFoundError,
    MemorySearchError,
    PathRefusedError,
    UsageError,
)
from qmdbridge.cli.common import EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit_json

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


def _resolve(args: argparse.Namespace) -> Any:
    from qmdbridge.config import load_config, resolve_agent

    cfg = load_config(args.config)
    return resolve_agent(cfg, args.agent, workspace=args.workspace)


def run_command(args: argparse.Namespace) -> int:
    """Run one parsed command; prints results and errors, returns the exit code."""
    try:
        agent = _resolve(args)
        handler = _HANDLERS[args.command]
        return anyio.run(handler, agent, args)
    except MemorySearchError as exc:
        code = exit_code_for(exc)
        if getattr(args, "json", False):
            emit_json({"error": str(exc), "errorType": type(exc).__name__, "exitCode": code})
        else:
            sys.stderr.write(f"qmdbridge: {exc}\n")
        return code


def _manager(agent: Any, args: argparse.Namespace, *, mode: str = "cli") -> Any:
    from qmdbridge.manager import MemoryManager

    return MemoryManager(agent, backend=args.backend, mode=mode)  # type: ignore[arg-type]


async def _search(agent: Any, args: argparse.Namespace) -> int:
    async with _manager(agent, args) as m:
        response = await m.search(args.query, max_results=args.max_results,
                                  min_score=args.min_score, session_key=args.session_key,
                                  explain=args.explain)
    if args.json:
        emit_json({**response.to_json_dict(), "servedBy": "process"})
        return EXIT_OK
    from qmdbridge.cli.output import print_search

    print_search(response)
    return EXIT_OK


async def _get(agent: Any, args: argparse.Namespace) -> int:
    async with _manager(agent, args) as m:
        result = await m.read_file(args.path, from_line=args.from_line, lines=args.lines)
    if result.missing:  # the tool answers empty text; a command says so with its exit code
        raise MemoryFileNotFoundError(result.path)
    if args.json:
        emit_json({**result.to_json_dict(), "servedBy": "process"})
    else:
        sys.stdout.write(result.text + ("\n" if result.text and not result.text.endswith("\n") else ""))
    return EXIT_OK


async def _status(agent: Any, args: argparse.Namespace) -> int:
    async with _manager(agent, args) as m:
        st = await m.status()
    if args.json:
        emit_json({**st.to_json_dict(), "servedBy": "process"})
    else:
        from qmdbridge.cli.output import print_status

        print_status(st)
    return EXIT_OK


async def _index(agent: Any, args: argparse.Namespace) -> int:
    from qmdbridge.cli.output import progress_reporter

    async with _manager(agent, args) as m:
        with progress_reporter(enabled=not args.json) as on_progress:
            await m.sync(reason="cli", force=args.force, progress=on_progress)
        st = await m.status()
    if args.json:
        emit_json({"ok": True, "forced": args.force, "status": st.to_json_dict()})
    else:
        sys.stdout.write(f"Memory index updated ({agent.agent_id}): {st.files} files, {st.chunks} chunks"
                         f"{', ' + str(len(st.skipped)) + ' skipped' if st.skipped else ''}.\n")
    return EXIT_OK


async def _qmd(agent: Any, args: argparse.Namespace) -> int:
    from qmdbridge.cli.ops import qmd_action

    return await qmd_action(agent, args)


async def _warmup(agent: Any, args: argparse.Namespace) -> int:
    from qmdbridge.cli.ops import warmup

    return await warmup(agent, args)


async def _serve(agent: Any, args: argparse.Namespace) -> int:
    from qmdbridge.cli.serve import serve

    return await serve(agent, args)


async def _mcp(agent: Any, args: argparse.Namespace) -> int:
    from qmdbridge.server.mcp_server import run_mcp

    return await run_mcp(agent, args)


async def _doctor(agent: Any, args: argparse.Namespace) -> int:
    from qmdbridge.cli.doctor import doctor

    return await doctor(agent, args)


async def _eval(agent: Any, args: argparse.Namespace) -> int:
    from qmdbridge.cli.evaluate import run_eval

    return await run_eval(agent, args)


_HANDLERS = {
    "search": _search, "get": _get, "status": _status, "index": _index, "qmd": _qmd,
    "warmup": _warmup, "serve": _serve, "mcp": _mcp, "doctor": _doctor, "eval": _eval,
}

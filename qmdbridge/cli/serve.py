"""``qmdbridge serve``: the long-lived sidecar process.

One ``full``-mode ``MemoryManager`` answers JSON-lines tool calls on stdin/stdout and on the
agent's daemon socket (docs/serve-protocol.md) until SIGTERM/SIGINT/SIGHUP or end of input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio

from fallback.errors import UsageError
from qmdbridge.cli.common import EXIT_OK
from qmdbridge.cli.render import keyword_notice
from qmdbridge.server.process import run_until_signal, stdin_lines
from qmdbridge.server.socket_listener import identity_for, serve_socket
from qmdbridge.server.wire import decode_line, encode_line
from qmdbridge.tools import SYNC_SCHEMA, call_tool, param_error

__all__ = ["handle_line", "serve", "start_daemon_socket"]


async def handle_line(manager: Any, line: bytes) -> dict[str, Any]:
    """Answer one JSON-lines request (see the module docstring for the shapes): ``sync`` here,
    every other tool by :func:`qmdbridge.tools.call_tool`. Never raises: a failure is the
    reply's ``error``."""
    try:
        req = decode_line(line)
    except ValueError as exc:
        return {"id": None, "error": f"invalid JSON: {exc}"}
    if not isinstance(req, dict):
        return {"id": None, "error": "request must be a JSON object"}
    rid, tool = req.get("id"), req.get("tool")
    params: dict[str, Any] = req["params"] if isinstance(req.get("params"), dict) else {}
    if not isinstance(tool, str):
        return {"id": rid, "error": "request names no tool: set \"tool\" to memory_search, memory_get, "
                                    "status or sync"}
    try:
        if tool != "sync":
            return {"id": rid, "result": await call_tool(
                manager, tool, params, session_key=req.get("sessionKey"), session_keys=req.get("sessionKeys"))}
        invalid = param_error(SYNC_SCHEMA, params)  # {"force": "false"} must not force a rebuild
        if invalid is not None:
            return {"id": rid, "error": invalid}
        await manager.sync(reason="serve", force=params.get("force") is True)
        return {"id": rid, "result": {"ok": True}}
    except UsageError as exc:  # an unknown tool
        return {"id": rid, "error": str(exc)}
    except Exception as exc:  # serve edge: a failed sync or status answers its request
        return {"id": rid, "error": f"{type(exc).__name__}: {exc}" if tool == "status" else str(exc)}


async def _read_stdin(manager: Any) -> None:
    """Answer each request line of stdin on stdout, one JSON line each, until end of input."""
    async with stdin_lines() as receive:
        async for line in receive:
            if not line.strip():
                continue
            sys.stdout.buffer.write(encode_line(await handle_line(manager, line)) + b"\n")
            sys.stdout.flush()


async def start_daemon_socket(tg: Any, manager: Any, agent: Any, args: argparse.Namespace) -> str | None:
    """Start the daemon socket in ``tg``, answering with :func:`handle_line` of the started
    ``manager`` plus ``keywordNotice`` and ``configWarnings`` (the agent's config warning lines,
    which the client prints) in each reply; ``args``' ``--config`` and ``--backend``
    are part of the daemon's identity. Returns the socket's path, or ``None`` when none could
    be made (the reason is on stderr)."""
    notice = keyword_notice(agent.memory_search.provider)
    warnings = agent.config_warning_lines()

    async def handle(line: bytes) -> dict[str, Any]:
        return {**await handle_line(manager, line), "keywordNotice": notice, "configWarnings": warnings}

    identity = identity_for(agent, config=args.config, backend=args.backend)
    path = await tg.start(serve_socket, identity, handle)
    if path is not None:
        sys.stderr.write(f"qmdbridge serve: daemon socket {path}\n")
    return path


async def serve(agent: Any, args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT/SIGHUP, or end of stdin unless ``--no-stdin``; returns the exit code."""
    async def body(manager: Any, tg: Any) -> None:
        if not args.no_socket:
            await start_daemon_socket(tg, manager, agent, args)
        if args.no_stdin:
            await anyio.sleep_forever()
        await _read_stdin(manager)

    await run_until_signal(agent, backend=args.backend, prog="qmdbridge serve", body=body)
    return EXIT_OK

"""``qmdbridge mcp``: the agent's memory as an MCP server (stdio, or Streamable HTTP).

The SDK's low-level ``Server`` with the tool schemas and handlers of :mod:`qmdbridge.tools`;
tools and results: docs/mcp-daemon.md, "MCP server".
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import socket
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any, cast

import anyio
import orjson
from mcp import types
from mcp.server.lowlevel import Server

from fallback.errors import UsageError
from qmdbridge.config import ResolvedAgent
from qmdbridge.manager import MemoryManager
from qmdbridge.server.process import run_until_signal, stdin_lines
from qmdbridge.tools import MEMORY_GET_SCHEMA, MEMORY_SEARCH_SCHEMA, call_tool

__all__ = ["STATUS_TOOL_SCHEMA", "build_server", "mcp_tools", "run_mcp"]

SERVER_NAME = "qmdbridge"
STATUS_TOOL_SCHEMA: dict[str, Any] = {
    "name": "status",
    "description": ("Health of the memory index: backend, indexed files and chunks, embedding "
                    "provider, fallback state, skipped files and issues."),
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
}
SESSION_KEY_PROPERTY: dict[str, Any] = {
    "type": "string",
    "description": "Session key of the conversation (e.g. agent:main:main); scope rules and citations depend on it.",
}
SESSION_KEYS_PROPERTY: dict[str, Any] = {
    "type": "array", "items": {"type": "string"},
    "description": ("Session keys this session acts for (e.g. the session that spawned a "
                    "sub-agent); the scope rules allow the search when any key is allowed."),
}
INSTRUCTIONS = ("Long-term memory of this agent (Markdown notes). Use memory_search to find facts, "
                "then memory_get with the returned path and line range to read more; cite results "
                "with their path#Lstart-Lend.")


def mcp_tools() -> list[types.Tool]:
    """The three MCP tools, their input schemas taken from :mod:`qmdbridge.tools`."""
    search = copy.deepcopy(MEMORY_SEARCH_SCHEMA)
    search["parameters"]["properties"].update(sessionKey=SESSION_KEY_PROPERTY, sessionKeys=SESSION_KEYS_PROPERTY)
    read_only = types.ToolAnnotations(readOnlyHint=True, openWorldHint=False)
    return [types.Tool(name=schema["name"], description=schema["description"],
                       inputSchema=copy.deepcopy(schema["parameters"]), annotations=read_only)
            for schema in (search, MEMORY_GET_SCHEMA, STATUS_TOOL_SCHEMA)]


def build_server(manager: MemoryManager) -> Server[Any, Any]:
    """An MCP ``Server`` answering ``tools/list`` and ``tools/call`` with ``manager``; the
    tools' handlers check the arguments, so a refusal is the answer ``serve`` gives."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        own_version: str | None = version("qmdbridge")
    except PackageNotFoundError:
        own_version = None
    server: Server[Any, Any] = Server(SERVER_NAME, version=own_version, instructions=INSTRUCTIONS)

    @server.list_tools()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        return mcp_tools()

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def call(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        params = {k: v for k, v in arguments.items() if k not in ("sessionKey", "sessionKeys")}
        try:  # the one routing of a tool call; a failure is a disabled result
            result = await call_tool(manager, name, params, session_key=arguments.get("sessionKey"),
                                     session_keys=arguments.get("sessionKeys"))
        except Exception as exc:  # tool edge: the client gets an error result, never a crash
            result = {"disabled": True, "error": str(exc) if isinstance(exc, UsageError) else f"{type(exc).__name__}: {exc}"}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=orjson.dumps(result).decode())],
            structuredContent=result, isError=bool(result.get("disabled")))

    return server


async def _serve_stdio(server: Server[Any, Any]) -> None:
    """Serve one MCP session on stdin/stdout until the client closes stdin. A line is read by
    ``json.loads`` (bytes that are not UTF-8 as U+FFFD), which keeps a lone surrogate escape
    (``"\\udcff"``) that the SDK's reader refuses, leaving the request unanswered."""
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage

    send, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)

    async def read(lines: Any) -> None:
        async with send:
            async for line in lines:
                try:
                    message: SessionMessage | Exception = SessionMessage(types.JSONRPCMessage.model_validate(
                        json.loads(line.decode("utf-8", "replace"))))
                except ValueError as exc:  # not JSON, or not a JSON-RPC message: the SDK tells the client
                    message = exc
                await send.send(message)

    async with stdin_lines() as lines, stdio_server(stdin=cast(Any, _no_lines())) as (_, write_stream), \
            anyio.create_task_group() as tg:
        tg.start_soon(read, lines)
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def _no_lines() -> Any:
    """No input for the SDK's own stdin reader (:func:`_serve_stdio` reads stdin)."""
    return
    yield


class _ClosedSessionStreams(logging.Filter):
    """Drops the SDK's ``Error in standalone SSE writer`` record when its cause is the
    session's own stream closing (every client ending its session); other errors still log."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is logged (everything but that routine stream closing)."""
        error = record.exc_info[1] if record.exc_info else None
        return not (record.getMessage() == "Error in standalone SSE writer"
                    and isinstance(error, anyio.ClosedResourceError | anyio.BrokenResourceError))


def _route_sdk_logs(*, verbose: bool) -> None:
    """Send the MCP SDK's log records to stderr as ``qmdbridge mcp: <level> <logger>: <message>``:
    warnings and below only with ``verbose`` (a refused client got its 4xx), errors always."""
    sdk = logging.getLogger("mcp")
    if any(h.get_name() == SERVER_NAME for h in sdk.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(SERVER_NAME)
    handler.setFormatter(logging.Formatter("qmdbridge mcp: %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO if verbose else logging.ERROR)
    sdk.addHandler(handler)
    sdk.propagate = False  # -v's root handler would print each record a second time


async def _serve_http(server: Server[Any, Any], sock: socket.socket, *, host: str, token: str,
                      token_path: Path | None, verbose: bool, request_timeout_s: float,
                      session_idle_s: float) -> None:
    """Serve Streamable HTTP at ``http://host:<port of sock>/mcp`` until cancelled, behind
    :mod:`~qmdbridge.server.http_auth` and :mod:`~qmdbridge.server.http_guard`.
    ``request_timeout_s``: deadline of one POST; ``session_idle_s``: idle session close (0: never)."""
    import uvicorn
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import Route

    from qmdbridge.server.http_auth import BearerTokenMiddleware, exposure_warning, loopback_security
    from qmdbridge.server.http_guard import RequestGuard

    _route_sdk_logs(verbose=verbose)
    sessions = StreamableHTTPSessionManager(app=server, security_settings=loopback_security(host),
                                            session_idle_timeout=session_idle_s or None)
    sdk_log = logging.getLogger("mcp.server.streamable_http")
    if not any(isinstance(f, _ClosedSessionStreams) for f in sdk_log.filters):
        sdk_log.addFilter(_ClosedSessionStreams())

    guarded = RequestGuard(sessions.handle_request, request_timeout_s=request_timeout_s)
    app = Starlette(routes=[Route("/mcp", endpoint=guarded)],
                    middleware=[Middleware(BearerTokenMiddleware, token=token)])
    bound = sock.getsockname()[1]

    class _Server(uvicorn.Server):
        def capture_signals(self) -> Any:
            return nullcontext()  # signals belong to run_mcp, not to uvicorn

    web = _Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False))
    shown = f"[{host}]" if ":" in host else host
    exposed = exposure_warning(host)
    sys.stderr.write(f"qmdbridge mcp: listening on http://{shown}:{bound}/mcp\n"
                     + (f"qmdbridge mcp: {exposed}\n" if exposed else "")
                     + (f"qmdbridge mcp: bearer token in {token_path}\n" if token_path
                        else "qmdbridge mcp: bearer token from $QMDBRIDGE_MCP_TOKEN\n"))
    async with sessions.run():
        try:
            await web.serve(sockets=[sock])
        finally:
            web.should_exit = True


async def run_mcp(agent: ResolvedAgent, args: argparse.Namespace) -> int:
    """Run ``qmdbridge mcp`` until SIGTERM/SIGINT/SIGHUP (or end of stdin over stdio); returns 0.

    Raises:
        ConfigError: ``--http`` and the bearer token is too short or its file unusable.
        UsageError: a bad ``--request-timeout``/``--session-idle``, or ``host:port`` cannot
            be bound.
    """
    token: str | None = None
    token_path: Path | None = None
    sock: socket.socket | None = None
    if args.http:
        from qmdbridge.server.http_auth import load_or_create_token

        if not args.request_timeout > 0 or not args.session_idle >= 0:
            raise UsageError("--request-timeout must be above 0 and --session-idle 0 or above (seconds)")
        if not 0 <= args.port <= 65535:
            raise UsageError(f"--port must be between 0 and 65535, not {args.port}")

        token, token_path = load_or_create_token(agent.state_dir, os.environ)  # fail before starting
        try:  # port 0 picks a free one
            sock = socket.create_server((args.host, args.port), backlog=128, reuse_port=False,
                                        family=socket.AF_INET6 if ":" in args.host else socket.AF_INET)
        except OSError as exc:  # a name that does not resolve: errno < 0, the resolver's text
            reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else (exc.strerror or str(exc))
            raise UsageError(f"cannot listen on {args.host}:{args.port}: {reason}") from None

    async def body(manager: MemoryManager, tg: object) -> None:
        server = build_server(manager)
        if sock is not None and token is not None:
            await _serve_http(server, sock, host=args.host, token=token, token_path=token_path,
                              verbose=args.verbose,
                              request_timeout_s=args.request_timeout, session_idle_s=args.session_idle)
        else:
            await _serve_stdio(server)

    try:
        await run_until_signal(agent, backend=args.backend, prog="qmdbridge mcp", body=body)
    finally:
        if sock is not None:
            sock.close()
    return 0

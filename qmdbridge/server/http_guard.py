"""Request rules of ``qmdbridge mcp --http`` that the MCP SDK's Streamable HTTP transport lacks.

One request per JSON-RPC id and session (``409``), a deadline per POST (``504``); GET and DELETE
pass through (docs/mcp-daemon.md, "MCP server").
"""

from __future__ import annotations

from typing import Any

import anyio
import orjson
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["RequestGuard"]

# Bodies above this are passed on unread past it: the SDK refuses them (413, its 4 MiB limit).
MAX_PEEK_BYTES = 4 * 1024 * 1024
SESSION_HEADER = "mcp-session-id"


class RequestGuard:
    """ASGI wrapper of the MCP transport ``app`` applying this module's rules;
    ``request_timeout_s``: the deadline of one POST in seconds (> 0)."""

    def __init__(self, app: ASGIApp, *, request_timeout_s: float) -> None:
        self.app = app
        self.request_timeout_s = request_timeout_s
        self._in_flight: set[tuple[str, str]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, more = await _peek_body(receive)
        replay = _replaying(body, more, receive)
        key, rid = _request_key(Headers(scope=scope).get(SESSION_HEADER), body) if not more else (None, None)
        if key is not None and key in self._in_flight:
            await _jsonrpc_error(409, rid, f"request id {rid!r} is already in flight in this session; "
                                 "each request needs its own id")(scope, replay, send)
            return
        if key is not None:
            self._in_flight.add(key)
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            with anyio.move_on_after(self.request_timeout_s) as deadline:
                await self.app(scope, replay, tracked)
            if deadline.cancelled_caught and not started:
                await _jsonrpc_error(504, rid, f"no reply within {self.request_timeout_s:g}s "
                                     "(mcp --request-timeout)")(scope, replay, send)
        finally:
            if key is not None:
                self._in_flight.discard(key)


async def _peek_body(receive: Receive) -> tuple[bytes, bool]:
    """The request body read so far and whether more follows (stopped past MAX_PEEK_BYTES)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        more = bool(message.get("more_body", False))
        if not more or size > MAX_PEEK_BYTES:
            return b"".join(chunks), more


def _replaying(body: bytes, more: bool, receive: Receive) -> Receive:
    """A ``receive`` that first yields the peeked ``body`` (``more``: then the rest of it)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replay


def _request_key(session: str | None, body: bytes) -> tuple[tuple[str, str] | None, Any]:
    """``((session id, request id as the SDK keys it, a str), request id)`` of a POST carrying one
    JSON-RPC request of an open session; ``(None, None)`` for anything else."""
    try:
        doc: Any = orjson.loads(body) if session else None
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or "method" not in doc or doc.get("id") is None:
        return None, None
    return (str(session), str(doc["id"])), doc["id"]


def _jsonrpc_error(status: int, request_id: Any, message: str) -> JSONResponse:
    """An HTTP ``status`` answer holding a JSON-RPC error (code -32600, invalid request)."""
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32600, "message": message}},
                        status_code=status)

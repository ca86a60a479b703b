"""A small MCP client for ``qmd mcp`` over stdio: newline-delimited JSON-RPC, answers matched by id.

One reader task hands each answer to the caller waiting for its id; a caller that leaves
sends ``notifications/cancelled`` and a late answer is dropped. A line that is not JSON-RPC,
or the end of stdout, ends the connection. Every failure becomes
:class:`~qmdbridge.qmd.errors.QmdMcpError`; deadlines are the caller's. (The ``mcp`` SDK's
``stdio_client`` owns its process, so it does not fit the warm child.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import anyio
import orjson
from anyio.abc import ByteReceiveStream, ByteSendStream
from anyio.streams.buffered import BufferedByteReceiveStream

from qmdbridge.qmd.errors import QmdMcpError

__all__ = ["EOF_REASON", "MAX_LINE_BYTES", "MCP_PROTOCOL_VERSION", "McpStdioClient"]

# The MCP revision this client speaks (what qmd 2.8.3 serves after a plain ``initialize``).
MCP_PROTOCOL_VERSION = "2025-11-25"
# Longest line read from the child, bytes (qmd itself refuses messages over 10 MiB).
MAX_LINE_BYTES = 16 * 1024 * 1024
# :attr:`McpStdioClient.broken` when the child's stdout ended (the child is exiting, or broke).
EOF_REASON = "the child closed its stdout"
# JSON-RPC "method not found": the answer to a server request other than ``ping``.
_METHOD_NOT_FOUND = -32601
_CLIENT_INFO = {"name": "qmdbridge", "version": "1"}


class _Pending:

    __slots__ = ("done", "error", "message")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.message: dict[str, Any] | None = None
        self.error: QmdMcpError | None = None


class McpStdioClient:
    """JSON-RPC over one ``qmd mcp`` child's stdin (``send``) and stdout (``receive``): :meth:`run`
    in a task for the child's life, :meth:`initialize` once, then :meth:`call_tool`.

    Attributes:
        server_info: the ``initialize`` answer's ``serverInfo``. requests_sent: requests written.
        stale_answers: answers that came after their caller left. broken: why it ended, or ``None``.
    """

    def __init__(self, send: ByteSendStream, receive: ByteReceiveStream) -> None:
        self._send = send
        self._receive = BufferedByteReceiveStream(receive)
        self._write_lock = anyio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self.server_info: dict[str, Any] = {}
        self.requests_sent = 0
        self.stale_answers = 0
        self.broken: str | None = None

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    async def run(self) -> str:
        """Read the child's stdout until the connection ends (its end, a line over
        :data:`MAX_LINE_BYTES`, or not JSON-RPC); returns why. A server ``ping`` is answered."""
        while self.broken is None:
            try:
                line = await self._receive.receive_until(b"\n", MAX_LINE_BYTES)
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError,
                    anyio.BrokenResourceError):
                self.close(EOF_REASON)
                break
            except anyio.DelimiterNotFound:
                self.close(f"a line longer than {MAX_LINE_BYTES} bytes on stdout")
                break
            line = line.removesuffix(b"\r")
            if not line.strip():
                continue
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                message = None
            if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
                self.close(f"not a JSON-RPC message on stdout: {_clip(line)!r}")
                break
            await self._dispatch(message)
        return self.broken or "closed"

    async def initialize(self) -> dict[str, Any]:
        """The MCP ``initialize`` exchange, then ``notifications/initialized``; returns the server's
        result (its ``serverInfo`` kept in :attr:`server_info`).

        Raises:
            QmdMcpError: no answer, or not an ``initialize`` result.
        """
        result = await self._request("initialize", {
            "protocolVersion": MCP_PROTOCOL_VERSION, "capabilities": {}, "clientInfo": _CLIENT_INFO})
        if not isinstance(result.get("serverInfo"), dict):
            raise QmdMcpError(f"qmd mcp initialize: no serverInfo in {_excerpt(result)}", transport=True)
        self.server_info = result["serverInfo"]
        await self._write({"jsonrpc": "2.0", "method": "notifications/initialized"}, "initialized")
        return result

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Call tool ``name`` and return its ``structuredContent``.

        Raises:
            QmdMcpError: ``transport=True`` when the connection failed or is closed; ``False`` for a
                JSON-RPC error, a result flagged ``isError`` or one without ``structuredContent``.
        """
        result = await self._request("tools/call", {"name": name, "arguments": dict(arguments)})
        if result.get("isError"):
            text = " ".join(str(c.get("text", "")) for c in result.get("content") or []
                            if isinstance(c, dict)).strip()
            raise QmdMcpError(f"qmd mcp {name}: {text or 'tool error'}", transport=False)
        structured = result.get("structuredContent")
        if not isinstance(structured, dict):
            raise QmdMcpError(f"qmd mcp {name}: no structuredContent in {_excerpt(result)}",
                              transport=False)
        return structured

    def close(self, reason: str = "the connection to the child is closed") -> None:
        """End the connection: waiting and later calls fail with ``transport=True``; idempotent."""
        if self.broken is None:
            self.broken = reason
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            waiter.error = QmdMcpError(f"qmd mcp: {self.broken}", transport=True)
            waiter.done.set()

    async def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send one request and wait for its answer; a caller that leaves tells the server."""
        if self.broken is not None:
            raise QmdMcpError(f"qmd mcp {method}: {self.broken}", transport=True)
        self._next_id += 1
        request_id = self._next_id
        waiter = self._pending[request_id] = _Pending()
        answered = False
        try:
            await self._write({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params},
                              method)
            self.requests_sent += 1
            await waiter.done.wait()
            answered = True
        finally:
            if not answered and self._pending.pop(request_id, None) is not None:
                await self._cancel(request_id)
        if waiter.error is not None:
            raise QmdMcpError(f"qmd mcp {method}: {self.broken}", transport=True) from None
        message = waiter.message or {}
        if "error" in message:
            error = message["error"] if isinstance(message["error"], dict) else {}
            raise QmdMcpError(f"qmd mcp {method}: JSON-RPC error {error.get('code')}: "
                              f"{error.get('message')}", transport=False)
        result = message.get("result")
        if not isinstance(result, dict):
            raise QmdMcpError(f"qmd mcp {method}: not a JSON-RPC result: {_excerpt(message)}",
                              transport=True)
        return result

    async def _cancel(self, request_id: int) -> None:
        """Tell the server a request's caller left (shielded, at most 1 s, best effort)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(1):
            with contextlib.suppress(QmdMcpError):  # the connection is gone: no answer comes either
                await self._write({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                   "params": {"requestId": request_id, "reason": "deadline"}},
                                  "notifications/cancelled")

    async def _dispatch(self, message: dict[str, Any]) -> None:
        if "method" in message:  # a request or notification from the server
            if "id" in message:
                reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
                if message["method"] == "ping":
                    reply["result"] = {}
                else:
                    reply["error"] = {"code": _METHOD_NOT_FOUND,
                                      "message": f"client does not serve {message['method']}"}
                with contextlib.suppress(QmdMcpError):  # the reader notices the end itself
                    await self._write(reply, str(message["method"]))
            return
        request_id = message.get("id")
        waiter = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        if waiter is None:
            self.stale_answers += 1
            return
        waiter.message = message
        waiter.done.set()

    async def _write(self, message: dict[str, Any], method: str) -> None:
        if self.broken is not None:
            raise QmdMcpError(f"qmd mcp {method}: {self.broken}", transport=True)
        line = orjson.dumps(message) + b"\n"
        try:
            async with self._write_lock:
                await self._send.send(line)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self.close(f"the child's stdin is closed ({type(exc).__name__})")
            raise QmdMcpError(f"qmd mcp {method}: {self.broken}", transport=True) from exc


def _clip(line: bytes) -> str:
    text = line.decode("utf-8", "replace")
    return text if len(text) <= 120 else text[:117] + "..."


def _excerpt(value: Any) -> str:
    text = orjson.dumps(value, default=str).decode()
    return text if len(text) <= 200 else text[:197] + "..."

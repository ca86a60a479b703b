"""The MCP connection to one ``qmd mcp`` child: the ``mcp`` SDK's ``ClientSession`` over the child's stdio.

A line that is not JSON-RPC, or the end of stdout, ends the connection and fails every waiting
call; every failure is a :class:`~qmdbridge.qmd.errors.QmdMcpError`; deadlines are the caller's.
Why not ``stdio_client``: docs/qmd.md, "The warm qmd child".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
import pydantic
from anyio.abc import ByteReceiveStream, ByteSendStream
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import ClientSession, McpError, types
from mcp.shared.message import SessionMessage

from qmdbridge.qmd.errors import QmdMcpError

__all__ = ["CLOSED_REASON", "EOF_REASON", "MAX_LINE_BYTES", "McpStdioClient"]

# Longest line read from the child, bytes (qmd itself refuses messages over 10 MiB).
MAX_LINE_BYTES = 16 * 1024 * 1024
# :attr:`McpStdioClient.broken` when the child's stdout ended (the child is exiting, or broke).
EOF_REASON = "the child closed its stdout"
# :attr:`McpStdioClient.broken` once :meth:`McpStdioClient.close` ended the connection.
CLOSED_REASON = "the connection to the child is closed"
_CLIENT_INFO = types.Implementation(name="qmdbridge", version="1")
_T = TypeVar("_T")


class McpStdioClient:
    """A ``ClientSession`` over one ``qmd mcp`` child's stdin (``send``) and stdout (``receive``):
    :meth:`run` in a task for the child's life, :meth:`initialize` once, then :meth:`call_tool`.

    Attributes:
        requests_sent: requests written to the child. stale_answers: answers that came after
            their caller left. broken: why the connection ended, or ``None``.
    """

    def __init__(self, send: ByteSendStream, receive: ByteReceiveStream) -> None:
        self._send = send
        self._receive = BufferedByteReceiveStream(receive)
        self._to_session, from_child = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        to_child, self._from_session = anyio.create_memory_object_stream[SessionMessage](0)
        self._session = ClientSession(from_child, to_child, message_handler=self._on_message,
                                      client_info=_CLIENT_INFO)
        self._waiting: set[anyio.CancelScope] = set()
        self.requests_sent = 0
        self.stale_answers = 0
        self.broken: str | None = None

    async def run(self) -> str:
        """Carry messages until the connection ends (the child's stdout ends, a line over
        :data:`MAX_LINE_BYTES` or not JSON-RPC, its stdin closes); returns why."""
        async with self._session, anyio.create_task_group() as tg:
            tg.start_soon(self._write_lines)
            await self._read_lines()
            tg.cancel_scope.cancel()
        return self.broken or "closed"

    async def initialize(self) -> types.InitializeResult:
        """The MCP ``initialize`` exchange, then ``notifications/initialized``; the server's answer.

        Raises:
            QmdMcpError: no answer, or not an ``initialize`` result of a protocol version the SDK speaks.
        """
        return await self._request("initialize", self._session.initialize)

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Call tool ``name`` and return its ``structuredContent`` (the result is not checked
        against the tool's output schema: no ``tools/list`` round trip).

        Raises:
            QmdMcpError: ``transport=True`` when the connection failed or is closed; ``False`` for a
                JSON-RPC error, a result flagged ``isError`` or one without ``structuredContent``.
        """
        request = types.ClientRequest(types.CallToolRequest(
            params=types.CallToolRequestParams(name=name, arguments=dict(arguments))))
        result = await self._request(
            "tools/call", lambda: self._session.send_request(request, types.CallToolResult))
        if result.isError:
            text = " ".join(c.text for c in result.content if isinstance(c, types.TextContent)).strip()
            raise QmdMcpError(f"qmd mcp {name}: {text or 'tool error'}", transport=False)
        if result.structuredContent is None:
            raise QmdMcpError(f"qmd mcp {name}: no structuredContent in {_clip(result.model_dump_json())}",
                              transport=False)
        return result.structuredContent

    def close(self, reason: str = CLOSED_REASON) -> None:
        """End the connection: waiting and later calls fail with ``transport=True``; idempotent."""
        if self.broken is None:
            self.broken = reason
        for scope in self._waiting:
            scope.cancel()
        self._to_session.close()

    async def _request(self, method: str, request: Callable[[], Awaitable[_T]]) -> _T:
        """Run one request of the session; a connection that ends meanwhile cancels it."""
        if self.broken is None:
            with anyio.CancelScope() as scope:
                self._waiting.add(scope)
                try:
                    return await request()
                except McpError as exc:
                    if exc.error.code != types.CONNECTION_CLOSED:
                        raise QmdMcpError(f"qmd mcp {method}: JSON-RPC error {exc.error.code}: "
                                          f"{exc.error.message}", transport=False) from None
                except (pydantic.ValidationError, RuntimeError) as exc:  # not the result asked for
                    raise QmdMcpError(f"qmd mcp {method}: {_clip(str(exc))}", transport=True) from None
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass  # the connection ended while the request was written
                finally:
                    self._waiting.discard(scope)
        raise QmdMcpError(f"qmd mcp {method}: {self.broken or CLOSED_REASON}", transport=True)

    async def _read_lines(self) -> None:
        while True:
            try:
                line = await self._receive.receive_until(b"\n", MAX_LINE_BYTES)
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError,
                    anyio.BrokenResourceError):
                return self.close(EOF_REASON)
            except anyio.DelimiterNotFound:
                return self.close(f"a line longer than {MAX_LINE_BYTES} bytes on stdout")
            if not line.strip():
                continue
            try:
                message = types.JSONRPCMessage.model_validate_json(line)
            except pydantic.ValidationError:
                return self.close(f"not a JSON-RPC message on stdout: {_clip(line.decode('utf-8', 'replace'))!r}")
            try:
                await self._to_session.send(SessionMessage(message))
            except anyio.ClosedResourceError:
                return

    async def _write_lines(self) -> None:
        async for item in self._from_session:
            line = item.message.model_dump_json(by_alias=True, exclude_none=True) + "\n"
            try:
                await self._send.send(line.encode())
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                return self.close(f"the child's stdin is closed ({type(exc).__name__})")
            self.requests_sent += isinstance(item.message.root, types.JSONRPCRequest)

    async def _on_message(self, message: object) -> None:
        """The session's unmatched input: an exception is an answer to no waiting call."""
        if isinstance(message, Exception):
            self.stale_answers += 1


def _clip(text: str) -> str:
    return text if len(text) <= 200 else text[:197] + "..."

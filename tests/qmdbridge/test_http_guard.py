"""``RequestGuard`` over real HTTP requests (httpx's ASGI transport) in front of a stand-in
transport that answers only when told to: the one behaviour the real MCP server cannot be made
to show on demand (a reply that never comes)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from starlette.responses import JSONResponse

from qmdbridge.server.http_guard import RequestGuard

pytestmark = pytest.mark.anyio
CALL = {"jsonrpc": "2.0", "id": "a1", "method": "tools/call", "params": {"name": "status", "arguments": {}}}


class HeldTransport:
    """Answers each POST with its JSON-RPC id once ``release`` is set; records the bodies seen."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.entered = anyio.Event()
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        self.entered.set()
        await self.release.wait()
        await JSONResponse({"jsonrpc": "2.0", "id": "a1", "result": {}})(scope, receive, send)


async def test_a_request_past_its_deadline_gets_a_504_not_silence() -> None:
    held = HeldTransport()
    guard = RequestGuard(held, request_timeout_s=0.2)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://127.0.0.1") as http:
        r = await http.post("/mcp", json=CALL, headers={"mcp-session-id": "s1"})
    assert r.status_code == 504
    assert r.json() == {"jsonrpc": "2.0", "id": "a1",
                        "error": {"code": -32600, "message": "no reply within 0.2s (mcp --request-timeout)"}}


async def test_the_same_id_in_flight_twice_in_one_session_is_refused() -> None:
    held = HeldTransport()
    guard = RequestGuard(held, request_timeout_s=60)
    answers: dict[str, httpx.Response] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://127.0.0.1") as http:
        async def first() -> None:
            answers["first"] = await http.post("/mcp", json=CALL, headers={"mcp-session-id": "s1"})

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await held.entered.wait()
            again = await http.post("/mcp", json=CALL, headers={"mcp-session-id": "s1"})
            tracked = guard._in_flight == {("s1", "a1")}
            held.release.set()
        later = await http.post("/mcp", json=CALL, headers={"mcp-session-id": "s1"})  # no longer in flight
    assert again.status_code == 409 and again.json()["error"]["message"] == (
        "request id 'a1' is already in flight in this session; each request needs its own id")
    assert tracked and answers["first"].status_code == 200 and later.status_code == 200
    assert len(held.bodies) == 2 and all(b'"id":"a1"' in b for b in held.bodies)  # the body reached it whole

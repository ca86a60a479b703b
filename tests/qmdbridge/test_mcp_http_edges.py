"""``qmdbridge mcp --http`` at its edges, as a real process driven over real HTTP: the bearer
scheme in any case, the SDK's log records kept off stderr unless ``-v``, a warning for a
non-loopback bind, one in-flight request per JSON-RPC id, and idle sessions that expire."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_procs import cli_env, live_children, make_workspace, start, stop  # noqa: E402

pytestmark = pytest.mark.anyio
TOKEN = "test-token-0123456789abcdef"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
           "Authorization": f"Bearer {TOKEN}"}


def _server(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str, list[str]]:
    ws = make_workspace(tmp_path)
    env = {**cli_env(tmp_path / "state", tmp_path / "home"), "QMDBRIDGE_MCP_TOKEN": TOKEN}
    proc, lines = start(["mcp", "--http", "--port", "0", "--workspace", str(ws), *extra], env,
                        ready="bearer token from")
    url = re.search(r"listening on (http://\S+)", "".join(lines))
    assert url is not None
    return proc, url.group(1), lines


def _rest_of_stderr(proc: subprocess.Popen[bytes]) -> list[str]:
    assert proc.stderr is not None
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read().decode().splitlines()
    assert stop(proc) == 0
    return rest


async def _open_session(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    opened = await http.post(url, json=INIT, headers=HEADERS)
    assert opened.status_code == 200
    headers = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"],
               "mcp-protocol-version": "2025-06-18"}
    done = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert done.status_code == 202
    return headers


def _sse_message(text: str) -> dict[str, Any]:
    data = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ") and line != "data: "]
    return orjson.loads(data[-1]) if data else {"noReply": text}  # a reply stream that ended empty


async def test_lowercase_scheme_and_refused_hosts_log_nothing(tmp_path: Path) -> None:
    proc, url, _ = _server(tmp_path)
    try:
        async with httpx.AsyncClient() as http:
            for scheme in ("bearer", "BEARER"):
                ok = await http.post(url, json=INIT, headers={**HEADERS, "Authorization": f"{scheme} {TOKEN}"})
                assert ok.status_code == 200, scheme
            assert (await http.post(url, json=INIT, headers={**HEADERS, "Authorization": f"Basic {TOKEN}"})
                    ).status_code == 401
            bad_host = await http.post(url, json=INIT, headers={**HEADERS, "Host": "evil.example"})
            assert bad_host.status_code == 421
            bad_origin = await http.post(url, json=INIT, headers={**HEADERS, "Origin": "http://evil.example"})
            assert bad_origin.status_code == 403
    finally:
        rest = _rest_of_stderr(proc)
    assert rest == ["qmdbridge mcp: stopped"]  # no raw 'Invalid Host header' lines
    assert live_children() == []


async def test_verbose_shows_the_sdk_records_as_our_lines(tmp_path: Path) -> None:
    proc, url, _ = _server(tmp_path, "-v")
    try:
        async with httpx.AsyncClient() as http:
            assert (await http.post(url, json=INIT, headers={**HEADERS, "Host": "evil.example"})).status_code == 421
    finally:
        rest = _rest_of_stderr(proc)
    assert "qmdbridge mcp: WARNING mcp.server.transport_security: Invalid Host header: evil.example" in rest


def test_a_non_loopback_bind_is_warned_about(tmp_path: Path) -> None:
    proc, _, lines = _server(tmp_path, "--host", "0.0.0.0")
    assert stop(proc, signal.SIGTERM) == 0
    assert ("qmdbridge mcp: warning: --host 0.0.0.0 listens on every network interface: other machines can "
            "connect, and only the bearer token keeps them from memory (use the default --host 127.0.0.1 "
            "unless you mean that)\n") in lines
    quiet, _, lines = _server(tmp_path / "again")
    assert stop(quiet, signal.SIGTERM) == 0
    assert not any("warning" in line for line in lines)


async def test_a_duplicate_request_id_is_refused_not_left_hanging(tmp_path: Path) -> None:
    """100 concurrent calls with one id in one session: before, one got its answer and 99 hung."""
    proc, url, _ = _server(tmp_path)
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "memory_search", "arguments": {"query": "Kestrel migration"}}}
    statuses: list[tuple[int, dict[str, Any]]] = []
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(120)) as http:
            headers = await _open_session(http, url)

            async def one() -> None:
                r = await http.post(url, json=call, headers=headers)
                statuses.append((r.status_code, _sse_message(r.text) if r.status_code == 200 else r.json()))

            async with anyio.create_task_group() as tg:
                for _ in range(100):
                    tg.start_soon(one)
    finally:
        assert stop(proc, signal.SIGTERM) == 0
    assert len(statuses) == 100
    refused = {"jsonrpc": "2.0", "id": 7, "error": {"code": -32600, "message": (
        "request id 7 is already in flight in this session; each request needs its own id")}}
    answered = [doc for status, doc in statuses if status == 200]
    assert answered and all(doc["result"]["structuredContent"]["results"][0]["path"] == "memory/2026-01-05.md"
                            for doc in answered)
    assert all(doc == refused for status, doc in statuses if status != 200)
    assert {status for status, _ in statuses} <= {200, 409}


async def test_an_idle_session_expires(tmp_path: Path) -> None:
    proc, url, _ = _server(tmp_path, "--session-idle", "0.5", "-v")
    assert proc.stderr is not None
    try:
        async with httpx.AsyncClient() as http:
            headers = await _open_session(http, url)
            while True:  # the server says when the session expired; bounded by start()'s reader
                line = proc.stderr.readline().decode()
                assert line, "server ended"
                if "idle timeout" in line:
                    break
            gone = await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers=headers)
            assert gone.status_code == 404
    finally:
        assert stop(proc, signal.SIGTERM) == 0

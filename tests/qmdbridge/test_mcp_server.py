"""``qmdbridge mcp`` as a real process, driven by the MCP SDK's own clients over stdio and
Streamable HTTP: tools, exact hits, memory_get, refusals, the bearer token, Host/Origin checks,
and a clean stop with no process left. The start-up errors (a bad token, a port in use, no
workspace folder) come before any serving and run in this process."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from qmdbridge.tools import MEMORY_GET_SCHEMA, MEMORY_SEARCH_SCHEMA
from tests.e2e.cli_proc import run_cli_in_process

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_procs import CLI, cli_env, live_children, make_workspace, start, stop  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # each test that serves starts qmdbridge mcp
TOKEN = "test-token-0123456789abcdef"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    return make_workspace(tmp_path), cli_env(tmp_path / "state", tmp_path / "home")


async def _exercise(session: ClientSession) -> None:
    """The same checks over either transport."""
    await session.initialize()
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert sorted(tools) == ["memory_get", "memory_search", "status"]
    search_schema = tools["memory_search"].inputSchema
    assert search_schema["properties"]["sessionKey"]["type"] == "string"
    assert search_schema["properties"]["sessionKeys"]["items"] == {"type": "string"}
    assert {k: v for k, v in search_schema["properties"].items() if k not in ("sessionKey", "sessionKeys")} \
        == MEMORY_SEARCH_SCHEMA["parameters"]["properties"]
    assert tools["memory_get"].inputSchema == MEMORY_GET_SCHEMA["parameters"]

    found = await session.call_tool("memory_search", {"query": "Kestrel migration",
                                                      "sessionKey": "agent:main:main"})
    assert found.isError is False
    doc: dict[str, Any] = found.structuredContent or {}
    assert orjson.loads(found.content[0].text) == doc  # type: ignore[union-attr]
    hit = doc["results"][0]
    assert (hit["path"], hit["startLine"], hit["endLine"]) == ("memory/2026-01-05.md", 1, 4)
    assert hit["citation"] == "memory/2026-01-05.md#L1-L4" and doc["backend"] == "builtin"

    page = await session.call_tool("memory_get", {"path": "MEMORY.md", "from": 4, "lines": 1})
    assert page.isError is False
    assert (page.structuredContent or {})["text"].startswith("- Coffee: flat white, no sugar.\n")

    refused = await session.call_tool("memory_get", {"path": "../secrets.md"})
    assert refused.isError is True
    assert refused.structuredContent == {"path": "../secrets.md", "text": "", "disabled": True,
                                         "error": "path refused: '../secrets.md': parent segment",
                                         "refused": True}
    blank = await session.call_tool("memory_get", {"path": ""})  # the words of `qmdbridge get ""`
    assert blank.structuredContent == {"path": "", "text": "", "disabled": True,
                                       "error": "path refused: '': empty path", "refused": True}
    spawned = await session.call_tool("memory_search", {
        "query": "Kestrel migration", "sessionKey": "agent:main:subagent:7f3c", "sessionKeys": ["agent:main:main"]})
    assert (spawned.structuredContent or {})["results"][0]["path"] == "memory/2026-01-05.md"
    # what the schema refuses is refused in serve's words, as a disabled answer
    for args, error in (({"maxResults": "six"}, "maxResults must be an integer, not 'six'"),
                        ({"maxResults": 0}, "max results must be between 1 and 2147483647"),
                        ({"max_results": 3}, "unknown parameter 'max_results' (memory_search takes "
                                             "query, maxResults, minScore, corpus)"),
                        ({"sessionKey": 5}, "session key must be a string")):
        bad = await session.call_tool("memory_search", {"query": "x", **args})
        assert (bad.isError, bad.structuredContent) == (True, {"results": [], "disabled": True, "error": error})
        assert orjson.loads(bad.content[0].text) == bad.structuredContent  # type: ignore[union-attr]
    low = await session.call_tool("memory_get", {"path": "MEMORY.md", "from": 0})
    assert low.structuredContent == {"path": "MEMORY.md", "text": "", "disabled": True,
                                     "error": "from must be between 1 and 2147483647", "refused": False}

    status = await session.call_tool("status", {})
    assert (status.structuredContent or {})["files"] == 2


async def test_stdio_transport_with_the_sdk_client(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    params = StdioServerParameters(command=CLI[0], args=[*CLI[1:], "mcp", "--workspace", str(ws)], env=env)
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await _exercise(session)
    assert live_children() == []


def test_stdio_stops_on_end_of_input_and_on_sigterm(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    proc, _ = start(["mcp", "--workspace", str(ws)], env, ready="qmdbridge mcp: agent main",
                    stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.close()  # end of input
    assert stop(proc) == 0
    proc, _ = start(["mcp", "--workspace", str(ws)], env, ready="qmdbridge mcp: agent main",
                    stdin=subprocess.PIPE)
    assert proc.stderr is not None
    rest = b""
    proc.send_signal(signal.SIGTERM)  # stdin still open: the server must not wait for input
    rest = proc.stderr.read()
    assert stop(proc) == 0 and rest.endswith(b"qmdbridge mcp: stopped\n")
    assert live_children() == []


def _http_server(ws: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str, list[str]]:
    proc, lines = start(["mcp", "--http", "--port", "0", "--workspace", str(ws)], env, ready="listening on")
    url = re.search(r"listening on (http://\S+)", lines[-1])
    assert url is not None
    return proc, url.group(1), lines


async def test_http_transport_with_the_sdk_client_and_the_token(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    proc, url, _ = _http_server(ws, {**env, "QMDBRIDGE_MCP_TOKEN": TOKEN})
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
                streamable_http_client(url, http_client=http) as (read, write, _), \
                ClientSession(read, write) as session:
            await _exercise(session)
        async with httpx.AsyncClient() as raw:
            none = await raw.post(url, json=INIT, headers=MCP_HEADERS)
            assert none.status_code == 401 and none.headers["www-authenticate"] == "Bearer"
            wrong = await raw.post(url, json=INIT, headers={**MCP_HEADERS, "Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            auth = {**MCP_HEADERS, "Authorization": f"Bearer {TOKEN}"}
            host = await raw.post(url, json=INIT, headers={**auth, "Host": "evil.example"})
            assert host.status_code == 421
            origin = await raw.post(url, json=INIT, headers={**auth, "Origin": "http://evil.example"})
            assert origin.status_code == 403
            local = await raw.post(url, json=INIT, headers={**auth, "Origin": "http://localhost:5173"})
            assert local.status_code == 200
    finally:
        assert stop(proc, signal.SIGTERM) == 0
    assert live_children() == []


async def test_http_token_file_is_created_owner_only_and_reused(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    proc, url, lines = _http_server(ws, env)
    token_path = Path(env["OPENCLAW_STATE_DIR"]) / "mcp" / "token"
    try:
        assert f"qmdbridge mcp: bearer token in {token_path}\n" in lines or \
            f"qmdbridge mcp: bearer token in {token_path}\n" == proc.stderr.readline().decode()  # type: ignore[union-attr]
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_path.parent.stat().st_mode) == 0o700
        token = token_path.read_text().strip()
        assert len(token) >= 32
        async with httpx.AsyncClient() as raw:
            ok = await raw.post(url, json=INIT, headers={**MCP_HEADERS, "Authorization": f"Bearer {token}"})
            assert ok.status_code == 200
    finally:
        assert stop(proc, signal.SIGINT) == 0
    again, url, _ = _http_server(ws, env)
    try:
        assert token_path.read_text().strip() == token
    finally:
        assert stop(again, signal.SIGTERM) == 0
    assert live_children() == []


def test_a_short_token_is_a_config_error(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    p = run_cli_in_process(["mcp", "--http", "--port", "0", "--workspace", str(ws)],
                           {**env, "QMDBRIDGE_MCP_TOKEN": "short"})
    assert p.returncode == 2
    assert p.stderr.decode().splitlines()[-1] == ("qmdbridge: environment: QMDBRIDGE_MCP_TOKEN: too short "
                                                  "(expected at least 16 characters)")


def test_a_token_file_that_is_not_text_is_a_config_error(setup: tuple[Path, dict[str, str]]) -> None:
    ws, env = setup
    token_path = Path(env["OPENCLAW_STATE_DIR"]) / "mcp" / "token"
    token_path.parent.mkdir(parents=True)
    token_path.write_bytes(b"\xff\xfe0123456789abcdefghij\n")
    p = run_cli_in_process(["mcp", "--http", "--port", "0", "--workspace", str(ws)], env)
    assert p.returncode == 2
    assert p.stderr.decode().splitlines()[-1] == (
        f"qmdbridge: {token_path}: the MCP token file is not UTF-8 text (expected a token of at least "
        "16 characters (delete the file to make a new one))")


@pytest.mark.parametrize("command", ["serve", "mcp"])
def test_a_workspace_that_is_no_folder_fails_the_start_in_every_commands_words(
        tmp_path: Path, command: str) -> None:
    """A file, or nothing, where the workspace should be: exit code 2 and the reason that
    search, get and status give, where the watcher's start failed with a traceback (exit 1)."""
    env = cli_env(tmp_path / "state", tmp_path / "home")
    (tmp_path / "notes.md").write_text("a file\n")
    for ws, error in ((tmp_path / "notes.md", "workspace is not a directory: {ws} (pass"),
                      (tmp_path / "gone", "workspace does not exist: {ws} (create it, pass")):
        p = run_cli_in_process([command, "--workspace", str(ws)], env)
        assert (p.returncode, p.stdout, p.stderr.decode()) == (2, b"", "qmdbridge: " + error.format(ws=ws)
                                                               + " --workspace or set agents.defaults.workspace)\n")


def test_servers_starting_together_agree_on_one_token(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from qmdbridge.server.http_auth import load_or_create_token

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: load_or_create_token(tmp_path, {}), range(32)))
    token_path = tmp_path / "mcp" / "token"
    assert {g for g in got} == {(token_path.read_text().strip(), token_path)}
    assert sorted(p.name for p in token_path.parent.iterdir()) == ["token"]


def test_a_port_in_use_is_a_usage_error(setup: tuple[Path, dict[str, str]]) -> None:
    import socket

    ws, env = setup
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        p = run_cli_in_process(["mcp", "--http", "--port", str(port), "--workspace", str(ws), "--json"],
                               {**env, "QMDBRIDGE_MCP_TOKEN": TOKEN})
    finally:
        taken.close()
    assert p.returncode == 2
    assert orjson.loads(p.stdout) == {"error": f"cannot listen on 127.0.0.1:{port}: Address already in use",
                                      "errorType": "UsageError", "exitCode": 2}
    for args, error in ((["--port", "70000"], "--port must be between 0 and 65535, not 70000"),
                        (["--host", "no-such-host.invalid", "--port", "0"], None)):
        p = run_cli_in_process(["mcp", "--http", *args, "--workspace", str(ws), "--json"],
                               {**env, "QMDBRIDGE_MCP_TOKEN": TOKEN})
        doc = orjson.loads(p.stdout)  # a usage error, not a traceback
        assert (p.returncode, doc["errorType"]) == (2, "UsageError"), p.stderr
        if error is not None:
            assert doc["error"] == error
        else:  # the resolver's own words, not "Unknown error -2"
            assert doc["error"].startswith("cannot listen on no-such-host.invalid:0: ")
            assert "Unknown error" not in doc["error"], doc


async def test_http_client_sessions_that_end_leave_no_traceback(setup: tuple[Path, dict[str, str]]) -> None:
    """A client closing its session is routine: the server's log (its stderr) shows no error
    for it, only the start and stop lines."""
    ws, env = setup
    proc, url, _ = _http_server(ws, {**env, "QMDBRIDGE_MCP_TOKEN": TOKEN})
    assert proc.stderr is not None
    try:
        for _ in range(2):
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
                    streamable_http_client(url, http_client=http) as (read, write, _), \
                    ClientSession(read, write) as session:
                await session.initialize()
                found = await session.call_tool("memory_search", {"query": "Kestrel migration"})
                assert (found.structuredContent or {})["results"][0]["path"] == "memory/2026-01-05.md"
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read().decode()
        assert stop(proc) == 0
    assert rest.splitlines() == ["qmdbridge mcp: bearer token from $QMDBRIDGE_MCP_TOKEN", "qmdbridge mcp: stopped"]


async def test_a_name_that_is_not_utf8_over_the_sdk_client(setup: tuple[Path, dict[str, str]]) -> None:
    """A note whose file name is not UTF-8 is cited and read in its printable form; a path holding
    a lone surrogate (the name's own bytes, as Python decodes them) is refused with the path in
    that form, and the session keeps serving (the reply echoing the path could not be encoded:
    ``str is not valid UTF-8``). The SDK's own client session, in memory against the server."""
    from mcp.shared.memory import create_connected_server_and_client_session

    from qmdbridge import MemoryManager
    from qmdbridge.config import parse_config, resolve_agent
    from qmdbridge.server.mcp_server import build_server

    ws, env = setup
    (ws / "memory" / os.fsdecode(b"caf\xe9.md")).write_text("# note\n\nThe zanzibar plan.\n")
    agent = resolve_agent(parse_config({}), "main", workspace=ws, env=env)
    async with MemoryManager(agent, mode="cli", env=env) as manager, \
            create_connected_server_and_client_session(build_server(manager)) as session:
        found = await session.call_tool("memory_search", {"query": "zanzibar"})
        assert [h["citation"] for h in (found.structuredContent or {})["results"]] == ["memory/caf\\xe9.md#L1-L3"]
        page = await session.call_tool("memory_get", {"path": "memory/caf\\xe9.md"})
        assert (page.isError, (page.structuredContent or {})["text"]) == (False, "# note\n\nThe zanzibar plan.")
        refused = await session.call_tool("memory_get", {"path": "memory/caf\udce9.md"})
        assert (refused.isError, refused.structuredContent) == (True, {
            "path": "memory/caf\\xe9.md", "text": "", "disabled": True, "refused": True,
            "error": "path refused: 'memory/caf\\udce9.md': invalid characters (a file name that is not "
                     "UTF-8 is written with \\xHH escapes, as search cites it: memory/caf\\xe9.md)"})
        status = await session.call_tool("status", {})
        assert (status.structuredContent or {})["files"] == 3


def test_a_lone_surrogate_escape_over_stdio_is_answered(setup: tuple[Path, dict[str, str]]) -> None:
    """A request whose JSON holds a lone surrogate escape (``"\\udcff"``: a name's byte as
    Python's surrogateescape reads it; ``"\\ud83d"``: half an emoji, cut by JavaScript) is
    answered under its id, as over the daemon socket (the SDK's reader refused the line and
    left the request unanswered), and the session keeps serving."""
    ws, env = setup
    proc, _ = start(["mcp", "--workspace", str(ws)], env, ready="qmdbridge mcp: agent main", stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None

    def call(line: bytes) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(line + b"\n")
        proc.stdin.flush()
        return orjson.loads(proc.stdout.readline())  # type: ignore[no-any-return]

    try:
        assert call(orjson.dumps(INIT))["id"] == 1
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        got = call(b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "memory_get",'
                   b' "arguments": {"path": "memory/caf\\udce9.md"}}}')
        assert (got["id"], got["result"]["isError"], got["result"]["structuredContent"]) == (2, True, {
            "path": "memory/caf\\xe9.md", "text": "", "disabled": True, "refused": True,
            "error": "path refused: 'memory/caf\\udce9.md': invalid characters (a file name that is not "
                     "UTF-8 is written with \\xHH escapes, as search cites it: memory/caf\\xe9.md)"})
        found = call(b'{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "memory_search",'
                     b' "arguments": {"query": "Kestrel migration \\ud83d"}}}')
        assert found["id"] == 3
        assert [h["path"] for h in found["result"]["structuredContent"]["results"]] == ["memory/2026-01-05.md"]
    finally:
        proc.stdin.close()
        assert stop(proc) == 0

"""The daemon socket's replies to malformed requests, in this process (the listener and
``serve``'s line handler over a real Unix socket): a line that is not JSON (or nested too deep
to read) is answered and the connection keeps serving; a line past ``MAX_LINE_BYTES`` is
refused and the connection closed; a client gone before its reply costs that reply only; a lone
surrogate escape is answered; a UTF-8 BOM before a request is read past; blank lines get no
reply and JSON that is not an object gets an error reply."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup

from qmdbridge import MemoryManager
from qmdbridge.cli.serve import start_daemon_socket
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.server.wire import MAX_LINE_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_procs import cli_env, make_workspace  # noqa: E402

pytestmark = pytest.mark.anyio
DEADLINE_S = 60


async def _reply(stream: Any) -> dict[str, Any]:
    """The next reply line on ``stream`` (``json``: a reply may hold a lone surrogate escape)."""
    data = b""
    while not data.endswith(b"\n"):
        data += await stream.receive()
    return json.loads(data)


@asynccontextmanager
async def _daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[MemoryManager, TaskGroup, str]]:
    """A manager of a small workspace and its daemon socket, listening in the task group."""
    ws = make_workspace(tmp_path)
    env = cli_env(tmp_path / "state", tmp_path / "home")
    for key in ("OPENCLAW_STATE_DIR", "HOME"):
        monkeypatch.setenv(key, env[key])
    agent = resolve_agent(parse_config({}), "main", workspace=ws, env=env)
    args = argparse.Namespace(config=None, backend=None)
    async with MemoryManager(agent, mode="cli", env=env) as manager, anyio.create_task_group() as tg:
        path = await start_daemon_socket(tg, manager, agent, args)
        assert path is not None
        yield manager, tg, path


async def test_bad_json_and_an_overlong_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with _daemon(tmp_path, monkeypatch) as (manager, tg, path):
        with anyio.fail_after(DEADLINE_S):
            async with await anyio.connect_unix(path) as stream:
                await stream.send(b'{"id": 1, "tool": \n')
                bad = await _reply(stream)
                assert (bad["id"], bad["error"].startswith("invalid JSON: ")) == (None, True)
                await stream.send(b"[" * 100_000 + b"\n")  # past the recursion limit of json.loads
                deep = await _reply(stream)
                assert (deep["id"], deep["error"]) == (None, "invalid JSON: nested too deep")
                await stream.send(b"\n \r\n\t\n")  # blank lines: no reply, the connection serves on
                for line in (b'[{"id": 5, "tool": "status"}]', b'"status"', b"null", b"7"):
                    await stream.send(line + b"\n")
                    assert await _reply(stream) == {"id": None, "error": "request must be a JSON object",
                                                    "keywordNotice": True, "configWarnings": []}, line
                await stream.send(b'{"id": 2, "tool": "status"}\n')
                status = await _reply(stream)
                assert (status["id"], status["result"]["backend"]) == (2, "builtin")
            async with await anyio.connect_unix(path) as stream:
                await stream.send(b"x" * (MAX_LINE_BYTES + 1))
                assert await _reply(stream) == {"id": None, "error": "request line too long"}
                with pytest.raises(anyio.EndOfStream):
                    await stream.receive()
        tg.cancel_scope.cancel()



async def test_a_client_gone_before_its_reply_leaves_the_daemon_serving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that sends a request and closes the connection before the reply (a CLI killed
    while it waits) costs that reply only: the listener, and the ``serve`` it runs in, keep
    answering other connections."""
    async with _daemon(tmp_path, monkeypatch) as (manager, tg, path):
        with anyio.fail_after(DEADLINE_S):
            for _ in range(3):
                # blocking calls, no await between them: each connection is closed before the
                # listener reads its line, so the reply (an error, answered without waiting on
                # anything) meets a broken pipe
                gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                gone.connect(path)
                gone.sendall(b'{"id": 1, "tool": "memory_delete"}\n')
                gone.close()
            async with await anyio.connect_unix(path) as stream:
                for request_id in (2, 3, 4):
                    await stream.send(b'{"id": %d, "tool": "status"}\n' % request_id)
                    status = await _reply(stream)
                    assert (status["id"], status["result"]["backend"]) == (request_id, "builtin")
                tg.cancel_scope.cancel()  # while the listener waits on this open connection


async def test_a_lone_surrogate_escape_is_answered_under_its_request_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``"\\ud83d"`` (half an emoji, as JavaScript's ``JSON.stringify`` writes a string cut
    between the halves of a surrogate pair) is valid JSON: the search is answered as the library
    answers it, and a path holding one is refused with the reason, each under its request id
    (the line was refused as invalid JSON with id null, and a reply echoing the path could not be
    encoded)."""
    async with _daemon(tmp_path, monkeypatch) as (manager, tg, path):
        library = await manager.search("Kestrel \ud83d")
        with anyio.fail_after(DEADLINE_S):
            async with await anyio.connect_unix(path) as stream:
                await stream.send(b'{"id": 1, "tool": "memory_search", "params": {"query": "Kestrel \\ud83d"}}\n')
                search = await _reply(stream)
                await stream.send(b'{"id": 2, "tool": "memory_get", "params": {"path": "memory/\\ud83d.md"}}\n')
                get = await _reply(stream)
                tg.cancel_scope.cancel()
    assert search["id"] == 1
    assert [(h["path"], h["startLine"]) for h in search["result"]["results"]] == [
        (h.path, h.start_line) for h in library.results] != []
    assert (get["id"], get["result"]["path"], get["result"]["refused"]) == (2, "memory/\\xed\\xa0\\xbd.md", True)
    assert get["result"]["error"].startswith("path refused: 'memory/\\ud83d.md': invalid characters")


async def test_a_request_line_that_starts_with_a_utf8_bom_is_answered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Windows client's first line starts with a UTF-8 BOM: the request is answered, one
    leading BOM read past as the config reader reads such a file (a reader of the line as text,
    or orjson, refuses it as invalid JSON with id null); a second BOM is not JSON."""
    async with _daemon(tmp_path, monkeypatch) as (manager, tg, path):
        with anyio.fail_after(DEADLINE_S):
            async with await anyio.connect_unix(path) as stream:
                await stream.send(b'\xef\xbb\xbf{"id": 7, "tool": "status"}\n')
                status = await _reply(stream)
                await stream.send(b'\xef\xbb\xbf\xef\xbb\xbf{"id": 8, "tool": "status"}\n')
                twice = await _reply(stream)
                tg.cancel_scope.cancel()
    assert (status["id"], status["result"]["backend"]) == (7, "builtin")
    assert (twice["id"], twice["error"].startswith("invalid JSON: ")) == (None, True)

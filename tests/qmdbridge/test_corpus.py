"""The ``corpus`` parameter on every surface: the MCP SDK's client against ``qmdbridge mcp``,
``qmdbridge serve`` on stdin (replies validated by the protocol's JSON Schema), and the CLI's
``--corpus`` in-process and through the daemon socket, all real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from qmdbridge.policy.corpus import NO_WIKI
from tests.e2e.cli_proc import run_cli_in_process

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_procs import CLI, cli_env, live_children, make_workspace, start, stop  # noqa: E402

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
SESSIONS_CFG = ("{agents: {defaults: {memorySearch: {provider: 'none', sources: ['memory', 'sessions'], "
                "experimental: {sessionMemory: true}}}}}")
NO_SESSIONS = ('session transcripts are not indexed: add "sessions" to memorySearch.sources and '
               "set memorySearch.experimental.sessionMemory to true")
# memory_get of a transcript with corpus memory, as every route words it
OUTSIDE_MEMORY = ("path refused: 'sessions/s1.jsonl': a session transcript, outside corpus 'memory' "
                  "(read it with corpus all)")


def _transcript(state: Path) -> None:
    """One session transcript of agent main that mentions Kestrel, as the memory note does."""
    folder = state / "agents" / "main" / "sessions"
    folder.mkdir(parents=True)
    record = {"type": "message", "message": {"role": "user", "content": "When does the Kestrel migration start?"}}
    (folder / "s1.jsonl").write_bytes(orjson.dumps(record) + b"\n")


def _sources(doc: dict[str, Any]) -> list[str]:
    return sorted({h["source"] for h in doc["results"]})


async def test_mcp_memory_search_and_get_take_corpus(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    env = cli_env(tmp_path / "state", tmp_path / "home")
    _transcript(tmp_path / "state")
    cfg = tmp_path / "openclaw.json5"
    cfg.write_text(SESSIONS_CFG)
    params = StdioServerParameters(command=CLI[0], env=env,
                                   args=[*CLI[1:], "mcp", "--workspace", str(ws), "--config", str(cfg)])
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()

            async def search(**extra: Any) -> dict[str, Any]:
                answer = await session.call_tool("memory_search", {"query": "Kestrel migration", **extra})
                assert answer.isError is False, answer.content
                return answer.structuredContent or {}

            both = await search()
            assert (_sources(both), both["corpus"]) == (["memory", "sessions"], "all")
            memory = await search(corpus="memory")
            assert (_sources(memory), memory["corpus"]) == (["memory"], "memory")
            assert memory["results"][0]["path"] == "memory/2026-01-05.md"
            sessions = await search(corpus="sessions")
            assert (_sources(sessions), sessions["corpus"]) == (["sessions"], "sessions")
            assert sessions["results"][0]["path"] == "sessions/s1.jsonl"
            wiki = await search(corpus="wiki")
            assert (wiki["results"], wiki["corpus"], wiki["warnings"]) == ([], "wiki", [NO_WIKI])

            page = await session.call_tool("memory_get", {"path": "MEMORY.md", "lines": 1, "corpus": "memory"})
            assert (page.isError, (page.structuredContent or {})["text"]) == (False, "# MEMORY\n\n[More content available. Use from=2 to continue.]")
            rest = await session.call_tool("memory_get", {"path": "MEMORY.md", "lines": 1, "fromChar": 3})
            assert (rest.isError, (rest.structuredContent or {})["text"]) == (False, "MEMORY\n\n[More content available. Use from=2 to continue.]")
            # a transcript a session hit cites: read with all (the default), refused with memory
            transcript = await session.call_tool("memory_get", {"path": "sessions/s1.jsonl"})
            assert (transcript.structuredContent or {})["text"] == "User: When does the Kestrel migration start?"
            outside = await session.call_tool("memory_get", {"path": "sessions/s1.jsonl", "corpus": "memory"})
            assert (outside.isError, outside.structuredContent) == (True, {
                "path": "sessions/s1.jsonl", "text": "", "disabled": True, "error": OUTSIDE_MEMORY, "refused": True})
            refused = await session.call_tool("memory_get", {"path": "MEMORY.md", "corpus": "wiki"})
            assert refused.isError is True
            assert refused.structuredContent == {"path": "MEMORY.md", "text": "", "disabled": True,
                                                 "error": "path refused: 'MEMORY.md': no wiki corpus is configured: "
                                                          "corpus 'wiki' has nothing to read (use memory or all)",
                                                 "refused": True}
            bad = await session.call_tool("memory_search", {"query": "x", "corpus": "notes"})
            assert (bad.isError, bad.structuredContent) == (True, {"results": [], "disabled": True, "error": (
                "corpus must be one of memory, sessions, all, wiki (memory_search), not 'notes'")})
    assert live_children() == []


def test_serve_corpus_requests_and_replies_match_the_schema(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs" / "serve-protocol.schema.json").read_text())
    ws = make_workspace(tmp_path)
    env = cli_env(tmp_path / "state", tmp_path / "home")
    _transcript(tmp_path / "state")  # not indexed: sessions are off by default
    requests = [
        {"id": 1, "tool": "memory_search", "params": {"query": "Kestrel migration", "corpus": "sessions"}},
        {"id": 2, "tool": "memory_search", "params": {"query": "Kestrel migration", "corpus": "memory"}},
        {"id": 3, "tool": "memory_search", "params": {"query": "Kestrel migration", "corpus": "notes"}},
        {"id": 4, "tool": "memory_get", "params": {"path": "MEMORY.md", "corpus": "all", "lines": 1}},
    ]

    def check(name: str, doc: dict[str, Any]) -> None:
        jsonschema.Draft202012Validator({**schema, "anyOf": [{"$ref": f"#/$defs/{name}"}]}).validate(doc)

    for req in requests[:2] + requests[3:]:
        check("request", req)
    proc, _ = start(["serve", "--no-socket", "--workspace", str(ws)], env, ready="qmdbridge serve: agent main",
                    stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    proc.stdin.close()
    replies = [orjson.loads(proc.stdout.readline()) for _ in requests]
    assert stop(proc) == 0
    for reply, name in zip(replies, ["memorySearchResponse"] * 3 + ["memoryGetResponse"], strict=True):
        check(name, reply)
    sessions, memory, bad, page = (r["result"] for r in replies)
    assert (sessions["results"], sessions["corpus"], sessions["warnings"]) == ([], "sessions", [NO_SESSIONS])
    assert (memory["corpus"], _sources(memory)) == ("memory", ["memory"])
    assert bad == {"results": [], "disabled": True,
                   "error": "corpus must be one of memory, sessions, all, wiki (memory_search), not 'notes'"}
    assert page["text"].startswith("# MEMORY\n\n[More content")


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``qmdbridge <args>`` run in this process (a client of the daemon while one serves)."""
    return run_cli_in_process(args, env)


def test_cli_corpus_in_process_and_through_the_daemon(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    env = cli_env(tmp_path / "state", tmp_path / "home")
    search = ["search", "Kestrel migration", "--workspace", str(ws), "--json"]
    wiki = _cli([*search, "--corpus", "wiki"], env)
    assert wiki.returncode == 0, wiki.stderr
    doc = orjson.loads(wiki.stdout)
    assert (doc["results"], doc["corpus"], doc["warnings"], doc["servedBy"]) == ([], "wiki", [NO_WIKI], "process")
    plain = _cli(["search", "Kestrel migration", "--workspace", str(ws), "--corpus", "wiki"], env)
    assert (plain.stdout, plain.stderr) == (b"No matches.\n", f"warning: {NO_WIKI}\n".encode())
    default = orjson.loads(_cli(search, env).stdout)
    assert (default["corpus"], _sources(default)) == ("all", ["memory"])
    refused = _cli(["get", "MEMORY.md", "--workspace", str(ws), "--corpus", "wiki"], env)
    assert (refused.returncode, refused.stderr.decode()) == (  # get takes no sessions corpus
        3, "qmdbridge: path refused: 'MEMORY.md': no wiki corpus is configured: corpus 'wiki' has "
           "nothing to read (use memory or all)\n")
    bad = _cli([*search, "--corpus", "notes"], env)
    assert bad.returncode == 2 and b"invalid choice: 'notes'" in bad.stdout
    _transcript(tmp_path / "state")
    cfg = tmp_path / "openclaw.json5"
    cfg.write_text(SESSIONS_CFG)
    get = ["get", "sessions/s1.jsonl", "--workspace", str(ws), "--config", str(cfg)]
    assert _cli(get, env).stdout == b"User: When does the Kestrel migration start?\n"
    outside = _cli([*get, "--corpus", "memory"], env)
    assert (outside.returncode, outside.stderr.decode()) == (3, f"qmdbridge: {OUTSIDE_MEMORY}\n")

    proc, _ = start(["serve", "--no-stdin", "--workspace", str(ws)], env, ready="daemon socket")
    try:
        served = _cli([*search, "--corpus", "sessions"], env)
        doc = orjson.loads(served.stdout)
        assert (doc["servedBy"], doc["results"], doc["corpus"], doc["warnings"]) == (
            "daemon", [], "sessions", [NO_SESSIONS])
        memory = orjson.loads(_cli([*search, "--corpus", "memory"], env).stdout)
        assert (memory["servedBy"], memory["corpus"], memory["results"][0]["path"]) == (
            "daemon", "memory", "memory/2026-01-05.md")
        page = orjson.loads(_cli(["get", "MEMORY.md", "--lines", "1", "--from-char", "3", "--corpus", "memory",
                                  "--workspace", str(ws), "--json"], env).stdout)
        assert (page["servedBy"], page["text"].split("\n")[0]) == ("daemon", "MEMORY")
    finally:
        assert stop(proc, 15) == 0
    assert live_children() == []

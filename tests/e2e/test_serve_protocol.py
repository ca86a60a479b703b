"""``docs/serve-protocol.schema.json`` describes what a real ``qmdbridge serve`` reads and writes:
every request sent here is valid by the schema, every reply is validated against the schema of
its tool (jsonschema, Draft 2020-12), replies come in request order, and the ready line and the
stop line are the ones the protocol page names."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # each test starts qmdbridge serve

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "docs" / "serve-protocol.schema.json").read_text())


def validator(name: str) -> Any:
    """A Draft 2020-12 validator of ``$defs/<name>`` (refs resolved inside the schema file)."""
    return jsonschema.Draft202012Validator({**SCHEMA, "anyOf": [{"$ref": f"#/$defs/{name}"}]})


def test_the_schema_is_valid_and_tells_good_requests_from_bad() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    request = validator("request")
    assert request.is_valid({"id": 1, "tool": "memory_search", "params": {"query": "router"}, "sessionKey": None})
    assert request.is_valid({"tool": "status"})
    assert request.is_valid({"id": "a", "tool": "sync", "params": {"force": True}})
    for bad in ({"id": 1, "tool": "memory_search", "params": {}},           # no query
                {"id": 1, "tool": "memory_search", "params": {"query": "x", "maxResults": 0}},
                {"id": 1, "tool": "memory_get", "params": {"path": "MEMORY.md", "from": 0}},
                {"id": 1, "tool": "memory_delete", "params": {}},
                {"id": 1, "tool": "status", "sessionKey": 7}):
        assert not request.is_valid(bad), bad


def test_real_serve_requests_and_replies_match_the_schema(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(REPO / "examples" / "workspace", ws)
    cfg = tmp_path / "scope.json5"
    cfg.write_text("{memory: {qmd: {scope: {default: 'deny', rules: [{action: 'allow', match: {chatType: 'direct'}}]}}}}")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "OPENAI_API_KEY")}
    env.update(OPENCLAW_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path / "home"))
    requests: list[tuple[dict[str, Any], str]] = [
        ({"id": 1, "tool": "memory_search", "params": {"query": "Atlas rollback"}, "sessionKey": "agent:main:main"},
         "memorySearchResponse"),
        ({"id": 2, "tool": "memory_search", "params": {"query": "router", "maxResults": 2},
          "sessionKey": "agent:main:telegram:group:42"}, "memorySearchResponse"),
        ({"id": 3, "tool": "memory_get", "params": {"path": "MEMORY.md", "from": 1, "lines": 2}}, "memoryGetResponse"),
        ({"id": 4, "tool": "memory_get", "params": {"path": "../secrets.md"}}, "memoryGetResponse"),
        ({"id": 5, "tool": "memory_get", "params": {"path": "memory/2030-01-01.md"}}, "memoryGetResponse"),
        ({"id": "six", "tool": "status"}, "statusResponse"),
        ({"id": 7, "tool": "sync", "params": {"force": False}}, "syncResponse"),
        ({"id": 8, "tool": "memory_search", "params": {"query": "   "}}, "memorySearchResponse"),
    ]
    request_schema = validator("request")
    for req, _ in requests:
        request_schema.validate(req)
    lines = [json.dumps(req) for req, _ in requests] + ['{"id": 9, "tool": "memory_delete"}', '{"id": 10}', "not json"]
    exe = shutil.which("qmdbridge")
    argv = [exe] if exe else [sys.executable, "-m", "qmdbridge.cli.main"]
    proc = subprocess.Popen([*argv, "serve", "--no-socket", "--workspace", str(ws), "--config", str(cfg)],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        ready = proc.stderr.readline()
        assert ready == f"qmdbridge serve: agent main, backend builtin, workspace {ws}\n"
        proc.stdin.write("\n".join(lines) + "\n")
        proc.stdin.flush()
        replies = [json.loads(proc.stdout.readline()) for _ in lines]
        proc.stdin.close()  # end of input stops the server
        assert proc.wait(timeout=60) == 0
        assert proc.stderr.read().endswith("qmdbridge serve: stopped\n")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert [r["id"] for r in replies] == [1, 2, 3, 4, 5, "six", 7, 8, 9, 10, None]  # in request order
    for (_, name), reply in zip(requests, replies, strict=False):
        validator(name).validate(reply)
        validator("response").validate(reply)
    hit = replies[0]["result"]["results"][0]
    assert hit["path"].startswith("memory/2026-11-") and hit["citation"].startswith(hit["path"] + "#L")
    assert replies[1]["result"]["denied"]["allowed"] is False and replies[1]["result"]["results"] == []
    assert replies[2]["result"]["nextFrom"] == 3 and replies[3]["result"]["refused"] is True
    assert replies[4]["result"]["missing"] is True and replies[5]["result"]["agentId"] == "main"
    assert replies[6]["result"] == {"ok": True}
    assert replies[7]["result"] == {"results": [], "disabled": True, "error": "query must not be empty"}
    assert replies[8] == {"id": 9, "error": "unknown tool: 'memory_delete'"}
    assert replies[9] == {"id": 10, "error": 'request names no tool: set "tool" to memory_search, memory_get, '
                                           'status or sync'}
    assert replies[10]["id"] is None and replies[10]["error"].startswith("invalid JSON")
    for reply in replies[8:]:
        validator("errorResponse").validate(reply)


def test_serve_help_points_to_the_protocol_page() -> None:
    exe = shutil.which("qmdbridge")
    argv = [exe] if exe else [sys.executable, "-m", "qmdbridge.cli.main"]
    p = subprocess.run([*argv, "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    assert "  docs/serve-protocol.md, JSON Schema docs/serve-protocol.schema.json\n" in p.stdout
    assert (REPO / "docs" / "serve-protocol.md").is_file()

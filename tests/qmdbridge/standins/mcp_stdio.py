#!/usr/bin/env python3
"""Stand-in for ``qmd mcp`` (stdio) that misbehaves after the handshake, as argv[1] says.

It answers ``initialize`` as qmd 2.8.3 does (one JSON line on stdout) and ignores notes; then
on ``tools/call``:

- ``garbage``: writes a line that is not JSON on stdout and keeps running;
- ``exit``: says so on stderr and exits with code 5 (its stdout closes);
- ``late``: holds the first call without an answer; on the next call answers the held one
  first (a late answer, after its caller left), then the new one; cancellations are ignored;
- ``ping``: asks the client ``ping`` and ``roots/list`` and sends a log note first, then
  answers the call with what the client replied (``isError`` when a reply is wrong).

A ``query`` call's answer echoes its query: one result, file ``<collection>/<query>.md``.
"""
import json
import sys


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(msg: dict) -> dict:
    args = msg["params"]["arguments"]
    q, coll = args["query"], args["collections"][0]
    hit = {"docid": "#abc123", "file": f"{coll}/{q}.md", "title": q, "score": 1, "context": None,
           "line": 1, "snippet": f"1: {q}"}
    return {"jsonrpc": "2.0", "id": msg["id"], "result": {
        "content": [{"type": "text", "text": q}], "structuredContent": {"results": [hit]}}}


mode = sys.argv[1]
held: dict | None = None
for raw in sys.stdin:
    msg = json.loads(raw)
    method = msg.get("method")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
            "serverInfo": {"name": "qmd", "version": "0-standin"}}})
    elif method != "tools/call":
        sys.stderr.write(f"note {method}\n")
        sys.stderr.flush()
    elif mode == "garbage":
        sys.stdout.buffer.write(b"\xff\xfe not json {oops\n")
        sys.stdout.flush()
    elif mode == "exit":
        sys.stderr.write("stand-in: exiting on tools/call\n")
        sys.exit(5)
    elif mode == "late":
        if held is None:
            held = msg
            continue
        send(answer(held))
        send(answer(msg))
    elif mode == "ping":
        send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}})
        send({"jsonrpc": "2.0", "id": "s1", "method": "ping"})
        send({"jsonrpc": "2.0", "id": "s2", "method": "roots/list"})
        replies = [json.loads(sys.stdin.readline()) for _ in range(2)]
        if replies[0] == {"jsonrpc": "2.0", "id": "s1", "result": {}} and replies[1]["id"] == "s2" \
                and replies[1]["error"]["code"] == -32600:
            send(answer(msg))
        else:
            send({"jsonrpc": "2.0", "id": msg["id"], "result": {
                "content": [{"type": "text", "text": f"bad replies {replies}"}], "isError": True}})

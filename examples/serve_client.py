"""Call ``qmdbridge serve`` from Python: start it once, then send tool calls as JSON lines.

Standard library only, so it can be copied into any agent runtime. The protocol is described
in ``docs/serve-protocol.md``.

    python examples/serve_client.py --workspace examples/workspace "router dropped the WAN link"
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import threading
from typing import Any


class ServeClient:
    """One ``qmdbridge serve`` child process and a request/reply exchange over its stdin/stdout.

    Requests are answered in the order they are sent; ids are still checked, as the protocol
    page recommends. Use as a context manager: leaving it closes stdin, which stops the server.
    """

    def __init__(self, *args: str, command: list[str] | None = None) -> None:
        exe = command or ([shutil.which("qmdbridge")] if shutil.which("qmdbridge") else
                          [sys.executable, "-m", "qmdbridge.cli.main"])
        self._proc = subprocess.Popen([*exe, "serve", "--no-socket", *args], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      encoding="utf-8")
        self._ids = itertools.count(1)
        self._ready = threading.Event()
        self.log: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _drain_stderr(self) -> None:
        """Keep reading stderr (a full pipe would block the server); the ready line sets the event."""
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self.log.append(line.rstrip("\n"))
            if line.startswith("qmdbridge serve: agent "):
                self._ready.set()
        self._ready.set()  # the process ended: do not wait forever

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait for the ready line (requests sent earlier are queued anyway)."""
        if not self._ready.wait(timeout_s) or self._proc.poll() is not None:
            raise RuntimeError("qmdbridge serve did not start: " + "\n".join(self.log[-5:]))

    def call(self, tool: str, params: dict[str, Any] | None = None, *,
             session_key: str | None = None) -> dict[str, Any]:
        """Send one request and return its ``result``; raise on a protocol ``error``."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        request_id = next(self._ids)
        request = {"id": request_id, "tool": tool, "params": params or {}, "sessionKey": session_key}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("qmdbridge serve stopped: " + "\n".join(self.log[-5:]))
        reply = json.loads(line)
        if reply.get("id") != request_id:
            raise RuntimeError(f"reply for id {reply.get('id')!r}, expected {request_id}")
        if "error" in reply:
            raise RuntimeError(reply["error"])
        result: dict[str, Any] = reply["result"]
        return result

    def close(self) -> int:
        """Close stdin (the server stops at end of input) and wait for the exit code."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        return self._proc.wait(timeout=60)

    def __enter__(self) -> ServeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> int:
    parser = argparse.ArgumentParser(description="search memory through qmdbridge serve")
    parser.add_argument("query")
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--session-key", default="agent:main:main")
    args = parser.parse_args()
    with ServeClient("--workspace", args.workspace) as client:
        client.wait_ready()
        found = client.call("memory_search", {"query": args.query, "maxResults": 3},
                            session_key=args.session_key)
        if found.get("disabled"):
            print(f"search failed: {found['error']}")
            return 1
        for hit in found["results"]:
            print(f"{hit['score']:.3f} {hit['citation']}")
        if found["results"]:
            first = found["results"][0]
            page = client.call("memory_get", {"path": first["path"], "from": first["startLine"], "lines": 3})
            print(page["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

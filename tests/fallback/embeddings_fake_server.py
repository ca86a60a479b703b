"""A small real HTTP server on 127.0.0.1 for the embedding provider tests.

Each test gives a handler ``(Recorded) -> Reply``; the server records every request, answers
at most ``max_requests`` times (then 503) and is shut down by the context manager.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    """One request as the server saw it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    """What to answer: status, a JSON-able body (or bytes/str), headers, delay in seconds."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


class FakeServer:
    """The running server: ``url``, ``requests`` (in arrival order)."""

    def __init__(self, handler: Callable[[Recorded], Reply], *, max_requests: int) -> None:
        self.handler = handler
        self.max_requests = max_requests
        self.requests: list[Recorded] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                rec = Recorded(self.command, self.path,
                               {k.lower(): v for k, v in self.headers.items()},
                               self.rfile.read(length) if length else b"")
                with outer._lock:
                    outer.requests.append(rec)
                    outer._arrived.notify_all()
                    over = len(outer.requests) > outer.max_requests
                reply = Reply(503, {"error": {"message": "too many test requests"}}) if over \
                    else outer.handler(rec)
                if reply.delay_s:
                    outer.stopping.wait(reply.delay_s)
                body = reply.body
                if isinstance(body, str):
                    data = body.encode()
                elif isinstance(body, bytes):
                    data = body
                else:
                    data = json.dumps(body).encode()
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = _serve
            do_POST = _serve

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    def wait_for_requests(self, count: int, timeout_s: float = 30.0) -> int:
        """Wait until ``count`` requests arrived (a client that gave up on a slow answer may
        leave before a loaded server's thread records its request); returns how many did."""
        with self._arrived:
            self._arrived.wait_for(lambda: len(self.requests) >= count, timeout=timeout_s)
            return len(self.requests)

    def paths(self) -> list[str]:
        return [r.path for r in self.requests]


@contextmanager
def serve(handler: Callable[[Recorded], Reply], *, max_requests: int = 50) -> Iterator[FakeServer]:
    """Run a :class:`FakeServer` for the duration of the block."""
    server = FakeServer(handler, max_requests=max_requests)
    server._thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server._httpd.shutdown()
        server._httpd.server_close()
        server._thread.join(timeout=5)

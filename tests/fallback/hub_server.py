"""A stand-in model hub on 127.0.0.1: serves real files the way Hugging Face does.

``GET /<owner>/<repo>/resolve/main/<file>`` answers a 302 to ``/cdn/<file>`` carrying
``X-Linked-Etag`` (the file's sha256, or a configured wrong one) and ``X-Linked-Size``, as the
hub does for LFS files; ``/cdn/<file>`` streams the bytes, honouring ``Range: bytes=N-`` with a
206 (unless ``ranges=False``). ``drop_after`` makes the first body transfers stop after that
many bytes and close the connection, as a flaky network does; ``unavailable_left`` makes the
first body requests answer 503, as an overloaded CDN does. Every request is recorded.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class HubRequest:
    """One request as the server saw it."""

    path: str
    range: str | None


@dataclass
class HubFile:
    """A file the hub serves under ``<repo>/<file>``.

    Attributes:
        data: the bytes.
        etag: the sha256 announced in ``X-Linked-Etag`` (default: the real one; ``None`` sends none).
        sidecar: text served at ``<file>.sha256`` (404 when ``None``).
    """

    data: bytes
    etag: str | None = None
    sidecar: str | None = None
    announce: bool = True

    def __post_init__(self) -> None:
        if self.etag is None and self.announce:
            self.etag = hashlib.sha256(self.data).hexdigest()


@dataclass
class Hub:
    """The running server: ``url``, ``requests``; ``drop_after`` / ``drops_left`` / ``ranges``
    change how bodies are sent."""

    files: dict[str, HubFile]
    url: str = ""
    requests: list[HubRequest] = field(default_factory=list)
    drop_after: int | None = None
    drops_left: int = 0
    ranges: bool = True
    unavailable_left: int = 0
    body_bytes_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            with hub.lock:
                hub.requests.append(HubRequest(self.path, self.headers.get("Range")))
            if "/resolve/main/" in self.path:
                key = self.path.replace("/resolve/main/", "/", 1).lstrip("/")
                if key.endswith(".sha256"):
                    f = hub.files.get(key[: -len(".sha256")])
                    if f is None or f.sidecar is None:
                        self._send(404, {}, b"not found")
                    else:
                        self._send(200, {"Content-Type": "text/plain"}, f.sidecar.encode())
                    return
                f = hub.files.get(key)
                if f is None:
                    self._send(404, {}, b"Entry not found")
                    return
                headers = {"Location": f"/cdn/{key}", "X-Linked-Size": str(len(f.data))}
                if f.etag is not None:
                    headers["X-Linked-Etag"] = f'"{f.etag}"'
                self._send(302, headers)
                return
            if self.path.startswith("/cdn/"):
                f = hub.files.get(self.path[len("/cdn/"):])
                if f is None:
                    self._send(404, {}, b"no such object")
                    return
                self._stream(f.data)
                return
            self._send(404, {}, b"no route")

        def _stream(self, data: bytes) -> None:
            with hub.lock:
                unavailable = hub.unavailable_left > 0
                hub.unavailable_left -= unavailable
            if unavailable:
                self._send(503, {"Content-Type": "text/plain"}, b"Service Unavailable")
                return
            start = 0
            wanted = self.headers.get("Range")
            status, headers = 200, {"Content-Type": "application/octet-stream"}
            if wanted and hub.ranges and wanted.startswith("bytes=") and wanted.endswith("-"):
                start = int(wanted[len("bytes="):-1])
                if start >= len(data):
                    self._send(416, {"Content-Range": f"bytes */{len(data)}"})
                    return
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            headers["Content-Length"] = str(len(body))
            with hub.lock:
                drop = hub.drop_after if hub.drops_left > 0 else None
                if drop is not None:
                    hub.drops_left -= 1
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            part = body if drop is None else body[:drop]
            view = memoryview(part)
            for i in range(0, len(view), 1 << 20):
                self.wfile.write(view[i:i + (1 << 20)])
            with hub.lock:
                hub.body_bytes_sent += len(part)
            if drop is not None:
                self.wfile.flush()
                self.close_connection = True

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up (a dropped or finished transfer) is normal here, not an error."""


@contextmanager
def serve_hub(files: dict[str, HubFile], **options: Any) -> Iterator[Hub]:
    """Run a :class:`Hub` serving ``files`` (keys ``<owner>/<repo>/<file>``) for the block."""
    hub = Hub(files=files, **options)
    httpd = _Server(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def model_bytes(path: Path) -> bytes:
    """The bytes of a model file (read once per test)."""
    return path.read_bytes()

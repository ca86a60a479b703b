#!/usr/bin/env python3
"""Stand-in for a ``qmd mcp --http`` whose connection breaks: it listens on 127.0.0.1:<argv[1]>,
answers ``GET /health`` and the MCP ``initialize`` exchange as qmd 2.8.3 does (one SSE
``message`` event), then drops the connection of every ``tools/call`` without an answer."""
import json
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"{self.command} {self.path}\n")

    def do_GET(self) -> None:
        body = b'{"status":"ok","uptime":0}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if msg.get("method") == "tools/call":
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if "id" not in msg:
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "qmd", "version": "0-standin"}}
        body = f"event: message\ndata: {json.dumps({'jsonrpc': '2.0', 'id': msg['id'], 'result': result})}\n\n"
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()

"""The CLI's fast path: answer ``search``, ``get`` and ``status`` through a running daemon.

Standard library only (``socket`` only when a socket file is there); see docs/cli.md, "One-shot
or daemon", and docs/mcp-daemon.md, "The daemon socket".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping

from qmdbridge.cli.common import EXIT_REFUSED, print_config_warnings, print_error
from qmdbridge.config_env import state_dir
from qmdbridge.server.wire import (
    DAEMON_ENV,
    MAX_LINE_BYTES,
    client_fingerprint,
    daemon_dir,
    peer_ids,
    remove_stale_socket,
    short_socket_path,
    turned_off,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a served `qmdbridge search` skips it)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["DAEMON_COMMANDS", "build_request", "exchange", "try_daemon"]

# Each command's tool and its parameters: (parameter name, argparse attribute), left out when unset.
_TOOL_PARAMS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "search": ("memory_search", (("query", "query"), ("maxResults", "max_results"),
                                 ("minScore", "min_score"), ("corpus", "corpus"))),
    "get": ("memory_get", (("path", "path"), ("from", "from_line"), ("lines", "lines"),
                           ("fromChar", "from_char"), ("corpus", "corpus"))),
    "status": ("status", ())}
DAEMON_COMMANDS = tuple(_TOOL_PARAMS)
# How long a daemon has to take a request (the reply's first byte, sent before any work), s:
# past it the daemon is stopped or hung and the command runs in-process.
HANDSHAKE_S = 5.0
# How long a served command then waits for the daemon's answer (a first search may sync first), s.
REPLY_TIMEOUT_S = 120.0


def build_request(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """The request (the ``serve`` protocol plus ``fingerprint``) for a parsed ``search`` /
    ``get`` / ``status``: ``{"id": 1, "tool", "params", "sessionKey", "fingerprint"}``."""
    tool, fields = _TOOL_PARAMS[args.command]
    params = {name: getattr(args, attr) for name, attr in fields if getattr(args, attr) is not None}
    session_key = args.session_key if args.command == "search" else None
    fingerprint = client_fingerprint(agent=args.agent, workspace=args.workspace, config=args.config,
                                     backend=args.backend, env=env)
    return {"id": 1, "tool": tool, "params": params, "sessionKey": session_key,
            "fingerprint": fingerprint}


def exchange(path: str, request: dict[str, Any], *, timeout_s: float = REPLY_TIMEOUT_S) -> dict[str, Any] | None:
    """Send one request line to the socket at ``path`` and read one reply line.

    Returns:
        The decoded reply, or ``None`` when nobody answers (no socket, a stale one, which is
        removed, a refused peer, a reply that is not one JSON object; a daemon that takes no
        request in :data:`HANDSHAKE_S` or answers none in ``timeout_s`` is named on stderr) or
        the request cannot be sent (an argument holding bytes that are not UTF-8, as a file
        name may).
    """
    import socket  # here: a CLI that finds no socket file never loads it

    try:
        data = json.dumps(request, ensure_ascii=False).encode() + b"\n"
    except UnicodeEncodeError:  # a surrogate escape: the command runs in-process
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(HANDSHAKE_S)
    buf, chunk = bytearray(), b""
    try:
        with short_socket_path(path) as where:
            sock.connect(where)
        sock.sendall(data)
        while b"\n" not in chunk:  # the newline ends the reply: only the new bytes need a look
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
            sock.settimeout(timeout_s)  # taken: the answer may wait for a sync
            if len(buf) > MAX_LINE_BYTES:
                return None
    except ConnectionRefusedError:
        remove_stale_socket(path)
        return None
    except TimeoutError:
        pid = (peer_ids(sock) or (0, 0))[0] or "<pid>"
        waited = f"answered nothing in {timeout_s:g} s" if buf else f"took no request in {HANDSHAKE_S:g} s"
        sys.stderr.write(f"qmdbridge: the daemon (pid {pid}, socket {path}) {waited}, stopped or hung: "
                         f"answered in-process; `kill -CONT {pid}` resumes a stopped daemon, `kill {pid}` "
                         "ends a hung one (then start `qmdbridge serve` again)\n")
        return None
    except OSError:
        return None
    finally:
        sock.close()
    line = bytes(buf).split(b"\n", 1)[0]
    try:
        reply = json.loads(line)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def _candidates(folder: str, agent: str | None) -> list[str]:
    """The sockets in ``folder``, the one named after ``--agent`` first."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".sock"))
    except OSError:
        return []
    if agent:
        wanted = f"{agent.strip().lower()}.sock"
        names.sort(key=lambda n: n != wanted)
    return [os.path.join(folder, n) for n in names]


def _print(args: argparse.Namespace, result: dict[str, Any], *, keyword_notice: bool = True,
           config_warnings: list[str] | None = None) -> int | None:
    """Print a daemon's result like the in-process command would; ``None`` to run in-process
    (which tells the config warnings itself). ``keyword_notice``: the daemon's ``keywordNotice``
    (``render.keyword_notice``); ``config_warnings``: its ``configWarnings``, told first."""
    if args.command == "get" and result.get("disabled"):
        if not result.get("refused"):
            return None
        print_config_warnings(config_warnings or ())
        return print_error(args.json, str(result.get("error")), "PathRefusedError", EXIT_REFUSED)
    if result.get("disabled") or (args.command == "get" and result.get("missing")):
        return None  # in-process gives the exact message and exit code (a missing file exits 4)
    from qmdbridge.cli.render import print_answer

    print_config_warnings(config_warnings or ())
    return print_answer(args, result, served_by="daemon", keyword_notice=keyword_notice)


def try_daemon(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int | None:
    """Run a parsed ``search`` / ``get`` / ``status`` through a daemon that serves it
    (``QMDBRIDGE_DAEMON=off`` in ``env`` skips the attempt).

    Returns:
        The exit code after printing the daemon's answer, or ``None``: the caller runs the
        command in-process.
    """
    e = os.environ if env is None else env
    if args.command not in DAEMON_COMMANDS or turned_off(e, DAEMON_ENV) or getattr(args, "explain", False):
        return None  # --explain traces are built in-process (the serve protocol has no such flag)
    if args.command == "get" and os.path.isabs(args.path):
        return None  # the workspace-relative form is worked out in-process (the tool refuses /x)
    folder = daemon_dir(state_dir(e))
    sockets = _candidates(folder, args.agent)
    if not sockets:
        return None
    request = build_request(args, e)
    for path in sockets:
        reply = exchange(path, request)
        if reply is None or "mismatch" in reply or not isinstance(reply.get("result"), dict):
            continue
        warnings = reply.get("configWarnings")
        return _print(args, reply["result"], keyword_notice=reply.get("keywordNotice") is not False,
                      config_warnings=[w for w in warnings if isinstance(w, str)] if isinstance(
                          warnings, list) else [])
    return None

"""``qmdbridge serve``: the long-lived sidecar process.

It keeps one ``MemoryManager`` in ``full`` mode (qmd boot update and timers, file watchers),
and answers tool calls as JSON lines on stdin/stdout::

    -> {"id": 1, "tool": "memory_search", "params": {"query": "router"}, "sessionKey": "agent:main:main"}
    <- {"id": 1, "result": {"backend": "builtin", "results": [...], ...}}

``sessionKeys`` (optional) lists keys the session inherits, e.g. the session that spawned a
sub-agent: ``"sessionKey": "agent:main:subagent:7f3c", "sessionKeys": ["agent:main:main"]``.

Tools: ``memory_search``, ``memory_get``, ``status``, ``sync``. A malformed line gets
``{"id": null, "error": "..."}``. It stops cleanly on SIGTERM/SIGINT or end of input (unless
``--no-stdin``), closing the manager so every qmd child is reaped.

The same requests are answered on the agent's daemon socket (``<stateDir>/daemon/<agentId>.sock``,
see ``qmdbridge.server.socket_listener``) unless ``--no-socket``, so ``qmdbridge search`` finds
this warm process by itself.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import anyio
import orjson

from qmdbridge.cli.common import EXIT_OK

__all__ = ["handle_line", "serve"]


async def handle_line(manager: Any, line: bytes) -> dict[str, Any]:
    """Answer one JSON-lines request (see the module docstring for the shapes)."""
    from qmdbridge.tools import SYNC_SCHEMA, handle_memory_get, handle_memory_search, param_error

    try:
        req = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return {"id": None, "error": f"invalid JSON: {exc}"}
    if not isinstance(req, dict):
        return {"id": None, "error": "request must be a JSON object"}
    rid = req.get("id")
    tool = req.get("tool")
    raw_params = req.get("params")
    params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
    key = req.get("sessionKey")
    if key is not None and not isinstance(key, str):
        return {"id": rid, "result": {"results": [], "disabled": True,
                                      "error": "session key must be a string"}}
    if tool == "memory_search":
        return {"id": rid, "result": await handle_memory_search(
            manager, params, session_key=key, session_keys=req.get("sessionKeys"))}
    if tool == "memory_get":
        return {"id": rid, "result": await handle_memory_get(manager, params)}
    if tool == "status":
        return {"id": rid, "result": (await manager.status()).to_json_dict()}
    if tool == "sync":
        invalid = param_error(SYNC_SCHEMA, params)  # {"force": "false"} must not force a rebuild
        if invalid is not None:
            return {"id": rid, "error": invalid}
        try:
            await manager.sync(reason="serve", force=params.get("force") is True)
        except Exception as exc:  # tool edge
            return {"id": rid, "error": str(exc)}
        return {"id": rid, "result": {"ok": True}}
    return {"id": rid, "error": f"unknown tool: {tool!r}"}


def _stdin_reader(send: Any, token: Any) -> None:
    """Daemon thread: forward stdin lines to the loop (a blocked read never delays exit)."""
    # os.read on the raw fd, not sys.stdin: a daemon thread blocked inside a buffered reader
    # aborts the interpreter at shutdown.
    fd = sys.stdin.fileno()
    pending = b""
    try:
        while True:
            chunk = os.read(fd, 65536)
            pending += chunk
            *lines, pending = pending.split(b"\n") if chunk else [*pending.splitlines(), b""]
            for line in lines:
                anyio.from_thread.run_sync(send.send_nowait, line + b"\n", token=token)
            if not chunk:
                anyio.from_thread.run_sync(send.send_nowait, b"", token=token)
                return
    except (OSError, RuntimeError, anyio.ClosedResourceError, anyio.BrokenResourceError):
        return  # stdin closed or the server is shutting down


async def _read_stdin(manager: Any, done: anyio.Event) -> None:
    import threading

    from anyio.lowlevel import current_token

    send, receive = anyio.create_memory_object_stream[bytes](max_buffer_size=1024)
    threading.Thread(target=_stdin_reader, args=(send, current_token()), daemon=True,
                     name="qmdbridge-stdin").start()
    async with receive:
        async for line in receive:
            if not line:
                break
            if not line.strip():
                continue
            try:
                reply = await handle_line(manager, line)
                data = orjson.dumps(reply)
            except Exception as exc:  # serve edge: one bad request never stops the server
                data = orjson.dumps({"id": None, "error": f"{type(exc).__name__}: {exc}"})
            sys.stdout.buffer.write(data + b"\n")
            sys.stdout.flush()
    done.set()


async def _start_socket(tg: Any, manager: Any, agent: Any, args: argparse.Namespace) -> None:
    """Start the daemon socket (``qmdbridge.server.socket_listener``) in ``tg``, answering with
    :func:`handle_line`, so the CLI's ``search``/``get``/``status`` find this process."""
    from qmdbridge.server.socket_listener import identity_for, serve_socket

    async def handle(line: bytes) -> dict[str, Any]:
        return await handle_line(manager, line)

    identity = identity_for(agent, config=args.config, backend=args.backend)
    path = await tg.start(serve_socket, identity, handle)
    if path is not None:
        sys.stderr.write(f"qmdbridge serve: daemon socket {path}\n")
        sys.stderr.flush()


async def serve(agent: Any, args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT (or end of stdin); returns the exit code.

    The manager is entered first (its task group holds every background task); the signal
    handlers are installed before anything starts, so a signal during start-up (a slow or
    hanging qmd reconciling its collections) still closes the manager, which cancels the group
    and reaps every child process.
    """
    from qmdbridge.manager import MemoryManager

    done = anyio.Event()
    async with MemoryManager(agent, backend=args.backend, mode="full") as manager:
        async with anyio.create_task_group() as tg:
            async def watch_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        done.set()
                        return

            async def stop_when_done() -> None:
                await done.wait()
                tg.cancel_scope.cancel()

            async def run() -> None:
                await manager.start()
                sys.stderr.write(f"qmdbridge serve: agent {agent.agent_id}, backend "
                                 f"{manager.backend_name}, workspace {agent.workspace_dir}\n")
                sys.stderr.flush()
                if not getattr(args, "no_socket", False):
                    await _start_socket(tg, manager, agent, args)
                if not args.no_stdin:
                    await _read_stdin(manager, done)

            tg.start_soon(watch_signals)
            tg.start_soon(stop_when_done)
            await anyio.sleep(0)  # let the signal receiver install first
            tg.start_soon(run)
    sys.stderr.write("qmdbridge serve: stopped\n")
    return EXIT_OK

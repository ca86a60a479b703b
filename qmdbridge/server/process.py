"""The long-lived process of ``qmdbridge serve`` and ``qmdbridge mcp``: stdin lines, signals, one manager."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from qmdbridge.config import ResolvedAgent
from qmdbridge.manager import BackendName, MemoryManager, require_workspace

__all__ = ["run_until_signal", "stdin_lines"]

# What stops a long-lived process cleanly: SIGTERM, Ctrl-C and, where it exists, SIGHUP (its
# terminal closed), whose default action would kill it without reaping its qmd children.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, *((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()))


def _pump_stdin(send: MemoryObjectSendStream[bytes], token: Any) -> None:
    # os.read on the raw fd, not sys.stdin: a daemon thread blocked inside a buffered reader
    # aborts the interpreter at shutdown.
    fd = sys.stdin.fileno()
    pending = b""
    # ends when stdin closes or the server shuts down
    with contextlib.suppress(OSError, RuntimeError, anyio.ClosedResourceError, anyio.BrokenResourceError):
        while chunk := os.read(fd, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                anyio.from_thread.run(send.send, line + b"\n", token=token)
        if pending.strip():
            anyio.from_thread.run(send.send, pending + b"\n", token=token)
    with contextlib.suppress(RuntimeError):  # the loop is already gone
        anyio.from_thread.run_sync(send.close, token=token)


def stdin_lines() -> MemoryObjectReceiveStream[bytes]:
    """Start a daemon thread that reads stdin and hands its lines to the running event loop
    (a blocked read in a loop worker would hold up exit after a signal).

    Returns:
        A stream of stdin's lines, each ending in ``b"\\n"``; it ends at end of input.
    """
    from anyio.lowlevel import current_token

    send, receive = anyio.create_memory_object_stream[bytes](max_buffer_size=256)
    threading.Thread(target=_pump_stdin, args=(send, current_token()), daemon=True,
                     name="qmdbridge-stdin").start()
    return receive


async def run_until_signal(agent: ResolvedAgent, *, backend: BackendName | None, prog: str,
                           body: Callable[[MemoryManager, TaskGroup], Awaitable[None]]) -> None:
    """Run one ``full``-mode manager for ``agent`` until ``body`` returns or one of
    SIGTERM, SIGINT or SIGHUP arrives, then close it, so every qmd child is reaped. The signal handlers
    come first, so a signal during start-up still closes it; ``<prog>: agent <id>, backend
    <name>, workspace <dir>`` and ``<prog>: stopped`` go to stderr; ``backend``: ``--backend``
    (``None``: the config's); ``body`` gets the started manager and the task group.

    Raises:
        UsageError: the workspace is missing or not a folder (the words of every command).
    """
    require_workspace(agent.workspace_dir)  # the watcher's start would fail inside the task group
    async with MemoryManager(agent, backend=backend, mode="full") as manager:
        async with anyio.create_task_group() as tg:
            async def watch_signals() -> None:
                with anyio.open_signal_receiver(*_STOP_SIGNALS) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        return

            async def run() -> None:
                await manager.start()
                sys.stderr.write(f"{prog}: agent {agent.agent_id}, backend {manager.backend_name}, "
                                 f"workspace {agent.workspace_dir}\n")
                await body(manager, tg)
                tg.cancel_scope.cancel()

            tg.start_soon(watch_signals)
            await anyio.sleep(0)  # let the signal receiver install first
            tg.start_soon(run)
    sys.stderr.write(f"{prog}: stopped\n")

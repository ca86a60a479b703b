"""The Unix-socket listener of ``qmdbridge serve``: the warm daemon the CLI finds by itself.

Layout and framing: :mod:`qmdbridge.server.wire`; peer checks and binding: docs/mcp-daemon.md,
"The daemon socket".
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from fallback.errors import ConfigError
from qmdbridge.config import ResolvedAgent, load_config, normalize_agent_id, resolve_agent
from qmdbridge.server.wire import (
    MAX_LINE_BYTES,
    config_identity,
    decode_line,
    encode_line,
    peer_ids,
    remove_stale_socket,
    short_socket_path,
    socket_path,
)

__all__ = ["DaemonIdentity", "LineHandler", "identity_for", "serve_socket"]

LineHandler = Callable[[bytes], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class DaemonIdentity:
    """What one daemon serves, compared with each request's fingerprint: the state dir,
    the served and the config's default agent, the served and the configured workspace, the
    config file and its stamp at start, ``memory.backend`` and the backend it runs."""

    state_dir: str
    agent_id: str
    default_agent_id: str | None
    workspace: str
    configured_workspace: str | None
    config_path: str | None
    config_stamp: str | None
    config_backend: str
    backend: str

    def mismatch(self, fp: dict[str, Any]) -> str | None:
        """Why a request with fingerprint ``fp`` (see ``wire.client_fingerprint``) is not for
        this daemon, or ``None`` when it is."""
        if fp.get("stateDir") != self.state_dir:
            return "state dir differs"
        if (fp.get("config"), fp.get("configStamp")) != (self.config_path, self.config_stamp):
            return "config file differs or changed since the daemon started"
        raw_agent = fp.get("agent")
        try:
            agent = normalize_agent_id(raw_agent) if isinstance(raw_agent, str) else self.default_agent_id
        except ConfigError:
            return "invalid agent id"
        if agent != self.agent_id:
            return "agent differs"
        workspace = fp.get("workspace")
        if (workspace if isinstance(workspace, str) else self.configured_workspace) != self.workspace:
            return "workspace differs"
        backend = fp.get("backend")
        if (backend if isinstance(backend, str) else self.config_backend) != self.backend:
            return "backend differs"
        return None


def identity_for(agent: ResolvedAgent, *, config: str | None, backend: str | None) -> DaemonIdentity:
    """The identity of a daemon serving ``agent``, started with ``--config`` and ``--backend``.

    Raises:
        ConfigError: the config file cannot be loaded (a concurrent edit).
    """
    cfg = load_config(config)
    try:
        default_agent: str | None = resolve_agent(cfg, None).agent_id
    except ConfigError:
        default_agent = None
    try:
        configured: str | None = str(resolve_agent(cfg, agent.agent_id).workspace_dir)
    except ConfigError:
        configured = None
    cfg_path, cfg_stamp = config_identity(config, str(agent.state_dir), os.environ)
    return DaemonIdentity(
        state_dir=str(agent.state_dir), agent_id=agent.agent_id, default_agent_id=default_agent,
        workspace=str(agent.workspace_dir), configured_workspace=configured,
        config_path=cfg_path, config_stamp=cfg_stamp, config_backend=agent.memory.backend,
        backend=backend or agent.memory.backend)


def _bind(path: str) -> socket.socket:
    """Create the folder (0700) and a listening socket (0600) at ``path``; ``FileExistsError``
    when a live daemon listens there, ``OSError`` when either cannot be made."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    if os.path.lexists(path) and not remove_stale_socket(path):
        raise FileExistsError(f"another daemon listens on {path}")
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with short_socket_path(tmp) as where:
            old_umask = os.umask(0o177)
            try:
                sock.bind(where)
            finally:
                os.umask(old_umask)
        os.chmod(tmp, 0o600)
        sock.listen(64)
        os.rename(tmp, path)
    except BaseException:
        sock.close()
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return sock


async def _serve_connection(stream: SocketStream, *, identity: DaemonIdentity, handle: LineHandler) -> None:
    """Answer request lines on one connection until the peer closes it, also before a reply
    (that reply is dropped; the daemon serves on)."""
    async with stream:
        with contextlib.suppress(anyio.BrokenResourceError):  # the peer went away
            raw = stream.extra(SocketAttribute.raw_socket)
            ids = peer_ids(raw)
            if ids is not None and ids[1] != os.geteuid():
                await stream.send(encode_line({"id": None, "error": f"refused: peer uid {ids[1]} is not the daemon's owner"}) + b"\n")
                return
            lines = BufferedByteReceiveStream(stream)
            while True:
                try:
                    line = await lines.receive_until(b"\n", MAX_LINE_BYTES + 1)
                except anyio.DelimiterNotFound:
                    await stream.send(encode_line({"id": None, "error": "request line too long"}) + b"\n")
                    return
                except anyio.IncompleteRead:
                    return
                if line.strip():  # a reply's first byte, a space, says the request was taken
                    await stream.send(b" ")
                    await stream.send(encode_line(await _answer(line, identity, handle)) + b"\n")


async def _answer(line: bytes, identity: DaemonIdentity, handle: LineHandler) -> dict[str, Any]:
    """One reply: ``mismatch`` when the fingerprint names another agent/workspace/config."""
    try:
        req = decode_line(line)
    except ValueError:
        req = None
    if isinstance(req, dict) and isinstance(req.get("fingerprint"), dict):
        reason = identity.mismatch(req["fingerprint"])
        if reason is not None:
            return {"id": req.get("id"), "mismatch": reason}
    return await handle(line)


async def serve_socket(identity: DaemonIdentity, handle: LineHandler, *,
                       task_status: TaskStatus[str | None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Listen on the agent's socket and answer requests with ``handle`` (``await handle(line) ->
    reply dict``, never raising) until cancelled; started with the socket path, or ``None`` when
    no socket could be made (the reason goes to stderr). The socket file is removed on the way
    out unless another daemon replaced it."""
    path = socket_path(identity.state_dir, identity.agent_id)
    try:
        sock = _bind(path)
    except OSError as exc:
        sys.stderr.write(f"qmdbridge serve: no daemon socket: {exc}\n")
        task_status.started(None)
        return
    mine = os.stat(path)
    try:
        listener = await anyio.abc.SocketListener.from_socket(sock)
        async with listener, anyio.create_task_group() as tg:
            task_status.started(path)
            await listener.serve(partial(_serve_connection, identity=identity, handle=handle),
                                 task_group=tg)
    finally:
        with contextlib.suppress(OSError):
            now = os.stat(path)
            if (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
                os.unlink(path)

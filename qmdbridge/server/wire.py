"""The daemon socket of ``qmdbridge serve``: where it lives, how to reach it, what a request names.

A cheap part of the standard library only (the CLI's fast path imports it first); paths are
``str``. Layout, framing and the fingerprint rule: docs/mcp-daemon.md, "The daemon socket".
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator, Mapping

from qmdbridge.config_env import env_stamp, state_dir

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a served `qmdbridge search` skips it)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "DAEMON_DIR_NAME",
    "DAEMON_ENV",
    "MAX_LINE_BYTES",
    "client_fingerprint",
    "config_identity",
    "daemon_dir",
    "decode_line",
    "encode_line",
    "peer_ids",
    "remove_stale_socket",
    "short_socket_path",
    "socket_path",
    "turned_off",
]

DAEMON_DIR_NAME = "daemon"
# "off", "0", "false" or "no" turn the CLI's daemon attempt off (the CLI works in-process).
DAEMON_ENV = "QMDBRIDGE_DAEMON"
# One request or reply line at most (a memory_get page or a status is far below this).
MAX_LINE_BYTES = 32 * 1024 * 1024
# sun_path is 108 bytes on Linux, 104 on the BSDs and macOS, including the final NUL.
_SUN_PATH_MAX = 103


def daemon_dir(state: str) -> str:
    """The folder of the daemon sockets: ``<stateDir>/daemon``."""
    return os.path.join(state, DAEMON_DIR_NAME)


def socket_path(state: str, agent_id: str) -> str:
    """The socket of ``agent_id`` (an already normalised agent id): ``<stateDir>/daemon/<id>.sock``."""
    return os.path.join(daemon_dir(state), f"{agent_id}.sock")


def turned_off(env: Mapping[str, str], name: str) -> bool:
    """True when ``env``'s variable ``name`` (:data:`DAEMON_ENV`, the CLI cache's) is ``off``, ``0``,
    ``false`` or ``no`` (any case)."""
    return env.get(name, "").strip().lower() in ("off", "0", "false", "no")


def decode_line(line: bytes) -> Any:
    """One request line of ``serve`` (stdin or the daemon socket) as JSON: ``json.loads``, which
    (unlike orjson) reads a lone surrogate escape (``"\\ud83d"``) as the MCP route does, and
    reads past one leading UTF-8 BOM.

    Raises:
        ValueError: the line is not JSON (``NaN`` and ``Infinity`` are not), not UTF-8, or
            nested deeper than Python's recursion limit.
    """
    try:
        return json.loads(line, parse_constant=_not_json)
    except RecursionError:
        raise ValueError("nested too deep") from None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def encode_line(doc: Any) -> bytes:
    """``doc`` as one compact JSON line without its ``\\n``: orjson's bytes, or, when a string
    holds a lone surrogate (echoed from a request), the standard library's with non-ASCII
    characters escaped."""
    import orjson  # here: the CLI's fast path never encodes a reply

    try:
        return orjson.dumps(doc)
    except orjson.JSONEncodeError:
        return json.dumps(doc, separators=(",", ":")).encode()


def peer_ids(sock: Any) -> tuple[int, int] | None:
    """``(pid, uid)`` of the process at the other end of a connected Unix socket (``SO_PEERCRED``:
    for a client, the daemon that listens), or ``None`` where the OS does not offer it (pid 0:
    not connected)."""
    import socket
    import struct

    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))
    return pid, uid


def config_identity(explicit: str | None, state: str,
                    env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The config file a command would load (``explicit``: ``--config``; else
    ``<state>/openclaw.json`` when it exists) and a stamp that changes when the file does, or a
    variable it references (``${NAME}``: :func:`qmdbridge.config_env.env_stamp`) has another
    value in ``env``.

    Returns:
        ``(resolved path, "<size>:<mtime ns>:<ctime ns>:<inode>[:env <crc>]")``; ``(None, None)``
        without a config file; ``(path, None)`` when it cannot be read (never matches a daemon).
    """
    if explicit is None and not os.path.isfile(os.path.join(state, "openclaw.json")):
        return None, None
    path = os.path.realpath(os.path.expanduser(explicit or os.path.join(state, "openclaw.json")))
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return path, None
        with open(path, "rb") as f:
            referenced = env_stamp(f.read().decode("utf-8", "replace"), env)
    except OSError:
        return path, None
    # ctime too: a file rewritten in place with its size, and its mtime put back (``touch -r``,
    # an editor or sync tool that keeps mtimes), has a new ctime, which no call can set.
    return path, f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}" + (
        f":env {referenced}" if referenced else "")


def client_fingerprint(*, agent: str | None, workspace: str | None, config: str | None,
                       backend: str | None, env: Mapping[str, str]) -> dict[str, Any]:
    """What a CLI command would work on, for the daemon to compare with what it serves:
    the raw ``--agent``, ``--workspace`` (resolved against the cwd), ``--config`` and
    ``--backend`` values and the caller's environment.

    Returns:
        ``{stateDir, agent, workspace, config, configStamp, backend}`` (strings or ``None``).
    """
    state = state_dir(env)
    cfg_path, cfg_stamp = config_identity(config, state, env)
    return {
        "stateDir": state,
        "agent": agent,
        "workspace": os.path.realpath(os.path.expanduser(workspace)) if workspace is not None else None,
        "config": cfg_path,
        "configStamp": cfg_stamp,
        "backend": backend,
    }


@contextlib.contextmanager
def short_socket_path(path: str) -> Iterator[str]:
    """Yield a path ``bind``/``connect`` accept for the socket at ``path``: itself when
    it fits in ``sun_path``, else (Linux) ``/proc/self/fd/<fd>/<name>`` through the parent
    folder, held open for the ``with`` block.

    Raises:
        OSError: too long and not shortenable, or the parent folder cannot be opened.
    """
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield path
        return
    if not os.path.isdir("/proc/self/fd"):
        raise OSError(f"socket path too long for this system ({len(path)} bytes): {path}")
    folder, name = os.path.split(path)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_PATH", 0))
    try:
        short = f"/proc/self/fd/{fd}/{name}"
        if len(os.fsencode(short)) > _SUN_PATH_MAX:
            raise OSError(f"socket name too long: {name}")
        yield short
    finally:
        os.close(fd)


def remove_stale_socket(path: str) -> bool:
    """Remove ``path`` when it is a socket nobody listens on (a refused connect, and
    still the same inode after it).

    Returns:
        True when a stale socket was removed.
    """
    try:
        before = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISSOCK(before.st_mode):
        return False
    import socket  # here: the CLI's fast paths import this module and connect to nothing

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with short_socket_path(path) as where:
            probe.connect(where)
    except ConnectionRefusedError:
        pass
    except OSError:
        return False
    else:
        return False
    finally:
        probe.close()
    try:
        after = os.lstat(path)
        if (after.st_ino, after.st_dev) == (before.st_ino, before.st_dev):
            os.unlink(path)
            return True
    except OSError:
        return False
    return False

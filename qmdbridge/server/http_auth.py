"""Access control of ``qmdbridge mcp --http``: the bearer token and the loopback Host/Origin rules.

What is refused with which status: docs/mcp-daemon.md, "MCP server".
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from fallback.errors import ConfigError

__all__ = ["TOKEN_ENV", "BearerTokenMiddleware", "exposure_warning", "load_or_create_token", "loopback_security"]

TOKEN_ENV = "QMDBRIDGE_MCP_TOKEN"
# Shorter secrets are refused: a bearer token is the only thing between a local process and memory.
MIN_TOKEN_CHARS = 16
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def load_or_create_token(state_dir: Path, env: Mapping[str, str]) -> tuple[str, Path | None]:
    """The bearer token and the file it came from: ``$QMDBRIDGE_MCP_TOKEN`` (file ``None``), else
    ``<stateDir>/mcp/token``.

    A missing file is written under a temporary name and linked into place (folder 0700, file
    0600, 32 random bytes), so two servers starting together agree on one token and neither
    reads a file the other has not written yet; an existing one is tightened to 0600.

    Raises:
        ConfigError: the token is shorter than 16 characters, or the file cannot be read or
            written, or is not UTF-8 text.
    """
    raw = env.get(TOKEN_ENV, "").strip()
    if raw:
        if len(raw) < MIN_TOKEN_CHARS:
            raise ConfigError("too short", file="environment", key=TOKEN_ENV,
                              expected=f"at least {MIN_TOKEN_CHARS} characters")
        return raw, None
    path = state_dir / "mcp" / "token"
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        if not path.exists():
            fresh = path.with_name(f".token-{secrets.token_hex(8)}")
            fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(secrets.token_urlsafe(32) + "\n")
                with contextlib.suppress(FileExistsError):  # another server linked its own first
                    os.link(fresh, path)
            finally:
                fresh.unlink()
        os.chmod(path, 0o600)
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"cannot read or create the MCP token file: {exc.strerror or exc}",
                          file=str(path)) from None
    except UnicodeDecodeError:
        raise ConfigError("the MCP token file is not UTF-8 text", file=str(path),
                          expected="a token of at least 16 characters (delete the file to make a new one)") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError("the MCP token file holds a token that is too short", file=str(path),
                          expected=f"at least {MIN_TOKEN_CHARS} characters (delete the file to make a new one)")
    return token, path


def loopback_security(bind_host: str) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding protection allowing loopback Host/Origin values on any
    port, and ``bind_host`` when it is a specific non-loopback address."""
    names = list(LOOPBACK_NAMES)
    if bind_host not in ("0.0.0.0", "::", "", *LOOPBACK_NAMES, "::1"):
        names.append(f"[{bind_host}]" if ":" in bind_host else bind_host)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*names, *(f"{n}:*" for n in names)],
        allowed_origins=[*(f"http://{n}" for n in names), *(f"http://{n}:*" for n in names)],
    )


def exposure_warning(bind_host: str) -> str | None:
    """The warning ``mcp --http`` prints when ``bind_host`` is not loopback (it names
    what protects memory then), else ``None``."""
    if bind_host in ("127.0.0.1", "localhost", "::1", "[::1]") or bind_host.startswith("127."):
        return None
    where = "every network interface" if bind_host in ("0.0.0.0", "::", "") else f"{bind_host}, not loopback"
    return (f"warning: --host {bind_host} listens on {where}: other machines can connect, and only "
            "the bearer token keeps them from memory (use the default --host 127.0.0.1 unless you "
            "mean that)")


class BearerTokenMiddleware:
    """ASGI middleware around ``app``: ``401`` unless ``Authorization: Bearer <token>`` matches."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        self.app = app
        self._expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # the scheme is case-insensitive (RFC 9110 11.1): "bearer", "BEARER" and "Bearer" alike
        scheme, _, given = Headers(scope=scope).get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._expected):
            response = JSONResponse({"error": "unauthorized: a valid bearer token is required"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

"""Long-lived ways to reach an agent's memory: the MCP server and the daemon socket of ``serve``.

- :mod:`qmdbridge.server.mcp_server`: ``qmdbridge mcp`` (stdio or Streamable HTTP, MCP SDK);
- :mod:`qmdbridge.server.http_auth`: its bearer token and loopback Host/Origin rules;
- :mod:`qmdbridge.server.socket_listener`: the Unix-socket listener ``serve`` runs;
- :mod:`qmdbridge.server.wire`: socket location and request fingerprint (standard library only,
  shared with the CLI's client in :mod:`qmdbridge.cli.daemon_client`).

Nothing is imported here, so the CLI's client can import ``wire`` without the rest.
"""

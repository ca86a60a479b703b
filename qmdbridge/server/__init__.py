"""Long-lived ways to reach an agent's memory: the MCP server and the daemon socket of ``serve``.

Nothing is imported here, so the CLI's client can import :mod:`qmdbridge.server.wire` alone.
"""

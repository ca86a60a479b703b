"""A long-lived server answers from the notes as they are now: ``qmdbridge mcp`` as a real
process, driven by the MCP SDK's client, and ``qmdbridge serve`` through the daemon socket the
CLI uses, searched right after a note was deleted, renamed or written (before the file
watcher's debounce has handed the change over)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_procs import CLI, DEADLINE_S, cli_env, live_children, make_workspace, start, stop  # noqa: E402

pytestmark = pytest.mark.anyio
# The watcher's own debounce would hand the changes over only after ten minutes: whatever a
# search finds of them, it found because the search itself looked.
SLOW_DEBOUNCE = {"agents": {"defaults": {"memorySearch": {"sync": {"watchDebounceMs": 600_000}}}}}
OKAPI = "# 2026-01-06\n\n- The okapi enclosure moved to bay 7.\n"


def _setup(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    ws = make_workspace(tmp_path)
    (ws / "memory" / "2026-01-06.md").write_text(OKAPI)
    config = tmp_path / "openclaw.json"
    config.write_text(json.dumps(SLOW_DEBOUNCE))
    return ws, config, cli_env(tmp_path / "state", tmp_path / "home")


def _hits(doc: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(h["path"], h["startLine"], h["endLine"]) for h in doc["results"]]


async def _call(session: ClientSession, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, args)
    assert result.isError is False, result.content
    return result.structuredContent or {}


async def _watcher_saw(session: ClientSession, changes: int) -> None:
    """Wait until the file watcher holds ``changes`` changed paths it has not handed over."""
    with anyio.fail_after(DEADLINE_S):
        while (await _call(session, "status", {}))["custom"]["watcher"]["pending"] < changes:
            await anyio.sleep(0.02)


async def test_mcp_search_right_after_notes_changed(tmp_path: Path) -> None:
    ws, config, env = _setup(tmp_path)
    params = StdioServerParameters(command=CLI[0], env=env,
                                   args=[*CLI[1:], "mcp", "--workspace", str(ws), "--config", str(config)])
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            before = await _call(session, "memory_search", {"query": "okapi enclosure"})
            assert _hits(before) == [("memory/2026-01-06.md", 1, 3)]

            (ws / "memory" / "2026-01-06.md").unlink()
            (ws / "memory" / "2026-01-07.md").write_text(
                "# 2026-01-07\n\n- Lunch with Priya: the okapi enclosure is now in bay 9.\n")
            await _watcher_saw(session, 2)
            after = await _call(session, "memory_search", {"query": "okapi enclosure"})
            assert _hits(after) == [("memory/2026-01-07.md", 1, 3)]
            page = await _call(session, "memory_get", {"path": "memory/2026-01-07.md", "from": 3, "lines": 1})
            assert page["text"] == "- Lunch with Priya: the okapi enclosure is now in bay 9."

            (ws / "memory" / "archive").mkdir()
            (ws / "memory" / "2026-01-07.md").rename(ws / "memory" / "archive" / "2026-01-07.md")
            await _watcher_saw(session, 3)
            moved = await _call(session, "memory_search", {"query": "okapi enclosure"})
            assert _hits(moved) == [("memory/archive/2026-01-07.md", 1, 3)]
    assert live_children() == []


def _cli_search(query: str, ws: Path, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([*CLI, "search", query, "--workspace", str(ws), "--json"], env=env,
                          capture_output=True, timeout=DEADLINE_S, check=True)
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_cli_search_served_by_the_daemon_right_after_a_note_was_deleted(tmp_path: Path) -> None:
    ws, config, env = _setup(tmp_path)
    env = {**env, "OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "openclaw.json").write_text(config.read_text())  # the default config
    proc, _ = start(["serve", "--no-stdin", "--workspace", str(ws)], env, ready="daemon socket")
    try:
        first = _cli_search("okapi enclosure", ws, env)
        assert (first["servedBy"], _hits(first)) == ("daemon", [("memory/2026-01-06.md", 1, 3)])
        (ws / "memory" / "2026-01-06.md").unlink()
        _daemon_watcher_saw(ws, env, 1)
        gone = _cli_search("okapi enclosure", ws, env)
        assert (gone["servedBy"], _hits(gone)) == ("daemon", [])
    finally:
        assert stop(proc, signal.SIGTERM) == 0
    assert live_children() == []


def _daemon_watcher_saw(ws: Path, env: dict[str, str], changes: int) -> None:
    """Wait until the daemon's file watcher holds ``changes`` paths it has not handed over."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        done = subprocess.run([*CLI, "status", "--workspace", str(ws), "--json"], env=env,
                              capture_output=True, timeout=DEADLINE_S, check=True)
        doc = json.loads(done.stdout)
        assert doc["servedBy"] == "daemon"
        if doc["custom"]["watcher"]["pending"] >= changes:
            return
    raise AssertionError(f"the watcher never saw {changes} changes")

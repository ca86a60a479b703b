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

from tests.e2e.cli_proc import run_cli_in_process

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_procs import CLI, DEADLINE_S, cli_env, live_children, make_workspace, start, stop  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # each test starts qmdbridge mcp or serve
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
    done = run_cli_in_process(["search", query, "--workspace", str(ws), "--json"], env)  # the daemon is real
    assert done.returncode == 0, done.stderr
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


async def _until_found(session: ClientSession, query: str, hits: list[tuple[str, int, int]]) -> None:
    """Search until the answer is ``hits`` (the periodic rescan, 5 minutes, is far off)."""
    with anyio.fail_after(60):
        while _hits(await _call(session, "memory_search", {"query": query})) != hits:
            await anyio.sleep(0.1)


async def test_extra_folders_created_after_the_server_started_are_watched(tmp_path: Path) -> None:
    """Extra paths configured before their folders exist (one in the workspace, one outside
    it): once created, notes written into them are found, and so are notes written later."""
    ws = make_workspace(tmp_path)
    outside = tmp_path / "journal"
    config = tmp_path / "openclaw.json"
    config.write_text(json.dumps({"agents": {"defaults": {"memorySearch": {
        "extraPaths": ["notes", str(outside)]}}}}))
    env = cli_env(tmp_path / "state", tmp_path / "home")
    params = StdioServerParameters(command=CLI[0], env=env,
                                   args=[*CLI[1:], "mcp", "--workspace", str(ws), "--config", str(config)])
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            assert _hits(await _call(session, "memory_search", {"query": "gecko"})) == []  # synced
            status = await _call(session, "status", {})
            assert sorted(status["issues"]) == [f"extra path missing: {outside}",
                                                f"extra path missing: {ws / 'notes'}"]
            (ws / "notes").mkdir()
            (ws / "notes" / "gecko.md").write_text("# Gecko\nThe gecko tank is at 28 degrees.\n")
            outside.mkdir()
            (outside / "2026-01-08.md").write_text("# 2026-01-08\nFed the gecko crickets.\n")
            await _until_found(session, "gecko", [("notes/gecko.md", 1, 2), ("../journal/2026-01-08.md", 1, 2)])
            with anyio.fail_after(DEADLINE_S):  # the watcher's own sync of these events is done
                while (await _call(session, "status", {}))["custom"]["live"]["syncs"].get("watch", 0) < 1:
                    await anyio.sleep(0.05)
            (outside / "2026-01-09.md").write_text("# 2026-01-09\nThe axolotl moved tanks.\n")
            (ws / "notes" / "axolotl.md").write_text("# Axolotl\nThe axolotl eats worms.\n")
            await _until_found(session, "axolotl", [("notes/axolotl.md", 1, 2), ("../journal/2026-01-09.md", 1, 2)])
            assert (await _call(session, "status", {}))["issues"] == []
    assert live_children() == []

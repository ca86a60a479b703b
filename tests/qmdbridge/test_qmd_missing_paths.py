"""A custom qmd collection (``memory.qmd.paths``) whose folder or file does not exist yet, with the
real qmd 2.8.3.

qmd refuses ``collection add`` for a path that does not exist. The bridge used to create the
folder (``mkdir -p``) to get the collection added: a typo in the config (``~/notse``) became an
empty folder tree, a single file not written yet (``~/notes/todo.md``) became a *folder* of that
name (so the file could never be written), and ``status`` said ``Problems: none``. Now it creates
nothing there: ``status`` names the missing path as a problem, and the collection is added (and
indexed) once the path exists, by the next one-shot command or the next search of ``serve``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from qmdbridge import MemoryManager
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.problems import status_problems

pytestmark = [pytest.mark.anyio, pytest.mark.qmd]

DEADLINE_S = 60


def _agent(tmp_path: Path, qmd_bin: Path) -> Any:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe router is in the hallway.\n")
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {
        "command": str(qmd_bin), "searchMode": "search",
        "update": {"interval": "0", "debounceMs": 0, "waitForBootSync": True},
        "limits": {"timeoutMs": 60_000},  # a bound: a loaded machine's qmd answers late, never falls back
        "paths": [{"name": "later", "path": str(tmp_path / "later")},
                  {"name": "todo", "path": str(tmp_path / "lists" / "todo.md")}]}},
        "agents": {"defaults": {"memorySearch": {"provider": "none",
                                                 "sync": {"watchDebounceMs": 100}}}}})
    return resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["HOME"] = str(tmp_path / "home")
    return env


async def test_missing_custom_paths_are_not_created_and_are_problems_until_they_exist(
        tmp_path: Path, qmd_bin: Path) -> None:
    agent = _agent(tmp_path, qmd_bin)
    async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:
        r = await m.search("router")
        assert (r.backend, [h.path for h in r.results]) == ("qmd", ["MEMORY.md"])
        await m.sync(reason="test")
        problems = [p["message"] for p in status_problems((await m.status()).to_json_dict())]
    assert not (tmp_path / "later").exists() and not (tmp_path / "lists").exists()
    assert problems == [f"extra path missing: {tmp_path / 'later'}",
                        f"extra path missing: {tmp_path / 'lists' / 'todo.md'}"]
    (tmp_path / "later").mkdir()
    (tmp_path / "later" / "heron.md").write_text("# Birds\n\nA heron by the weir.\n")
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "todo.md").write_text("# Todo\n\nFeed the axolotl.\n")
    async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:  # the next command
        heron = await m.search("heron weir")
        todo = await m.search("axolotl")
        await m.sync(reason="test")
        problems = status_problems((await m.status()).to_json_dict())
    assert (heron.backend, [h.path for h in heron.results]) == ("qmd", ["qmd/later/heron.md"])
    assert (todo.backend, [h.path for h in todo.results]) == ("qmd", ["qmd/todo/todo.md"])
    assert problems == []



async def test_the_next_command_lists_the_missing_paths_without_a_sync(tmp_path: Path,
                                                                       qmd_bin: Path) -> None:
    """The command after the one that reconciled the collections (its marker holds them, so it
    reconciles nothing) and before any builtin sync lists the missing paths too: they were known
    only to the builtin engine's scan, so ``status`` said ``Problems: none`` and ``doctor``
    passed."""
    agent = _agent(tmp_path, qmd_bin)
    async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:
        assert (await m.search("router")).backend == "qmd"
    async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:  # the next command
        status = (await m.status()).to_json_dict()
    assert (status["backend"], status["backends"]["builtin"]["lastSyncAtMs"]) == ("qmd", None)
    assert [(p["check"], p["message"]) for p in status_problems(status)] == [
        ("memory paths", f"extra path missing: {tmp_path / 'later'}"),
        ("memory paths", f"extra path missing: {tmp_path / 'lists' / 'todo.md'}")]

async def test_skipped_notes_are_problems_without_a_builtin_sync(tmp_path: Path, qmd_bin: Path) -> None:
    """A note symlinked out of the workspace, a FIFO with a note's name and a binary note are
    listed by qmd mode's status before any builtin sync, as the builtin scan lists them: the
    memory-file discovery's skip reasons, found by stat, and the builtin read's binary rule on
    the whole note (``status`` said ``Problems: none``; a note binary after its first 4 KiB was
    not listed)."""
    agent = _agent(tmp_path, qmd_bin)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "plans.md").write_text("# Plans\n\nThe kiln is fired on Sundays.\n")
    (agent.workspace_dir / "memory" / "plans.md").symlink_to(tmp_path / "outside" / "plans.md")
    os.mkfifo(agent.workspace_dir / "memory" / "pipe.md")
    (agent.workspace_dir / "memory" / "x.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"\x00" * 9000)
    # text for its first 5,000 bytes, binary after them: the builtin read's rule, not the head's
    (agent.workspace_dir / "memory" / "late.md").write_bytes(b"# Late\n" + b"a" * 5000 + b"\x00\x01\x02")
    async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:
        status = (await m.status()).to_json_dict()
    assert (status["backend"], status["backends"]["builtin"]["lastSyncAtMs"]) == ("qmd", None)
    assert [(p["check"], p["message"], p["hint"]) for p in status_problems(status)] == [
        ("memory file", "memory/pipe.md is not indexed: not a regular file",
         "memory files are regular Markdown files; move it out of the memory folders"),
        ("memory file", "memory/plans.md is not indexed: symlink (not followed)",
         "symlinks are never followed: replace the link with what it points to, or add the "
         "target's real path to memorySearch.extraPaths"),
        ("memory file", "memory/late.md is not indexed: binary file (NUL bytes)",
         "memory files are Markdown text; move the file out of the memory folders"),
        ("memory file", "memory/x.md is not indexed: binary file (NUL bytes)",
         "memory files are Markdown text; move the file out of the memory folders"),
        ("memory paths", f"extra path missing: {tmp_path / 'later'}",
         "create it, or fix or remove its entry in memorySearch.extraPaths or memory.qmd.paths"),
        ("memory paths", f"extra path missing: {tmp_path / 'lists' / 'todo.md'}",
         "create it, or fix or remove its entry in memorySearch.extraPaths or memory.qmd.paths")]


async def test_serve_adds_a_custom_collection_once_its_folder_exists(tmp_path: Path,
                                                                    qmd_bin: Path) -> None:
    agent = _agent(tmp_path, qmd_bin)
    async with MemoryManager(agent, mode="full", env=_env(tmp_path)) as m:
        await m.start()
        assert (await m.search("router")).backend == "qmd"
        assert not (tmp_path / "later").exists()
        (tmp_path / "later").mkdir()
        (tmp_path / "later" / "heron.md").write_text("# Birds\n\nA heron by the weir.\n")
        with anyio.fail_after(DEADLINE_S):
            while True:
                r = await m.search("heron weir")
                if r.results:
                    break
                await anyio.sleep(0.1)
        assert (r.backend, [h.path for h in r.results]) == ("qmd", ["qmd/later/heron.md"])

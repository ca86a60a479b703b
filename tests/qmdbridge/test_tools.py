"""Tool handlers: schemas, success payloads, and errors as ``disabled`` payloads (never raised)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.manager import MemoryManager
from qmdbridge.tools import MEMORY_GET_SCHEMA, MEMORY_SEARCH_SCHEMA, handle_memory_get, handle_memory_search

pytestmark = pytest.mark.anyio


@pytest.fixture
def manager(tmp_path: Path) -> MemoryManager:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("Coffee: flat white with oat milk.\n")
    cfg = parse_config({"agents": {"defaults": {"memorySearch": {"provider": "none"}}}})
    env = {"OPENCLAW_STATE_DIR": str(tmp_path / "state")}
    return MemoryManager(resolve_agent(cfg, workspace=ws, env=env), env=env)


def test_schemas() -> None:
    assert MEMORY_SEARCH_SCHEMA["name"] == "memory_search"
    assert MEMORY_SEARCH_SCHEMA["parameters"]["required"] == ["query"]
    assert MEMORY_GET_SCHEMA["name"] == "memory_get"
    assert set(MEMORY_GET_SCHEMA["parameters"]["properties"]) == {"path", "from", "lines"}


async def test_search_and_get_payloads(manager: MemoryManager) -> None:
    async with manager:
        out = await handle_memory_search(manager, {"query": "oat milk", "maxResults": 3},
                                         session_key="agent:main:main")
        assert out["backend"] == "builtin" and out["citations"] == "auto"
        assert out["results"][0]["path"] == "MEMORY.md"
        assert out["results"][0]["snippet"].endswith("Source: MEMORY.md#L1")
        page = await handle_memory_get(manager, {"path": "MEMORY.md", "from": 1, "lines": 5})
        assert page["text"] == "Coffee: flat white with oat milk." and page["from"] == 1


async def test_errors_become_disabled_payloads(manager: MemoryManager) -> None:
    async with manager:
        assert await handle_memory_search(manager, {"query": 5}) == {
            "results": [], "disabled": True, "error": "query required"}
        blank = await handle_memory_search(manager, {"query": "  "})
        assert blank["disabled"] is True and blank["error"] == "query must not be empty"
        refused = await handle_memory_get(manager, {"path": "../../etc/passwd"})
        assert refused["refused"] is True and refused["disabled"] is True and refused["text"] == ""
        assert (await handle_memory_get(manager, {}))["error"] == "path required"
        (manager.agent.workspace_dir / "memory" / "blob.md").write_bytes(b"GIF\x00\x01\x02\n")
        assert await handle_memory_get(manager, {"path": "memory/blob.md"}) == {
            "path": "memory/blob.md", "text": "", "disabled": True, "refused": True,
            "error": "path refused: 'memory/blob.md': binary file (NUL bytes)"}
        denied = await handle_memory_search(manager, {"query": "oat"}, session_key="agent:main:wa:group:g1")
        assert denied["results"] == [] and denied["denied"]["allowed"] is False


async def test_sub_agent_searches_with_the_key_it_inherits(manager: MemoryManager) -> None:
    async with manager:
        alone = await handle_memory_search(manager, {"query": "oat milk"},
                                           session_key="agent:main:subagent:7f3c")
        assert alone["results"] == [] and alone["denied"]["allowed"] is False
        out = await handle_memory_search(manager, {"query": "oat milk"},
                                         session_key="agent:main:subagent:7f3c",
                                         session_keys=["agent:main:main"])
        assert out["denied"] is None and [r["path"] for r in out["results"]] == ["MEMORY.md"]
        bad = await handle_memory_search(manager, {"query": "oat"}, session_keys="agent:main:main")  # type: ignore[arg-type]
        assert bad == {"results": [], "disabled": True, "error": "session keys must be a list of strings"}

"""What the builtin engine's status says before a search would surprise: the roots memory is read
from, a rebuild the next sync will run, and a configured provider that cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest

from fallback.embeddings import ProviderSelection, select_provider
from fallback.embeddings.local_gguf import LLAMA_CPP_MISSING
from fallback.engine.builtin import BuiltinEngine
from fallback.settings import EngineSettings, MemorySearchSettings


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Memory\n\nThe router is an Omada ER605.\n")
    (root / "notes").mkdir()
    return root


def settings_for(ws: Path, **search: object) -> EngineSettings:
    return EngineSettings.for_workspace(ws, state_dir=ws.parent / "state",
                                        search=MemorySearchSettings.model_validate(search))


@pytest.mark.anyio
async def test_roots_and_a_pending_rebuild_after_a_provider_change(ws: Path) -> None:
    plain = settings_for(ws, extraPaths=["notes", {"path": "../journal", "pattern": "*.md"}])
    engine = BuiltinEngine(plain, provider_selection=select_provider(plain.search, env={}))
    try:
        await engine.sync(reason="test")
        st = await engine.status()
    finally:
        await engine.close()
    assert st.roots == [
        {"kind": "root", "path": str(ws / "MEMORY.md"), "pattern": "MEMORY.md", "exists": True},
        {"kind": "memory", "path": str(ws / "memory"), "pattern": "**/*.md", "exists": True},
        {"kind": "extra", "path": str(ws / "notes"), "pattern": "**/*.md", "exists": True},
        {"kind": "extra", "path": str(ws.parent / "journal"), "pattern": "*.md", "exists": False}]
    assert (st.dirty, st.dirty_reason, st.search_mode) == (False, None, "fts-only")
    remote = settings_for(ws, provider="openai-compatible", model="m",
                          remote={"baseUrl": "http://127.0.0.1:9/v1"},
                          extraPaths=["notes", {"path": "../journal", "pattern": "*.md"}])
    later = BuiltinEngine(remote, provider_selection=select_provider(remote.search, env={}))
    try:
        changed = await later.status()
    finally:
        await later.close()
    assert (changed.dirty, changed.dirty_reason) == (True, "rebuild pending: model changed (fts-only -> m)")
    assert changed.search_mode == "hybrid" and changed.files == 1


@pytest.mark.anyio
async def test_a_configured_provider_that_cannot_load_is_unavailable_not_keyword_only(ws: Path) -> None:
    local = settings_for(ws, provider="local")
    # what select_provider answers on a machine without llama-cpp-python
    selection = ProviderSelection(None, "local", unavailable_reason=LLAMA_CPP_MISSING,
                                  error=f"memory search unavailable: local: {LLAMA_CPP_MISSING}")
    engine = BuiltinEngine(local, provider_selection=selection)
    try:
        st = await engine.status()
    finally:
        await engine.close()
    assert (st.search_mode, st.provider, st.requested_provider) == ("unavailable", "none", "local")
    assert st.provider_unavailable_reason == (
        "memory search unavailable: local: llama-cpp-python is not installed (pip install 'qmdbridge[local]')")

"""Targeted re-indexing of the files a watcher saw change (no full scan), and the cases that
must fall back to a full scan."""

from __future__ import annotations

from pathlib import Path

import pytest

from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from fallback.sources.memory_files import classify_changed_path

pytestmark = pytest.mark.anyio


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "memory" / "sub").mkdir(parents=True)
    (w / "MEMORY.md").write_text("# Memory\nroot fact\n")
    (w / "memory" / "a.md").write_text("alpha note\n")
    (w / "memory" / "sub" / "b.md").write_text("bravo note\n")
    return w


def test_classify_changed_paths(ws: Path, tmp_path: Path) -> None:
    extra = tmp_path / "notes"
    (extra / "deep").mkdir(parents=True)
    (extra / "deep" / "n.md").write_text("n\n")
    (ws / "memory" / "node_modules").mkdir()
    (ws / "memory" / "node_modules" / "x.md").write_text("x\n")
    kind, mf = classify_changed_path(ws, [str(extra)], str(ws / "memory" / "sub" / "b.md"))
    assert kind == "file" and mf.rel_path == "memory/sub/b.md"  # type: ignore[union-attr]
    assert classify_changed_path(ws, [], str(ws / "memory" / "gone.md")) == ("gone", "memory/gone.md")
    assert classify_changed_path(ws, [], str(ws / "memory" / "node_modules" / "x.md")) == (
        "gone", "memory/node_modules/x.md")
    kind, mf = classify_changed_path(ws, [str(extra)], str(extra / "deep" / "n.md"))
    assert kind == "file" and mf.rel_path == "../notes/deep/n.md"  # type: ignore[union-attr]
    for full in (ws / "MEMORY.md", ws / "memory.md", ws / "memory" / "sub", ws / "other" / "y.md",
                 ws / "memory" / "a.txt"):
        assert classify_changed_path(ws, [], str(full)) == ("full", None), full


async def test_watch_paths_reindex_only_those_files(ws: Path, tmp_path: Path) -> None:
    settings = EngineSettings.for_workspace(ws, state_dir=tmp_path / "state",
                                            search=MemorySearchSettings(provider="none"))
    engine = BuiltinEngine(settings)
    try:
        await engine.sync(reason="test")
        (ws / "memory" / "a.md").write_text("alpha note, now with a quokka\n")
        (ws / "memory" / "sub" / "b.md").unlink()
        (ws / "memory" / "c.md").write_bytes(b"\x00\x01binary")
        report = await engine.sync(reason="watch", paths={str(ws / "memory" / "a.md"),
                                                          str(ws / "memory" / "sub" / "b.md"),
                                                          str(ws / "memory" / "c.md")})
        assert (report.files_total, report.files_indexed, report.files_deleted) == (2, 1, 2)
        assert [h.path for h in (await engine.search(SearchRequest.of("quokka"))).results] == ["memory/a.md"]
        assert (await engine.search(SearchRequest.of("bravo"))).results == []
        st = await engine.status()
        assert st.files == 2  # MEMORY.md and memory/a.md
        assert [(s.path, s.reason) for s in st.skipped] == [("memory/c.md", "binary file (NUL bytes)")]
        # a change the classifier can't judge alone (the root file) runs the full scan
        (ws / "MEMORY.md").write_text("# Memory\nnew wombat fact\n")
        full = await engine.sync(reason="watch", paths={str(ws / "MEMORY.md")})
        assert full.files_total == 3
        assert [h.path for h in (await engine.search(SearchRequest.of("wombat"))).results] == ["MEMORY.md"]
    finally:
        await engine.close()

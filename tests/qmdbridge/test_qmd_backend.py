"""QmdBackend against the real qmd 2.8.3 (per-agent home, search, sync, isolation, CI failure)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fallback.errors import BackendUnavailableError
from fallback.request import SearchRequest
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.qmd.backend import QmdBackend
from qmdbridge.qmd.locate import QmdLocation

pytestmark = [pytest.mark.anyio, pytest.mark.qmd]


def make_backend(tmp_path: Path, qmd_bin: Path, base_path_env: str, *, agent_id: str = "main",
                 qmd_cfg: dict | None = None, ci: bool = False) -> QmdBackend:
    ws = tmp_path / f"ws-{agent_id}"
    (ws / "memory").mkdir(parents=True, exist_ok=True)
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": qmd_cfg or {}}})
    agent = resolve_agent(cfg, agent_id, workspace=ws,
                          env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    loc = QmdLocation(path=str(qmd_bin), found=True, runtime_ok=True, version="2.8.3", reason=None,
                      searched=[], path_env=base_path_env, child_path=base_path_env)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["HOME"] = str(tmp_path / "home")
    if ci:
        env["CI"] = "1"
    return QmdBackend(agent, location=loc, mode="cli", env=env)


def write_memory(b: QmdBackend) -> None:
    ws = b.agent.workspace_dir
    (ws / "MEMORY.md").write_text("# Memory\n\nalpha line one\n-dash topic here\nlex: literal colon\n")
    (ws / "memory" / "2026-01-02.md").write_text("# Day\n\nfirst\nsecond\nbravo keyword\nthird\n")


async def test_collections_search_and_sync(tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    b = make_backend(tmp_path, qmd_bin, base_path_env)
    write_memory(b)
    try:
        await b.start()
        yml = (tmp_path / "state/agents/main/qmd/xdg-config/qmd/index.yml").read_text()
        assert "memory-root-main:" in yml and "memory-dir-main:" in yml
        [hit] = (await b.search(SearchRequest.of("bravo", min_score=0))).results
        # the note fits the chunk budget and the snippet's: the hit is the whole note (qmd's own
        # snippet was lines 4-6 around "bravo")
        assert (hit.path, hit.start_line, hit.end_line, hit.source) == ("memory/2026-01-02.md", 1, 6, "memory")
        assert hit.snippet == "# Day\n\nfirst\nsecond\nbravo keyword\nthird"
        [dash] = (await b.search(SearchRequest.of("-dash", min_score=0))).results
        # a leading dash is no qmd syntax: ranked as "dash" is, the whole note as the builtin engine cites it
        assert (dash.path, dash.start_line, dash.end_line) == ("MEMORY.md", 1, 5)
        [lex] = (await b.search(SearchRequest.of("lex: literal", min_score=0))).results
        assert (lex.path, lex.start_line, lex.end_line) == ("MEMORY.md", 1, 5)
        assert (await b.search(SearchRequest.of("zulu", min_score=0))).results == []
        (b.agent.workspace_dir / "memory" / "2026-01-03.md").write_text("# New\n\nzulu fresh\n")
        await b.sync(reason="test", force=True)
        assert [r.path for r in (await b.search(SearchRequest.of("zulu", min_score=0))).results] == ["memory/2026-01-03.md"]
        page = await b.read_file("memory/2026-01-03.md", from_line=3, lines=1)
        assert (page.text, page.from_line, page.lines) == ("zulu fresh", 3, 1)
        st = await b.status()
        assert (st.files, st.custom["qmd"]["collections"]) == (3, 2)
    finally:
        await b.close()


async def test_second_agent_is_isolated(tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    a = make_backend(tmp_path, qmd_bin, base_path_env)
    write_memory(a)
    other = make_backend(tmp_path, qmd_bin, base_path_env, agent_id="ops")
    (other.agent.workspace_dir / "MEMORY.md").write_text("# Ops\n\ncharlie only here\n")
    try:
        await a.start()
        await other.start()
        assert (await other.search(SearchRequest.of("bravo", min_score=0))).results == []
        assert [r.path for r in (await other.search(SearchRequest.of("charlie", min_score=0))).results] == ["MEMORY.md"]
        assert (await a.search(SearchRequest.of("charlie", min_score=0))).results == []
        assert [c["name"] for c in await other.list_collections()] == ["memory-root-ops", "memory-dir-ops"]
    finally:
        await a.close()
        await other.close()


@pytest.mark.parametrize("mode", ["query", "vsearch"])
async def test_ci_env_fails_fast(tmp_path: Path, qmd_bin: Path, base_path_env: str, mode: str) -> None:
    b = make_backend(tmp_path, qmd_bin, base_path_env, ci=True,
                     qmd_cfg={"searchMode": mode, "limits": {"timeoutMs": 20000}})
    write_memory(b)
    try:
        await b.start()
        with pytest.raises(BackendUnavailableError) as ei:
            await b.search(SearchRequest.of("bravo", min_score=0))
        # Decided from the model state before any qmd search process starts.
        assert ei.value.reason == (f"qmd {mode} skipped: qmd refuses model operations while the CI "
                                   "environment variable is set; unset CI to embed or warm up the models")
    finally:
        await b.close()


async def test_reconcile_rebinds_changed_pattern(tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    b = make_backend(tmp_path, qmd_bin, base_path_env)
    write_memory(b)
    try:
        await b.start()
        await b._collection_cmd(["collection", "remove"], ["memory-dir-main"])
        await b._collection_cmd(["collection", "add", "--name", "memory-dir-main", "--mask", "*.txt"],
                                [str(b.agent.workspace_dir / "memory")])
        before = {c["name"]: c["pattern"] for c in await b.list_collections()}
        assert before["memory-dir-main"] == "*.txt"
        await b.reconcile()
        after = {c["name"]: (c["path"], c["pattern"]) for c in await b.list_collections()}
        assert after["memory-dir-main"] == (str(b.agent.workspace_dir / "memory"), "**/*.md")
        assert [r.path for r in (await b.search(SearchRequest.of("bravo", min_score=0))).results] == ["memory/2026-01-02.md"]
    finally:
        await b.close()


async def test_hits_with_qmds_lines_lose_carriage_returns_and_nul_bytes(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """qmd's snippet holds a note's ``\\r`` and NUL bytes as they are. A hit that keeps qmd's
    lines (a query in qmd's syntax, one of stop words only) shows its lines as the passages and
    the builtin engine show theirs: ``\\r\\n`` ends a line like ``\\n`` and NUL bytes are
    dropped, the line range unchanged."""
    b = make_backend(tmp_path, qmd_bin, base_path_env)
    ws = b.agent.workspace_dir
    (ws / "MEMORY.md").write_bytes(b"# Memory\r\n\r\nThe pelican eats fish daily.\r\nSecond line here.\r\n")
    (ws / "memory" / "2026-01-01.md").write_bytes(b"# Day\n\nThe kestrel hovers high.\n" + b"\0" * 20 + b"\n")
    try:
        await b.start()
        [passage] = (await b.search(SearchRequest.of("pelican", min_score=0))).results  # ranked passages: already clean
        assert (passage.start_line, passage.end_line, passage.snippet) == (
            1, 4, "# Memory\n\nThe pelican eats fish daily.\nSecond line here.")
        [phrase] = (await b.search(SearchRequest.of('"pelican eats"', min_score=0))).results  # qmd's syntax: qmd's lines
        assert (phrase.path, phrase.start_line, phrase.end_line, phrase.snippet) == (
            "MEMORY.md", 1, 3, "# Memory\n\nThe pelican eats fish daily.")
        stop_words = (await b.search(SearchRequest.of("the", min_score=0))).results
        assert sorted((h.path, h.start_line, h.end_line, h.snippet) for h in stop_words) == [
            ("MEMORY.md", 2, 4, "\nThe pelican eats fish daily.\nSecond line here."),
            ("memory/2026-01-01.md", 2, 4, "\nThe kestrel hovers high.")]
    finally:
        await b.close()

"""The memory-file rule in qmd mode: the legacy root file in qmd's root collection, custom
collections read through the safe reader with their pattern (streamed above 1 MiB), and the
builtin fallback indexing the same custom collections when qmd is unavailable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fallback.errors import PathRefusedError
from fallback.sources.read_page import page_text
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.manager import MemoryManager
from qmdbridge.qmd.collections import build_collections

pytestmark = pytest.mark.anyio


def _manager(tmp_path: Path, command: str, **qmd: Any) -> MemoryManager:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "OPENAI_API_KEY", "GEMINI_API_KEY",
                                                           "GOOGLE_API_KEY", "VOYAGE_API_KEY",
                                                           "MISTRAL_API_KEY")}
    env.update({"OPENCLAW_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path / "home")})
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {"command": command,
                                                             "limits": {"timeoutMs": 15000}, **qmd}},
                        "agents": {"defaults": {"memorySearch": {"provider": "none"}}}})
    return MemoryManager(resolve_agent(cfg, "main", workspace=tmp_path / "ws", env=env), env=env)


def _notes(tmp_path: Path) -> Path:
    (tmp_path / "ws" / "memory").mkdir(parents=True)
    (tmp_path / "ws" / "MEMORY.md").write_text("# Memory\n\nRouter: Omada ER605.\n")
    notes = tmp_path / "notes"
    (notes / "private").mkdir(parents=True)
    (notes / "trip.md").write_text("# Trip\n\nThe quokka photo was taken on Rottnest.\n")
    (notes / "private" / "diary.md").write_text("quokka diary, not in the collection\n")
    return notes


async def test_builtin_fallback_indexes_qmd_custom_collections(tmp_path: Path) -> None:
    notes = _notes(tmp_path)
    async with _manager(tmp_path, str(tmp_path / "no-qmd-here"),
                        paths=[{"path": str(notes), "name": "notes", "pattern": "*.md"}]) as m:
        resp = await m.search("quokka", min_score=0)
        page = await m.read_file("../notes/trip.md")
        with pytest.raises(PathRefusedError) as refused:
            await m.read_file("../notes/private/diary.md")
        st = await m.status()
    assert resp.backend == "builtin" and resp.fallback is not None
    assert [(h.path, h.start_line, h.end_line) for h in resp.results] == [("../notes/trip.md", 1, 3)]
    assert page.text == "# Trip\n\nThe quokka photo was taken on Rottnest."
    assert refused.value.reason == "outside the pattern *.md"
    assert st.backend == "builtin" and st.backends["builtin"]["files"] == 2
    assert st.backends["qmd"]["collections"] == [
        {"name": "memory-root-main", "path": str(tmp_path / "ws"), "pattern": "MEMORY.md"},
        {"name": "memory-dir-main", "path": str(tmp_path / "ws" / "memory"), "pattern": "**/*.md"},
        {"name": "notes", "path": str(notes), "pattern": "*.md"}]


def test_root_collection_follows_the_root_file(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    cfg = parse_config({"memory": {"backend": "qmd"}})
    agent = resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(tmp_path / "s")})
    (ws / "memory.md").write_text("legacy\n")
    assert build_collections(agent, sessions_dir=tmp_path / "x")[0].pattern == "memory.md"
    (ws / "MEMORY.md").write_text("canonical\n")
    assert build_collections(agent, sessions_dir=tmp_path / "x")[0].pattern == "MEMORY.md"


@pytest.mark.qmd
async def test_real_qmd_searches_and_reads_the_legacy_root_file(tmp_path: Path, qmd_bin: Path) -> None:
    (tmp_path / "ws" / "memory").mkdir(parents=True)
    (tmp_path / "ws" / "memory.md").write_text("# Memory\n\nThe wombat burrow is behind the shed.\n")
    async with _manager(tmp_path, str(qmd_bin)) as m:
        resp = await m.search("wombat burrow", min_score=0)
        page = await m.read_file("memory.md")
        via_qmd = await m.read_file("qmd/memory-root-main/memory.md", from_line=3, lines=1)
        (tmp_path / "ws" / "MEMORY.md").write_text("# Memory\n")
        with pytest.raises(PathRefusedError) as shadowed:
            await m.read_file("qmd/memory-root-main/memory.md")
    assert resp.backend == "qmd" and resp.fallback is None
    # a three-line note fits the chunk budget: the hit is the whole note, the snippet too
    assert [(h.path, h.start_line, h.end_line, h.snippet_start_line, h.snippet_end_line)
            for h in resp.results] == [("memory.md", 1, 3, 1, 3)]
    assert page.text == "# Memory\n\nThe wombat burrow is behind the shed."
    assert (via_qmd.path, via_qmd.text) == ("qmd/memory-root-main/memory.md",
                                            "The wombat burrow is behind the shed.")
    assert shadowed.value.reason == "shadowed legacy root file"


@pytest.mark.qmd
async def test_real_qmd_collection_reads_apply_its_pattern_and_stream(tmp_path: Path, qmd_bin: Path) -> None:
    notes = _notes(tmp_path)
    body = "".join(f"line {i} of the long log, quokka count {i % 7}\n" for i in range(1, 30_001))
    (notes / "long.md").write_text(body)
    assert (notes / "long.md").stat().st_size > 1 << 20
    (notes / "linked").symlink_to(notes / "private")
    async with _manager(tmp_path, str(qmd_bin),
                        paths=[{"path": str(notes), "name": "notes", "pattern": "*.md,linked/*.md"}]) as m:
        resp = await m.search("Rottnest", min_score=0)
        trip = await m.read_file("qmd/notes/trip.md")
        long_page = await m.read_file("qmd/notes/long.md", from_line=29_999, lines=5)
        reasons = {}
        for rel in ("qmd/notes/private/diary.md", "qmd/notes/linked/diary.md", "qmd/notes/../ws/MEMORY.md",
                    "qmd/notes/trip.MD", "qmd/nope/trip.md"):
            with pytest.raises(PathRefusedError) as info:
                await m.read_file(rel)
            reasons[rel] = info.value.reason
    assert resp.backend == "qmd" and [h.path for h in resp.results] == ["qmd/notes/trip.md"]
    assert trip.text == "# Trip\n\nThe quokka photo was taken on Rottnest."
    expected = page_text(body, from_line=29_999, lines=5)
    assert (long_page.text, long_page.from_line, long_page.lines, long_page.truncated) == (
        expected[0], 29_999, 2, False)
    assert reasons == {"qmd/notes/private/diary.md": "outside the pattern *.md,linked/*.md",
                       "qmd/notes/linked/diary.md": "symlinked directory",
                       "qmd/notes/../ws/MEMORY.md": "parent segment",
                       "qmd/notes/trip.MD": "not markdown",
                       "qmd/nope/trip.md": "unknown qmd collection: nope"}


@pytest.mark.qmd
async def test_a_custom_collection_of_the_workspace_never_cites_the_diary_or_the_shadowed_legacy_file(
        tmp_path: Path, qmd_bin: Path) -> None:
    """A custom collection of the workspace itself (``paths: [{path: "."}]``) holds every note
    at the workspace root, yet qmd mode cites only what the memory-file rule admits there, as
    the builtin engine does: not ``DREAMS.md`` (the dreaming diary) nor ``memory.md`` beside
    ``MEMORY.md`` (which ``memory_get`` refuses), while another root note is found."""
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nzebra crossing fact\n")
    (ws / "memory.md").write_text("# Old\n\nzebra legacy line\n")
    (ws / "DREAMS.md").write_text("# Dreams\n\nzebra dream candidate\n")
    (ws / "notes.md").write_text("# Notes\n\nzebra note line\n")
    async with _manager(tmp_path, str(qmd_bin), paths=[{"path": str(ws), "name": "ws"}]) as m:
        resp = await m.search("zebra", min_score=0)
    assert resp.backend == "qmd" and resp.fallback is None
    assert sorted(h.path for h in resp.results) == ["MEMORY.md", "notes.md"]


def test_reading_a_custom_collection_of_the_workspace_refuses_the_diary_and_the_shadowed_file(
        tmp_path: Path) -> None:
    """``qmd/<collection>/...`` reads of a custom collection of the workspace itself refuse
    what search never cites there; ``memory.md`` is readable there while it is the root file."""
    from qmdbridge.qmd.reads import read_qmd_path

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "DREAMS.md").write_text("dream\n")
    (ws / "memory.md").write_text("legacy\n")
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {"paths": [{"path": str(ws), "name": "ws"}]}}})
    agent = resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(tmp_path / "s")})
    coll = next(c for c in build_collections(agent, sessions_dir=tmp_path / "x") if c.kind == "custom")
    assert read_qmd_path({"ws": coll}, "qmd/ws/memory.md", None, None, workspace=ws).text == "legacy"
    (ws / "MEMORY.md").write_text("canonical\n")
    for name, reason in (("DREAMS.md", "the dreaming diary (DREAMS.md) is not memory"),
                         ("memory.md", "shadowed legacy root file")):
        with pytest.raises(PathRefusedError) as refused:
            read_qmd_path({"ws": coll}, f"qmd/ws/{name}", None, None, workspace=ws)
        assert refused.value.reason == reason


@pytest.mark.qmd
async def test_real_qmd_cites_a_name_holding_a_newline_as_the_builtin_engine_does(
        tmp_path: Path, qmd_bin: Path) -> None:
    """qmd cites a name holding a newline in the printable form the builtin engine cites
    (``\\x0a``), which ``memory_get`` reads, not as the raw name it refuses."""
    (tmp_path / "ws" / "memory").mkdir(parents=True)
    (tmp_path / "ws" / "MEMORY.md").write_text("# Memory\n\nRouter: Omada ER605.\n")
    (tmp_path / "ws" / "memory" / "two\nlines.md").write_text("# Kiln\nThe kiln reaches cone 6.\n")
    async with _manager(tmp_path, str(qmd_bin)) as m:
        resp = await m.search("kiln", min_score=0)
        page = await m.read_file(resp.results[0].path)
    assert resp.backend == "qmd" and resp.fallback is None
    assert [(h.path, h.citation) for h in resp.results] == [
        ("memory/two\\x0alines.md", "memory/two\\x0alines.md#L1-L2")]
    assert page.text == "# Kiln\nThe kiln reaches cone 6."


@pytest.mark.qmd
async def test_a_name_that_is_not_utf8_which_real_qmd_skips_is_a_status_problem(
        tmp_path: Path, qmd_bin: Path) -> None:
    """qmd skips a note whose name is not UTF-8 or holds a backslash (``Skipped 1 unreadable
    file``) without naming it; once a sync has indexed it in the builtin engine, status lists it as a problem that
    names the file (and doctor fails on it), not as the builtin engine's mere caveat."""
    from qmdbridge.problems import status_problems

    (tmp_path / "ws" / "memory").mkdir(parents=True)
    (tmp_path / "ws" / "MEMORY.md").write_text("# Memory\n\nRouter: Omada ER605.\n")
    with open(os.path.join(os.fsencode(tmp_path / "ws" / "memory"), b"caf\xe9.md"), "wb") as fh:
        fh.write(b"# Espresso\nThe grinder setting is 7.\n")
    (tmp_path / "ws" / "memory" / "back\\slash.md").write_text("# Slash\nThe grinder is clean.\n")
    async with _manager(tmp_path, str(qmd_bin)) as m:
        await m.sync(reason="test")
        resp = await m.search("grinder", min_score=0)
        status = (await m.status()).to_json_dict()
    assert (resp.backend, resp.fallback, resp.results) == ("qmd", None, [])
    assert status["files"] == 1 and status["backends"]["builtin"]["files"] == 3
    skipped = "; qmd skips it, so only the builtin engine's answers (a fallback) can find it"
    hint = "rename the file: qmd indexes valid UTF-8 names without a backslash"
    assert status_problems(status) == [
        {"check": "memory file", "message": "memory/back\\x5cslash.md is not indexed by qmd: file name "
         "holds a control character or backslash (path shown with \\xHH escapes)" + skipped, "hint": hint},
        {"check": "memory file", "message": "memory/caf\\xe9.md is not indexed by qmd: file name is not "
         "valid UTF-8 (path shown with \\xHH escapes)" + skipped, "hint": hint}]

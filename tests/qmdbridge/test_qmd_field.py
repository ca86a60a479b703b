"""Field failures on the qmd side, reproduced with the real qmd 2.8.3 (behind a thin argv filter,
or over an index rewritten as an older build left it, where a different qmd build is the point):
a build that ignores the collection pattern flag; paths an old build stored normalised."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.qmd.backend import QmdBackend
from qmdbridge.qmd.locate import QmdLocation
from qmdbridge.qmd.parse import index_counts

pytestmark = [pytest.mark.anyio, pytest.mark.qmd]


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nalpha root fact\n")
    (ws / "memory" / "2026-01-02.md").write_text("# Day\n\nbravo day note\n")
    (ws / "README.md").write_text("# Readme\n\ncharlie stray note, not memory\n")
    return ws


def _backend(tmp_path: Path, exe: Path, base_path_env: str, **env_extra: str) -> QmdBackend:
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {"limits": {"timeoutMs": 20000}}}})
    agent = resolve_agent(cfg, "main", workspace=_workspace(tmp_path),
                          env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    loc = QmdLocation(path=str(exe), found=True, runtime_ok=True, version="2.8.3", reason=None,
                      searched=[], path_env=base_path_env, child_path=base_path_env)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(HOME=str(tmp_path / "home"), **env_extra)
    return QmdBackend(agent, location=loc, mode="cli", env=env)


async def test_mask_dropped_collection_is_read_back_and_re_added_with_glob(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    """`--mask MEMORY.md` silently dropped: qmd would index the whole workspace as the root
    collection. Read back, removed, added again with `--glob`, which this build honours."""
    b = _backend(tmp_path, standins_dir / "pattern_flag_ignored.py", base_path_env, REAL_QMD=str(qmd_bin))
    ws = b.agent.workspace_dir
    try:
        await b.start()
        listed = {c["name"]: (c["path"], c["pattern"]) for c in await b.list_collections()}
        assert listed == {"memory-root-main": (str(ws), "MEMORY.md"),
                          "memory-dir-main": (str(ws / "memory"), "**/*.md")}
        assert b.reconcile_state.flags_tried == ["--mask", "--glob", "--glob"]
        assert (b.reconcile_state.pattern_flag, b.reconcile_state.refused) == ("--glob", {})
        assert index_counts(b.home.index_db) == ({"memory-root-main": 1, "memory-dir-main": 1}, None)
        assert [h.path for h in await b.search("alpha", min_score=0)] == ["MEMORY.md"]
        assert await b.search("charlie", min_score=0) == []
    finally:
        await b.close()


async def test_both_flags_dropped_refuses_the_collection_with_a_reason(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str) -> None:
    b = _backend(tmp_path, standins_dir / "pattern_flag_ignored.py", base_path_env,
                 REAL_QMD=str(qmd_bin), IGNORE_GLOB="1")
    ws = b.agent.workspace_dir
    try:
        await b.start()
        reason = ("qmd collection memory-root-main not searched through qmd: this qmd does not honour "
                  f"the pattern flag (--mask 'MEMORY.md' gave path {ws} pattern '**/*.md'; --glob "
                  f"'MEMORY.md' gave path {ws} pattern '**/*.md'; wanted {ws} 'MEMORY.md'); upgrade "
                  "qmd (2.8.3 honours --mask and --glob)")
        assert b.reconcile_state.refused == {"memory-root-main": reason}
        # removed again, so qmd does not index the whole workspace; memory-dir's pattern is
        # qmd's default, so that collection is what was asked for and stays
        assert [c["name"] for c in await b.list_collections()] == ["memory-dir-main"]
        assert index_counts(b.home.index_db) == ({"memory-dir-main": 1}, None)
        assert [h.path for h in await b.search("bravo", min_score=0)] == ["memory/2026-01-02.md"]
        assert await b.search("alpha", min_score=0) == []
        status = await b.status()
        assert status.custom["qmd"]["refusedCollections"] == {"memory-root-main": reason}
        assert reason in status.issues
        # not recorded as reconciled: the next start checks (and refuses) again
        assert not (b.home.qmd_dir / "reconciled.json").exists()
    finally:
        await b.close()


def _as_old_build_stored_it(db: Path, literal: str, normalised: str, *, drop: str) -> None:
    """Rewrite qmd's index as a qmd older than 2.6 left it: paths stored normalised, so of two
    files that normalise alike only one row survived (UNIQUE(collection, path))."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("DELETE FROM documents WHERE path = ?", (drop,))
        conn.execute("UPDATE documents SET path = ? WHERE path = ?", (normalised, literal))
        conn.commit()
    finally:
        conn.close()


async def test_normalised_index_path_is_cited_as_the_file_that_matched(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    b = _backend(tmp_path, qmd_bin, base_path_env)
    mem = b.agent.workspace_dir / "memory"
    (mem / "Trip Notes.md").write_text("# Trip\n\nferry to Hydra at 07:40\n")
    (mem / "trip_notes.md").write_text("# Trip\n\nbus to Delphi at 09:15\n")
    try:
        await b.start()
        _as_old_build_stored_it(b.home.index_db, "trip_notes.md", "trip-notes.md", drop="Trip Notes.md")
        [hit] = await b.search("Delphi", min_score=0)
        # both files normalise to trip-notes.md; the first by name is "Trip Notes.md", the
        # one whose lines hold the snippet is trip_notes.md
        assert (hit.path, hit.start_line, hit.end_line) == ("memory/trip_notes.md", 2, 3)
        assert b.last_search_notes == []
        (mem / "trip_notes.md").unlink()  # the indexed file is gone; its look-alike is not it
        assert await b.search("Delphi", min_score=0) == []
        assert b.last_search_notes == []
    finally:
        await b.close()


async def test_two_files_that_fit_a_normalised_path_are_reported_not_guessed(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    b = _backend(tmp_path, qmd_bin, base_path_env)
    mem = b.agent.workspace_dir / "memory"
    (mem / "Trip Notes.md").write_text("# Trip\n\nferry to Hydra at 07:40\n")
    (mem / "trip_notes.md").write_text("# Trip\n\nferry to Hydra at 07:40\nand back at six\n")
    try:
        await b.start()
        _as_old_build_stored_it(b.home.index_db, "Trip Notes.md", "trip-notes.md", drop="trip_notes.md")
        assert await b.search("Hydra", min_score=0) == []
        note = ("qmd hit dropped: trip-notes.md in qmd's index (a path normalised by a qmd older than "
                "2.6) matches 2 files (Trip Notes.md, trip_notes.md); run `qmdbridge qmd update` so "
                "qmd stores the real paths")
        assert b.last_search_notes == [note]
        assert note in (await b.status()).issues
    finally:
        await b.close()

"""qmd's collections repaired under the bridge, with the real qmd 2.8.3: the ``qmd update``
repairs (spec 2.7.2), the ``collection add`` conflicts of reconciliation (spec 2.6), and qmd's
index deleted under a running backend."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fallback.errors import BackendUnavailableError
from fallback.request import SearchRequest
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.qmd.backend import QmdBackend
from qmdbridge.qmd.locate import QmdLocation

pytestmark = [pytest.mark.anyio, pytest.mark.qmd]

MANAGED = ["memory-root-main", "memory-dir-main"]


def _backend(tmp_path: Path, exe: Path, path_env: str, *, paths: list[dict[str, str]] | None = None,
             **env_extra: str) -> QmdBackend:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True, exist_ok=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe router is a Mikrotik in the hallway.\n")
    (ws / "memory" / "2026-03-01.md").write_text("# Day\n\nThe heron nests by the weir.\n")
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {"limits": {"timeoutMs": 60_000},
                                                   "paths": paths or []}}})
    agent = resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    loc = QmdLocation(path=str(exe), found=True, runtime_ok=True, version="2.8.3", reason=None,
                      searched=[], path_env=path_env, child_path=path_env)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(HOME=str(tmp_path / "home"), **env_extra)
    return QmdBackend(agent, location=loc, mode="cli", env=env)


async def _qmd(b: QmdBackend, *args: str, pos: tuple[str, ...] = ()) -> Any:
    """One collection command of the backend's qmd, in its home."""
    return await b._collection_cmd(list(args), list(pos))


async def _bound(b: QmdBackend) -> dict[str, tuple[Any, Any]]:
    """qmd's collections: name -> (path, pattern), from ``collection list`` and ``show``."""
    return {c["name"]: (c["path"], c["pattern"]) for c in await b.list_collections()}


async def _paths(b: QmdBackend, query: str) -> list[str]:
    return [h.path for h in (await b.search(SearchRequest.of(query, min_score=0))).results]


@pytest.mark.parametrize("stderr", [
    "Error: ENOTDIR: not a directory, scandir '/ws/memory\\u0000'",
    "SQLiteError: UNIQUE constraint failed: documents.collection, documents.path"],
    ids=["null-byte", "duplicate-rows"])
async def test_update_failure_rebuilds_the_managed_collections_and_retries_once(
        tmp_path: Path, qmd_bin: Path, standins_dir: Path, base_path_env: str, stderr: str) -> None:
    """``qmd update`` fails with a null byte in collection metadata, or with duplicate document
    rows: ``index.yml`` is written again with exactly the managed collections (a stray one
    dropped), each is removed and added, and the update runs once more; the note is found. The
    repair is used once per backend: the same failure again propagates."""
    mark, log = tmp_path / "failed", tmp_path / "updates.log"
    b = _backend(tmp_path, standins_dir / "update_fails_once.py", base_path_env,
                 REAL_QMD=str(qmd_bin), UPDATE_STDERR=stderr, FAILED_MARK=str(mark), UPDATE_LOG=str(log))
    stray = tmp_path / "stray"
    stray.mkdir()
    try:
        await b.start(boot_update=False)
        assert (await _qmd(b, "collection", "add", "--name", "stray", "--mask", "**/*.md",
                           pos=(str(stray),))).ok
        ws = b.agent.workspace_dir
        (ws / "memory" / "2026-03-02.md").write_text("# Day\n\nA narwhal in the fjord.\n")
        await b.sync(reason="test")
        assert log.read_text() == "update\nupdate\n"
        assert await _bound(b) == {"memory-root-main": (str(ws), "MEMORY.md"),
                                   "memory-dir-main": (str(ws / "memory"), "**/*.md")}
        assert await _paths(b, "narwhal") == ["memory/2026-03-02.md"]
        mark.unlink()
        with pytest.raises(BackendUnavailableError) as err:
            await b.sync(reason="test")
        assert stderr in str(err.value) or stderr in (getattr(err.value, "stderr_tail", "") or "")
        assert log.read_text() == "update\n" * 3
    finally:
        await b.close()


async def test_enotdir_without_a_null_byte_is_no_repair(tmp_path: Path, qmd_bin: Path,
                                                        base_path_env: str) -> None:
    """The real qmd fails ``update`` with ENOTDIR when a collection's folder became a file: the
    error propagates and ``index.yml`` is left as it is (no rebuild, spec 2.7.2)."""
    import shutil

    b = _backend(tmp_path, qmd_bin, base_path_env)
    try:
        await b.start(boot_update=False)
        before = b.home.index_yml.read_text()
        memory = b.agent.workspace_dir / "memory"
        shutil.rmtree(memory)
        memory.write_text("a file where the folder was\n")
        with pytest.raises(BackendUnavailableError, match="ENOTDIR"):
            await b.sync(reason="test")
        assert b.home.index_yml.read_text() == before
    finally:
        await b.close()


async def test_a_managed_name_held_by_an_excluded_collection_is_replaced(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """qmd holds ``memory-dir-main``, excluded from default searches and bound to another folder:
    its listing entry (``[excluded]``) is not read, so the add reports the name as taken
    (``Collection 'memory-dir-main' already exists.``); the collection is removed and added on
    the workspace's ``memory/``, with no warning, and the day note is found."""
    other = tmp_path / "other"
    other.mkdir()
    b = _backend(tmp_path, qmd_bin, base_path_env)
    b.home.index_yml.parent.mkdir(parents=True, exist_ok=True)
    b.home.index_yml.write_text(f'collections:\n  "memory-dir-main":\n    path: "{other}"\n'
                                '    pattern: "**/*.md"\n    includeByDefault: false\n')
    try:
        await b.start(boot_update=False)
        ws = b.agent.workspace_dir
        assert b.reconcile_state.warnings == []
        assert await _bound(b) == {"memory-root-main": (str(ws), "MEMORY.md"),
                                   "memory-dir-main": (str(ws / "memory"), "**/*.md")}
        assert await _paths(b, "heron") == ["memory/2026-03-01.md"]
    finally:
        await b.close()


async def test_a_folder_held_by_another_name_is_rebound(tmp_path: Path, qmd_bin: Path,
                                                        base_path_env: str) -> None:
    """qmd already holds the custom folder ``notes`` with ``**/*.md`` under another name
    (``old-notes``): the add is refused (``A collection already exists for this path and
    pattern``), the owner is found and replaced by ``notes``, with no warning, and the note is
    found. The folder is named through a symlinked parent (macOS's ``/tmp``): qmd records the
    real path, which is the same folder (the owner was not recognised then, and the rebind
    refused as unverifiable)."""
    real = tmp_path / "real"
    (real / "notes").mkdir(parents=True)
    (real / "notes" / "falcon.md").write_text("# Falcon\n\nThe falcon deploy runbook.\n")
    (tmp_path / "link").symlink_to(real)
    named = tmp_path / "link"
    b = _backend(tmp_path, qmd_bin, base_path_env, paths=[{"name": "notes", "path": str(named / "notes")}])
    try:
        await b.prepare()
        assert (await _qmd(b, "collection", "add", "--name", "old-notes", "--mask", "**/*.md",
                           pos=(str(real / "notes"),))).ok
        await b.start(boot_update=False)
        assert b.reconcile_state.warnings == []
        held = await _bound(b)
        assert sorted(held) == ["memory-dir-main", "memory-root-main", "notes"]
        assert held["notes"] == (str(real / "notes"), "**/*.md")
        assert await _paths(b, "falcon runbook") == ["qmd/notes/falcon.md"]
    finally:
        await b.close()


@pytest.mark.parametrize("first", ["sync", "search"])
async def test_a_null_byte_put_in_index_yml_is_bound_again_before_qmd_sees_it(
        tmp_path: Path, qmd_bin: Path, base_path_env: str, first: str) -> None:
    """``index.yml`` edited behind the bridge's back so a managed collection's path ends in a NUL
    byte: the real qmd 2.8.3's ``update`` then hangs (it prints ``without null bytes`` and never
    exits), and comparing the path threw ``ValueError: embedded null byte`` out of every search's
    reconcile. The next update or search binds the collection to its folder again first, and qmd
    answers."""
    b = _backend(tmp_path, qmd_bin, base_path_env)
    try:
        await b.start(boot_update=False)
        ws, yml = b.agent.workspace_dir, b.home.index_yml
        text = yml.read_text()
        edited = text.replace(f"path: {ws / 'memory'}\n", f'path: "{ws / "memory"}\\0"\n')
        assert edited != text
        yml.write_text(edited)
        (ws / "memory" / "2026-03-02.md").write_text("# Day\n\nA narwhal in the fjord.\n")
        if first == "sync":
            await b.sync(reason="test")
        else:
            assert await _paths(b, "heron") == ["memory/2026-03-01.md"]
            await b.sync(reason="test")
        assert await _bound(b) == {"memory-root-main": (str(ws), "MEMORY.md"),
                                   "memory-dir-main": (str(ws / "memory"), "**/*.md")}
        assert await _paths(b, "narwhal") == ["memory/2026-03-02.md"]
    finally:
        await b.close()

"""qmd's index lost or corrupt under the bridge, with the real qmd 2.8.3.

An operator deletes the agent's ``index.sqlite`` (a cache clean-up, a reset by hand) or it is
truncated (a full disk, a crash): qmd then answers every search with nothing (it recreates an
empty index from ``index.yml``) or fails with ``SQLITE_CORRUPT``. The bridge notices that the
index holds no document of collections whose folders hold memory files, re-indexes it (a corrupt
one moved aside first), and until then the builtin engine answers with the reason, without
opening the circuit breaker. A warm ``qmd mcp`` child that still reads the replaced file is
restarted, so it never answers from the old one.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import filelock
import pytest

from qmdbridge import MemoryManager
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.paths import qmd_home
from qmdbridge.problems import status_problems

pytestmark = [pytest.mark.anyio, pytest.mark.qmd]

# Longest wait for a background re-index or a child restart, seconds (a bound, not a timing).
DEADLINE_S = 60


def _agent(tmp_path: Path, qmd_bin: Path, **qmd: Any) -> Any:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True, exist_ok=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nThe router is a Mikrotik in the hallway.\n")
    (ws / "memory" / "2026-03-01.md").write_text("# Day\n\nThe heron nests by the weir.\n")
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {
        "command": str(qmd_bin), "searchMode": "search",
        "update": {"interval": "0", "debounceMs": 0, "waitForBootSync": True}, **qmd}},
        "agents": {"defaults": {"memorySearch": {"provider": "none",
                                                 "sync": {"watchDebounceMs": 100}}}}})
    return resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["HOME"] = str(tmp_path / "home")
    return env


def _index_files(agent: Any) -> list[Path]:
    db = agent.state_dir / "agents" / "main" / "qmd" / "xdg-cache" / "qmd" / "index.sqlite"
    return [db, db.with_name("index.sqlite-wal"), db.with_name("index.sqlite-shm")]


def _delete_index(agent: Any) -> None:
    for p in _index_files(agent):
        p.unlink(missing_ok=True)


def _corrupt_index(agent: Any) -> None:
    db = _index_files(agent)[0]
    with open(db, "r+b") as f:  # keep the header, lose the pages: "database disk image is malformed"
        f.truncate(8192)


async def _indexed(tmp_path: Path, agent: Any) -> None:
    """A one-shot search that qmd answers with the heron note (the index is built)."""
    async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:
        r = await m.search("heron")
        assert (r.backend, [h.path for h in r.results]) == ("qmd", ["memory/2026-03-01.md"])


@pytest.mark.parametrize("boot_sync", [False, True], ids=["default", "waitForBootSync"])
@pytest.mark.parametrize("damage", [_delete_index, _corrupt_index], ids=["deleted", "corrupt"])
async def test_one_shot_search_reindexes_a_lost_or_corrupt_index(tmp_path: Path, qmd_bin: Path,
                                                                damage: Any, boot_sync: bool) -> None:
    """The next one-shot command after the damage re-indexes at start-up (a corrupt index is
    moved aside, named in the log), and qmd answers. Before: a deleted index answered every
    search with no hit, no fallback and a healthy status; a corrupt one failed every search
    with the reason ``... failed (code 1): 72 |  */`` and opened the breaker. (One-shot
    commands run no boot update unless ``waitForBootSync``; with it, that update re-indexes.)"""
    agent = _agent(tmp_path, qmd_bin, update={"interval": "0", "waitForBootSync": boot_sync})
    await _indexed(tmp_path, agent)
    damage(agent)
    async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:
        r = await m.search("heron")
        assert (r.backend, r.fallback, [h.path for h in r.results]) == (
            "qmd", None, ["memory/2026-03-01.md"])
        status = (await m.status()).to_json_dict()
        assert (status["backend"], status["files"], status_problems(status)) == ("qmd", 2, [])
        assert m.breaker.state.failures == 0
    aside = [p.name for p in _index_files(agent)[0].parent.glob("index.sqlite.corrupt-*")
             if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == (1 if damage is _corrupt_index else 0)


@pytest.mark.parametrize("damage", [_delete_index, _corrupt_index], ids=["deleted", "corrupt"])
async def test_serve_answers_from_builtin_while_it_reindexes_then_qmd_finds_new_notes(
        tmp_path: Path, qmd_bin: Path, damage: Any) -> None:
    """Under a running long-lived manager (``serve``, its warm child ready): the index is
    damaged and a note is saved. ``status`` says what happened and that it is re-indexing; a
    search answers from the builtin engine with that reason, the breaker stays closed; once
    re-indexed, qmd answers (through a child restarted on the new file) with the new note.
    Before: qmd answered nothing for a deleted index until the next update, and then the
    warm child kept answering from the deleted file, without the note, until a restart."""
    agent = _agent(tmp_path, qmd_bin)
    await _indexed(tmp_path, agent)
    async with MemoryManager(agent, mode="full", env=_env(tmp_path)) as m:
        await m.start()
        backend: Any = m.sidecar.backend if m.sidecar else None
        assert backend is not None and backend.warm is not None
        with anyio.fail_after(DEADLINE_S):
            await backend.warm.wait_for(lambda w: w.ready)
        assert (await m.search("heron")).backend == "qmd"
        old_pid = backend.warm.pid
        # qmd's write lock held here keeps the re-index waiting until status has answered
        # (a fast re-index could otherwise finish first, and status rightly say nothing)
        holder = filelock.FileLock(str(backend.home.write_lock))
        holder.acquire()
        try:
            damage(agent)
            status = (await m.status()).to_json_dict()
        finally:
            holder.release()
        problems = [p for p in status_problems(status) if p["check"] == "qmd index"]
        assert len(problems) == 1, status_problems(status)
        assert "re-indexing" in problems[0]["message"]
        (agent.workspace_dir / "memory" / "2026-03-02.md").write_text("# Day\n\nA narwhal in the fjord.\n")
        with anyio.fail_after(DEADLINE_S):
            while True:
                r = await m.search("narwhal")
                if r.backend == "qmd" and r.results:
                    break
                if r.backend == "builtin":
                    assert r.fallback is not None and "re-index" in r.fallback.reason
                await anyio.sleep(0.1)
        assert [h.path for h in r.results] == ["memory/2026-03-02.md"]
        assert m.breaker.state.failures == 0
        with anyio.fail_after(DEADLINE_S):  # the child that read the old file was replaced
            await backend.warm.wait_for(lambda w: w.ready and w.pid != old_pid)
        answered = backend.warm.answered
        again = await m.search("narwhal")
        assert (again.backend, [h.path for h in again.results]) == ("qmd", ["memory/2026-03-02.md"])
        assert backend.warm.answered > answered
        status = (await m.status()).to_json_dict()
        assert [p for p in status_problems(status) if p["check"] == "qmd index"] == []


async def test_a_failing_search_is_told_in_one_line_naming_the_error(tmp_path: Path, qmd_bin: Path,
                                                                      base_path_env: str) -> None:
    """qmd under Bun prints a stack trace on a failure: source lines first, the error line in
    the middle. The test search of ``status`` says why in one line, naming the error: it was
    qmd's whole stderr, whose first line (``72 |  */``) is what ``status`` showed first and the
    circuit breaker recorded."""
    from qmdbridge.qmd.backend import QmdBackend
    from qmdbridge.qmd.locate import QmdLocation
    from qmdbridge.qmd.search_calls import probe_search

    agent = _agent(tmp_path, qmd_bin)
    await _indexed(tmp_path, agent)
    _corrupt_index(agent)
    loc = QmdLocation(path=str(qmd_bin), found=True, runtime_ok=True, version="2.8.3", reason=None,
                      searched=[], path_env=base_path_env, child_path=base_path_env)
    b = QmdBackend(agent, location=loc, mode="cli", env=_env(tmp_path))  # not started: no repair
    why = await probe_search(b._run_search, timeout_ms=20_000)
    assert why is not None and "\n" not in why
    assert why.startswith("qmd search --json -n 1 --index index -- qmdbridge-health-probe failed (code 1): ")
    assert "database disk image is malformed" in why
    await b.close()


async def test_serve_rebinds_a_collection_whose_path_was_edited_in_index_yml(tmp_path: Path,
                                                                            qmd_bin: Path) -> None:
    """An operator edits qmd's ``index.yml`` under a running ``serve``: the custom collection
    ``notes`` now points at another folder. qmd's next update indexes that folder under the
    name, so the configured folder's notes dropped out of every search, and ``status`` said
    nothing, until a restart. The next search (or status) sees that qmd's collection list
    changed since the last reconcile, binds the collection to its folder again, and finds them."""
    notes, other = tmp_path / "notes", tmp_path / "other"
    notes.mkdir()
    other.mkdir()
    (notes / "falcon.md").write_text("# Falcon\n\nThe falcon deploy runbook.\n")
    (other / "unrelated.md").write_text("# Other\n\nNothing about birds of prey.\n")
    # a loaded machine's qmd may take longer than the default 4 s deadline, which would fall back
    agent = _agent(tmp_path, qmd_bin, paths=[{"name": "notes", "path": str(notes)}],
                   limits={"timeoutMs": 60_000})
    async with MemoryManager(agent, mode="full", env=_env(tmp_path)) as m:
        await m.start()
        first = await m.search("falcon runbook")
        assert (first.backend, [h.path for h in first.results]) == ("qmd", ["qmd/notes/falcon.md"])
        yml = agent.state_dir / "agents" / "main" / "qmd" / "xdg-config" / "qmd" / "index.yml"
        text = yml.read_text()
        assert text.count(str(notes)) == 1
        yml.write_text(text.replace(str(notes), str(other)))
        await m.sync(reason="test")  # qmd update: indexes the folder index.yml names
        again = await m.search("falcon runbook")
        assert (again.backend, again.fallback, [h.path for h in again.results]) == (
            "qmd", None, ["qmd/notes/falcon.md"])
        assert str(notes) in yml.read_text() and str(other) not in yml.read_text()


async def test_notes_qmd_never_indexes_are_no_lost_index(tmp_path: Path, qmd_bin: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """qmd skips a note that holds only whitespace (a new agent's empty ``MEMORY.md``): an index
    without documents then is not a lost one, and no command re-indexes it."""
    agent = _agent(tmp_path, qmd_bin)
    (agent.workspace_dir / "MEMORY.md").write_text("  \n\n")
    (agent.workspace_dir / "memory" / "2026-03-01.md").write_text("")
    for _ in range(2):
        async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:
            r = await m.search("heron")
            assert (r.backend, r.results) == ("qmd", [])
            backend: Any = m.sidecar.backend if m.sidecar else None
            assert backend is not None and backend.cycle.updates_run == 1  # waitForBootSync's
    assert "re-index" not in caplog.text


async def test_doctor_tells_a_corrupt_qmd_index_from_a_broken_qmd(tmp_path: Path, qmd_bin: Path) -> None:
    """``doctor``'s qmd check on a corrupt index: its test search fails naming the corruption,
    and the fix is the re-index any command runs, not reinstalling qmd (its hint said
    ``reinstall qmd (scripts/install-qmd.sh) or fix memory.qmd.command``)."""
    from qmdbridge.doctor import run_doctor

    agent = _agent(tmp_path, qmd_bin)
    await _indexed(tmp_path, agent)
    _corrupt_index(agent)
    report = await run_doctor(agent, env=_env(tmp_path))
    check = next(c for c in report.checks if c.name == "qmd")
    assert check.level == "error" and check.detail.endswith(
        "failed (code 1): SQLiteError: database disk image is malformed")
    assert check.hint is not None and check.hint.startswith("qmd's index is corrupt") \
        and "install-qmd" not in check.hint


async def test_an_index_yml_qmd_cannot_parse_is_written_again(tmp_path: Path, qmd_bin: Path) -> None:
    """qmd's collection list (``index.yml``, which the bridge owns in the agent's qmd home)
    broken by a hand edit: every qmd command failed (``Failed to parse .../index.yml``), the
    reconcile's adds too, each leaving a stack trace in ``status``, and the advice was to
    reinstall qmd, until someone fixed the file. The next search or status notices the edit,
    keeps the broken file as ``index.yml.broken-<ms>``, writes the managed collections again,
    and qmd answers; nothing is left in ``status``."""
    agent = _agent(tmp_path, qmd_bin)
    async with MemoryManager(agent, mode="full", env=_env(tmp_path)) as m:
        await m.start()
        assert [h.path for h in (await m.search("heron")).results] == ["memory/2026-03-01.md"]
        yml = agent.state_dir / "agents" / "main" / "qmd" / "xdg-config" / "qmd" / "index.yml"
        yml.write_text("collections: [oops\n  : : :\n")
        status = (await m.status()).to_json_dict()
        assert status_problems(status) == [] and status["issues"] == [], status["issues"]
        (agent.workspace_dir / "memory" / "2026-03-02.md").write_text("# Day\n\nAn ibis at dawn.\n")
        await m.sync(reason="test")  # qmd update reads index.yml
        r = await m.search("ibis dawn")
        assert (r.backend, r.fallback, [h.path for h in r.results]) == ("qmd", None, ["memory/2026-03-02.md"])
    broken = list(yml.parent.glob("index.yml.broken-*"))
    assert len(broken) == 1 and broken[0].read_text() == "collections: [oops\n  : : :\n"
    assert "memory-dir-main" in yml.read_text()


@pytest.mark.parametrize("damage", [_delete_index, _corrupt_index], ids=["deleted", "corrupt"])
async def test_index_damaged_under_a_running_one_shot_manager_falls_back_with_the_fix(
        tmp_path: Path, qmd_bin: Path, damage: Any) -> None:
    """The index is damaged under a running one-shot manager: its next search answers from the
    builtin engine, the reason saying what happened and that it is being re-indexed; the
    breaker stays closed, and once re-indexed qmd answers again."""
    agent = _agent(tmp_path, qmd_bin)
    async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:
        assert (await m.search("heron")).backend == "qmd"
        damage(agent)
        r = await m.search("heron")
        assert (r.backend, [h.path for h in r.results]) == ("builtin", ["memory/2026-03-01.md"])
        db = _index_files(agent)[0]
        why = ("is corrupt (failed to read qmd index stats: database disk image is malformed)"
               if damage is _corrupt_index else "holds no document of memory-root-main, "
               "memory-dir-main, whose folders hold memory files (was it deleted or replaced?)")
        assert r.fallback is not None
        assert r.fallback.reason == f"qmd's index {db} {why}; re-indexing it (qmd update) in the background"
        assert m.breaker.state.failures == 0
        with anyio.fail_after(DEADLINE_S):  # the re-index ends: qmd answers again
            while (r := await m.search("heron")).backend != "qmd":
                await anyio.sleep(0.1)
        assert [h.path for h in r.results] == ["memory/2026-03-01.md"]


async def test_a_half_rebuilt_index_is_not_searched_until_the_reindex_ends(tmp_path: Path,
                                                                          qmd_bin: Path) -> None:
    """While the re-index runs, the index may hold one collection and not yet the next (``qmd
    update`` fills them in turn): searches keep answering from the builtin engine with the
    reason until the update has ended. Before: once any collection held a document, qmd
    answered, with no hit for a note of the collection still to come and no warning."""
    (tmp_path / "ws" / "memory").mkdir(parents=True)
    agent = _agent(tmp_path, qmd_bin)
    heron = agent.workspace_dir / "memory" / "2026-03-01.md"
    note = heron.read_text()
    heron.unlink()
    db = _index_files(agent)[0]
    half = tmp_path / "half.sqlite"  # qmd's index with MEMORY.md and no memory/ note yet
    async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:
        assert (await m.search("router")).backend == "qmd"
    with sqlite3.connect(db) as src, sqlite3.connect(half) as dst:
        src.backup(dst)
    heron.write_text(note)
    async with MemoryManager(agent, mode="cli", env=_env(tmp_path)) as m:
        assert [h.path for h in (await m.search("heron")).results] == ["memory/2026-03-01.md"]
        # qmd's write lock held here keeps the re-index waiting while the half index is in place
        holder = filelock.FileLock(str(qmd_home(agent.state_dir, "main").write_lock))
        holder.acquire()
        try:
            _delete_index(agent)
            assert (await m.search("heron")).backend == "builtin"  # starts the re-index
            with sqlite3.connect(half) as src, sqlite3.connect(db) as dst:
                src.backup(dst)
            r = await m.search("heron")
            assert (r.backend, [h.path for h in r.results]) == ("builtin", ["memory/2026-03-01.md"])
            assert r.fallback is not None and r.fallback.reason.endswith("; re-indexing it (qmd update)")
        finally:
            holder.release()
        with anyio.fail_after(DEADLINE_S):  # the re-index ends: qmd answers again
            while (r := await m.search("heron")).backend != "qmd":
                await anyio.sleep(0.1)
        assert [h.path for h in r.results] == ["memory/2026-03-01.md"]

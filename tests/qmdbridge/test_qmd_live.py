"""The qmd backend's long-lived mode with the real qmd: boot update, file watcher -> update
(qmd's 15 s-style debounce defers the update instead of dropping it), status dirty flag, and a
clean close with no child process left."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import psutil
import pytest

from fallback.background import BackgroundTasks
from fallback.index.racy import racily_clean, wall_clock_ms
from fallback.request import SearchRequest
from qmdbridge.config import parse_config, resolve_agent
from qmdbridge.qmd.backend import QmdBackend
from qmdbridge.qmd.locate import QmdLocation
from tests.fallback.watcher_faults import kill_observer

pytestmark = [pytest.mark.anyio, pytest.mark.qmd]

DEADLINE_S = 60


def _backend(tmp_path: Path, qmd_bin: Path, base_path_env: str, *,
             debounce_ms: int = 1500, timeout_ms: int = 4000,
             watch_debounce_ms: int = 200) -> QmdBackend:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nalpha fact\n")
    cfg = parse_config({
        "memory": {"backend": "qmd", "qmd": {"update": {"debounceMs": debounce_ms, "interval": "0",
                                                        "waitForBootSync": True},
                                             "limits": {"timeoutMs": timeout_ms}}},
        "agents": {"defaults": {"memorySearch": {"sync": {"watchDebounceMs": watch_debounce_ms}}}}})
    agent = resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(tmp_path / "state")})
    loc = QmdLocation(path=str(qmd_bin), found=True, runtime_ok=True, version="2.8.3", reason=None,
                      searched=[], path_env=base_path_env, child_path=base_path_env)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["HOME"] = str(tmp_path / "home")
    return QmdBackend(agent, location=loc, mode="full", env=env)


async def _wait_found(b: QmdBackend, query: str) -> list[str]:
    with anyio.fail_after(DEADLINE_S):
        while True:
            paths = [r.path for r in (await b.search(SearchRequest.of(query, min_score=0))).results]
            if paths:
                return paths
            await anyio.sleep(0.2)


def _save(path: Path, text: str) -> None:
    """Save a note as one file event, an editor's atomic save: written beside the workspace, then
    moved in. Written in place, its create and its write can reach the watcher more than
    ``watchDebounceMs`` apart on a loaded machine, and each batch runs its own update."""
    tmp = path.parents[2] / f"{path.name}.part"
    tmp.write_text(text)
    os.replace(tmp, path)


async def _wait_settled(b: QmdBackend) -> None:
    """Until the watcher's update has ended (its ``qmd update`` exited, the cycle counted it)."""
    assert b.freshness is not None
    with anyio.fail_after(DEADLINE_S):
        while b.freshness.dirty:
            await anyio.sleep(0.02)


async def test_saved_file_becomes_searchable_through_the_watcher(tmp_path: Path, qmd_bin: Path,
                                                                 base_path_env: str) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    b = _backend(tmp_path, qmd_bin, base_path_env)
    async with BackgroundTasks() as tasks:
        await b.start(tasks)
        assert b.freshness is not None
        assert [r.path for r in (await b.search(SearchRequest.of("alpha", min_score=0))).results] == ["MEMORY.md"]
        # right after the boot update: the update debounce must defer, not drop, this change
        (b.agent.workspace_dir / "memory" / "2026-05-01.md").write_text("# Day\n\nquokka sighting\n")
        assert await _wait_found(b, "quokka") == ["memory/2026-05-01.md"]
        st = await b.status()
        assert st.dirty is False and st.custom["qmd"]["freshness"]["watcher"]["mode"] == "native"
        tmp = b.agent.workspace_dir / ".MEMORY.md.swp"
        tmp.write_text("# Memory\n\nwombat fact\n")
        os.replace(tmp, b.agent.workspace_dir / "MEMORY.md")
        assert await _wait_found(b, "wombat") == ["MEMORY.md"]
        # the file watcher and the warm qmd mcp child (interval "0"; search mode has no embed timer)
        assert tasks.running == 2
        kill_observer(b.freshness.watcher)  # a dead watcher: noticed, re-armed, rescanned
        # told as the builtin engine tells it (test_engine_live.py), in status and stale warnings
        assert b.freshness.check_watcher() == b.freshness.dirty_reason == (
            "watcher dead: native watcher thread died; re-arming")
        with anyio.fail_after(DEADLINE_S):
            while True:
                st = await b.status()
                if st.custom["qmd"]["freshness"]["watcher"]["rearms"] == 1 and not st.dirty:
                    break
                await anyio.sleep(0.1)
        watcher = st.custom["qmd"]["freshness"]["watcher"]
        assert (watcher["mode"], watcher["alive"], watcher["lastRearm"]["cause"]) == (
            "polling", True, "native watcher thread died")
        (b.agent.workspace_dir / "memory" / "2026-05-02.md").write_text("# Day\n\nnumbat burrow\n")
        assert await _wait_found(b, "numbat") == ["memory/2026-05-02.md"]
        await b.close()
        assert tasks.running == 0
    with anyio.fail_after(DEADLINE_S):
        while {p.pid for p in psutil.Process().children(recursive=True)} - before:
            await anyio.sleep(0.05)


async def test_sync_request_right_after_an_update_indexes_what_changed(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """A ``sync`` request (the serve tool, ``MemoryManager.sync``) answers once qmd's index is
    up to date: within ``update.debounceMs`` of the boot update it still runs ``qmd update``,
    so the note saved just before it is found by the next search, without waiting for the
    watcher (whose update waits out the debounce, a minute here)."""
    b = _backend(tmp_path, qmd_bin, base_path_env, debounce_ms=60_000)
    async with BackgroundTasks() as tasks:
        await b.start(tasks)
        updates = b.cycle.updates_run
        assert updates == 1  # the boot update, just now
        (b.agent.workspace_dir / "memory" / "2026-05-03.md").write_text("# Day\n\npelican on the quay\n")
        await b.sync(reason="serve")
        assert b.cycle.updates_run == updates + 1
        assert [r.path for r in (await b.search(SearchRequest.of("pelican", min_score=0))).results] == ["memory/2026-05-03.md"]
        await b.close()



async def test_the_root_collection_follows_the_root_file_while_serving(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """A long-lived backend binds ``memory-root-main`` to the root file of the moment: a
    ``MEMORY.md`` created beside a legacy ``memory.md`` is searched after the next sync and the
    shadowed file is not, and removing ``MEMORY.md`` brings ``memory.md`` back. (The collection
    kept the name it was built with, so qmd answered without the new root file.)"""
    b = _backend(tmp_path, qmd_bin, base_path_env)
    ws = b.agent.workspace_dir
    (ws / "MEMORY.md").unlink()
    (ws / "memory.md").write_text("# Memory\n\nThe wombat burrow is behind the shed.\n")

    async def found(query: str) -> list[str]:
        response = await b.search(SearchRequest.of(query, min_score=0))
        return [r.path for r in response.results]

    async with BackgroundTasks() as tasks:
        await b.start(tasks)
        assert await found("wombat burrow") == ["memory.md"]
        (ws / "MEMORY.md").write_text("# Memory\n\nThe quokka photo was taken on Rottnest.\n")
        await b.sync(reason="serve")
        assert (await found("quokka photo"), await found("wombat burrow")) == (["MEMORY.md"], [])
        (ws / "MEMORY.md").unlink()
        await b.sync(reason="serve")
        assert (await found("quokka photo"), await found("wombat burrow")) == ([], ["memory.md"])
        await b.close()


async def test_a_note_a_sync_indexed_leaves_no_stale_warning(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """The watcher's event of a save that a ``sync`` request's update indexed (it started after
    the save) is no change for qmd: the answers after it carry no ``index stale`` warning and
    status is clean. (Every answer warned, and status was dirty, until the watcher's own update,
    ``update.debounceMs`` later: a minute here.)"""
    b = _backend(tmp_path, qmd_bin, base_path_env, debounce_ms=60_000)
    note = b.agent.workspace_dir / "memory" / "2026-05-03.md"
    async with BackgroundTasks() as tasks:
        await b.start(tasks)
        assert b.freshness is not None
        with anyio.fail_after(DEADLINE_S):
            while not b.freshness.watcher.snapshot()["alive"]:  # its observer runs
                await anyio.sleep(0.02)
        seen = b.freshness.watcher.unsent()[0]
        _save(note, "# Day\n\npelican on the quay\n")
        saved_ns = max(note.stat().st_mtime_ns, note.stat().st_ctime_ns)
        with anyio.fail_after(DEADLINE_S):  # the update must start clearly after the save
            while racily_clean(saved_ns, wall_clock_ms()):
                await anyio.sleep(0.01)
        await b.sync(reason="serve")
        with anyio.fail_after(DEADLINE_S):  # the watcher saw the save (pending, or handed over)
            while b.freshness.watcher.unsent()[0] == seen:
                await anyio.sleep(0.02)
        found = await b.search(SearchRequest.of("pelican", min_score=0))
        assert ([r.path for r in found.results], found.warnings) == (["memory/2026-05-03.md"], [])
        assert (b.freshness.dirty, b.freshness.stale_warning()) == (False, None)
        await b.close()

async def test_a_search_waits_only_for_an_update_due_within_its_wait(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """A note saved within ``update.debounceMs`` of the last update marks the index dirty and
    its update waits out the debounce (about 14 s here, well past the search's wait also on
    a loaded machine). A search meanwhile answers at once from the index as it is: the update
    cannot start within the search's wait (half of ``limits.timeoutMs``, 5.95 s), so waiting
    would only cost that long and answer the same.
    The deferred update still runs when the debounce allows. A note saved once the debounce has
    passed is updated at once, and the search waits for that update and finds it."""
    b = _backend(tmp_path, qmd_bin, base_path_env, debounce_ms=15_000, timeout_ms=12_000)
    ws = b.agent.workspace_dir
    async with BackgroundTasks() as tasks:
        await b.start(tasks)
        assert b.freshness is not None and b.cycle.updates_run == 1  # the boot update
        with anyio.fail_after(DEADLINE_S):
            while not b.freshness.watcher.snapshot()["alive"]:  # its observer runs
                await anyio.sleep(0.02)
        # the last update just now (start-up may have taken longer than the debounce)
        await b.sync(reason="manual")
        assert b.cycle.updates_run == 2
        _save(ws / "memory" / "2026-05-04.md", "# Day\n\nkestrel over the dunes\n")
        with anyio.fail_after(DEADLINE_S):
            while not b.freshness.dirty:  # the watcher saw the note; its update is deferred
                await anyio.sleep(0.02)
        # the deferred update starts after the search's wait (5.95 s): it waits for nothing
        assert b.freshness._update_due_in_ms() > 5950
        stale = await b.search(SearchRequest.of("kestrel", min_score=0))
        assert (stale.results, stale.warnings) == ([], [  # said, as the builtin engine says it
            "index stale: 1 file(s) changed; qmd's update is still due; the newest content may be missing"])
        assert (b.cycle.updates_run, b.freshness.dirty) == (2, True)  # still deferred
        assert await _wait_found(b, "kestrel") == ["memory/2026-05-04.md"]
        await _wait_settled(b)  # qmd's rows may be read before its `qmd update` has exited
        assert b.cycle.updates_run == 3
        last = b.cycle.last_update_at
        assert last is not None
        with anyio.fail_after(DEADLINE_S):  # until the debounce allows an update at once
            while b.now_ms() - last <= 15_000:
                await anyio.sleep(0.05)
        _save(ws / "memory" / "2026-05-05.md", "# Day\n\nosprey at the weir\n")
        with anyio.fail_after(DEADLINE_S):
            while not b.freshness.dirty:
                await anyio.sleep(0.02)
        assert [r.path for r in (await b.search(SearchRequest.of("osprey", min_score=0))).results] == ["memory/2026-05-05.md"]
        await _wait_settled(b)
        assert b.cycle.updates_run == 4
        await b.close()


async def test_a_search_right_after_a_save_waits_for_the_watchers_update(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """A note saved just before a search: the watcher has seen it, but its quiet time
    (``sync.watchDebounceMs``, 1.5 s) has not passed, so no update is pending yet. That update
    starts within the search's wait (half of ``limits.timeoutMs``), so the search waits for it
    and finds the note. It answered at once from the index without the note: an agent that
    wrote a fact and searched for it at once did not find it."""
    b = _backend(tmp_path, qmd_bin, base_path_env, debounce_ms=0, timeout_ms=8000,
                 watch_debounce_ms=1500)
    ws = b.agent.workspace_dir
    async with BackgroundTasks() as tasks:
        await b.start(tasks)
        assert b.freshness is not None
        with anyio.fail_after(DEADLINE_S):
            while not b.freshness.watcher.snapshot()["alive"]:
                await anyio.sleep(0.02)
        (ws / "memory" / "2026-05-06.md").write_text("# Day\n\navocet in the saltmarsh\n")
        with anyio.fail_after(DEADLINE_S):
            while not b.freshness.watcher.snapshot()["pending"]:  # seen, not yet handed over
                await anyio.sleep(0.01)
        updates = b.cycle.updates_run
        assert [r.path for r in (await b.search(SearchRequest.of("avocet", min_score=0))).results] == ["memory/2026-05-06.md"]
        assert b.cycle.updates_run == updates + 1
        await b.close()


async def test_a_watch_update_that_fails_then_succeeds_is_no_longer_failing(
        tmp_path: Path, qmd_bin: Path, base_path_env: str) -> None:
    """qmd removed from disk while ``serve`` runs: the watcher's update fails and
    ``status().background`` names it failing. Once qmd is back, the retried update indexes the
    note, and the task is no longer failing; it stayed in ``failing`` (and the status said
    ``Background: ... failing: qmd: watch update``) until a restart."""
    wrapper = tmp_path / "bin" / "qmd"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {qmd_bin} "$@"\n')
    wrapper.chmod(0o755)
    b = _backend(tmp_path, wrapper, base_path_env, debounce_ms=0)
    b.cfg.mcp.enabled = False  # no warm child: every search spawns the wrapper
    ws = b.agent.workspace_dir
    async with BackgroundTasks() as tasks:
        await b.start(tasks)
        assert b.freshness is not None
        with anyio.fail_after(DEADLINE_S):
            while not b.freshness.watcher.snapshot()["alive"]:
                await anyio.sleep(0.02)
        wrapper.rename(wrapper.with_name("qmd.away"))
        (ws / "memory" / "2026-05-07.md").write_text("# Day\n\ngannet colony\n")
        with anyio.fail_after(DEADLINE_S):
            while "qmd: watch update" not in tasks.status().failing:
                await anyio.sleep(0.02)
        wrapper.with_name("qmd.away").rename(wrapper)
        assert await _wait_found(b, "gannet") == ["memory/2026-05-07.md"]
        with anyio.fail_after(DEADLINE_S):
            while b.freshness.watcher.snapshot()["failures"]:
                await anyio.sleep(0.02)  # the retried delivery has returned
        assert tasks.status().failing == []
        await b.close()


async def test_session_transcripts_are_exported_searched_and_readable(tmp_path: Path, qmd_bin: Path,
                                                                       base_path_env: str) -> None:
    import orjson

    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "MEMORY.md").write_text("# Memory\n\nnothing about birds\n")
    state = tmp_path / "state"
    sessions = state / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    records = [
        {"type": "session", "id": "s1"},
        {"type": "message", "message": {"role": "user", "content": "Which bird did we see at the lake?"}},
        {"type": "message", "message": {"role": "assistant", "content": [
            {"type": "text", "text": "A grey heron, and my key is sk-proj-abcdefghijklmnopqrstuvwx1234"}]}},
    ]
    (sessions / "s1.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    cfg = parse_config({"memory": {"backend": "qmd", "qmd": {"sessions": {"enabled": True},
                                                             "update": {"waitForBootSync": True}}}})
    agent = resolve_agent(cfg, "main", workspace=ws, env={"OPENCLAW_STATE_DIR": str(state)})
    loc = QmdLocation(path=str(qmd_bin), found=True, runtime_ok=True, version="2.8.3", reason=None,
                      searched=[], path_env=base_path_env, child_path=base_path_env)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["HOME"] = str(tmp_path / "home")
    b = QmdBackend(agent, location=loc, mode="cli", env=env)
    try:
        await b.start()
        await b.sync(reason="test", force=True)
        hits = (await b.search(SearchRequest.of("heron", min_score=0))).results
        assert [(h.path, h.source) for h in hits] == [("qmd/sessions-main/s1.md", "sessions")]
        page = await b.read_file("qmd/sessions-main/s1.md")
        assert page.text.startswith("# Session s1\n\nUser: Which bird did we see at the lake?\n"
                                    "Assistant: A grey heron, and my key is [REDACTED")
        assert "sk-proj-" not in page.text
    finally:
        await b.close()

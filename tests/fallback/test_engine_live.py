"""BuiltinEngine live mode (``start()``) and the search sync budget: real watchdog events, real
files and SQLite; every wait is bounded by a deadline, nothing asserts on timing."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import orjson
import pytest

from fallback.background import BackgroundTasks
from fallback.embeddings import ProviderSelection
from fallback.engine.builtin import BuiltinEngine
from fallback.request import SearchRequest
from fallback.settings import EngineSettings, MemorySearchSettings
from tests.fallback.count_provider import CountProvider
from tests.fallback.watcher_faults import kill_observer, silence_observer

pytestmark = pytest.mark.anyio

DEADLINE_S = 60.0
STALE_1000_MS = ("index stale: the sync before this search still runs after its 1000 ms budget; the "
                 "newest content may be missing")
NOW_MS = 1_770_681_600_000


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Re-check ``check`` until it holds; fail after ``DEADLINE_S`` seconds."""
    try:
        with anyio.fail_after(DEADLINE_S):
            while not await check():
                await anyio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"not reached within {DEADLINE_S}s: {what}")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "memory").mkdir(parents=True)
    (w / "MEMORY.md").write_text("Alpha base knowledge.\n")
    return w


def _engine(ws: Path, provider: CountProvider | None = None, *, watch: bool = True,
            with_sessions: bool = False, **sync: object) -> BuiltinEngine:
    cfg = MemorySearchSettings(
        provider="none" if provider is None else "openai",
        sources=["memory", "sessions"] if with_sessions else ["memory"],
        experimental={"sessionMemory": with_sessions},
        sync={"watch": watch, "watchDebounceMs": 100, **sync})
    sel = ProviderSelection(provider, "none" if provider is None else "test-count",
                            unavailable_reason=None if provider else "provider set to none")
    engine = BuiltinEngine(EngineSettings.for_workspace(ws, search=cfg), provider_selection=sel,
                           now_ms=lambda: NOW_MS)
    engine.rescan_interval_ms = 0
    engine.watch_poll_interval_s = 0.2
    return engine


@asynccontextmanager
async def live(engine: BuiltinEngine) -> AsyncIterator[BackgroundTasks]:
    """Live mode in a task group of the test's own; the engine is closed on the way out."""
    async with BackgroundTasks() as tasks:
        try:
            await engine.start(tasks)
            yield tasks
        finally:
            await engine.close()


async def _booted(engine: BuiltinEngine) -> None:
    async def done() -> bool:
        return engine._live.sync_counts["boot"] == 1
    await eventually(done, "boot sync finished")


def _finds(engine: BuiltinEngine, query: str, paths: list[str]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return [h.path for h in (await engine.search(SearchRequest.of(query))).results] == paths
    return check


async def test_saved_renamed_deleted_and_nested_files_become_searchable(ws: Path) -> None:
    engine = _engine(ws)
    async with live(engine):
        await _booted(engine)
        mem = ws / "memory"
        (mem / "birds.md").write_text("Falcon sighting at dawn.\n")
        await eventually(_finds(engine, "Falcon", ["memory/birds.md"]), "saved file indexed")
        tmp = mem / ".birds.md.swp"
        tmp.write_text("Griffin sighting at dusk.\n")
        os.replace(tmp, mem / "birds.md")  # editor-style atomic save
        await eventually(_finds(engine, "Griffin", ["memory/birds.md"]), "renamed save indexed")
        assert (await engine.search(SearchRequest.of("Falcon"))).results == []
        (mem / "birds.md").unlink()
        await eventually(_finds(engine, "Griffin", []), "deleted file removed")
        deep = mem / "projects" / "raptors"
        deep.mkdir(parents=True)
        (deep / "notes.md").write_text("Harrier nest count.\n")
        await eventually(_finds(engine, "Harrier", ["memory/projects/raptors/notes.md"]),
                         "file in a new sub-folder indexed")
        # a search that finds the watcher holding changes syncs first; the watcher still hands
        # them over once its debounce has passed
        async def watch_synced() -> bool:
            return engine._live.sync_counts["watch"] >= 1
        await eventually(watch_synced, "the watcher's own sync ran")
        status = await engine.status()
        assert status.custom["watcher"]["mode"] == "native"
        assert status.dirty is False


async def test_a_watch_sync_that_failed_once_is_not_failing_after_its_retry(
        ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch sync fails (stood in here by a sync that raises once, as a full disk would) and
    ``status().background`` names it failing; the watcher retries it, the retry indexes the
    note, and the task is no longer failing. It stayed in ``failing`` until a restart."""
    from fallback.errors import IndexStoreError

    engine = _engine(ws)
    real = engine.sync_after_running
    failed = anyio.Event()

    async def fails_once(**kwargs: object) -> object:
        if not failed.is_set():
            failed.set()
            raise IndexStoreError("database or disk is full")
        return await real(**kwargs)  # type: ignore[arg-type]

    async with live(engine) as tasks:
        await _booted(engine)
        monkeypatch.setattr(engine, "sync_after_running", fails_once)
        (ws / "memory" / "tern.md").write_text("Arctic tern colony.\n")
        await failed.wait()

        async def reported() -> bool:
            return tasks.status().failing == ["builtin: watch sync"]
        await eventually(reported, "the failed watch sync reported")
        await eventually(_finds(engine, "tern", ["memory/tern.md"]), "the retry indexed the note")

        async def recovered() -> bool:
            return engine._live.watcher.snapshot()["failures"] == 0
        await eventually(recovered, "the retried delivery returned")
        assert tasks.status().failing == []


async def test_dead_watcher_thread_is_noticed_by_status_and_re_armed_on_polling(ws: Path) -> None:
    engine = _engine(ws)
    engine.watch_health_check_ms = 3_600_000  # only searches and status look at the watcher
    async with live(engine):
        await _booted(engine)
        kill_observer(engine._live.watcher)
        status = await engine.status()  # notices it, reports it, re-arms it in the background
        assert (status.dirty, status.dirty_reason) == (
            True, "watcher dead: native watcher thread died; re-arming")

        async def re_armed() -> bool:
            st = await engine.status()
            return not st.dirty and st.custom["watcher"]["rearms"] == 1
        await eventually(re_armed, "watcher re-armed and the rescan synced")
        watcher = (await engine.status()).custom["watcher"]
        assert (watcher["mode"], watcher["alive"], watcher["degradedReason"]) == (
            "polling", True, "native watcher thread died")
        assert (watcher["lastRearm"]["cause"], watcher["lastRearm"]["mode"]) == (
            "native watcher thread died", "polling")
        (ws / "memory" / "late.md").write_text("Kestrel seen after the watcher died.\n")
        await eventually(_finds(engine, "Kestrel", ["memory/late.md"]), "polling picked it up")
        assert (await engine.status()).dirty is False


async def test_a_watcher_deaf_with_its_thread_alive_is_caught_by_folder_mtimes(ws: Path) -> None:
    engine = _engine(ws)
    engine.watch_health_check_ms = 3_600_000  # only searches and status look at the watcher
    async with live(engine):
        await _booted(engine)
        silence_observer(engine._live.watcher)  # no event from now on, thread alive
        (ws / "memory" / "heron.md").write_text("Grey heron at the weir.\n")
        assert engine._live.watcher.snapshot()["events"] == 0  # nothing reported it
        # no rescan runs (rescan_interval_ms = 0): only the folder check can find the note
        await eventually(_finds(engine, "heron weir", ["memory/heron.md"]), "the deaf watcher noticed")

        async def re_armed() -> bool:  # in the background, after the search that noticed it
            return (await engine.status()).custom["watcher"]["rearms"] == 1
        await eventually(re_armed, "the deaf observer replaced")
        snap = (await engine.status()).custom["watcher"]
        assert (snap["rearms"], snap["lastRearm"]["cause"], snap["mode"]) == (
            1, f"missed changes in {ws / 'memory'}", "native")
        (ws / "memory" / "egret.md").write_text("Little egret in the reeds.\n")
        # the re-armed observer hears it
        await eventually(_finds(engine, "egret reeds", ["memory/egret.md"]), "re-armed watcher")
        assert (await engine.status()).custom["watcher"]["rearms"] == 1


async def test_deleted_and_recreated_memory_folder_is_watched_again(ws: Path) -> None:
    engine = _engine(ws)
    engine.watch_health_check_ms = 3_600_000  # only searches and status look at the watcher
    mem = ws / "memory"
    (mem / "old.md").write_text("Plover census.\n")
    async with live(engine):
        await _booted(engine)
        shutil.rmtree(mem)  # watchdog stops the watch of a deleted folder for good

        async def re_armed() -> bool:  # found by the watcher loop on the deletion's events or
            # by this status call, whichever looks after the watch stopped
            st = await engine.status()
            return not st.dirty and st.custom["watcher"]["rearms"] == 1
        await eventually(re_armed, "watcher re-armed and the rescan synced")
        assert (await engine.search(SearchRequest.of("Plover"))).results == []
        mem.mkdir()
        (mem / "new.md").write_text("Avocet nest on the dyke.\n")
        # not dirty, so a search does not sync: only the re-armed watcher can index it
        await eventually(_finds(engine, "Avocet", ["memory/new.md"]), "new folder watched")
        snap = (await engine.status()).custom["watcher"]
        assert (snap["mode"], snap["alive"], snap["rearms"], snap["degradedReason"]) == (
            "native", True, 1, None)
        assert snap["lastRearm"]["cause"] == f"watch on {mem} stopped"


@pytest.mark.parametrize("trigger", ["interval", "rescan"])
async def test_interval_and_rescan_keep_index_fresh_without_watcher(ws: Path,
                                                                    trigger: str) -> None:
    engine = _engine(ws, watch=False,
                     intervalMinutes=0.005 if trigger == "interval" else 0)
    if trigger == "rescan":
        engine.rescan_interval_ms = 300
    async with live(engine):
        await _booted(engine)
        assert engine._live.watcher is None
        (ws / "memory" / "later.md").write_text("Osprey fishing notes.\n")
        await eventually(_finds(engine, "Osprey", ["memory/later.md"]), f"{trigger} sync ran")

        async def counted() -> bool:
            return engine._live.sync_counts[trigger] >= 1
        await eventually(counted, f"{trigger} sync counted")
        assert engine._live.sync_counts["watch"] == 0


def _record(role: str, text: str) -> bytes:
    return orjson.dumps({"type": "message", "message": {"role": role, "content": text}}) + b"\n"


def _session_engine(ws: Path, batch_ms: int) -> tuple[BuiltinEngine, Path]:
    """An engine syncing a transcript after 3 new messages (its batch window ``batch_ms``),
    and the transcript ``chat.jsonl``, which holds one message."""
    engine = _engine(ws, with_sessions=True, sessions={"deltaMessages": 3, "deltaBytes": 100_000})
    engine.session_batch_ms = batch_ms
    sdir = engine.settings.sessions_dir
    sdir.mkdir(parents=True)
    path = sdir / "chat.jsonl"
    path.write_bytes(_record("user", "Morning plans."))
    return engine, path


async def test_session_delta_threshold_syncs_after_batch_window(ws: Path) -> None:
    engine, path = _session_engine(ws, 200)
    async with live(engine):
        await _booted(engine)
        assert engine._live.tracker.pending(path) == (path.stat().st_size, 0, 0)
        with path.open("ab") as fh:
            fh.write(_record("user", "Remember the Osprey tagging permit."))

        async def counted() -> bool:
            return engine._live.tracker.pending(path)[2] == 1
        await eventually(counted, "first append observed")
        assert engine._live.sync_counts["session-delta"] == 0
        assert (await engine.search(SearchRequest.of("Osprey tagging permit"))).results == []  # below threshold: no sync
        with path.open("ab") as fh:
            fh.write(_record("assistant", "Noted."))
            fh.write(_record("user", "Thanks."))

        async def synced() -> bool:
            hits = (await engine.search(SearchRequest.of("Osprey tagging permit"))).results
            return [(h.path, h.source, h.start_line, h.end_line) for h in hits] == [
                ("sessions/chat.jsonl", "sessions", 1, 4)]
        await eventually(synced, "threshold hit -> session-delta sync")

        async def delta_counted() -> bool:
            return engine._live.sync_counts["session-delta"] == 1
        await eventually(delta_counted, "session-delta sync counted")
        assert engine._live.tracker.pending(path) == (path.stat().st_size, 0, 0)


async def _queue_transcript_lines(engine: BuiltinEngine, path: Path, count: int) -> None:
    """Append ``count`` transcript lines and wait until the watcher has queued the transcript
    for the session batch window."""
    with path.open("ab") as fh:
        for n in range(count):
            fh.write(_record("user", f"Line {n} about the Osprey tagging permit."))

    async def queued() -> bool:
        return (await engine.status()).custom["live"]["sessionsPending"] == 1
    await eventually(queued, "the watcher handed the transcript over")


async def test_transcript_lines_waiting_for_their_sync_are_told_not_hidden(ws: Path) -> None:
    engine, path = _session_engine(ws, 600_000)  # the batch window stays open for the whole test
    async with live(engine):
        await _booted(engine)
        await _queue_transcript_lines(engine, path, 2000)
        stale = "1 transcripts changed and wait for the session batch window (600000 ms)"
        outcome = await engine.search(SearchRequest.of("Osprey tagging permit"))
        assert outcome.results == []  # not indexed yet, and the answer says so
        assert outcome.warnings == [f"index stale: {stale}; the newest content may be missing"]
        status = await engine.status()
        assert (status.dirty, status.dirty_reason, status.custom["indexStale"]) == (
            True, f"index stale: {stale}", stale)


async def test_transcript_lines_below_the_delta_thresholds_keep_the_index_dirty(ws: Path) -> None:
    engine, path = _session_engine(ws, 200)
    async with live(engine):
        await _booted(engine)
        with path.open("ab") as fh:
            fh.write(_record("user", "Remember the Osprey tagging permit."))

        async def counted() -> bool:  # the batch window is over, the growth below deltaMessages
            return engine._live.tracker.pending(path)[2] == 1 and not (
                await engine.status()).custom["live"]["sessionsPending"]
        await eventually(counted, "append observed after the batch window")
        stale = ("new lines of 1 transcript are below sync.sessions.deltaBytes/deltaMessages "
                 "(indexed once they reach one, or by the next sync)")
        status = await engine.status()
        assert (status.dirty, status.dirty_reason, status.custom["indexStale"]) == (
            True, f"index stale: {stale}", stale)
        outcome = await engine.search(SearchRequest.of("Osprey tagging permit"))
        assert (outcome.results, outcome.warnings) == ([], [])  # the thresholds' choice, not news
        await engine.sync(reason="manual")
        status = await engine.status()
        assert (status.dirty, status.custom["indexStale"]) == (False, None)
        assert [h.path for h in (await engine.search(SearchRequest.of("Osprey tagging permit"))).results] == [
            "sessions/chat.jsonl"]


async def test_a_sync_inside_the_batch_window_indexes_the_waiting_transcripts(ws: Path) -> None:
    engine, path = _session_engine(ws, 600_000)  # the batch window stays open for the whole test
    async with live(engine):
        await _booted(engine)
        await _queue_transcript_lines(engine, path, 5)
        await engine.sync(reason="manual")
        status = await engine.status()
        assert (status.dirty, status.custom["indexStale"], status.custom["live"]["sessionsPending"]) == (
            False, None, 0)
        outcome = await engine.search(SearchRequest.of("Osprey tagging permit"))
        assert [h.path for h in outcome.results] == ["sessions/chat.jsonl"] and outcome.warnings == []


async def test_warm_session_syncs_once_per_key(ws: Path) -> None:
    engine = _engine(ws, watch=False)
    async with live(engine):
        await _booted(engine)
        (ws / "memory" / "warm.md").write_text("Plover notes.\n")
        await engine.search(SearchRequest.of("Plover", session_key="agent:main:dm:7"))
        await engine.search(SearchRequest.of("Plover", session_key="agent:main:dm:7"))
        engine.warm_session("  ")

        async def warmed() -> bool:
            return engine._live.sync_counts["session-start"] == 1
        await eventually(warmed, "session-start sync")
        assert [h.path for h in (await engine.search(SearchRequest.of("Plover"))).results] == ["memory/warm.md"]
        assert engine._live.sync_counts["session-start"] == 1


def _our_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if not t.name.startswith("AnyIO worker thread")}


async def test_close_stops_watcher_threads_and_tasks(ws: Path) -> None:
    before = _our_threads()
    engine = _engine(ws, with_sessions=True, intervalMinutes=1)
    engine.rescan_interval_ms = 60_000
    async with BackgroundTasks() as tasks:
        await engine.start(tasks)
        await _booted(engine)
        assert _our_threads() - before  # the observer threads run
        assert tasks.running == 3  # watcher, interval sync, rescan
        await engine.close()
        assert _our_threads() == before
        assert tasks.running == 0  # live mode's subgroup counts in its parent's
        assert engine._live.watcher.snapshot()["mode"] == "stopped"
        assert tasks.is_open  # the engine closed its own tasks, not the owner's group


async def test_one_shot_search_budget_cancels_sync_and_keeps_progress(ws: Path) -> None:
    provider = CountProvider(gated=True)
    engine = _engine(ws, provider)
    try:
        await engine.sync(reason="test")
        (ws / "memory" / "b1.md").write_text("Beta one.\n")
        provider.blocking = True
        engine.mark_dirty("files changed: 1")
        hits = (await engine.search(SearchRequest.of("alpha"), sync_budget_ms=1_000)).results
        assert provider.entered.is_set() and not provider.gate.is_set()
        assert [h.path for h in hits] == ["MEMORY.md"]
        status = await engine.status()
        assert (status.dirty, status.dirty_reason, status.last_error) == (
            True, "files changed: 1", None)
        provider.blocking = False
        await engine.sync(reason="test")
        assert [h.path for h in (await engine.search(SearchRequest.of("beta"))).results] == ["memory/b1.md"]
    finally:
        await engine.close()


async def test_live_search_budget_answers_while_sync_continues(ws: Path) -> None:
    provider = CountProvider(gated=True)
    engine = _engine(ws, provider, watch=False)
    async with live(engine):
        await _booted(engine)
        (ws / "memory" / "b2.md").write_text("Beta two.\n")
        provider.blocking = True
        engine.mark_dirty("files changed: 1")
        answer = await engine.search(SearchRequest.of("alpha"), sync_budget_ms=1_000)
        assert [h.path for h in answer.results] == ["MEMORY.md"]
        assert answer.warnings == [STALE_1000_MS]  # the answer says it may miss what is syncing
        assert provider.entered.is_set() and engine._live.sync_counts["search"] == 0
        provider.gate.set()

        async def finished() -> bool:
            return engine._live.sync_counts["search"] >= 1
        await eventually(finished, "background search sync finished")
        answer = await engine.search(SearchRequest.of("beta"))
        assert ([h.path for h in answer.results], answer.warnings) == (["memory/b2.md"], [])


async def test_a_live_search_while_another_process_holds_the_store_says_it_may_be_stale(ws: Path) -> None:
    """Another process holding the store in a transaction stalls live mode's sync (it waits for
    the lock): a search answers from the index as it is within its budget and says so, as a
    one-shot search tells its failed sync."""
    engine = _engine(ws, watch=False)
    async with live(engine):
        await _booted(engine)
        (ws / "memory" / "b3.md").write_text("Beta three.\n")
        holder = sqlite3.connect(engine.settings.db_path, isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            engine.mark_dirty("files changed: 1")
            answer = await engine.search(SearchRequest.of("beta"), sync_budget_ms=1_000)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert (answer.results, answer.warnings) == ([], [STALE_1000_MS])

        async def indexed() -> bool:
            return [h.path for h in (await engine.search(SearchRequest.of("beta"))).results] == ["memory/b3.md"]
        await eventually(indexed, "the note indexed once the lock is released")


async def test_cancelled_full_rebuild_leaves_no_temp_file(ws: Path) -> None:
    provider = CountProvider(gated=True)
    engine = _engine(ws, provider)
    try:
        await engine.sync(reason="test")
        (ws / "memory" / "b3.md").write_text("Beta three.\n")
        provider.blocking = True
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: engine.sync(reason="test", force=True))
            await provider.entered.wait()
            tg.cancel_scope.cancel()
        leftovers = [p.name for p in engine.settings.db_path.parent.iterdir() if ".tmp-" in p.name]
        assert leftovers == []
        provider.blocking = False
        assert [h.path for h in (await engine.search(SearchRequest.of("alpha"))).results] == ["MEMORY.md"]
        assert (await engine.search(SearchRequest.of("beta"))).results == []  # the live index was left as it was
    finally:
        await engine.close()

"""Real watchdog events through MemoryWatcher: saves, atomic renames, deletes, moves, new
folders, extra paths outside the workspace, a dead observer degrading to polling, a deleted
folder's dead watch re-armed, and a failing callback backing off instead of retrying every
tick."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import anyio
import pytest

from fallback.background import RetryPolicy
from fallback.errors import EmbeddingProviderError, MemorySearchError
from fallback.sources.watcher import RESCAN_MARKER, MemoryWatcher
from tests.fallback.watcher_faults import kill_observer

pytestmark = pytest.mark.anyio

DEADLINE_S = 60.0


class Recorder:
    def __init__(self) -> None:
        self.batches: list[tuple[set[str], str]] = []
        self.event = anyio.Event()

    async def __call__(self, paths: set[str], reason: str) -> None:
        self.batches.append((set(paths), reason))
        self.event.set()

    def seen(self) -> set[str]:
        out: set[str] = set()
        for paths, _ in self.batches:
            out |= paths
        return out

    async def wait_for(self, predicate) -> None:
        with anyio.fail_after(DEADLINE_S):
            while not predicate(self.seen()):
                self.event = anyio.Event()
                await self.event.wait()


async def _run(watcher: MemoryWatcher, body) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run)
        await body()
        tg.cancel_scope.cancel()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "memory").mkdir(parents=True)
    (w / "MEMORY.md").write_text("root\n")
    return w


async def test_edit_and_atomic_rename_save_are_seen(ws: Path) -> None:
    rec = Recorder()
    watcher = MemoryWatcher(ws, on_change=rec, debounce_ms=50)

    async def body() -> None:
        (ws / "memory" / "2026-01-01.md").write_text("hello\n")
        await rec.wait_for(lambda s: str(ws / "memory" / "2026-01-01.md") in s)
        tmp = ws / ".MEMORY.md.tmp123"
        tmp.write_text("new root\n")
        os.replace(tmp, ws / "MEMORY.md")
        await rec.wait_for(lambda s: str(ws / "MEMORY.md") in s)

    await _run(watcher, body)
    assert all(reason == "watch" for _, reason in rec.batches)
    assert str(ws / ".MEMORY.md.tmp123") not in rec.seen()


async def test_delete_move_and_new_subfolder(ws: Path) -> None:
    note = ws / "memory" / "a.md"
    note.write_text("a\n")
    rec = Recorder()
    watcher = MemoryWatcher(ws, on_change=rec, debounce_ms=50)

    async def body() -> None:
        note.unlink()
        await rec.wait_for(lambda s: str(note) in s)
        sub = ws / "memory" / "projects" / "deep"
        sub.mkdir(parents=True)
        await anyio.sleep(0.2)  # let the recursive watch pick up the new folder
        (sub / "x.md").write_text("x\n")
        await rec.wait_for(lambda s: str(sub / "x.md") in s)
        (sub / "x.md").rename(ws / "memory" / "y.md")
        await rec.wait_for(lambda s: str(ws / "memory" / "y.md") in s)

    await _run(watcher, body)


async def test_memory_folder_created_later_and_irrelevant_files_ignored(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    rec = Recorder()
    watcher = MemoryWatcher(ws, on_change=rec, debounce_ms=50)

    async def body() -> None:
        (ws / "notes.txt").write_text("not memory\n")
        (ws / "memory").mkdir()
        await rec.wait_for(lambda s: str(ws / "memory") in s)
        await anyio.sleep(0.2)
        (ws / "memory" / "later.md").write_text("later\n")
        await rec.wait_for(lambda s: str(ws / "memory" / "later.md") in s)

    await _run(watcher, body)
    assert str(ws / "notes.txt") not in rec.seen()


async def test_extra_path_outside_workspace(ws: Path, tmp_path: Path) -> None:
    extra = tmp_path / "shared-notes"
    extra.mkdir()
    single = tmp_path / "standalone.md"
    single.write_text("one\n")
    rec = Recorder()
    watcher = MemoryWatcher(ws, extra_paths=[extra, single], on_change=rec, debounce_ms=50)

    async def body() -> None:
        (extra / "n.md").write_text("n\n")
        await rec.wait_for(lambda s: str(extra / "n.md") in s)
        single.write_text("changed\n")
        await rec.wait_for(lambda s: str(single) in s)

    await _run(watcher, body)


async def test_debounce_batches_a_burst(ws: Path) -> None:
    rec = Recorder()
    watcher = MemoryWatcher(ws, on_change=rec, debounce_ms=400)

    async def body() -> None:
        for i in range(5):
            (ws / "memory" / f"{i}.md").write_text(f"{i}\n")
        await rec.wait_for(lambda s: all(str(ws / "memory" / f"{i}.md") in s for i in range(5)))

    await _run(watcher, body)
    assert len(rec.batches) == 1


async def test_dead_observer_degrades_to_polling_and_still_sees_changes(ws: Path) -> None:
    rec = Recorder()
    watcher = MemoryWatcher(ws, on_change=rec, debounce_ms=50, poll_interval_s=0.2)

    async def body() -> None:
        assert watcher.state.mode == "native"
        kill_observer(watcher)
        with anyio.fail_after(DEADLINE_S):
            while watcher.state.mode != "polling":
                await anyio.sleep(0.05)
        assert watcher.state.degraded_reason == "native watcher thread died"
        (ws / "memory" / "after.md").write_text("after\n")
        await rec.wait_for(lambda s: str(ws / "memory" / "after.md") in s)

    await _run(watcher, body)
    assert watcher.snapshot()["degradedReason"] == "native watcher thread died"


class _NoNativeWatcher(MemoryWatcher):
    """The native observer cannot start, as when the inotify watch limit is spent (a limit a
    test cannot spend on a shared machine)."""

    def _new_observer(self, polling: bool):  # type: ignore[no-untyped-def]
        if not polling:
            raise OSError(errno.ENOSPC, "inotify watch limit reached")
        return super()._new_observer(polling)


async def test_a_native_observer_that_cannot_start_polls_and_rescans(ws: Path) -> None:
    rec = Recorder()
    watcher = _NoNativeWatcher(ws, on_change=rec, debounce_ms=50, poll_interval_s=0.2)

    async def body() -> None:
        assert watcher.state.mode == "polling"
        await rec.wait_for(lambda s: RESCAN_MARKER in s)  # events may have been lost
        (ws / "memory" / "polled.md").write_text("polled\n")
        await rec.wait_for(lambda s: str(ws / "memory" / "polled.md") in s)

    await _run(watcher, body)
    assert watcher.state.degraded_reason == (
        "inotify watch limit reached (raise fs.inotify.max_user_watches)")



async def test_transcripts_are_told_by_the_transcript_rule(ws: Path, tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    rec = Recorder()
    watcher = MemoryWatcher(ws, sessions_dir=sessions, on_change=rec, debounce_ms=50)

    async def body() -> None:
        # neither is indexed: a compaction checkpoint and a backup wake no sync
        (sessions / "a.checkpoint.0f8fad5b-d9cb-469f-a165-70867728950e.jsonl").write_text("{}\n")
        (sessions / "a.jsonl.bak").write_text("{}\n")
        (sessions / "a.jsonl").write_text("{}\n")
        await rec.wait_for(lambda s: str(sessions / "a.jsonl") in s)

    await _run(watcher, body)
    assert rec.seen() == {str(sessions / "a.jsonl")}


def test_relevance_follows_the_memory_file_rule(tmp_path: Path) -> None:
    from fallback.settings import ExtraPath

    ws = tmp_path / "ws"
    (ws / "memory" / "sub").mkdir(parents=True)
    notes = tmp_path / "notes"
    (notes / "deep").mkdir(parents=True)

    async def ignore(paths: set[str], reason: str) -> None:
        return None

    watcher = MemoryWatcher(ws, extra_paths=[ExtraPath(path=str(notes), pattern="*.md")], on_change=ignore)
    relevant = {p: watcher.is_relevant(p) for p in (
        ws / "MEMORY.md", ws / "memory.md", ws / "memory", ws / "DREAMS.md", ws / "notes.md",
        ws / "memory" / "a.md", ws / "memory" / "a.MD", ws / "memory" / ".a.md.swp",
        ws / "memory" / "sub", ws / "memory" / "node_modules", ws / "memory" / "build" / "x.md",
        ws / "memory" / ".git" / "x.md", notes / "top.md", notes / "deep" / "inner.md", notes / "deep")}
    assert [str(p.relative_to(tmp_path)) for p, yes in relevant.items() if yes] == [
        "ws/MEMORY.md", "ws/memory.md", "ws/memory", "ws/memory/a.md", "ws/memory/sub", "notes/top.md"]


async def test_failed_delivery_keeps_the_batch_and_backs_off(ws: Path) -> None:
    note = ws / "memory" / "2026-02-01.md"
    calls: list[set[str]] = []
    errors: list[tuple[int, int, str]] = []
    healthy = False
    changed = anyio.Event()

    async def on_change(paths: set[str], reason: str) -> None:
        nonlocal changed
        calls.append(set(paths))
        changed.set()
        changed = anyio.Event()
        if not healthy:
            raise EmbeddingProviderError("openai", "invalid key", status=401)

    def on_error(exc: BaseException, failures: int, retry_in_ms: int) -> None:
        errors.append((failures, retry_in_ms, str(exc)))

    watcher = MemoryWatcher(ws, on_change=on_change, debounce_ms=20, on_error=on_error,
                            retry=RetryPolicy(base_ms=20, factor=2.0, max_ms=80))

    async def body() -> None:
        nonlocal healthy
        note.write_text("revoked key day\n")
        with anyio.fail_after(DEADLINE_S):
            while len(errors) < 4:
                await changed.wait()
        snap = watcher.snapshot()
        assert (snap["failures"] >= 4, snap["pending"], snap["lastError"]) == (
            True, 1, "EmbeddingProviderError: openai embedding failed (HTTP 401): invalid key")
        assert snap["retryAtMs"] is not None
        healthy = True
        with anyio.fail_after(DEADLINE_S):
            while watcher.snapshot()["failures"]:
                await changed.wait()

    await _run(watcher, body)
    assert [(f, r) for f, r, _ in errors[:4]] == [(1, 20), (2, 40), (3, 80), (4, 80)]
    assert all(c == {str(note)} for c in calls)  # the same batch each time: nothing lost
    assert len(calls) == len(errors) + 1  # one delivery per failure, then the good one
    snap = watcher.snapshot()
    assert (snap["failures"], snap["retryAtMs"], snap["lastError"], snap["pending"]) == (0, None, None, 0)


async def test_deleted_memory_folder_is_a_dead_watch_that_rearm_replaces(ws: Path) -> None:
    rec = Recorder()
    mem = ws / "memory"
    watcher = MemoryWatcher(ws, on_change=rec, debounce_ms=50, health_check_ms=3_600_000)

    async def body() -> None:
        assert watcher.dead_reason() is None and watcher.rearm() is False  # healthy: no-op
        shutil.rmtree(mem)
        with anyio.fail_after(DEADLINE_S):  # the loop may notice it on the deletion's events
            while watcher.dead_reason() is None and watcher.state.rearms == 0:
                await anyio.sleep(0.02)
        await anyio.to_thread.run_sync(watcher.rearm)
        snap = watcher.snapshot()
        assert (snap["rearms"], snap["alive"], snap["mode"], snap["degradedReason"]) == (
            1, True, "native", None)
        assert snap["lastRearm"]["cause"] == f"watch on {mem} stopped"
        await rec.wait_for(lambda s: RESCAN_MARKER in s)  # events were lost: rescan
        mem.mkdir()
        # The root watch schedules the new folder on its own thread; a write that lands before
        # that is seen by the rescan, not as an event, so write again until an event arrives.
        target = str(mem / "again.md")
        with anyio.fail_after(DEADLINE_S):
            attempt = 0
            while target not in rec.seen():
                attempt += 1
                (mem / "again.md").write_text(f"again {attempt}\n")
                with anyio.move_on_after(0.5):
                    await rec.wait_for(lambda s: target in s)

    await _run(watcher, body)


def _tree_with_tool_folders(root: Path) -> None:
    """An extra path that is also a code checkout: notes next to dependency and VCS trees."""
    (root / "notes" / "deep").mkdir(parents=True)
    (root / "notes" / "deep" / "plan.md").write_text("plan\n")
    (root / "README.md").write_text("readme\n")
    for skipped in ("node_modules/pkg/lib", ".git/objects/ab", ".venv/lib/site-packages",
                    "venv/bin", "__pycache__", "build/out", ".obsidian"):
        (root / skipped).mkdir(parents=True)
        (root / skipped / "x.md").write_text("not a note\n")
    (root / "loop").symlink_to(root, target_is_directory=True)  # a cycle, never followed


def test_polling_snapshot_skips_tool_folders_and_symlinks(ws: Path, tmp_path: Path) -> None:
    from watchdog.utils.dirsnapshot import DirectorySnapshot

    repo = tmp_path / "repo"
    _tree_with_tool_folders(repo)
    watcher = MemoryWatcher(ws, extra_paths=[repo], on_change=Recorder(), force_polling=True)
    snap = DirectorySnapshot(str(repo), recursive=True, stat=os.lstat, listdir=watcher.list_folder)
    assert sorted(os.path.relpath(p, repo) for p in snap.paths) == [
        ".", "README.md", "loop", "notes", "notes/deep", "notes/deep/plan.md"]
    observer = watcher._new_observer(True)
    assert type(observer).__name__ == "PollingObserverVFS"


def test_polling_depth_limit(ws: Path) -> None:
    from watchdog.utils.dirsnapshot import DirectorySnapshot

    from fallback.sources.watcher import MAX_WATCH_DEPTH

    deep = ws / "memory" / os.path.join(*[f"d{i}" for i in range(MAX_WATCH_DEPTH + 2)])
    deep.mkdir(parents=True)
    watcher = MemoryWatcher(ws, on_change=Recorder(), force_polling=True)
    snap = DirectorySnapshot(str(ws / "memory"), recursive=True, stat=os.lstat,
                             listdir=watcher.list_folder)
    depths = sorted(os.path.relpath(p, ws / "memory").count(os.sep) + 1
                    for p in snap.paths if p != str(ws / "memory"))
    assert depths == list(range(1, MAX_WATCH_DEPTH + 1))  # d0 .. d11, nothing below


async def test_polling_watcher_sees_notes_beside_tool_folders(ws: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _tree_with_tool_folders(repo)
    rec = Recorder()
    watcher = MemoryWatcher(ws, extra_paths=[repo], on_change=rec, debounce_ms=50,
                            force_polling=True, poll_interval_s=0.1)

    async def body() -> None:
        (repo / "notes" / "deep" / "plan.md").write_text("plan, revised with more text\n")
        await rec.wait_for(lambda s: str(repo / "notes" / "deep" / "plan.md") in s)

    await _run(watcher, body)
    assert watcher.state.mode == "stopped"
    assert not any("node_modules" in p or ".git" in p for p in rec.seen())


async def test_a_missing_workspace_is_a_plain_error_not_a_crash(ws: Path) -> None:
    """A workspace deleted (or not mounted yet) under a running server is an expected state: the
    watcher says so in one line (a MemorySearchError, which the background group logs without a
    traceback and retries), instead of watchdog's FileNotFoundError."""
    shutil.rmtree(ws)
    watcher = MemoryWatcher(ws, on_change=Recorder(), debounce_ms=50)
    with pytest.raises(MemorySearchError) as caught:
        await watcher.run()
    assert str(caught.value) == (f"workspace {ws} is missing: its memory files are watched again "
                                 "once it is back")

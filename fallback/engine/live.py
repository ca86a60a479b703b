"""Live mode of the builtin engine: watcher, session deltas, interval and rescan syncs.

:class:`LiveSync` is what ``BuiltinEngine.start()`` runs in the long-lived ``serve`` mode
(spec §5.1/§5.2, issue 5 "Freshness"). One-shot CLI use never creates it. Background work runs
as asyncio tasks owned by this object (as ``qmdbridge/qmd/backend.py`` does), so ``start()`` and
``close()`` may be called from different tasks (a blocking portal runs each call in its own
task); ``close()`` cancels every task and awaits them, which also stops and joins the
watchdog observer threads.

Triggers (reason strings as in the spec):
- ``watch``: the :class:`~fallback.sources.watcher.MemoryWatcher` (when ``sync.watch``) reports memory
  changes ``sync.watchDebounceMs`` after the last one -> ``mark_dirty("files changed: <n>")``
  then a sync that starts after any running one (so a change made during a sync is not lost);
- ``session-delta``: transcript events are collected; a batch window (``session_batch_ms``,
  5,000 ms, started by the first event and not reset) feeds them to a
  :class:`~fallback.sources.transcripts.SessionDeltaTracker`; a hit (100,000 bytes / 50 messages by
  default) marks the engine dirty and syncs;
- ``interval``: every ``sync.intervalMinutes`` when > 0;
- ``rescan``: every ``rescan_interval_ms`` (5 min by default) as a safety net for lost events;
  a successful rescan clears a degraded-watcher mark;
- ``session-start``: :meth:`LiveSync.warm`, at most once per non-empty session key;
- ``boot``: one sync right after start.

Degradation: when the watcher falls back to polling (dead observer thread, inotify limit) or
cannot start at all, :attr:`LiveSync.degraded_reason` is ``"watcher degraded: <cause>"`` until
the next successful rescan; the engine reports it as ``dirty``/``dirty_reason``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from fallback.errors import MemorySearchError
from fallback.settings import EngineSettings
from fallback.sources.transcripts import SessionDeltaTracker

if TYPE_CHECKING:
    from fallback.index.indexer import SyncReport
    from fallback.sources.watcher import MemoryWatcher

__all__ = ["LiveSync", "Syncable"]


class Syncable(Protocol):
    """What live mode needs of an engine (``BuiltinEngine`` implements it)."""

    settings: EngineSettings

    def mark_dirty(self, reason: str = ...) -> None:
        """Mark the index stale; the next search syncs first."""

    async def sync(self, *, reason: str, force: bool = ...,
                   paths: set[str] | None = ...) -> SyncReport:
        """Bring the index up to date (joins a running sync)."""

    async def sync_after_running(self, *, reason: str,
                                 paths: set[str] | None = ...) -> SyncReport:
        """Let a running sync finish, then sync again."""

    async def rescan(self) -> SyncReport:
        """The safety-net rescan."""

log = logging.getLogger(__name__)

# Pending-set marker the watcher adds when it degraded (events may have been lost).
_RESCAN_MARKER = "<rescan>"


class LiveSync:
    """Background freshness for one engine (a :class:`Syncable`, e.g. ``BuiltinEngine``).

    Args:
        engine: the engine to keep fresh (its ``settings``, ``mark_dirty``, ``sync``,
            ``sync_after_running`` and ``rescan`` are used).
        session_batch_ms: transcript event batch window in ms (spec: 5,000).
        rescan_interval_ms: period of the safety-net rescan in ms (0 = off).
        force_polling: start the watcher with watchdog's polling observer.
        poll_interval_s: polling observer period in seconds.
    """

    def __init__(self, engine: Syncable, *, session_batch_ms: int = 5000,
                 rescan_interval_ms: int = 300_000, force_polling: bool = False,
                 poll_interval_s: float = 1.0) -> None:
        self._engine = engine
        self.session_batch_ms = max(0, session_batch_ms)
        self.rescan_interval_ms = max(0, rescan_interval_ms)
        self.force_polling = force_polling
        self.poll_interval_s = poll_interval_s
        sync = engine.settings.search.sync
        self.tracker = SessionDeltaTracker(sync.sessions.delta_bytes, sync.sessions.delta_messages)
        self.watcher: MemoryWatcher | None = None
        self.sync_counts: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._session_pending: set[str] = set()
        self._session_timer = False
        self._warmed: set[str] = set()
        self._degraded: str | None = None
        self._seen_cause: str | None = None
        self._started = False
        self._closed = False

    @property
    def sessions_enabled(self) -> bool:
        """Whether the engine indexes the ``sessions`` source."""
        return "sessions" in self._engine.settings.search.sources

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the watcher (waits until it runs), the timers and a background boot sync.

        Idempotent. A watcher that cannot start at all is not an error: the state is marked
        degraded and the rescan and interval timers keep the index correct.
        """
        if self._started or self._closed:
            return
        self._started = True
        settings = self._engine.settings
        sync = settings.search.sync
        if sync.watch:
            from fallback.sources.watcher import MemoryWatcher

            sessions_dir = settings.sessions_dir if self.sessions_enabled else None
            if sessions_dir is not None:
                await anyio.to_thread.run_sync(
                    lambda: sessions_dir.mkdir(parents=True, exist_ok=True))
            self.watcher = MemoryWatcher(
                settings.workspace_dir,
                extra_paths=settings.search.extra_paths,
                sessions_dir=sessions_dir, on_change=self._on_change,
                debounce_ms=sync.watch_debounce_ms, rescan_interval_ms=0,
                force_polling=self.force_polling, poll_interval_s=self.poll_interval_s)
            started = anyio.Event()
            self._spawn(lambda: self._run_watcher(started), "watcher")
            await started.wait()
        if sync.interval_minutes > 0:
            self._spawn(lambda: self._every(sync.interval_minutes * 60_000, "interval"),
                        "interval sync")
        if self.rescan_interval_ms > 0:
            self._spawn(lambda: self._every(self.rescan_interval_ms, "rescan"), "rescan")
        self.spawn_sync("boot")

    async def close(self) -> None:
        """Cancel every background task and wait for all of them (observers joined); idempotent."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- background tasks ---------------------------------------------------------------------

    def _spawn(self, factory: Callable[[], Coroutine[Any, Any, Any]], what: str) -> asyncio.Task[Any]:
        async def guarded() -> None:
            try:
                await factory()
            except MemorySearchError as exc:
                log.warning("memory %s failed: %s", what, exc)

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def spawn_sync(self, reason: str) -> anyio.Event:
        """Run ``engine.sync(reason=reason)`` in the background (joining a running sync).

        Returns:
            An event set when that sync finished (successfully or not); a search waits on it
            for at most its budget.
        """
        done = anyio.Event()
        if self._closed:
            done.set()
            return done

        async def run() -> None:
            try:
                await self._engine.sync(reason=reason)
                self.sync_counts[reason] += 1
            finally:
                done.set()

        self._spawn(run, f"{reason} sync")
        return done

    async def _run_watcher(self, started: anyio.Event) -> None:
        assert self.watcher is not None
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(self.watcher.run)
                started.set()
        except OSError as exc:
            self._degraded = f"watcher degraded: watcher failed to start: {exc}"
            log.warning("memory %s", self._degraded)
        finally:
            started.set()

    async def _every(self, period_ms: float, reason: str) -> None:
        while True:
            await anyio.sleep(period_ms / 1000)
            try:
                if reason == "rescan":
                    await self._engine.rescan()
                else:
                    await self._engine.sync_after_running(reason=reason)
                self.sync_counts[reason] += 1
            except MemorySearchError as exc:
                log.warning("memory %s sync failed: %s", reason, exc)

    # -- watcher events -----------------------------------------------------------------------

    async def _on_change(self, paths: set[str], reason: str) -> None:
        """Watcher callback: split transcript events from memory events."""
        self._check_degraded()
        sessions_dir = self._engine.settings.sessions_dir
        session_paths = {p for p in paths if p != _RESCAN_MARKER and Path(p).parent == sessions_dir}
        memory_paths = paths - session_paths
        if session_paths and self.sessions_enabled:
            self._queue_sessions(session_paths)
        if memory_paths:
            changed = len(memory_paths - {_RESCAN_MARKER})
            self._engine.mark_dirty(self._degraded if _RESCAN_MARKER in memory_paths and
                                    self._degraded else f"files changed: {changed}")
            changed_paths = None if _RESCAN_MARKER in memory_paths else set(memory_paths)
            await self._engine.sync_after_running(reason="watch", paths=changed_paths)
            self.sync_counts["watch"] += 1

    def _queue_sessions(self, paths: set[str]) -> None:
        self._session_pending |= paths
        if not self._session_timer:
            self._session_timer = True
            self._spawn(self._session_batch, "session-delta sync")

    async def _session_batch(self) -> None:
        try:
            await anyio.sleep(self.session_batch_ms / 1000)
        finally:
            self._session_timer = False
        batch, self._session_pending = self._session_pending, set()
        hits = [p for p in sorted(batch)
                if await anyio.to_thread.run_sync(self.tracker.observe, Path(p))]
        if hits:
            self._engine.mark_dirty(f"session transcripts changed: {len(hits)}")
            await self._engine.sync_after_running(reason="session-delta")
            self.sync_counts["session-delta"] += 1

    def after_sync(self, report: SyncReport) -> None:
        """Reset the delta tracker to the sizes the index now holds (spec §5.4)."""
        for path, size in report.session_sizes.items():
            self.tracker.reset(Path(path), size)

    # -- session warm-up and health -----------------------------------------------------------

    def warm(self, session_key: str | None) -> None:
        """Fire-and-forget ``sync("session-start")`` once per non-empty key (``sync.onSessionStart``)."""
        key = (session_key or "").strip()
        if (not key or key in self._warmed or self._closed
                or not self._engine.settings.search.sync.on_session_start):
            return
        self._warmed.add(key)
        self.spawn_sync("session-start")

    def _check_degraded(self) -> None:
        cause = self.watcher.state.degraded_reason if self.watcher is not None else None
        if cause is not None and cause != self._seen_cause:
            self._seen_cause = cause
            self._degraded = f"watcher degraded: {cause}"
            log.warning("memory %s; polling and periodic rescans keep the index fresh",
                        self._degraded)

    def rescanned(self) -> None:
        """Called after a successful rescan sync: the index is known correct again."""
        self._check_degraded()
        self._degraded = None

    @property
    def degraded_reason(self) -> str | None:
        """``"watcher degraded: <cause>"`` until the next successful rescan, else ``None``."""
        self._check_degraded()
        return self._degraded

    def status_custom(self) -> dict[str, Any]:
        """Entries for ``MemoryStatus.custom``: ``{"watcher": MemoryWatcher.snapshot() | None,
        "live": {"degraded", "syncs": {reason: count}, "sessionsPending"}}``."""
        return {"watcher": self.watcher.snapshot() if self.watcher is not None else None,
                "live": {"degraded": self.degraded_reason, "syncs": dict(self.sync_counts),
                         "sessionsPending": len(self._session_pending)}}

"""Live mode of the builtin engine (``serve``, spec §5.1/§5.2): watcher, session deltas,
interval, rescan, session-start and boot syncs, in a subgroup of the manager's task group, each
reported and retried with backoff there (docs/architecture.md "Background work and deadlines").
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from fallback.background import BackgroundTasks
from fallback.sources.transcripts import SessionDeltaTracker
from fallback.sources.watcher import DEAD_WATCHER, RESCAN_MARKER, MemoryWatcher
from fallback.text.counts import counted

if TYPE_CHECKING:
    from fallback.engine.builtin import BuiltinEngine
    from fallback.index.indexer import SyncReport

__all__ = ["LiveSnapshot", "LiveSync"]


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveSnapshot:
    """What ``status()`` reports of live mode (:meth:`LiveSync.snapshot`)."""

    degraded_reason: str | None
    custom: dict[str, Any]
    stale_reason: str | None = None


class LiveSync:
    """Background freshness for ``engine`` in ``tasks`` (a subgroup of the manager's task group),
    timed by its live-mode attributes (``session_batch_ms``, ``rescan_interval_ms``, ``watch_*``)."""

    def __init__(self, engine: BuiltinEngine, tasks: BackgroundTasks) -> None:
        self._engine = engine
        self._tasks = tasks
        self.session_batch_ms = max(0, engine.session_batch_ms)
        self.rescan_interval_ms = max(0, engine.rescan_interval_ms)
        sync = engine.settings.search.sync
        self.tracker = SessionDeltaTracker(sync.sessions.delta_bytes, sync.sessions.delta_messages)
        self.watcher: MemoryWatcher | None = None
        self.sync_counts: Counter[str] = Counter()
        self._sync_done: dict[str, anyio.Event] = {}
        self._session_pending: set[str] = set()
        self._session_sync_due = False
        self._warmed: set[str] = set()
        self._degraded: str | None = None
        self._rearms_synced = 0
        self._events_searched = 0  # the watcher's event count a search last synced for
        self._closed = False

    @property
    def sessions_enabled(self) -> bool:
        """Whether the engine indexes the ``sessions`` source."""
        return "sessions" in self._engine.settings.search.sources

    async def start(self) -> None:
        """Start the watcher (waits until it runs), the timers and a background boot sync; called
        once. A watcher that cannot start marks the state degraded. Raises ``UsageError``."""
        tasks = self._tasks
        settings = self._engine.settings
        sync = settings.search.sync
        if sync.watch:
            sessions_dir = settings.sessions_dir if self.sessions_enabled else None
            if sessions_dir is not None:
                await anyio.to_thread.run_sync(
                    lambda: sessions_dir.mkdir(parents=True, exist_ok=True))
            self.watcher = MemoryWatcher(
                settings.workspace_dir,
                extra_paths=settings.search.extra_paths,
                sessions_dir=sessions_dir, on_change=self._on_change,
                debounce_ms=sync.watch_debounce_ms,
                force_polling=self._engine.watch_force_polling,
                poll_interval_s=self._engine.watch_poll_interval_s,
                retry=tasks.policy, on_error=self._watch_failed,
                health_check_ms=self._engine.watch_health_check_ms)
            try:
                await tasks.start("file watcher", self.watcher.run)
            except OSError as exc:
                self._degraded = f"watcher degraded: watcher failed to start: {exc}"
                log.warning("memory %s", self._degraded)
        if sync.interval_minutes > 0:
            tasks.every("interval sync", int(sync.interval_minutes * 60_000), self._interval_tick)
        if self.rescan_interval_ms > 0:
            tasks.every("rescan", self.rescan_interval_ms, self._rescan_tick)
        self.spawn_sync("boot")

    async def close(self) -> None:
        """Cancel every live-mode task and wait for all of them (observers joined); idempotent."""
        self._closed = True
        await self._tasks.aclose()

    async def _interval_tick(self) -> None:
        report = await self._engine.sync_after_running(reason="interval")
        self.sync_counts["interval"] += 1
        _raise_embedding_failure(report)

    async def _rescan_tick(self) -> None:
        """The safety-net rescan; on success a degraded-watcher mark is cleared."""
        await self._engine.sync_after_running(reason="rescan")
        self._degraded = None  # the index is known correct again
        if self.watcher is not None:
            self._rearms_synced = self.watcher.state.rearms
        self.sync_counts["rescan"] += 1

    def spawn_sync(self, reason: str) -> anyio.Event:
        """Run ``engine.sync(reason=reason)`` in the background, unless one of the same reason
        is running or waiting to retry; returns an event set when its first attempt finished."""
        done = anyio.Event()
        tasks = self._tasks
        if self._closed or not tasks.is_open:
            done.set()
            return done
        name = f"{reason} sync"
        previous = self._sync_done.get(reason)
        if previous is not None and tasks.is_active(name):
            return previous

        async def run() -> None:
            try:
                report = await self._engine.sync(reason=reason)
                self.sync_counts[reason] += 1
            finally:
                done.set()
            _raise_embedding_failure(report)

        self._sync_done[reason] = done
        if not tasks.start_soon(name, run, dedupe=True):
            done.set()
        return done

    def _watch_failed(self, exc: BaseException, failures: int, retry_in_ms: int) -> None:
        self._tasks.report("watch sync", exc, failures=failures, retry_in_ms=retry_in_ms)

    async def _on_change(self, paths: set[str], reason: str) -> None:
        """Watcher callback: split transcript events from memory events; raises on failure
        (the watcher retries after its backoff)."""
        sessions_dir = self._engine.settings.sessions_dir
        session_paths = {p for p in paths if p != RESCAN_MARKER and Path(p).parent == sessions_dir}
        memory_paths = paths - session_paths
        if session_paths and self.sessions_enabled:
            self._session_pending |= session_paths
            if not self._closed:
                self._tasks.start_soon("session-delta sync", self._session_batch, dedupe=True)
        if memory_paths:
            rescan = RESCAN_MARKER in memory_paths
            rearms = self.watcher.state.rearms if self.watcher is not None else 0
            changed = len(memory_paths - {RESCAN_MARKER})
            self._engine.mark_dirty(self.degraded_reason if rescan and self.degraded_reason
                                    else f"files changed: {changed}")
            await self._engine.sync_after_running(reason="watch",
                                                  paths=None if rescan else set(memory_paths))
            self.sync_counts["watch"] += 1
            failures = self.watcher.state.failures if self.watcher is not None else 0
            if failures:  # the retry of a failed sync worked
                self._tasks.recovered("watch sync", failures)
            if rescan:
                self._rearms_synced = max(self._rearms_synced, rearms)

    async def _session_batch(self) -> None:
        await anyio.sleep(self.session_batch_ms / 1000)
        batch, self._session_pending = self._session_pending, set()
        hits = [p for p in sorted(batch)
                if await anyio.to_thread.run_sync(self.tracker.observe, Path(p))]
        if hits:
            self._session_sync_due = True
            self._engine.mark_dirty(f"session transcripts changed: {len(hits)}")
        if self._session_sync_due:
            await self._engine.sync_after_running(reason="session-delta")
            self._session_sync_due = False
            self.sync_counts["session-delta"] += 1

    def after_sync(self, report: SyncReport) -> None:
        """Reset the delta tracker to the sizes the index now holds (spec §5.4); a transcript
        waiting for the batch window that the sync indexed as it is now waits no more."""
        for path, size in report.session_sizes.items():
            self.tracker.reset(Path(path), size)
            if path in self._session_pending and _size(path) == size:
                self._session_pending.discard(path)

    def warm(self, session_key: str | None) -> None:
        """Fire-and-forget ``sync("session-start")`` once per non-empty key (``sync.onSessionStart``)."""
        key = self._unwarmed(session_key)
        if key is not None:
            self._warmed.add(key)
            self.spawn_sync("session-start")

    def _unwarmed(self, session_key: str | None) -> str | None:
        """The stripped ``session_key`` when :meth:`warm` would sync for it, else ``None``."""
        key = (session_key or "").strip()
        if (not key or key in self._warmed or self._closed
                or not self._engine.settings.search.sync.on_session_start):
            return None
        return key

    def quiet(self, session_key: str | None) -> bool:
        """Whether a search of ``session_key`` needs none of live mode's pre-search steps
        (watcher healthy, no new event, key warmed). Reads only: callable from any thread."""
        watcher = self.watcher
        return (self._unwarmed(session_key) is None and (watcher is None or self._closed or (
            watcher.dead_reason() is None and watcher.unsent()[0] <= self._events_searched)))

    def check_watcher(self) -> str | None:
        """When the watcher is dead, re-arm it in the background and return why
        (``watcher.DEAD_WATCHER``); ``None`` when it is healthy or absent."""
        if self.watcher is None or self._closed:
            return None
        return self.watcher.rearm_if_dead(self._tasks, "memory")

    def unsynced_changes(self) -> int:
        """Memory paths the watcher holds in its debounce, counted once per new event (a search
        then syncs first); 0 when no event is new since the last call that returned more."""
        if self._closed:
            return 0
        events, changed = self._memory_unsent(rescan=True)
        if changed:
            self._events_searched = events
        return changed

    def _memory_unsent(self, *, rescan: bool) -> tuple[int, int]:
        """``(watcher events seen, memory paths it holds unsent)``; the paths count 0 when no
        event is new since a search last synced (``rescan``: the rescan marker counts too)."""
        if self.watcher is None:
            return 0, 0
        events, pending = self.watcher.unsent()
        sessions_dir = self._engine.settings.sessions_dir
        memory = [p for p in pending if p == RESCAN_MARKER or Path(p).parent != sessions_dir]
        count = len(memory) if rescan else sum(1 for p in memory if p != RESCAN_MARKER)
        return events, 0 if events <= self._events_searched else count

    def snapshot(self, dead: str | None = None) -> LiveSnapshot:
        """The live part of a status (``dead``: what :meth:`check_watcher` just found); its
        ``custom``: ``{"watcher": MemoryWatcher.snapshot() | None, "live": {"degraded", "syncs":
        {reason: count}, "sessionsPending", "stale"}}``."""
        degraded = dead or self.degraded_reason
        stale = self.stale_reason()
        return LiveSnapshot(degraded, {
            "watcher": self.watcher.snapshot() if self.watcher is not None else None,
            "live": {"degraded": degraded, "syncs": dict(self.sync_counts),
                     "sessionsPending": len(self._session_pending), "stale": stale}}, stale)

    def stale_reason(self, *, memory: bool = True, below_delta: bool = True) -> str | None:
        """Changes live mode has seen and the index does not hold yet, in words, or ``None``:
        transcripts in the batch window, a session-delta sync due, (``below_delta``) transcripts
        grown below ``sync.sessions.deltaBytes``/``deltaMessages``, and (``memory``) memory
        files the watcher holds that no search has synced."""
        parts: list[str] = []
        if self._session_pending:
            parts.append(f"{len(self._session_pending)} transcripts changed and wait for the "
                         f"session batch window ({self.session_batch_ms} ms)")
        if self._session_sync_due:
            parts.append("a session-delta sync is due")
        grown = self.tracker.below_threshold() if below_delta else 0
        if grown:
            parts.append(f"new lines of {counted(grown, 'transcript')} are below "
                         "sync.sessions.deltaBytes/deltaMessages (indexed once they reach one, "
                         "or by the next sync)")
        files = self._memory_unsent(rescan=False)[1] if memory else 0
        if files:
            parts.append(f"{counted(files, 'changed memory file', 'wait')} for the watch debounce")
        return "; ".join(parts) or None

    @property
    def degraded_reason(self) -> str | None:
        """``"watcher dead: <cause>; re-arming"``, ``"watcher re-armed after: <cause>; rescan
        pending"``, ``"watcher degraded: <cause>"`` or ``None``."""
        watcher = self.watcher
        if watcher is not None:
            dead = watcher.dead_reason()
            if dead is not None:
                return DEAD_WATCHER.format(cause=dead)
            last = watcher.state.last_rearm
            if watcher.state.rearms > self._rearms_synced and last is not None:
                return f"watcher re-armed after: {last['cause']}; rescan pending"
        return self._degraded


def _size(path: str) -> int | None:
    """The file's size in bytes, or ``None`` when it cannot be stat'ed."""
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _raise_embedding_failure(report: SyncReport) -> None:
    """Raise the provider error a background sync absorbed, so the supervisor reports it and
    retries. Raises ``EmbeddingProviderError``."""
    if report.embedding_exception is not None:
        raise report.embedding_exception

"""Freshness of the qmd index in the long-lived mode: file watcher -> debounced ``qmd update``.

A :class:`~fallback.sources.watcher.MemoryWatcher` watches the workspace's memory files and every
custom collection folder (spec 2.7.6). A change marks the index dirty and, once the files have
been quiet for ``sync.watchDebounceMs``, runs an unforced update; within ``update.debounceMs``
of the last update it waits for the rest of that window instead of being dropped.
:meth:`QmdFreshness.before_search` (with ``sync.onSearch``) waits for an update that runs or
starts within the search's wait, never past its deadline; an update the debounce defers past
that wait is not waited for. :meth:`QmdFreshness.check_watcher` re-arms a dead watcher in the
background. Everything runs in the backend's subgroup of the manager's
:class:`~fallback.background.BackgroundTasks`: a failed update is logged once, shown in
``status().background`` and retried with backoff (the watcher keeps the changed paths).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from fallback.background import BackgroundTasks
from fallback.settings import ExtraPath

__all__ = ["QmdFreshness", "start_background"]

log = logging.getLogger("qmdbridge.qmd.backend")


class QmdFreshness:
    """Watcher-driven updates for one qmd backend.

    Args:
        workspace: the agent workspace (``MEMORY.md``, ``memory/``).
        extra_dirs: the custom collections as the memory-file rule's extra paths (folder and
            pattern), so the watcher sees exactly the files qmd indexes.
        cycle: the backend's ``UpdateCycle`` (``run(reason, force=...)``, ``last_update_at``).
        watch_debounce_ms: quiet time after the last change before updating (1,500 ms).
        update_debounce_ms: minimum distance between two unforced updates (15,000 ms).
        now_ms: clock in epoch ms.
        tasks: where the re-arm of a dead watcher runs and failures are reported.
        force_polling: use the polling observer (tests, network file systems).
    """

    def __init__(self, workspace: Path, *, extra_dirs: Sequence[ExtraPath | Path], cycle: Any,
                 watch_debounce_ms: int, update_debounce_ms: int, now_ms: Callable[[], int],
                 tasks: BackgroundTasks, force_polling: bool = False) -> None:
        from fallback.sources.watcher import MemoryWatcher

        self.cycle = cycle
        self.tasks = tasks
        self.update_debounce_ms = max(0, update_debounce_ms)
        self._now = now_ms
        self.dirty = False
        self.dirty_reason: str | None = None
        self.last_error: str | None = None
        # When the watcher's pending update starts (epoch ms; it may run already), else None.
        self._update_at_ms: int | None = None
        self._settled = anyio.Event()  # set when the pending update ends, done or failed
        self.watcher = MemoryWatcher(workspace, extra_paths=extra_dirs, on_change=self._on_change,
                                     debounce_ms=watch_debounce_ms, force_polling=force_polling,
                                     retry=tasks.policy, on_error=self._update_failed)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled (``task_status.started()`` once the observer runs)."""
        await self.watcher.run(task_status=task_status)

    async def _on_change(self, paths: set[str], reason: str) -> None:
        """Watcher callback; raises when the update fails (the watcher keeps the paths and
        retries after its backoff)."""
        from fallback.sources.watcher import RESCAN_MARKER

        files = paths - {RESCAN_MARKER}
        self.dirty = True
        self.dirty_reason = f"{len(files)} file(s) changed" if files else "rescan"
        last = self.cycle.last_update_at
        wait_ms = 0 if last is None else max(0, self.update_debounce_ms - (self._now() - last))
        self._update_at_ms = self._now() + wait_ms
        try:
            if wait_ms > 0:
                await anyio.sleep(wait_ms / 1000)
            await self.cycle.run("watch")
        finally:
            self._update_at_ms = None
            self._settled.set()
            self._settled = anyio.Event()
        self.dirty = False
        self.dirty_reason = None
        self.last_error = None
        if self.watcher.state.failures:  # the retry of a failed update worked
            self.tasks.recovered("watch update", self.watcher.state.failures)

    def _update_failed(self, exc: BaseException, failures: int, retry_in_ms: int) -> None:
        self.last_error = str(exc)
        self.tasks.report("watch update", exc, failures=failures, retry_in_ms=retry_in_ms)

    def check_watcher(self) -> str | None:
        """Look at the watcher's health (every search and status): when it is dead, re-arm it
        in the background and return the cause; ``None`` when it is healthy."""
        watcher = self.watcher
        cause = watcher.dead_reason()
        if cause is not None:
            self.dirty = True
            self.dirty_reason = f"watcher dead: {cause}"
            if self.tasks.is_open and not self.tasks.is_active("watcher re-arm"):
                log.warning("qmd file watcher is dead (%s); re-arming it", cause)
                self.tasks.start_soon("watcher re-arm",
                                      lambda: anyio.to_thread.run_sync(watcher.rearm))
        return cause

    def _update_due_in_ms(self) -> int | None:
        """ms until the next watcher update starts (0: it runs already), or ``None`` when none
        is coming: the update being waited for or run, else that of changes the watcher has
        seen but not handed over yet (its quiet time, ``sync.watchDebounceMs``, then
        ``update.debounceMs`` after the last update)."""
        now = self._now()
        if self._update_at_ms is not None:
            return max(0, self._update_at_ms - now)
        delivery = self.watcher.pending_delivery_in_ms()
        if delivery is None:
            return None
        last = self.cycle.last_update_at
        debounce_left = 0 if last is None else self.update_debounce_ms - (now - last)
        return max(delivery, debounce_left, 0)

    async def before_search(self, *, budget_ms: int) -> None:
        """Wait at most ``budget_ms`` (ms) for the watcher's update when one runs or starts
        within ``budget_ms``: that of a change already handed over (the index is dirty), or of
        a change the watcher has seen whose quiet time has not passed yet (a note saved just
        before the search). Return at once when the update starts later (``update.debounceMs``
        defers it) or none is coming (a failed update waits for the watcher's retry). The wait
        ends when no update is due within what is left of ``budget_ms`` any more (each one
        ends done or failed)."""
        if budget_ms <= 0:
            return
        deadline = anyio.current_time() + budget_ms / 1000
        with anyio.move_on_after(budget_ms / 1000):
            while True:
                due = self._update_due_in_ms()
                left_ms = (deadline - anyio.current_time()) * 1000
                if due is None or due >= left_ms:
                    return
                await self._settled.wait()

    def snapshot(self) -> dict[str, Any]:
        """Status view: dirty flag, reason, last error and the watcher's own state."""
        return {"dirty": self.dirty, "dirtyReason": self.dirty_reason, "lastError": self.last_error,
                "watcher": self.watcher.snapshot()}


def start_background(backend: Any, tasks: BackgroundTasks) -> QmdFreshness | None:
    """Start the long-lived mode's background work on ``backend`` (a ``QmdBackend``) in
    ``tasks``: the interval update (``update.interval``), the separate embed timer (spec 2.7.3:
    only when vectors are used and the update interval is off or longer than the embed
    interval), and the file watcher (``memorySearch.sync.watch``). A failed run is reported
    by ``tasks`` and the timers go on after ``max(period, backoff)``.

    Returns:
        The :class:`QmdFreshness` when the watcher runs, else ``None``.
    """
    from qmdbridge.qmd.update import embed_jitter_ms

    up = backend.cfg.update
    interval, embed_every = up.interval_ms, up.embed_interval_ms
    if interval > 0:
        tasks.every("interval update", interval, lambda: backend.cycle.run("interval"))
    if embed_every > 0 and backend.cfg.search_mode != "search" and (interval <= 0 or interval > embed_every):
        first = embed_jitter_ms(backend.agent.agent_id, [
            (str(c.path), c.pattern) for c in backend.collections if c.kind == "custom"], embed_every)
        tasks.every("embed-interval update", embed_every,
                    lambda: backend.cycle.run("embed-interval"), first_ms=first)
    sync = backend.agent.memory_search.sync
    if not sync.watch:
        return None
    freshness = QmdFreshness(
        backend.agent.workspace_dir,
        extra_dirs=[ExtraPath(path=str(c.path), pattern=c.pattern)
                    for c in backend.collections if c.kind == "custom"],
        cycle=backend.cycle, watch_debounce_ms=sync.watch_debounce_ms,
        update_debounce_ms=up.debounce_ms, now_ms=backend.now_ms, tasks=tasks)
    tasks.start_soon("file watcher", freshness.run)
    return freshness

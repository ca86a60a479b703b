"""Freshness of the qmd index in long-lived mode: file watcher -> debounced ``qmd update`` (spec 2.7.6)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from fallback.background import BackgroundTasks
from fallback.contract import STALE_WARNING
from fallback.index.racy import racily_clean
from fallback.settings import ExtraPath
from fallback.sources.watcher import RESCAN_MARKER, MemoryWatcher

__all__ = ["QmdFreshness"]

log = logging.getLogger("qmdbridge.qmd.backend")


class QmdFreshness:
    """Watcher-driven updates for one qmd backend: a change marks the index dirty and, once the files
    were quiet for ``watch_debounce_ms``, runs an unforced update (deferred within
    ``update_debounce_ms`` of the last one) by the backend's ``cycle``; a failure is reported by
    ``tasks`` (which also re-arm a dead watcher) and retried. ``extra_dirs``: the custom
    collections as extra paths; ``now_ms``: clock in epoch ms.
    """

    def __init__(self, workspace: Path, *, extra_dirs: Sequence[ExtraPath | Path], cycle: Any,
                 watch_debounce_ms: int, update_debounce_ms: int, now_ms: Callable[[], int],
                 tasks: BackgroundTasks) -> None:
        self.cycle = cycle
        self.tasks = tasks
        self.update_debounce_ms = max(0, update_debounce_ms)
        self._now = now_ms
        self._dirty = False
        self._reason: str | None = None
        self._batch: set[str] = set()  # the paths of the change being handled
        self.last_error: str | None = None
        # When the watcher's pending update starts (epoch ms; it may run already), else None.
        self._update_at_ms: int | None = None
        self._settled = anyio.Event()  # set when the pending update ends, done or failed
        self.watcher = MemoryWatcher(workspace, extra_paths=extra_dirs, on_change=self._on_change,
                                     debounce_ms=watch_debounce_ms, retry=tasks.policy,
                                     on_error=self._update_failed)

    @property
    def dirty(self) -> bool:
        """Whether a change the watcher saw may be missing from qmd's index: not once an update
        that began after it (a ``sync`` request's) has read it."""
        return self._dirty and not self._indexed(self._batch)

    @property
    def dirty_reason(self) -> str | None:
        """Why :attr:`dirty` (``1 file(s) changed``, ``rescan``, ``watcher dead: ...``), else ``None``."""
        return self._reason if self.dirty else None

    def _indexed(self, paths: set[str]) -> bool:
        """Whether the last completed update began clearly after each of ``paths`` last changed
        (not racily clean), so it read them: a ``sync`` request's update that ran after a save
        the watcher tells later. A path gone (when is unknown) or a rescan never is."""
        started = self.cycle.scan_started_ms
        if started is None or not paths or RESCAN_MARKER in paths:
            return False
        for path in paths:
            try:
                st = os.lstat(path)
            except OSError:
                return False
            if racily_clean(max(st.st_mtime_ns, st.st_ctime_ns), started):
                return False
        return True

    async def _on_change(self, paths: set[str], reason: str) -> None:
        """Watcher callback; raises when the update fails (the watcher keeps the paths and retries)."""
        files = paths - {RESCAN_MARKER}
        self._dirty, self._batch = True, paths
        self._reason = f"{len(files)} file(s) changed" if files else "rescan"
        last = self.cycle.last_update_at
        wait_ms = 0 if last is None else max(0, self.update_debounce_ms - (self._now() - last))
        self._update_at_ms = self._now() + wait_ms
        try:
            if wait_ms > 0:
                await anyio.sleep(wait_ms / 1000)
            if not self._indexed(paths):  # else a sync's update read them meanwhile
                await self.cycle.run("watch")
        finally:
            self._update_at_ms = None
            self._settled.set()
            self._settled = anyio.Event()
        self._dirty, self._batch, self._reason = False, set(), None
        self.last_error = None
        if self.watcher.state.failures:  # the retry of a failed update worked
            self.tasks.recovered("watch update", self.watcher.state.failures)

    def _update_failed(self, exc: BaseException, failures: int, retry_in_ms: int) -> None:
        self.last_error = str(exc)
        self.tasks.report("watch update", exc, failures=failures, retry_in_ms=retry_in_ms)

    def check_watcher(self) -> str | None:
        """Re-arm a dead watcher in the background and return why (the dirty reason,
        ``watcher.DEAD_WATCHER``); ``None`` when it is healthy."""
        dead = self.watcher.rearm_if_dead(self.tasks, "qmd")
        if dead is not None:
            self._dirty, self._batch, self._reason = True, {RESCAN_MARKER}, dead
        return dead

    def _update_due_in_ms(self) -> int | None:
        """ms until the next watcher update starts (0: running), or ``None`` when none is coming."""
        now = self._now()
        if self._update_at_ms is not None and not self._indexed(self._batch):
            return max(0, self._update_at_ms - now)
        delivery = self.watcher.pending_delivery_in_ms()
        if delivery is None or self._indexed(self.watcher.unsent()[1]):
            return None
        last = self.cycle.last_update_at
        debounce_left = 0 if last is None else self.update_debounce_ms - (now - last)
        return max(delivery, debounce_left, 0)

    async def before_search(self, *, budget_ms: int) -> None:
        """Wait at most ``budget_ms`` (ms) for a watcher update that runs or starts within it; return
        at once when none is due in what is left of the budget."""
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

    def stale_warning(self) -> str | None:
        """The warning of an answer given while a watcher update is due, running or failed (the
        index may miss the newest content), or ``None`` when the index holds what was seen."""
        if not self.dirty and self._update_due_in_ms() is None:
            return None
        return STALE_WARNING.format(reason=f"{self._reason or 'memory files changed'}; qmd's update is still due")

    def snapshot(self) -> dict[str, Any]:
        """Status view: dirty flag, reason, last error and the watcher's own state."""
        return {"dirty": self.dirty, "dirtyReason": self.dirty_reason, "lastError": self.last_error,
                "watcher": self.watcher.snapshot()}

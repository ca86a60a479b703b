"""File watcher for memory files: watchdog observers, debounced hand-off to the event loop.

What is watched and which changes matter is decided by the memory-file rule
(:func:`fallback.sources.memory_files.memory_roots`). watchdog calls
:meth:`MemoryWatcher.dispatch` on its own thread, which only records the path and pokes the
loop; the debounce and the callback run in the async core. Health: docs/architecture.md
("Background work and deadlines").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.lowlevel import current_token

from fallback.background import BackgroundTasks, RetryPolicy, describe_error
from fallback.errors import ManagerClosedError, MemorySearchError
from fallback.sources.memory_files import (
    LEGACY_ROOT_MEMORY_FILE,
    MEMORY_DIR_NAME,
    ROOT_MEMORY_FILE,
    SKIP_DIR_NAMES,
    ExtraPathEntry,
    RootFile,
    is_excluded,
    memory_roots,
)
from fallback.sources.transcripts import is_transcript_name

__all__ = ["DEAD_WATCHER", "MAX_WATCH_DEPTH", "MemoryWatcher", "RESCAN_MARKER", "WatchState"]

# How often the run loop looks at the observer's health, in ms (searches and status look too).
HEALTH_CHECK_MS = 1000
# A watched folder changed this long ago (ms) with no event since means the observer missed it
# (polling adds three of its periods).
MISSED_GRACE_MS = 3000
# Pending-set marker for "events may have been lost: rescan everything".
RESCAN_MARKER = "<rescan>"
# How both backends tell a dead watcher (a status's dirty reason, a search's stale warning).
DEAD_WATCHER = "watcher dead: {cause}; re-arming"
# The polling observer descends at most this many folders below a watched root (the periodic
# rescan of the watcher's owner finds changes deeper down).
MAX_WATCH_DEPTH = 12

log = logging.getLogger(__name__)


@dataclass
class WatchState:
    """Observable state of a watcher (``status()``; :meth:`MemoryWatcher.snapshot` names the
    fields): ``mode`` is ``native``, ``polling`` or ``stopped``; times are epoch ms;
    ``last_rearm`` is ``{"cause", "atMs", "mode"}``."""

    mode: str = "stopped"
    degraded_reason: str | None = None
    pending: set[str] = field(default_factory=set)
    events: int = 0
    last_event_ms: int | None = None
    last_error: str | None = None
    failures: int = 0
    retry_at_ms: int | None = None
    rearms: int = 0
    last_rearm: dict[str, Any] | None = None


class MemoryWatcher:
    """Watches memory files and calls ``on_change(paths, reason)`` after a quiet period.

    Args:
        workspace: the agent workspace.
        extra_paths: extra paths as configured.
        sessions_dir: folder of ``*.jsonl`` transcripts to watch too, or ``None``.
        on_change: async callback ``(changed_paths, "watch")``; ``changed_paths`` holds
            :data:`RESCAN_MARKER` when events may have been lost.
        debounce_ms: quiet time after the last change before the callback runs, in ms.
        force_polling: start with the polling observer.
        poll_interval_s: polling observer period, in seconds.
        retry: delays before a failed batch is delivered again.
        on_error: ``on_error(exc, failures, retry_in_ms)`` after each failed delivery
            (``None``: the watcher logs it).
        health_check_ms: period of the run loop's own health check, in ms.
    """

    def __init__(self, workspace: Path, *, extra_paths: Sequence[ExtraPathEntry | Path] | None = None,
                 sessions_dir: Path | None = None,
                 on_change: Callable[[set[str], str], Awaitable[None]],
                 debounce_ms: int = 1500, force_polling: bool = False, poll_interval_s: float = 1.0,
                 retry: RetryPolicy | None = None,
                 on_error: Callable[[BaseException, int, int], None] | None = None,
                 health_check_ms: int = HEALTH_CHECK_MS) -> None:
        self.workspace = workspace
        # The rule's places; the root file is matched by name (both names), so no listing.
        self.roots = memory_roots(workspace, [str(p) if isinstance(p, Path) else p
                                              for p in extra_paths or []], root=RootFile(None, False))
        self.sessions_dir = sessions_dir
        self.on_change = on_change
        self.debounce_ms = max(0, debounce_ms)
        self.force_polling = force_polling
        self.poll_interval_s = poll_interval_s
        self.retry = retry or RetryPolicy()
        self.on_error = on_error
        self.health_check_ms = max(1, health_check_ms)
        self.state = WatchState()
        self._lock = threading.Lock()  # state.pending and counters (watchdog's thread writes them)
        self._obs_lock = threading.Lock()  # self._observer and self._memory_watched
        self._rearm_lock = threading.Lock()  # one re-arm at a time
        self._retry_at_mono: float | None = None
        self._observer: Any = None
        self._memory_watched = False
        self._missing: list[Path] = []  # extra folders that did not exist when last scheduled
        self._token: Any = None
        self._wake: anyio.Event | None = None
        self._last_change_mono = 0.0
        # the folders watched, deepest first (the roots of list_folder's depth)
        watched = {str(workspace), str(workspace / MEMORY_DIR_NAME), *(str(r.path) for r in self.roots[2:])}
        self._watched_roots = sorted(watched | ({str(sessions_dir)} if sessions_dir else set()),
                                     key=len, reverse=True)
        self._heard_ns: dict[str, int] = {}  # folder -> when the observer last reported in it
        self._stamps: dict[str, int] = {}  # folder -> mtime (ns) known to be heard of
        self._subfolders: dict[str, tuple[int, list[str]]] = {}  # folder -> (mtime, subfolders)
        self._missed: str | None = None  # the deaf observer's cause, until it is re-armed

    def is_relevant(self, path: Path) -> bool:
        """Whether a changed path can affect the index, by the memory-file rule (a folder below
        a memory folder counts: it may take notes with it)."""
        if path.parent == self.workspace and path.name in (ROOT_MEMORY_FILE, LEGACY_ROOT_MEMORY_FILE,
                                                           MEMORY_DIR_NAME):
            return True
        for root in self.roots[1:]:
            if path == root.entry:
                return True
            if root.path not in path.parents:
                continue
            rel = path.relative_to(root.path).as_posix()
            if root.admits(rel):
                return True
            folder = path.suffix == "" or path.is_dir()  # a deleted folder cannot be stat'ed
            if folder and root.recursive and not is_excluded([*rel.split("/"), "-"]):
                return True
        if self.sessions_dir is not None and path.parent == self.sessions_dir:
            return is_transcript_name(path.name)
        return False

    def dispatch(self, event: Any) -> None:
        """watchdog's handler call (on its thread): note that the event's folders are not
        deaf, record the relevant paths, poke the loop."""
        now = time.time_ns()
        paths = [os.fsdecode(raw) for raw in (event.src_path, getattr(event, "dest_path", "") or "") if raw]
        for path in paths:  # any event at all: that folder is heard
            self._heard_ns[os.path.dirname(path)] = now
            if event.is_directory:
                self._heard_ns[path] = now
        if event.event_type in ("opened", "closed", "closed_no_write"):
            return
        if event.is_directory and event.event_type == "modified":
            return  # a folder "modified" only echoes the file events inside it
        for changed in map(Path, paths):
            if not self.is_relevant(changed):
                continue
            with self._lock:
                self.state.pending.add(str(changed))
                self.state.events += 1
                self.state.last_event_ms = int(time.time() * 1000)
            if (event.is_directory and event.event_type in ("created", "moved")
                    and changed == self.workspace / "memory"):
                self._schedule_memory_dir()
            self._poke()

    def _poke(self) -> None:
        if (token := self._token) is not None:
            with contextlib.suppress(RuntimeError):  # the loop is shutting down
                anyio.from_thread.run_sync(self._wake_loop, token=token)

    def _wake_loop(self) -> None:
        self._last_change_mono = time.monotonic()
        if self._wake is not None:
            self._wake.set()

    def list_folder(self, path: str | None) -> Iterator[os.DirEntry[str]]:
        """What the polling observer sees of one folder below a watched root (its
        ``listdir``): ``os.DirEntry`` items without hidden names, skipped folders, or any
        folder :data:`MAX_WATCH_DEPTH` below the root.

        Raises:
            OSError: ``path`` cannot be listed.
        """
        folder = os.fspath(path or ".")
        root = next((r for r in self._watched_roots
                     if folder == r or folder.startswith(r.rstrip(os.sep) + os.sep)), folder)
        depth = 0 if folder == root else folder[len(root):].strip(os.sep).count(os.sep) + 1
        keep: list[os.DirEntry[str]] = []
        with os.scandir(folder) as it:
            for entry in it:
                try:
                    if entry.name.startswith(".") or entry.is_dir(follow_symlinks=False) and (
                            entry.name in SKIP_DIR_NAMES or depth >= MAX_WATCH_DEPTH):
                        continue
                except OSError:
                    continue
                keep.append(entry)
        return iter(keep)

    def _new_observer(self, polling: bool) -> Any:
        if polling:
            from watchdog.observers.polling import PollingObserverVFS

            # lstat: symlinks are never followed (the memory-file rule), nor walked into
            return PollingObserverVFS(os.lstat, self.list_folder,
                                      polling_interval=self.poll_interval_s)
        from watchdog.observers import Observer

        return Observer()

    def _schedule_all(self, observer: Any) -> None:
        """Schedule every watch on ``observer`` (watchdog calls this watcher's :meth:`dispatch`)."""
        observer.schedule(self, str(self.workspace), recursive=False)
        mem = self.workspace / MEMORY_DIR_NAME
        self._memory_watched = mem.is_dir() and not mem.is_symlink()
        if self._memory_watched:
            observer.schedule(self, str(mem), recursive=True)
        self._missing = []
        for root in self.roots[2:]:
            if root.entry.is_symlink():
                continue
            if root.entry.is_dir():
                observer.schedule(self, str(root.entry), recursive=root.recursive)
            elif root.path.is_dir():
                observer.schedule(self, str(root.path), recursive=False)
            else:
                self._missing.append(root.path)  # watched once it exists (dead_reason looks)
        if self.sessions_dir is not None and self.sessions_dir.is_dir():
            observer.schedule(self, str(self.sessions_dir), recursive=False)

    def _schedule_memory_dir(self) -> None:
        mem = self.workspace / "memory"
        with self._obs_lock:
            if (obs := self._observer) is None or self._memory_watched or not mem.is_dir():
                return
            try:
                obs.schedule(self, str(mem), recursive=True)
                self._memory_watched = True
            except OSError as exc:
                self.state.degraded_reason = f"cannot watch {mem}: {exc}"

    def _launch(self, polling: bool) -> Any:
        """A new started observer with every watch scheduled (blocking); one that fails to
        start is stopped."""
        obs = self._new_observer(polling)
        try:
            self._schedule_all(obs)
            obs.start()
        except BaseException:
            obs.stop()
            with contextlib.suppress(RuntimeError):  # never started: nothing to join
                obs.join(timeout=5)
            raise
        return obs

    def _folder_stamps(self) -> dict[str, int]:
        """mtime (ns) of the watched folders (recursive roots with the folders below them, as
        :meth:`list_folder` lists them, again only when the mtime changed)."""
        stamps: dict[str, int] = {}
        flat = {str(self.workspace)} | ({str(self.sessions_dir)} if self.sessions_dir else set())
        flat |= {str(r.path) for r in self.roots[2:] if not r.recursive or r.entry != r.path}
        todo = list(self._watched_roots)
        while todo:
            folder = todo.pop()
            try:
                mtime = stamps[folder] = os.stat(folder).st_mtime_ns
                if folder in flat:
                    continue
                listed = self._subfolders.get(folder)
                if listed is None or listed[0] != mtime:
                    listed = (mtime, [e.path for e in self.list_folder(folder)
                                      if e.is_dir(follow_symlinks=False)])
                    self._subfolders[folder] = listed
                todo += listed[1]
            except OSError:
                continue
        return stamps

    def _missed_change(self) -> str | None:
        """``missed changes in <folder>`` for a watched folder whose mtime changed more than
        :data:`MISSED_GRACE_MS` ago with no event heard in it since (blocking)."""
        now = self._folder_stamps()
        polling_ms = 3 * self.poll_interval_s * 1000 if self.state.mode == "polling" else 0
        grace_ns = int((MISSED_GRACE_MS + polling_ms) * 1_000_000)
        missed: list[str] = []
        for folder, mtime in now.items():
            if self._stamps.get(folder) == mtime:
                continue
            if self._heard_ns.get(folder, 0) >= mtime or folder not in self._stamps:
                self._stamps[folder] = mtime  # heard of (or new: its parent tells the change)
            elif time.time_ns() - mtime >= grace_ns:
                missed.append(folder)
        if not missed:
            return None
        more = f" and {len(missed) - 1} more folders" if len(missed) > 1 else ""
        return f"missed changes in {min(missed)}{more}"

    def _install(self, polling: bool) -> bool:
        """Start an observer and make it this watcher's (blocking; a native one that cannot start
        falls back to polling); whether it polls. Raises as :meth:`run`."""
        if not self.workspace.is_dir():  # an expected state (deleted, unmounted): no traceback
            raise MemorySearchError(f"workspace {self.workspace} is missing: its memory files "
                                    "are watched again once it is back")
        try:
            obs = self._launch(polling)
        except OSError as exc:
            if polling:
                raise
            self.state.degraded_reason = ("inotify watch limit reached (raise fs.inotify.max_user_watches)"
                                          if exc.errno == errno.ENOSPC else f"native watcher failed: {exc}")
            obs, polling = self._launch(True), True
        with self._obs_lock:
            self._observer = obs
            self.state.mode = "polling" if polling else "native"
            self._missed = None
            self._stamps = self._folder_stamps()
        self._schedule_memory_dir()  # memory/ may have appeared while the observer started
        return polling

    def _stop_observer(self) -> None:
        with self._obs_lock:
            obs, self._observer = self._observer, None
        if obs is not None:
            with contextlib.suppress(RuntimeError):
                obs.stop()
                obs.join(timeout=5)

    def unsent(self) -> tuple[int, set[str]]:
        """``(events seen, changed paths not handed to the callback yet)``, read together."""
        with self._lock:
            return self.state.events, set(self.state.pending)

    def dead_reason(self) -> str | None:
        """Why the running watcher is deaf, or ``None`` when it is healthy (or not running):
        ``<mode> watcher thread died``, ``watch on <folder> stopped``, ``<folder> appeared``
        (an extra folder missing at start) or ``missed changes in <folder>``. A ``stat`` per
        watched folder."""
        if self.state.mode == "stopped" or (obs := self._observer) is None:  # None: being replaced
            return None
        if not obs.is_alive():
            return f"{self.state.mode} watcher thread died"
        try:
            emitters = list(obs.emitters)
        except RuntimeError:  # changed while we copied: look again next time
            return None
        for emitter in emitters:
            if not emitter.is_alive():
                return f"watch on {emitter.watch.path} stopped"
        for folder in self._missing:
            if folder.is_dir():
                return f"{folder} appeared"
        if self._missed is None:
            self._missed = self._missed_change()
        return self._missed

    def rearm_if_dead(self, tasks: BackgroundTasks, whose: str) -> str | None:
        """When the watcher is dead, :meth:`rearm` it on ``tasks`` (one re-arm at a time) and
        return :data:`DEAD_WATCHER` of the cause; ``None`` when it is healthy. ``whose`` names it
        in the log (``memory``, ``qmd``)."""
        cause = self.dead_reason()
        if cause is not None and tasks.is_open and not tasks.is_active("watcher re-arm"):
            log.warning("%s file watcher is dead (%s); re-arming it", whose, cause)
            tasks.start_soon("watcher re-arm", lambda: anyio.to_thread.run_sync(self.rearm))
        return None if cause is None else DEAD_WATCHER.format(cause=cause)

    def rearm(self) -> bool:
        """Replace a dead observer with a new one and queue a rescan (blocking); a dead native
        thread falls back to polling. Returns whether one was replaced."""
        with self._rearm_lock:
            cause = self.dead_reason()
            if cause is None:
                return False
            # a dead thread may die again: polling; a stopped watch: the same kind again
            polling = (self.force_polling or self.state.mode == "polling"
                       or cause.endswith("thread died"))
            self._stop_observer()
            if polling and self.state.mode != "polling" and not self.force_polling:
                self.state.degraded_reason = cause
            self._install(polling)
            with self._lock:
                self.state.rearms += 1
                self.state.last_rearm = {"cause": cause, "atMs": int(time.time() * 1000),
                                         "mode": self.state.mode}
                self.state.pending.add(RESCAN_MARKER)
            log.warning("memory file watcher re-armed (%s observer): %s; rescanning",
                        self.state.mode, cause)
        self._poke()
        return True

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled. Signals ``task_status.started()`` once the observer runs.

        Raises:
            MemorySearchError: the workspace folder is missing.
            OSError: no observer could be started (not even polling).
            ManagerClosedError: the callback's owner was closed.
        """
        self._token = current_token()
        self._wake = anyio.Event()
        if await anyio.to_thread.run_sync(self._install, self.force_polling) and not self.force_polling:
            with self._lock:  # a native observer failed: events may be lost, rescan
                self.state.pending.add(RESCAN_MARKER)
        task_status.started()
        next_health = time.monotonic() + self.health_check_ms / 1000
        try:
            while True:
                wake_at = [next_health]
                if self.state.pending and self._retry_at_mono is not None:
                    wake_at.append(self._retry_at_mono)
                with anyio.move_on_after(max(0.0, min(wake_at) - time.monotonic())):
                    await self._wake.wait()
                self._wake = anyio.Event()
                if self.dead_reason() is not None or time.monotonic() >= next_health:
                    next_health = time.monotonic() + self.health_check_ms / 1000
                    await anyio.to_thread.run_sync(self.rearm)
                retry_at = self._retry_at_mono
                if self.state.pending and (retry_at is None or time.monotonic() >= retry_at):
                    # trailing-edge debounce: wait until no event arrived for debounce_ms
                    while (left_s := self._quiet_left_s()) > 0:
                        await anyio.sleep(left_s)
                    with self._lock:
                        batch, self.state.pending = self.state.pending, set()
                    await self._deliver(batch)
        finally:
            self.state.mode = "stopped"
            self._token = None
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._stop_observer)

    async def _deliver(self, batch: set[str]) -> None:
        try:
            await self.on_change(batch, "watch")
        except Exception as exc:  # the watcher's edge: keep the batch, back off, report
            with self._lock:
                self.state.pending |= batch
            if isinstance(exc, ManagerClosedError):
                raise
            with self._lock:
                self.state.failures += 1
                failures = self.state.failures
            delay_ms = self.retry.delay_ms(failures)
            self._retry_at_mono = time.monotonic() + delay_ms / 1000
            self.state.retry_at_ms = int(time.time() * 1000) + delay_ms
            self.state.last_error = describe_error(exc)
            if self.on_error is not None:
                self.on_error(exc, failures, delay_ms)
            else:
                log.warning("memory watcher callback failed (%d in a row; retry in %gs): %s",
                            failures, delay_ms / 1000, self.state.last_error)
            return
        self._retry_at_mono = None
        self.state.failures = 0
        self.state.retry_at_ms = None
        self.state.last_error = None

    def pending_delivery_in_ms(self) -> int | None:
        """ms until the pending changes are handed to ``on_change`` (0: due now); ``None``
        when nothing is pending or a failed delivery waits for its retry."""
        with self._lock:
            if not self.state.pending or self._retry_at_mono is not None:
                return None
        return max(0, int(self._quiet_left_s() * 1000))

    def _quiet_left_s(self) -> float:
        """Seconds until ``debounce_ms`` have passed since the last change (<= 0: now)."""
        return self.debounce_ms / 1000 - (time.monotonic() - self._last_change_mono)

    def snapshot(self) -> dict[str, Any]:
        """Status view: ``{mode, alive, deadReason, degradedReason, pending, events,
        lastEventMs, lastError, failures, retryAtMs, rearms, lastRearm}``."""
        dead = self.dead_reason()
        with self._lock:
            st = self.state
            return {"mode": st.mode, "alive": st.mode != "stopped" and dead is None,
                    "deadReason": dead, "degradedReason": st.degraded_reason,
                    "pending": len(st.pending), "events": st.events,
                    "lastEventMs": st.last_event_ms, "lastError": st.last_error,
                    "failures": st.failures, "retryAtMs": st.retry_at_ms, "rearms": st.rearms,
                    "lastRearm": dict(st.last_rearm) if st.last_rearm else None}

"""File watcher for memory files: watchdog observers, debounced hand-off to the event loop.

What is watched (spec 5.2): the places of the memory-file rule
(:func:`fallback.sources.memory_files.memory_roots`), and which changes matter is decided by
that rule too:
- the workspace root, not recursively, for ``MEMORY.md``/``memory.md`` and for the creation of
  a ``memory/`` folder (which then gets its own recursive watch);
- ``memory/`` recursively, for the files the rule admits and for folders (a folder moved or
  deleted takes its notes with it);
- each extra path: a folder recursively (or only its top level when its pattern cannot match
  deeper), a single file through its parent folder;
- optionally a sessions folder (``*.jsonl`` transcripts).

Editors that save by writing a temp file and renaming it over the target show up as a move
whose destination is a memory file; deletions and moves out count too. Hidden names and the
rule's skipped folders (``.git``, ``node_modules``, ``build`` ...) below a root are ignored.

Threads: watchdog calls our handler on its own thread; the handler only records the path in a
thread-safe set and pokes the loop (``anyio.from_thread.run_sync`` with the loop's token). The
debounce (``debounce_ms`` after the last change) and the callback run in the async core.

Health: if the native observer cannot be started (for example the inotify watch limit,
``ENOSPC``) or its thread dies, the watcher switches to watchdog's polling observer, marks the
state ``degraded`` with the cause, and reports ``dirty`` so a rescan runs; a periodic rescan
callback (``rescan_interval_ms``) keeps the index correct even if events are lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.lowlevel import current_token

from fallback.sources.memory_files import (
    LEGACY_ROOT_MEMORY_FILE,
    MEMORY_DIR_NAME,
    ROOT_MEMORY_FILE,
    ExtraPathEntry,
    RootFile,
    is_excluded,
    memory_roots,
)

__all__ = ["WatchState", "MemoryWatcher"]

# How often the health check looks at the observer thread, in seconds.
HEALTH_CHECK_S = 1.0


@dataclass
class WatchState:
    """Observable state of a watcher (reported by the engine's ``status()``).

    Attributes:
        mode: ``native`` (inotify/FSEvents/kqueue), ``polling``, or ``stopped``.
        degraded_reason: why the watcher fell back to polling, if it did.
        pending: paths changed and not yet handed to the callback.
        events: number of relevant events seen.
        last_event_ms: epoch ms of the last relevant event.
        errors: last callback error, if any.
    """

    mode: str = "stopped"
    degraded_reason: str | None = None
    pending: set[str] = field(default_factory=set)
    events: int = 0
    last_event_ms: int | None = None
    last_error: str | None = None


class _Handler:
    """watchdog handler: filters events, records relevant paths, pokes the loop."""

    def __init__(self, watcher: MemoryWatcher) -> None:
        self._watcher = watcher

    def dispatch(self, event: Any) -> None:
        if event.event_type in ("opened", "closed", "closed_no_write"):
            return
        if event.is_directory and event.event_type == "modified":
            return  # a folder "modified" only echoes the file events inside it
        paths = [event.src_path, getattr(event, "dest_path", "") or ""]
        for raw in paths:
            if not raw:
                continue
            p = Path(raw.decode() if isinstance(raw, bytes) else raw)
            self._watcher._on_raw_event(p, is_directory=event.is_directory,
                                        created=event.event_type in ("created", "moved"))


class MemoryWatcher:
    """Watches memory files and calls ``on_change(paths, reason)`` after a quiet period.

    Args:
        workspace: the agent workspace.
        extra_paths: extra paths as configured (folders or single files; strings, paths or
            ``ExtraPath`` with a pattern).
        sessions_dir: folder of ``*.jsonl`` transcripts to watch too, or ``None``.
        on_change: async callback ``(changed_paths, reason)``; reason is ``watch`` or ``rescan``.
        debounce_ms: quiet time after the last change before the callback runs (1,500 ms).
        rescan_interval_ms: period of a full rescan callback (0 = off).
        force_polling: start with the polling observer (tests, network file systems).
        poll_interval_s: polling observer period, in seconds.
    """

    def __init__(self, workspace: Path, *, extra_paths: Sequence[ExtraPathEntry | Path] | None = None,
                 sessions_dir: Path | None = None,
                 on_change: Callable[[set[str], str], Awaitable[None]],
                 debounce_ms: int = 1500, rescan_interval_ms: int = 0,
                 force_polling: bool = False, poll_interval_s: float = 1.0) -> None:
        self.workspace = workspace
        # The rule's places; the root file is matched by name (both names), so no listing.
        self.roots = memory_roots(workspace, [str(p) if isinstance(p, Path) else p
                                              for p in extra_paths or []], root=RootFile(None, False))
        self.sessions_dir = sessions_dir
        self.on_change = on_change
        self.debounce_ms = max(0, debounce_ms)
        self.rescan_interval_ms = max(0, rescan_interval_ms)
        self.force_polling = force_polling
        self.poll_interval_s = poll_interval_s
        self.state = WatchState()
        self._lock = threading.Lock()
        self._observer: Any = None
        self._memory_watched = False
        self._token: Any = None
        self._wake: anyio.Event | None = None
        self._last_change_mono = 0.0

    # -- relevance ----------------------------------------------------------------------------

    def is_relevant(self, path: Path) -> bool:
        """Whether a changed path can affect the index, by the memory-file rule: a root file
        name or the ``memory`` folder at the workspace root, a file a memory folder admits, a
        folder below a memory folder (not hidden or skipped), or a transcript."""
        ws = self.workspace
        if path.parent == ws and path.name in (ROOT_MEMORY_FILE, LEGACY_ROOT_MEMORY_FILE, MEMORY_DIR_NAME):
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
            return ".jsonl" in path.name
        return False

    # -- thread side --------------------------------------------------------------------------

    def _on_raw_event(self, path: Path, *, is_directory: bool, created: bool) -> None:
        if not self.is_relevant(path):
            return
        with self._lock:
            self.state.pending.add(str(path))
            self.state.events += 1
            self.state.last_event_ms = int(time.time() * 1000)
        if is_directory and created and path == self.workspace / "memory":
            self._schedule_memory_dir()
        self._poke()

    def _poke(self) -> None:
        token = self._token
        if token is None:
            return
        try:
            anyio.from_thread.run_sync(self._wake_loop, token=token)
        except RuntimeError:
            pass  # the loop is shutting down

    def _wake_loop(self) -> None:
        self._last_change_mono = time.monotonic()
        if self._wake is not None:
            self._wake.set()

    # -- observer management ------------------------------------------------------------------

    def _new_observer(self, polling: bool) -> Any:
        if polling:
            from watchdog.observers.polling import PollingObserver

            return PollingObserver(timeout=self.poll_interval_s)
        from watchdog.observers import Observer

        return Observer()

    def _schedule_all(self, observer: Any) -> None:
        handler = _Handler(self)
        observer.schedule(handler, str(self.workspace), recursive=False)
        self._memory_watched = False
        mem = self.workspace / "memory"
        if mem.is_dir() and not mem.is_symlink():
            observer.schedule(handler, str(mem), recursive=True)
            self._memory_watched = True
        for root in self.roots[2:]:
            if root.entry.is_symlink():
                continue
            if root.entry.is_dir():
                observer.schedule(handler, str(root.entry), recursive=root.recursive)
            elif root.path.is_dir():
                observer.schedule(handler, str(root.path), recursive=False)
        if self.sessions_dir is not None and self.sessions_dir.is_dir():
            observer.schedule(handler, str(self.sessions_dir), recursive=False)

    def _schedule_memory_dir(self) -> None:
        obs = self._observer
        mem = self.workspace / "memory"
        if obs is None or self._memory_watched or not mem.is_dir():
            return
        try:
            obs.schedule(_Handler(self), str(mem), recursive=True)
            self._memory_watched = True
        except OSError as exc:
            self.state.degraded_reason = f"cannot watch {mem}: {exc}"

    def _start_observer(self) -> None:
        polling = self.force_polling
        try:
            obs = self._new_observer(polling)
            self._schedule_all(obs)
            obs.start()
        except OSError as exc:
            if polling:
                raise
            reason = ("inotify watch limit reached (raise fs.inotify.max_user_watches)"
                      if getattr(exc, "errno", None) == 28 else f"native watcher failed: {exc}")
            self._degrade(reason)
            return
        self._observer = obs
        self.state.mode = "polling" if polling else "native"

    def _degrade(self, reason: str) -> None:
        self._stop_observer()
        self.state.degraded_reason = reason
        obs = self._new_observer(True)
        self._schedule_all(obs)
        obs.start()
        self._observer = obs
        self.state.mode = "polling"
        with self._lock:
            self.state.pending.add("<rescan>")

    def _stop_observer(self) -> None:
        obs, self._observer = self._observer, None
        if obs is not None:
            try:
                obs.stop()
                obs.join(timeout=5)
            except RuntimeError:
                pass

    def check_health(self) -> None:
        """Switch to polling if the observer thread died (called periodically by ``run``, in a
        worker thread, since starting an observer blocks)."""
        obs = self._observer
        if obs is not None and not obs.is_alive() and self.state.mode != "stopped":
            self._degrade(f"{self.state.mode} watcher thread died")
            self._last_change_mono = time.monotonic()

    def kill_observer_for_test(self) -> None:
        """Stop the observer thread behind the watcher's back (simulates a dead watcher)."""
        obs = self._observer
        if obs is not None:
            obs.stop()
            obs.join(timeout=5)

    # -- async side ---------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled. Signals ``task_status.started()`` once the observer runs."""
        self._token = current_token()
        self._wake = anyio.Event()
        await anyio.to_thread.run_sync(self._start_observer)
        task_status.started()
        next_rescan = time.monotonic() + self.rescan_interval_ms / 1000 if self.rescan_interval_ms else None
        try:
            while True:
                timeout = HEALTH_CHECK_S
                if next_rescan is not None:
                    timeout = min(timeout, max(0.0, next_rescan - time.monotonic()))
                with anyio.move_on_after(timeout):
                    await self._wake.wait()
                self._wake = anyio.Event()
                await anyio.to_thread.run_sync(self.check_health)
                if self.state.pending:
                    # trailing-edge debounce: wait until no event arrived for debounce_ms
                    while True:
                        quiet_for = time.monotonic() - self._last_change_mono
                        remaining = self.debounce_ms / 1000 - quiet_for
                        if remaining <= 0:
                            break
                        await anyio.sleep(remaining)
                    with self._lock:
                        batch, self.state.pending = self.state.pending, set()
                    await self._deliver(batch, "watch")
                if next_rescan is not None and time.monotonic() >= next_rescan:
                    next_rescan = time.monotonic() + self.rescan_interval_ms / 1000
                    await self._deliver(set(), "rescan")
        finally:
            self.state.mode = "stopped"
            self._token = None
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._stop_observer)

    async def _deliver(self, batch: set[str], reason: str) -> None:
        try:
            await self.on_change(batch, reason)
            self.state.last_error = None
        except Exception as exc:  # a failed sync must not kill the watcher; it is retried
            self.state.last_error = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.state.pending |= batch or {"<rescan>"}

    def snapshot(self) -> dict[str, Any]:
        """Status view: ``{mode, degradedReason, pending, events, lastEventMs, lastError}``."""
        with self._lock:
            return {"mode": self.state.mode, "degradedReason": self.state.degraded_reason,
                    "pending": len(self.state.pending), "events": self.state.events,
                    "lastEventMs": self.state.last_event_ms, "lastError": self.state.last_error}

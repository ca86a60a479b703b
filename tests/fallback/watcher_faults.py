"""Faults injected into a running :class:`~fallback.sources.watcher.MemoryWatcher` behind its back."""

from __future__ import annotations

from fallback.sources.watcher import MemoryWatcher


def silence_observer(watcher: MemoryWatcher) -> None:
    """Drop every watch while the observer thread runs on (a deaf watcher)."""
    watcher._observer.unschedule_all()


def kill_observer(watcher: MemoryWatcher) -> None:
    """Stop the observer thread (a dead watcher)."""
    watcher._observer.stop()
    watcher._observer.join(timeout=5)

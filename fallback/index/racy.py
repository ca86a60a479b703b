"""Racily clean files: rows whose ``(mtime, size)`` match the file but whose text may not.

An incremental sync does not read a file whose ``(mtime, size)`` equals its ``files`` row
(``fallback/index/indexer.py``), and the one-shot search trusts an index whose rows all match
(``fallback/engine/in_sync.py``). The clock that stamps files moves in ticks, though: a few ms
on Linux and Windows (the coarse clock), whole seconds on FAT, HFS+, ext3 and some network file
systems. A file saved again with the same size in the tick in which a sync read it keeps its
mtime, so a row written from the first save would match the second one forever (a checkbox
ticked, ``[ ]`` to ``[x]``, right after an agent wrote the note and searched).

Such a row is *racily clean*, as Git calls its index entries of the same kind (Git's
``Documentation/technical/racy-git.txt``; here the sync's start time plays the part of the
index file's mtime): its file's mtime is not clearly earlier than the start of the scan that
read it. Each sync records when its scan started (:data:`SCAN_STARTED_META`); the next sync
reads racily clean files again (their content hash decides), and the one-shot search leaves
an index holding one to the engine. A row stops being racy once a scan that started a window
after its mtime has read it. The window is :func:`racy_window_ms`.

Not covered: a file system whose clock is behind the machine's by more than the window (a
network share with a skewed server clock).
"""

from __future__ import annotations

import time

__all__ = ["SCAN_STARTED_META", "racily_clean", "racy_window_ms", "wall_clock_ms"]

# ``meta`` key: when the last completed scan of the files started, epoch ms (wall clock).
SCAN_STARTED_META = "scan_started_at_ms"
# Window for a whole-second mtime: FAT stamps in 2 s steps, HFS+ and ext3 in 1 s steps.
WHOLE_SECOND_WINDOW_MS = 2000
# Window for a finer mtime: several ticks of the coarse clock that stamps files (1-16 ms).
FINE_WINDOW_MS = 50


def wall_clock_ms() -> int:
    """The wall clock in epoch ms, the clock file systems stamp files with (a sync's injected
    clock may be a test's fixed time; this one is compared with mtimes)."""
    return time.time_ns() // 1_000_000


def racy_window_ms(mtime_ms: int) -> int:
    """How close to a scan's start an mtime must be for the file to count as racily clean:
    :data:`WHOLE_SECOND_WINDOW_MS` for a whole-second mtime (one in a thousand finer ones gets
    it too, which only costs a re-read), else :data:`FINE_WINDOW_MS`."""
    return WHOLE_SECOND_WINDOW_MS if mtime_ms % 1000 == 0 else FINE_WINDOW_MS


def racily_clean(mtime_ms: int, scan_started_ms: int | None) -> bool:
    """Whether a file whose row says ``mtime_ms`` (epoch ms) may have been saved again unseen.

    Args:
        mtime_ms: the file's mtime, equal to its row's.
        scan_started_ms: :data:`SCAN_STARTED_META` of the index, ``None`` when none is recorded
            (every file then counts as racily clean).

    Returns:
        True when the mtime is not at least :func:`racy_window_ms` before the scan's start
        (a future mtime included).
    """
    return scan_started_ms is None or mtime_ms > scan_started_ms - racy_window_ms(mtime_ms)

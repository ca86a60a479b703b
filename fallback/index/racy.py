"""Racily clean files: rows whose ``(mtime, size, ctime)`` match the file but whose text may not.

A file saved again with the same size within the clock tick in which a sync read it keeps its
mtime; a row whose mtime is not clearly earlier than the start of the scan that read it
(:data:`SCAN_STARTED_META`) is read again, as Git treats its racily clean entries
(``Documentation/technical/racy-git.txt``).
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
    """The wall clock in epoch ms, the clock file systems stamp files with."""
    return time.time_ns() // 1_000_000


def racy_window_ms(stamp_ns: int) -> int:
    """How close to a scan's start a file's stamp (epoch ns) must be for the file to count as
    racily clean: :data:`WHOLE_SECOND_WINDOW_MS` for a whole-second stamp, else
    :data:`FINE_WINDOW_MS`."""
    return WHOLE_SECOND_WINDOW_MS if stamp_ns % 1_000_000_000 == 0 else FINE_WINDOW_MS


def racily_clean(stamp_ns: int, scan_started_ms: int | None) -> bool:
    """Whether a file stamped at ``stamp_ns`` (epoch ns: its mtime, a config file's ctime) may
    have been saved again unseen since a scan that started at ``scan_started_ms`` (epoch ms:
    :data:`SCAN_STARTED_META`; ``None``: every file counts) read it: the stamp is not at least
    :func:`racy_window_ms` before the scan's start."""
    return scan_started_ms is None or (
        stamp_ns // 1_000_000 > scan_started_ms - racy_window_ms(stamp_ns))

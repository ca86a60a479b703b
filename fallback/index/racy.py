"""Racily clean files: rows whose ``(mtime, size, ctime)`` match the file but whose text may not.

An incremental sync does not read a file whose ``(mtime, size, ctime)`` equals its ``files``
row (``fallback/index/indexer.py``; the ctime where the platform gives one,
``fallback/sources/stamps.py``), and the one-shot search trusts an index whose rows all match
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

The stamp judged is the mtime, as in Git: the ctime is only compared for equality. Judging the
ctime as well would make every file whose metadata changed just before a scan (a ``chmod``, a
restored mtime) racily clean, so a one-shot search right after a sync would go to the engine.

Not covered: a file system whose clock is behind the machine's by more than the window (a
network share with a skewed server clock); a file whose ctime moved within one tick of the
scan that read it and that is then rewritten with the same size, its mtime put back, in that
same tick.
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


def racy_window_ms(stamp_ns: int) -> int:
    """How close to a scan's start a file's stamp (epoch ns) must be for the file to count as
    racily clean: :data:`WHOLE_SECOND_WINDOW_MS` for a whole-second stamp, else
    :data:`FINE_WINDOW_MS`. A stamp known to the ms only (a ``files`` row) that falls on a
    whole second gets the longer window too: one file in a thousand on a finer file system,
    which costs at most one more read."""
    return WHOLE_SECOND_WINDOW_MS if stamp_ns % 1_000_000_000 == 0 else FINE_WINDOW_MS


def racily_clean(stamp_ns: int, scan_started_ms: int | None) -> bool:
    """Whether a file stamped at ``stamp_ns`` may have been saved again unseen since a scan
    that started at ``scan_started_ms`` read it.

    Args:
        stamp_ns: the file's mtime (a config file's ctime), epoch ns; ``mtime_ms * 1_000_000``
            for a stamp known to the ms.
        scan_started_ms: :data:`SCAN_STARTED_META` of the index (or when a config file was
            looked at), epoch ms; ``None`` when none is recorded: every file counts then.

    Returns:
        True when the stamp is not at least :func:`racy_window_ms` before the scan's start
        (a stamp in the future included).
    """
    return scan_started_ms is None or (
        stamp_ns // 1_000_000 > scan_started_ms - racy_window_ms(stamp_ns))

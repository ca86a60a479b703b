"""Progress of index syncs on stderr: files, chunks written, embedded chunks, rate and ETA.

A sync that ends within :data:`SHOW_AFTER_S` prints nothing; a longer one shows a rich bar on a
terminal, otherwise a plain line then, one every :data:`PLAIN_EVERY_S` seconds and a last one::

    indexing: 120/3000 files, 480 chunks written, 350 embedded, 12.3 chunks/s, ETA 3m 55s
    indexing: done, 3000 files, 12000 chunks written, 9000 embedded in 17m 2s

A sync that waits for another process's (its writer lock held) says so once, after
:data:`SHOW_AFTER_S`, in the same way (a bar on a terminal, else one line)::

    indexing: waiting for the index another process (pid 4242) is building

``chunks written``: the chunks this sync (re)wrote; ``embedded``: those that got their vectors
(provider or cache). An interrupted sync says what was kept (the embedding cache) and that a
rerun resumes. The decisions take the time as an argument; a small thread calls ``tick``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

__all__ = ["LABEL", "PLAIN_EVERY_S", "SHOW_AFTER_S", "SyncProgress", "format_duration", "progress_line", "sync_progress"]

# Syncs shorter than this (seconds) show no progress at all.
SHOW_AFTER_S = 1.0
# Seconds between two plain progress lines (a log, not an animation).
PLAIN_EVERY_S = 5.0
# How often the ticker thread looks at the clock, in seconds.
_TICK_S = 0.25
# The first word of every line.
LABEL = "indexing"


def format_duration(seconds: float) -> str:
    """``0.4`` -> ``"0s"``, ``75`` -> ``"1m 15s"``, ``3725`` -> ``"1h 2m"``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    return f"{s // 3600}h {s % 3600 // 60}m"


def progress_line(*, files_done: int, files_total: int, chunks: int, embedded: int,
                  elapsed_s: float) -> str:
    """One plain progress line: the rate in embedded chunks per second while embedding,
    else files per second; the ETA from the files per second so far (after the first file)."""
    parts = [f"{files_done}/{files_total} files", f"{chunks} chunks written", f"{embedded} embedded"]
    if elapsed_s > 0:
        if embedded:
            parts.append(f"{embedded / elapsed_s:.1f} chunks/s")
        elif files_done:
            parts.append(f"{files_done / elapsed_s:.1f} files/s")
        if 0 < files_done < files_total:
            parts.append(f"ETA {format_duration((files_total - files_done) * elapsed_s / files_done)}")
    return f"{LABEL}: " + ", ".join(parts)


class SyncProgress:
    """The ``on_progress(files_done, files_total, chunks_embedded, chunks_written)``
    callback of a sync, and what it prints to ``stream`` (a rich bar with ``rich``);
    ``started_s`` on the :func:`time.monotonic` scale; ``index_writer``: ``() -> pid`` of the
    writer lock's holder, or ``None`` (the default) for no such check."""

    def __init__(self, *, stream: IO[str], rich: bool, started_s: float,
                 index_writer: Callable[[], int | None] | None = None) -> None:
        self.index_writer = index_writer
        self.waiting_told = False
        self.stream = stream
        self.rich = rich
        self.started_s = started_s
        self.files_done = self.files_total = self.embedded = self.chunks = 0
        self.shown = False
        self.reported = False  # the sync called back at least once (else there is no sync to show)
        self._last_line_s: float | None = None
        self._lock = threading.Lock()
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, files_done: int, files_total: int, chunks_embedded: int, chunks_written: int) -> None:
        with self._lock:
            self.files_done, self.files_total = files_done, files_total
            self.embedded, self.chunks = chunks_embedded, chunks_written
            self.reported = True
        if self._bar is not None:
            self._bar.update(self._task, completed=files_done, total=files_total or None,
                             description=self._text(time.monotonic()))

    def _text(self, now_s: float) -> str:
        with self._lock:
            return progress_line(files_done=self.files_done, files_total=self.files_total,
                                 chunks=self.chunks, embedded=self.embedded,
                                 elapsed_s=now_s - self.started_s)

    def tick(self, now_s: float) -> str | None:
        """Decide what to show at ``now_s``: the plain line printed (returned), or None. Starts
        the rich bar once the sync has run :data:`SHOW_AFTER_S`."""
        if now_s - self.started_s < SHOW_AFTER_S:
            return None  # short: nothing to show
        if not self.reported:  # no sync at all (a slow qmd search), or one waiting for another's
            return self._tell_waiting()
        if self.rich:
            if self._bar is None:
                self._start_bar(self._text(now_s))
            return None
        if self._last_line_s is not None and now_s - self._last_line_s < PLAIN_EVERY_S:
            return None
        self._last_line_s = now_s
        return self._write(self._text(now_s))

    def _write(self, line: str) -> str:
        self.shown = True
        self.stream.write(line + "\n")
        self.stream.flush()
        return line

    def _tell_waiting(self) -> str | None:
        """Once, when another process holds the index's writer lock: the waiting line (a bar's
        text on a terminal; the plain line printed is returned), else None."""
        if self.waiting_told or self.index_writer is None:
            return None
        pid = self.index_writer()
        if pid is None or pid == os.getpid():
            return None
        self.waiting_told = True
        line = f"{LABEL}: waiting for the index another process (pid {pid}) is building"
        if self.rich:
            self._start_bar(line)
            return None
        return self._write(line)

    def _start_bar(self, text: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self._bar = Progress(BarColumn(), TextColumn("{task.description}"),
                             console=Console(file=self.stream), transient=True)
        self._task = self._bar.add_task(text, total=self.files_total or None,
                                        completed=self.files_done)
        self._bar.start()
        self.shown = True

    def finish(self, now_s: float, *, interrupted: bool, failed: bool = False) -> str | None:
        """Stop the bar and print the closing line (returned): ``done`` when progress was shown,
        ``interrupted`` always after an interruption, ``failed at`` instead of ``done`` after a
        failed sync (the command's error follows it), ``stopped at`` after a search's sync that
        ended before its last file (its budget, or a failure it recorded and the search's
        warning tells), nothing for a short sync."""
        if self._bar is not None:
            self._bar.stop()
        with self._lock:
            if not self.reported:
                return None
            if interrupted:
                line = (f"{LABEL}: interrupted at {self.files_done}/{self.files_total} files; "
                        + (f"the vectors of {self.embedded} embedded chunks are kept in the embedding "
                           "cache, run the command again to resume" if self.embedded
                           else "run the command again"))  # keyword-only: nothing was embedded
            elif not self.shown:
                return None
            elif failed:
                line = f"{LABEL}: failed at {self.files_done}/{self.files_total} files"
            elif self.files_done < self.files_total:
                line = (f"{LABEL}: stopped at {self.files_done}/{self.files_total} files "
                        "(the rest waits for the next sync)")
            else:
                line = (f"{LABEL}: done, {self.files_total} files, {self.chunks} chunks written, "
                        f"{self.embedded} embedded in {format_duration(now_s - self.started_s)}")
        return self._write(line)


@contextmanager
def sync_progress(*, enabled: bool, stream: IO[str] | None = None,
                  index_writer: Callable[[], int | None] | None = None,
                  ) -> Iterator[Callable[[int, int, int, int], None] | None]:
    """Yield a :class:`SyncProgress` callback for the block (``None`` when not
    ``enabled``) and run its ticker thread; an interrupt inside the block prints the
    ``interrupted`` line and propagates. ``index_writer`` as :class:`SyncProgress`."""
    if not enabled:
        yield None
        return
    out = stream if stream is not None else sys.stderr
    progress = SyncProgress(stream=out, rich=out.isatty(), started_s=time.monotonic(),
                            index_writer=index_writer)
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(_TICK_S):
            progress.tick(time.monotonic())

    ticker = threading.Thread(target=run, name="qmdbridge-progress", daemon=True)
    ticker.start()
    interrupted = failed = False
    try:
        yield progress
    except (KeyboardInterrupt, asyncio.CancelledError):
        interrupted = True
        raise
    except Exception:
        failed = True  # not "done": the sync raised (a locked or full store ...)
        raise
    finally:
        stop.set()
        ticker.join()
        progress.finish(time.monotonic(), interrupted=interrupted, failed=failed)

"""Sync progress lines: what is printed when, decided on given times (no clock, no sleeping)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fallback.store.lock import StoreWriteLock
from qmdbridge.cli.progress import SyncProgress, format_duration, progress_line, sync_progress

REPO = Path(__file__).resolve().parents[2]
STORE_CHILD = REPO / "tests" / "fallback" / "store_child.py"


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0.4, 59.6, 75, 3599, 3725)] == ["0s", "1m 0s", "1m 15s", "59m 59s", "1h 2m"]


def test_progress_line_rate_and_eta() -> None:
    assert progress_line(files_done=120, files_total=3000, chunks=480, embedded=350,
                         elapsed_s=28.0) == (
        "indexing: 120/3000 files, 480 chunks written, 350 embedded, 12.5 chunks/s, ETA 11m 12s")
    # no embeddings (keyword-only): files per second; finished: no ETA
    assert progress_line(files_done=10, files_total=10, chunks=40, embedded=0,
                         elapsed_s=4.0) == "indexing: 10/10 files, 40 chunks written, 0 embedded, 2.5 files/s"
    assert progress_line(files_done=0, files_total=5, chunks=0, embedded=0,
                         elapsed_s=0.0) == "indexing: 0/5 files, 0 chunks written, 0 embedded"


def test_plain_lines_after_one_second_then_every_five() -> None:
    out = io.StringIO()
    p = SyncProgress(stream=out, rich=False, started_s=100.0)
    p(1, 4, 2, 2)
    assert p.tick(100.9) is None  # a short sync shows nothing
    assert p.tick(101.0) == "indexing: 1/4 files, 2 chunks written, 2 embedded, 2.0 chunks/s, ETA 3s"
    p(2, 4, 6, 6)
    assert p.tick(105.9) is None
    assert p.tick(106.0) == "indexing: 2/4 files, 6 chunks written, 6 embedded, 1.0 chunks/s, ETA 6s"
    p(4, 4, 9, 9)
    assert p.finish(112.0, interrupted=False) == "indexing: done, 4 files, 9 chunks written, 9 embedded in 12s"
    assert out.getvalue().splitlines() == [
        "indexing: 1/4 files, 2 chunks written, 2 embedded, 2.0 chunks/s, ETA 3s",
        "indexing: 2/4 files, 6 chunks written, 6 embedded, 1.0 chunks/s, ETA 6s",
        "indexing: done, 4 files, 9 chunks written, 9 embedded in 12s"]


def test_short_sync_prints_nothing_but_an_interruption_is_always_reported() -> None:
    out = io.StringIO()
    quick = SyncProgress(stream=out, rich=False, started_s=0.0)
    quick(3, 3, 0, 3)
    assert quick.tick(0.5) is None and quick.finish(0.6, interrupted=False) is None
    assert out.getvalue() == ""
    stopped = SyncProgress(stream=out, rich=False, started_s=0.0)
    stopped(7, 30, 21, 25)
    assert stopped.finish(0.3, interrupted=True) == (
        "indexing: interrupted at 7/30 files; the vectors of 21 embedded chunks are kept in the embedding cache, "
        "run the command again to resume")


def test_an_interrupted_keyword_only_sync_claims_no_kept_vectors() -> None:
    out = io.StringIO()
    keyword_only = SyncProgress(stream=out, rich=False, started_s=0.0)
    keyword_only(437, 2001, 0, 1190)
    assert keyword_only.finish(2.5, interrupted=True) == (
        "indexing: interrupted at 437/2001 files; run the command again")


def test_sync_progress_disabled_and_interrupt() -> None:
    with sync_progress(enabled=False) as none:
        assert none is None
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), sync_progress(enabled=True, stream=out) as cb:
        assert cb is not None
        cb(1, 2, 3, 4)
        raise KeyboardInterrupt
    assert out.getvalue() == ("indexing: interrupted at 1/2 files; the vectors of 3 embedded chunks are kept in the "
                              "embedding cache, run the command again to resume\n")


def test_a_failed_sync_is_never_reported_done() -> None:
    out = io.StringIO()
    with pytest.raises(RuntimeError), sync_progress(enabled=True, stream=out) as cb:
        assert cb is not None
        cb(13, 16, 0, 0)
        raise RuntimeError("index store is locked by another process past the busy timeout")
    assert out.getvalue() == ""  # a short sync prints no closing line: the error says it all
    shown = SyncProgress(stream=io.StringIO(), rich=False, started_s=0.0)
    shown(13, 16, 0, 0)
    assert shown.tick(1.0) is not None
    assert shown.finish(15.0, interrupted=False, failed=True) == "indexing: failed at 13/16 files"


def test_a_search_sync_that_stopped_before_its_last_file_is_not_reported_done() -> None:
    """A search's sync ends without raising when it stops at the search's budget or records a
    failure (a store locked by another process): it says where it stopped, not ``done``."""
    out = io.StringIO()
    with sync_progress(enabled=True, stream=out) as cb:
        assert cb is not None
        progress = cb
        cb(6, 301, 0, 0)
        assert isinstance(progress, SyncProgress) and progress.tick(progress.started_s + 1.0) is not None
    assert out.getvalue().splitlines()[-1] == (
        "indexing: stopped at 6/301 files (the rest waits for the next sync)")


def test_a_slow_search_without_a_sync_prints_no_progress() -> None:
    """A search that takes over a second without indexing anything (qmd starting, a slow qmd
    search, an index already in sync) never calls the callback: no ``indexing: 0/0 files``
    line, no ``done, 0 files``, and no ``interrupted at 0/0 files`` on Ctrl-C."""
    out = io.StringIO()
    idle = SyncProgress(stream=out, rich=False, started_s=0.0)
    assert idle.tick(1.0) is None and idle.tick(6.0) is None
    assert idle.finish(7.0, interrupted=False) is None
    stopped = SyncProgress(stream=out, rich=False, started_s=0.0)
    assert stopped.finish(2.0, interrupted=True) is None
    assert out.getvalue() == ""
    late = SyncProgress(stream=out, rich=False, started_s=0.0)
    assert late.tick(1.5) is None
    late(1, 2, 0, 3)  # the sync reports: shown from the next tick on
    assert late.tick(1.6) == "indexing: 1/2 files, 3 chunks written, 0 embedded, 0.6 files/s, ETA 2s"


def test_a_sync_waiting_for_another_process_says_so_once(tmp_path: Path) -> None:
    """A sync that waits for the writer lock another process holds (a search during another
    process's first index) printed nothing: after a second it says whom it waits for, once; a
    lock this process holds, or none, prints nothing."""
    db = tmp_path / "main.sqlite"
    out = io.StringIO()
    free = SyncProgress(stream=out, rich=False, started_s=0.0,
                        index_writer=StoreWriteLock(db).holder_pid)
    assert free.tick(1.0) is None
    mine = StoreWriteLock(db)
    assert mine.try_acquire()
    try:
        assert free.tick(2.0) is None  # this process is the writer
    finally:
        mine.release()
    holder = subprocess.Popen([sys.executable, str(STORE_CHILD), json.dumps({"role": "hold-lock", "db": str(db)})],
                              text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        p = SyncProgress(stream=out, rich=False, started_s=0.0,
                         index_writer=StoreWriteLock(db).holder_pid)
        assert p.tick(0.9) is None
        line = f"indexing: waiting for the index another process (pid {holder.pid}) is building"
        assert p.tick(1.0) == line
        assert p.tick(7.0) is None  # once
    finally:
        holder.communicate("\n", timeout=60)
    p(2, 2, 0, 0)  # the lock came free: the sync ran
    assert p.finish(8.0, interrupted=False) == "indexing: done, 2 files, 0 chunks written, 0 embedded in 8s"
    assert out.getvalue().splitlines() == [line, "indexing: done, 2 files, 0 chunks written, 0 embedded in 8s"]

"""An inter-process file lock that records its holder's pid and never waits without a deadline.

The model:

- The OS lock is filelock's ``FileLock`` (``flock`` on POSIX, ``msvcrt.locking`` on Windows):
  the kernel drops it when the holder dies. The lock file is never deleted (deleting a file
  another process is about to lock would let two holders in).
- While held, the file holds the holder's pid; a release empties it. A recorded pid that no
  longer runs is a stale record: :meth:`PidFileLock.holder_pid` names no one.
- Every wait has a budget: non-blocking attempts with jittered exponential backoff, sleeping
  in a worker thread (:meth:`PidFileLock.acquire_blocking`) or on the event loop
  (:meth:`PidFileLock.acquire`), then :meth:`PidFileLock.timeout_error`.
- One lock object is re-entrant across threads; two objects on one path exclude each other.

``flock`` is unreliable on some network file systems: keep state folders on a local disk.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from fallback.errors import LockTimeoutError

if TYPE_CHECKING:
    from filelock import BaseFileLock

__all__ = ["PidFileLock", "backoff_s"]

# Backoff between non-blocking attempts, in seconds: doubling, capped, plus jitter so two
# waiters do not retry in lockstep.
BACKOFF_INITIAL_S = 0.01
BACKOFF_MAX_S = 0.25
BACKOFF_JITTER_S = 0.05


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a running process (a zombie counts as dead)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _record_pid(fd: int) -> None:
    """filelock's ``on_acquired`` hook: the lock file's content becomes ``<pid>\\n`` (best
    effort: a full disk must not cost the lock)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())


def backoff_s(budget_ms: int, *, initial_s: float = BACKOFF_INITIAL_S, max_s: float = BACKOFF_MAX_S,
              jitter_s: float = BACKOFF_JITTER_S) -> Iterator[float]:
    """The sleeps between attempts to get something another process holds, in seconds:
    ``initial_s`` doubling up to ``max_s``, plus up to ``jitter_s``, the last one ending at
    ``budget_ms`` from the first ``next()`` (none for a budget of 0 ms). The caller attempts
    before each sleep, and once more after the last."""
    deadline = time.monotonic() + budget_ms / 1000
    delay = initial_s
    while (left := deadline - time.monotonic()) > 0:
        yield min(left, delay + random.uniform(0, jitter_s))
        delay = min(2 * delay, max_s)


class PidFileLock:
    """An exclusive inter-process lock on one file (the model is in the module docstring);
    the file is created on the first acquisition. Subclasses change the errors through
    :meth:`timeout_error` and :meth:`open_error`.

    Args:
        path: the lock file.
        timeout_ms: default wait budget of :meth:`acquire` / :meth:`acquire_blocking`, in ms
            (>= 0; 0 makes a single attempt).

    Raises:
        ValueError: ``timeout_ms`` is negative.
    """

    def __init__(self, path: Path, *, timeout_ms: int) -> None:
        if timeout_ms < 0:
            raise ValueError(f"lock timeout must be >= 0 ms, got {timeout_ms}")
        self.path = Path(path)
        self.timeout_ms = timeout_ms
        self._mutex = threading.Lock()
        self._lock: BaseFileLock | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._lock is not None and self._lock.is_locked

    def timeout_error(self, timeout_ms: int) -> Exception:
        """The error raised when the budget ``timeout_ms`` ran out: :class:`LockTimeoutError`
        naming the live holder's pid (subclasses word it for their resource)."""
        return LockTimeoutError(str(self.path), timeout_ms, self.holder_pid())

    def open_error(self, exc: OSError) -> Exception:
        """The error raised when the lock file cannot be created or opened: ``exc`` itself
        (subclasses translate it)."""
        return exc

    def try_acquire(self) -> bool:
        """Make one non-blocking attempt (re-entering a held lock); True when this object now
        holds the lock, to be paired with :meth:`release`.

        Raises:
            OSError: the lock file or its folder cannot be created or opened (or what
                :meth:`open_error` makes of it).
        """
        from filelock import FileLock, Timeout

        with self._mutex:
            if self._lock is None:  # the file is created on the first acquisition
                self._lock = FileLock(self.path, thread_local=False, preserve_lock_file=True,
                                      on_acquired=_record_pid)
            lock = self._lock
            if lock.is_locked:
                lock.acquire(blocking=False)
                return True
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                lock.acquire(blocking=False)
            except Timeout:
                return False
            except OSError as exc:
                raise self.open_error(exc) from exc
            return True

    def release(self, *, force: bool = False) -> None:
        """Leave the lock once (``force``: whatever the depth); at depth 0 the pid record is
        cleared and the OS lock dropped (a lock not held: nothing)."""
        with self._mutex:
            lock = self._lock
            if lock is None or not lock.is_locked:
                return
            if force or lock.lock_counter == 1:
                with contextlib.suppress(OSError):
                    os.truncate(self.path, 0)
            lock.release(force=force)

    def close(self) -> None:
        """Drop the lock whatever the depth (its owner is closing); idempotent."""
        self.release(force=True)

    def holder_pid(self) -> int | None:
        """The pid of the live process the lock file names, or None (free, unreadable, or a
        stale record); read without taking the lock."""
        try:
            text = self.path.read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() and _pid_alive(int(text)) else None

    def _waits(self, timeout_ms: int | None) -> Iterator[float]:
        """The sleeps (s) after failed attempts until one succeeds; raises as :meth:`acquire_blocking`."""
        budget_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        for wait_s in backoff_s(budget_ms):
            if self.try_acquire():
                return
            yield wait_s
        if not self.try_acquire():  # the last attempt, at the end of the budget
            raise self.timeout_error(budget_ms)

    def acquire_blocking(self, *, timeout_ms: int | None = None) -> None:
        """Acquire from a worker thread: attempts with backoff (``time.sleep``) up to a budget.

        Args:
            timeout_ms: budget in ms (default :attr:`timeout_ms`).

        Raises:
            LockTimeoutError: the budget ran out (or the subclass's :meth:`timeout_error`).
            OSError: the lock file cannot be opened (or the subclass's :meth:`open_error`).
        """
        for wait_s in self._waits(timeout_ms):
            time.sleep(wait_s)

    async def acquire(self, *, timeout_ms: int | None = None) -> None:
        """Acquire without blocking the event loop: attempts with backoff (``anyio.sleep``).

        Args:
            timeout_ms: budget in ms (default :attr:`timeout_ms`).

        Raises:
            LockTimeoutError / OSError: as :meth:`acquire_blocking`.
        """
        for wait_s in self._waits(timeout_ms):
            await anyio.sleep(wait_s)

    @contextlib.contextmanager
    def hold_blocking(self) -> Iterator[None]:
        """``with lock.hold_blocking():`` acquire (:meth:`acquire_blocking`), always release."""
        self.acquire_blocking()
        try:
            yield
        finally:
            self.release()

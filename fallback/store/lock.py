"""The inter-process writer lock of one store: ``<db>.lock`` held with an OS file lock.

Concurrency model of the builtin engine's store (see also ``fallback/store/db.py``):

- Any number of processes may read one store at the same time (SQLite WAL: readers never
  block and are never blocked by the writer).
- At most one process writes at a time. A writer holds :class:`StoreWriteLock` for the whole
  sync, incremental or full rebuild including the publish step; crash recovery of leftover
  ``.tmp-``/``.backup-`` files and the creation of a new store also happen only under it.
- The lock is ``fcntl.flock(LOCK_EX)`` on ``<db>.lock`` (``msvcrt.locking`` on Windows). The
  kernel drops it when the holding process dies, SIGKILL included, so a crashed writer never
  leaves a stale lock behind; the lock file itself is never deleted (deleting a lock file that
  another process is about to lock would let two writers in). Limitation: ``flock`` is not
  reliable on some network file systems (old NFS); keep stores on a local disk.
- Acquiring never blocks an event loop: :meth:`StoreWriteLock.acquire` makes non-blocking
  attempts with jittered exponential backoff (``anyio.sleep`` between them) up to a budget,
  60 s by default, then raises ``IndexStoreError``. :meth:`StoreWriteLock.acquire_blocking`
  does the same with ``time.sleep`` for code that already runs in a worker thread.
- One lock object is re-entrant: acquiring it again while this object holds it only counts
  the depth (the engine's ``CapacityLimiter(1)`` already serialises writers inside one
  engine, and a rebuild's temporary store shares the live store's lock object). Two lock
  objects for the same store exclude each other even inside one process, exactly like two
  processes, because ``flock`` locks belong to the open file description.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio

from fallback.errors import IndexStoreError

__all__ = ["DEFAULT_LOCK_TIMEOUT_MS", "StoreWriteLock", "lock_path_for"]

# How long a writer waits for another process's sync to finish before giving up (ms).
DEFAULT_LOCK_TIMEOUT_MS = 60_000
# Backoff between non-blocking attempts (s): starts at 10 ms, doubles, capped at 250 ms, plus up
# to 50 ms of jitter so two waiting processes do not retry in lockstep.
_BACKOFF_INITIAL_S = 0.01
_BACKOFF_MAX_S = 0.25
_BACKOFF_JITTER_S = 0.05


def lock_path_for(db_path: Path) -> Path:
    """Return the lock file of the store at ``db_path``: ``<db>.lock`` next to it."""
    return db_path.with_name(f"{db_path.name}.lock")


def _try_lock_fd(fd: int) -> bool:
    """One non-blocking exclusive lock attempt on ``fd``; True when it is now held."""
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return False
    return True


def _unlock_fd(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        with contextlib.suppress(OSError):
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]
        return
    fcntl.flock(fd, fcntl.LOCK_UN)


class StoreWriteLock:
    """The writer lock of one store (see the module docstring for the model).

    Thread-safe; re-entrant per object (a depth counter). The lock file is created on the first
    acquisition, so a store that is only read never gets one. While held, the file contains the
    holder's pid (for the timeout message and for people looking at the state directory).

    Args:
        db_path: the store's SQLite file; the lock is ``<db>.lock`` (:func:`lock_path_for`).
        timeout_ms: default budget of :meth:`acquire` / :meth:`acquire_blocking`, in ms (> 0).
    """

    def __init__(self, db_path: Path, *, timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS) -> None:
        self.db_path = Path(db_path)
        self.path = lock_path_for(self.db_path)
        self.timeout_ms = timeout_ms
        self._mutex = threading.Lock()
        self._fd: int | None = None
        self._depth = 0

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        with self._mutex:
            return self._depth > 0

    def try_acquire(self) -> bool:
        """Make one non-blocking attempt; True when this object now holds the lock.

        A held lock is re-entered (depth + 1). Every True must be paired with :meth:`release`.

        Raises:
            IndexStoreError: the lock file cannot be created or opened.
        """
        with self._mutex:
            if self._depth > 0:
                self._depth += 1
                return True
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise IndexStoreError(f"cannot open the index writer lock {self.path}: {exc}",
                                      db_path=str(self.db_path)) from exc
            if not _try_lock_fd(fd):
                os.close(fd)
                return False
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                os.lseek(fd, 0, os.SEEK_SET)
            self._fd = fd
            self._depth = 1
            return True

    def release(self) -> None:
        """Leave the lock once; the OS lock is dropped when the depth reaches 0.

        Releasing a lock that is not held does nothing.
        """
        with self._mutex:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth > 0 or self._fd is None:
                return
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                _unlock_fd(fd)
            os.close(fd)

    def holder_pid(self) -> int | None:
        """The pid written by the current holder, or None when unknown (best effort)."""
        try:
            text = self.path.read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def _timeout_error(self, timeout_ms: int) -> IndexStoreError:
        pid = self.holder_pid()
        who = f"another process (pid {pid})" if pid is not None else "another process"
        return IndexStoreError(
            f"{who} is writing the index; waiting for the writer lock {self.path.name} timed"
            f" out after {timeout_ms} ms", db_path=str(self.db_path))

    def _next_delay_s(self, attempt: int, deadline: float) -> float | None:
        """Seconds to sleep before attempt ``attempt + 1``, or None when the budget is spent."""
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        backoff = min(_BACKOFF_MAX_S, _BACKOFF_INITIAL_S * 2 ** min(attempt, 16))
        return min(left, backoff + random.uniform(0, _BACKOFF_JITTER_S))

    def _attempts(self, timeout_ms: int | None) -> Iterator[float]:
        """Try to take the lock; while it is busy yield the next backoff delay in seconds.

        Raises:
            IndexStoreError: the budget ran out (``another process (pid N) is writing ...``).
        """
        budget = self.timeout_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + budget / 1000
        attempt = 0
        while not self.try_acquire():
            delay = self._next_delay_s(attempt, deadline)
            if delay is None:
                raise self._timeout_error(budget)
            yield delay
            attempt += 1

    def acquire_blocking(self, *, timeout_ms: int | None = None) -> None:
        """Acquire from a worker thread: attempts with backoff (``time.sleep``) up to a budget.

        Args:
            timeout_ms: budget in ms (default :attr:`timeout_ms`).

        Raises:
            IndexStoreError: ``another process (pid N) is writing the index; ... timed out
                after N ms`` past the budget, or the lock file cannot be opened.
        """
        for delay in self._attempts(timeout_ms):
            time.sleep(delay)

    async def acquire(self, *, timeout_ms: int | None = None) -> None:
        """Acquire without blocking the event loop: attempts with backoff up to a budget.

        Args:
            timeout_ms: budget in ms (default :attr:`timeout_ms`).

        Raises:
            IndexStoreError: as :meth:`acquire_blocking`.
        """
        for delay in self._attempts(timeout_ms):
            await anyio.sleep(delay)

    @contextlib.asynccontextmanager
    async def hold(self, *, timeout_ms: int | None = None) -> AsyncIterator[None]:
        """``async with lock.hold():`` acquire (:meth:`acquire`) and always release."""
        await self.acquire(timeout_ms=timeout_ms)
        try:
            yield
        finally:
            self.release()

    @contextlib.contextmanager
    def hold_blocking(self, *, timeout_ms: int | None = None) -> Iterator[None]:
        """``with lock.hold_blocking():`` acquire (:meth:`acquire_blocking`), always release."""
        self.acquire_blocking(timeout_ms=timeout_ms)
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        """Drop the lock whatever the depth (the store is closing); idempotent."""
        with self._mutex:
            fd, self._fd, self._depth = self._fd, None, 0
        if fd is not None:
            with contextlib.suppress(OSError):
                _unlock_fd(fd)
            os.close(fd)

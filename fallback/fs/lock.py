"""An inter-process file lock that records its holder's pid and never waits without a deadline.

Why this module is not in ``fallback.store``: files are locked by the store (its writer lock,
``fallback/store/lock.py``) and by the qmd sidecar (the per-agent update lock, the global embed
lock, the session export lock). ``qmdbridge`` may import ``fallback`` but never the reverse, and
the lock knows nothing about stores or qmd, so it sits in ``fallback.fs``, a neutral package
below both that only touches files.

The model:

- The OS lock is `filelock <https://py-filelock.readthedocs.io>`_'s ``FileLock``:
  ``fcntl.flock(LOCK_EX)`` on POSIX, ``msvcrt.locking`` on Windows. The kernel drops it when
  the holding process dies, SIGKILL included, so a dead holder never blocks anyone. The lock
  file is never deleted (``preserve_lock_file``): deleting a file that another process is
  about to lock would let two holders in.
- While held, the file contains the holder's pid and a newline (written through filelock's
  ``on_acquired`` hook); a release empties it again. So a non-empty file whose pid no longer
  runs is the stale record of a holder that died while holding the lock:
  :meth:`PidFileLock.holder_pid` names no one, its OS lock is already gone, and the next holder
  overwrites the record. A lock that is held while its recorded pid is gone was inherited by a child of
  the dead holder; timeouts then name no pid.
- Every wait has a budget: non-blocking attempts with jittered exponential backoff (10 ms,
  doubling, capped at 250 ms, plus up to 50 ms so two waiters do not retry in lockstep) through
  tenacity, sleeping with ``time.sleep`` (:meth:`PidFileLock.acquire_blocking`, for worker
  threads) or ``anyio.sleep`` (:meth:`PidFileLock.acquire`, never blocking an event loop), and
  :meth:`PidFileLock.timeout_error` (``LockTimeoutError`` unless a subclass says otherwise)
  when the budget is spent.
- One lock object is re-entrant across threads (a depth counter: filelock's lock counter with
  ``thread_local=False``); two objects on the same path exclude each other even inside one
  process, like two processes, because ``flock`` locks belong to the open file description.

Limitations: ``flock`` is not reliable on some network file systems (old NFS), so keep state
folders on a local disk; on a file system without ``flock`` acquisition fails with ``OSError``
instead of falling back to filelock's soft lock, which could not carry the pid record.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from fallback.errors import LockTimeoutError

if TYPE_CHECKING:
    from filelock import BaseFileLock

__all__ = ["BACKOFF_INITIAL_S", "BACKOFF_JITTER_S", "BACKOFF_MAX_S", "PidFileLock"]

# Backoff between non-blocking attempts (s): starts at 10 ms, doubles, capped at 250 ms, plus up
# to 50 ms of jitter. An attempt is two system calls, so polling at this rate costs nothing and
# hands a released lock over within about a quarter second.
BACKOFF_INITIAL_S = 0.01
BACKOFF_MAX_S = 0.25
BACKOFF_JITTER_S = 0.05


class _Busy(Exception):
    """One non-blocking attempt found the lock held elsewhere (tenacity retries on it)."""


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a running process (a zombie counts as dead)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _record_pid(fd: int) -> None:
    """filelock's ``on_acquired`` hook: replace the lock file's content with ``<pid>\\n``.

    Best effort: a full disk must not cost the lock, so ``OSError`` is ignored.
    """
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())


def _backoff_within(budget_s: float) -> Callable[[RetryCallState], float]:
    """Tenacity wait: the jittered exponential backoff, never past the end of ``budget_s``."""
    backoff = wait_exponential(multiplier=BACKOFF_INITIAL_S, max=BACKOFF_MAX_S) + \
        wait_random(0, BACKOFF_JITTER_S)

    def wait(state: RetryCallState) -> float:
        left = budget_s - (state.seconds_since_start or 0.0)
        return max(0.0, min(left, backoff(state)))

    return wait


class PidFileLock:
    """An exclusive inter-process lock on one file (see the module docstring for the model).

    Thread-safe; re-entrant per object. The file (and its folder) is created on the first
    acquisition, and filelock is imported only then, so merely constructing a lock costs
    nothing. Subclasses change the errors through :meth:`timeout_error` and :meth:`open_error`.

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
        lock = self._lock
        return lock is not None and lock.is_locked

    def timeout_error(self, timeout_ms: int) -> Exception:
        """The error raised when the budget ``timeout_ms`` ran out: :class:`LockTimeoutError`
        naming the live holder's pid (subclasses word it for their resource)."""
        return LockTimeoutError(str(self.path), timeout_ms, self.holder_pid())

    def open_error(self, exc: OSError) -> Exception:
        """The error raised when the lock file cannot be created or opened: ``exc`` itself
        (subclasses translate it)."""
        return exc

    def _file_lock(self) -> BaseFileLock:
        if self._lock is None:
            from filelock import FileLock

            self._lock = FileLock(self.path, thread_local=False, preserve_lock_file=True,
                                  on_acquired=_record_pid)
        return self._lock

    def try_acquire(self) -> bool:
        """Make one non-blocking attempt; True when this object now holds the lock.

        A held lock is re-entered (depth + 1). Every True must be paired with :meth:`release`.

        Raises:
            OSError: the lock file or its folder cannot be created or opened (or what
                :meth:`open_error` makes of it).
        """
        from filelock import Timeout

        with self._mutex:
            lock = self._file_lock()
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

    def release(self) -> None:
        """Leave the lock once; at depth 0 the pid record is cleared and the OS lock dropped.

        Releasing a lock that is not held does nothing.
        """
        with self._mutex:
            lock = self._lock
            if lock is None or not lock.is_locked:
                return
            if lock.lock_counter == 1:
                self._clear_record()
            lock.release()

    def close(self) -> None:
        """Drop the lock whatever the depth (its owner is closing); idempotent."""
        with self._mutex:
            lock = self._lock
            if lock is not None and lock.is_locked:
                self._clear_record()
                lock.release(force=True)

    def _clear_record(self) -> None:
        with contextlib.suppress(OSError):
            os.truncate(self.path, 0)

    def holder_pid(self) -> int | None:
        """The pid of the live process the lock file names, or None: it names none (free, or
        unreadable) or a process that no longer exists or is a zombie (the stale record of a
        holder that died while holding the lock). Best effort: read without taking the lock."""
        try:
            text = self.path.read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() and _pid_alive(int(text)) else None

    def _attempt(self) -> None:
        if not self.try_acquire():
            raise _Busy

    async def _attempt_async(self) -> None:
        self._attempt()

    def _policy(self, budget_ms: int) -> dict[str, Any]:
        budget_s = budget_ms / 1000
        return {"stop": stop_after_delay(budget_s), "wait": _backoff_within(budget_s),
                "retry": retry_if_exception_type(_Busy), "reraise": True}

    def acquire_blocking(self, *, timeout_ms: int | None = None) -> None:
        """Acquire from a worker thread: attempts with backoff (``time.sleep``) up to a budget.

        Args:
            timeout_ms: budget in ms (default :attr:`timeout_ms`).

        Raises:
            LockTimeoutError: the budget ran out (or the subclass's :meth:`timeout_error`).
            OSError: the lock file cannot be opened (or the subclass's :meth:`open_error`).
        """
        budget_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        try:
            Retrying(sleep=time.sleep, **self._policy(budget_ms))(self._attempt)
        except _Busy:
            raise self.timeout_error(budget_ms) from None

    async def acquire(self, *, timeout_ms: int | None = None) -> None:
        """Acquire without blocking the event loop: attempts with backoff (``anyio.sleep``).

        Args:
            timeout_ms: budget in ms (default :attr:`timeout_ms`).

        Raises:
            LockTimeoutError: as :meth:`acquire_blocking`.
            OSError: as :meth:`acquire_blocking`.
        """
        budget_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        try:
            await AsyncRetrying(sleep=anyio.sleep, **self._policy(budget_ms))(self._attempt_async)
        except _Busy:
            raise self.timeout_error(budget_ms) from None

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

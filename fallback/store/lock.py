"""The inter-process writer lock of one store: ``<db>.lock``, a :class:`~fallback.fs.lock.PidFileLock`.

Concurrency model of the builtin engine's store (see also ``fallback/store/db.py``):

- Any number of processes may read one store at the same time (SQLite WAL: readers never
  block and are never blocked by the writer).
- At most one process writes at a time. A writer holds :class:`StoreWriteLock` for the whole
  sync, incremental or full rebuild including the publish step; crash recovery of leftover
  ``.tmp-``/``.backup-`` files and the creation of a new store also happen only under it.
- The lock itself (an OS file lock the kernel drops when the holder dies, SIGKILL included;
  the holder's pid recorded in the file; a lock file that is never deleted; re-entrant per
  object, exclusive between objects even in one process) is described in
  ``fallback/fs/lock.py``. Keep stores on a local disk: ``flock`` is not reliable on some
  network file systems.
- Acquiring never blocks an event loop (:meth:`~fallback.fs.lock.PidFileLock.acquire`) and
  always has a budget, 60 s by default, after which ``IndexStoreError`` names the writer:
  ``another process (pid N) is writing the index; waiting for the writer lock main.sqlite.lock
  timed out after 60000 ms (<db>)``.
- The engine's ``CapacityLimiter(1)`` already serialises writers inside one engine, and a
  rebuild's temporary store shares the live store's lock object, so re-entering it only counts
  the depth.
"""

from __future__ import annotations

import errno
from pathlib import Path

from fallback.errors import IndexStoreError
from fallback.fs.lock import PidFileLock
from fallback.store.errors import IndexStoreReadOnlyError

__all__ = ["DEFAULT_LOCK_TIMEOUT_MS", "StoreWriteLock", "lock_path_for"]

# How long a writer waits for another process's sync to finish before giving up (ms).
DEFAULT_LOCK_TIMEOUT_MS = 60_000


def lock_path_for(db_path: Path) -> Path:
    """Return the lock file of the store at ``db_path``: ``<db>.lock`` next to it."""
    return db_path.with_name(f"{db_path.name}.lock")


class StoreWriteLock(PidFileLock):
    """The writer lock of one store (see the module docstring for the model).

    A :class:`~fallback.fs.lock.PidFileLock` on ``<db>.lock`` whose errors are
    ``IndexStoreError`` carrying the store path.

    Args:
        db_path: the store's SQLite file; the lock is ``<db>.lock`` (:func:`lock_path_for`).
        timeout_ms: default budget of ``acquire`` / ``acquire_blocking``, in ms (>= 0).

    Raises (from the acquiring methods):
        IndexStoreError: ``another process (pid N) is writing the index; waiting for the writer
            lock <db>.lock timed out after N ms`` past the budget; :meth:`open_error` when the
            lock file cannot be created or opened.
    """

    def __init__(self, db_path: Path, *, timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS) -> None:
        self.db_path = Path(db_path)
        super().__init__(lock_path_for(self.db_path), timeout_ms=timeout_ms)

    def timeout_error(self, timeout_ms: int) -> Exception:
        """``IndexStoreError`` naming the live writer's pid when the lock file records one."""
        pid = self.holder_pid()
        who = f"another process (pid {pid})" if pid is not None else "another process"
        return IndexStoreError(
            f"{who} is writing the index; waiting for the writer lock {self.path.name} timed"
            f" out after {timeout_ms} ms", db_path=str(self.db_path))

    def open_error(self, exc: OSError) -> Exception:
        """The error for a lock file (or its folder) that cannot be created or opened, naming
        the lock file and the cause: ``IndexStoreReadOnlyError`` when this process may not
        (``index store is read-only (its writer lock <db>.lock cannot be written): Permission
        denied (<db>)``, ``... cannot be created)`` while there is none; ``Read-only file
        system`` on a read-only mount), else ``IndexStoreError`` (``cannot open the index writer
        lock <db>.lock: <cause> (<db>)``)."""
        cause = exc.strerror or str(exc)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            verb = "written" if self.path.exists() else "created"
            return IndexStoreReadOnlyError(
                f"index store is read-only (its writer lock {self.path} cannot be {verb}): {cause}",
                db_path=str(self.db_path))
        return IndexStoreError(f"cannot open the index writer lock {self.path}: {cause}",
                               db_path=str(self.db_path))

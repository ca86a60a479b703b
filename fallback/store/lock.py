"""The inter-process writer lock of one store: ``<db>.lock``, a :class:`~fallback.fs.lock.PidFileLock`,
held for a whole sync; a rebuild's temporary store shares the live store's lock object.
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
    """The writer lock of the store ``db_path``: a :class:`~fallback.fs.lock.PidFileLock` on
    ``<db>.lock`` (``timeout_ms``: default wait of the acquiring methods, >= 0) whose errors are
    ``IndexStoreError`` carrying the store path (:meth:`timeout_error`, :meth:`open_error`)."""

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
        """The error for a lock file that cannot be created or opened: ``IndexStoreReadOnlyError``
        when this process may not (``index store is read-only (its writer lock <db>.lock cannot
        be written): Permission denied (<db>)``, ``... created)``), else ``IndexStoreError``
        (``cannot open the index writer lock <db>.lock: <cause> (<db>)``)."""
        cause = exc.strerror or str(exc)
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            verb = "written" if self.path.exists() else "created"
            return IndexStoreReadOnlyError(
                f"index store is read-only (its writer lock {self.path} cannot be {verb}): {cause}",
                db_path=str(self.db_path))
        return IndexStoreError(f"cannot open the index writer lock {self.path}: {cause}",
                               db_path=str(self.db_path))

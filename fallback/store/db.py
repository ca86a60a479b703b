"""The builtin engine's SQLite store: connection, migrations, error mapping, publishing a rebuild.

One SQLite file per agent (``EngineSettings.db_path``), opened with WAL, ``busy_timeout`` and
``synchronous=NORMAL``; the schema comes from the numbered migrations in
``fallback/store/migrations.py``. Every ``sqlite3.Error`` is translated into ``IndexStoreError`` in
exactly one place, :func:`translate_errors`.

A :class:`Store` serialises all use of its one connection with a lock, so it may be shared
between worker threads (``anyio.to_thread``); each file's write is one ``BEGIN IMMEDIATE``
transaction (:meth:`Store.transaction`).

Concurrency model (several processes on one store: a ``serve`` process syncing while CLI
calls search and index; the writer lock itself is described in ``fallback/store/lock.py``):

- Readers never wait for writers (WAL) and never see a half-written index: an incremental sync
  writes each file in one transaction, and a full rebuild is built in ``<db>.tmp-<uuid>`` and
  published in one transaction.
- Publishing (:meth:`Store.swap_from`) copies the finished temp database into the live one
  with SQLite's online backup API: one write transaction on the same file, so the inode never
  changes, readers in other processes simply see a new commit (an open read transaction keeps
  its snapshot), and a process killed mid-publish leaves an uncommitted WAL tail that SQLite
  ignores. Renaming files over a live WAL database is not safe (another process's ``-wal`` and
  ``-shm`` belong to the old file and SQLite would replay that ``-wal`` into the new one), so
  the rename swap of spec §4.5 (:func:`fallback.store.files.swap_db_files`) is only the fallback
  for a live file that cannot take a backup (missing, not a database, other page size).
- ``SQLITE_BUSY``/``SQLITE_LOCKED`` (a checkpoint, a schema change, a non-engine writer) are
  retried a few times with jittered backoff on top of the busy timeout (``Store.busy_retries``
  counts them); only then does ``IndexStoreError`` reach the caller.
- Opening never creates an empty database in the middle of another process's swap: an
  existing store is opened with ``mode=rw``; a new one is created only under the writer lock;
  when ``<db>`` is missing but a backup exists, the open waits (bounded) for the swap to
  finish, or repairs it when the writer died. Leftovers of a killed rebuild or swap are
  removed under the writer lock (:func:`fallback.store.files.recover_db_files`).
- Each open records the file's ``(st_dev, st_ino)``; :meth:`Store.reopen_if_replaced` (called
  by the engine before every search and status) reopens when another process swapped files.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from fallback.errors import IndexStoreError
from fallback.store.files import (
    file_id,
    has_leftovers,
    recover_db_files,
    remove_db_files,
    swap_db_files,
    temp_db_path,
)
from fallback.store.lock import StoreWriteLock, lock_path_for
from fallback.store.migrations import MIGRATIONS

__all__ = [
    "META_KEY",
    "ReadonlyRecovery",
    "Store",
    "is_busy_error",
    "is_readonly_error",
    "remove_db_files",
    "swap_db_files",
    "temp_db_path",
    "translate_errors",
]

T = TypeVar("T")

# Meta key of the index identity JSON (spec §4.2, E1/E2 name).
META_KEY = "memory_index_meta_v1"
# Default busy timeout: how long a statement waits for another connection's lock (ms).
DEFAULT_BUSY_TIMEOUT_MS = 5000
# Attempts of a statement that keeps failing with SQLITE_BUSY/LOCKED (each one waits the busy
# timeout first); the backoff between them is random exponential, 20 ms up to 250 ms.
DEFAULT_BUSY_RETRY_ATTEMPTS = 3
# How long opening waits for another process to finish a rename swap (``<db>`` missing while a
# backup exists and the writer lock is held), in ms.
DEFAULT_SWAP_WAIT_MS = 10_000
# The WAL is truncated back to this size after checkpoints (bytes); a published rebuild passes
# the whole database through the WAL once.
WAL_SIZE_LIMIT_BYTES = 16 * 1024 * 1024
# Opens retried when the file at the path changes while it is being opened.
_OPEN_ATTEMPTS = 3
# SQLite primary result codes used below.
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 5, 6, 8
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26


def _primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    return int(code) & 0xFF if isinstance(code, int) else None


def is_busy_error(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's ``SQLITE_BUSY``/``SQLITE_LOCKED`` ("database is locked")."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = _primary_code(exc)
    if code is not None:
        return code in (_SQLITE_BUSY, _SQLITE_LOCKED)
    low = str(exc).lower()
    return "database is locked" in low or "busy" in low or "table is locked" in low


def is_readonly_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or the ``sqlite3.Error`` an ``IndexStoreError`` wraps) is
    ``SQLITE_READONLY`` ("attempt to write a readonly database")."""
    cause = exc.__cause__ if isinstance(exc, IndexStoreError) else exc
    if not isinstance(cause, sqlite3.Error):
        return False
    code = _primary_code(cause)
    if code is not None:
        return code == _SQLITE_READONLY
    low = str(cause).lower()
    return "readonly" in low or "read-only" in low


def _is_corrupt(exc: BaseException) -> bool:
    code = _primary_code(exc)
    if code is not None:
        return code in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    low = str(exc).lower()
    return "malformed" in low or "not a database" in low


def _retry_busy(fn: Callable[[], T], *, attempts: int, on_retry: Callable[[], None]) -> T:
    """Call ``fn``; retry it while it raises a busy error, at most ``attempts`` calls in all."""
    retrying = Retrying(retry=retry_if_exception(is_busy_error),
                        stop=stop_after_attempt(max(1, attempts)),
                        wait=wait_random_exponential(multiplier=0.02, max=0.25),
                        before_sleep=lambda _state: on_retry(), reraise=True)
    return retrying(fn)


def _describe(exc: sqlite3.Error) -> str:
    text = str(exc) or type(exc).__name__
    low = text.lower()
    if "locked" in low or "busy" in low:
        return f"index store is locked by another process past the busy timeout: {text}"
    if "readonly" in low or "read-only" in low:
        return f"index store is read-only: {text}"
    if "malformed" in low or "not a database" in low or "corrupt" in low:
        return f"index store is corrupt: {text}"
    if "unable to open" in low:
        return f"index store cannot be opened: {text}"
    return f"index store error: {text}"


@contextlib.contextmanager
def translate_errors(db_path: Path | str | None) -> Iterator[None]:
    """Re-raise any ``sqlite3.Error`` inside the block as ``IndexStoreError`` (chained).

    The message names the condition: ``locked ... past the busy timeout``, ``read-only``,
    ``corrupt`` (``database disk image is malformed``, ``file is not a database``) or a generic
    ``index store error``, followed by SQLite's own text; ``db_path`` is kept on the error.

    Raises:
        IndexStoreError: for every ``sqlite3.Error``.
    """
    try:
        yield
    except sqlite3.Error as exc:
        raise IndexStoreError(_describe(exc), db_path=str(db_path) if db_path else None) from exc


@dataclass
class ReadonlyRecovery:
    """Counters of readonly recovery (spec §5.3 step 6): reopen the store and retry once.

    Attributes:
        attempts: recoveries started (a sync failed with ``SQLITE_READONLY``).
        successes: retries that succeeded.
        failures: retries that failed again.
        last_error: the message of the last readonly error, or None.
    """

    attempts: int = 0
    successes: int = 0
    failures: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """``{"attempts", "successes", "failures", "lastError"}`` for ``status().custom``."""
        return {"attempts": self.attempts, "successes": self.successes,
                "failures": self.failures, "lastError": self.last_error}


class Store:
    """An open store: one connection, migrated to the latest schema, lock-serialised.

    Args:
        path: the SQLite file; its parent directory is created.
        fts_tokenizer: ``unicode61`` or ``trigram``; used only when the FTS table is created
            (an existing store keeps its tokenizer, see :attr:`fts_tokenizer`).
        busy_timeout_ms: how long a statement waits for another connection's lock, in ms.
        busy_retry_attempts: calls of a statement that keeps hitting ``SQLITE_BUSY`` before
            ``IndexStoreError`` is raised (>= 1).
        writer_lock: the inter-process writer lock to use (a rebuild's temporary store shares
            the live store's); default a new :class:`~fallback.store.lock.StoreWriteLock`.
        swap_wait_ms: how long opening waits for another process's swap to bring ``<db>``
            back, in ms.

    Attributes:
        writer_lock: the store's :class:`~fallback.store.lock.StoreWriteLock`.
        readonly_recovery: :class:`ReadonlyRecovery` counters (kept across reopens).
        busy_retries: how many times a busy statement was retried (kept across reopens).

    Raises:
        IndexStoreError: the file cannot be opened, is corrupt, read-only or locked, or another
            process's swap did not finish within ``swap_wait_ms``.
    """

    def __init__(self, path: Path, *, fts_tokenizer: str = "unicode61",
                 busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
                 busy_retry_attempts: int = DEFAULT_BUSY_RETRY_ATTEMPTS,
                 writer_lock: StoreWriteLock | None = None,
                 swap_wait_ms: int = DEFAULT_SWAP_WAIT_MS) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._tokenizer_wanted = fts_tokenizer
        self._busy_timeout_ms = busy_timeout_ms
        self._busy_attempts = busy_retry_attempts
        self._swap_wait_ms = swap_wait_ms
        self._owns_writer_lock = writer_lock is None
        self.writer_lock = writer_lock or StoreWriteLock(self.path)
        self.readonly_recovery = ReadonlyRecovery()
        self.busy_retries = 0
        self._conn: sqlite3.Connection | None = None
        self._file_id: tuple[int, int] | None = None
        self._open()

    # -- opening ---------------------------------------------------------------------------

    def _count_retry(self) -> None:
        self.busy_retries += 1

    def _retry(self, fn: Callable[[], T]) -> T:
        return _retry_busy(fn, attempts=self._busy_attempts, on_retry=self._count_retry)

    def _open(self) -> None:
        """Open the connection (see the module docstring for when the writer lock is taken)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise IndexStoreError(f"cannot create the store directory: {exc}",
                                  db_path=str(self.path)) from exc
        lock = self.writer_lock
        if lock.held:  # our own sync (or the rebuild's temp store): recovery is done already
            self._connect(create=True)
            return
        if self.path.exists() and not has_leftovers(self.path) and self._connect_existing():
            return
        deadline = time.monotonic() + self._swap_wait_ms / 1000
        pause_s = 0.01
        while True:
            if lock.try_acquire():
                try:
                    recover_db_files(self.path)
                    self._connect(create=True)
                finally:
                    lock.release()
                return
            if self.path.exists() and self._connect_existing():
                return  # any leftovers belong to the live writer
            if time.monotonic() >= deadline:
                raise IndexStoreError(
                    "index store is missing while another process holds the writer lock"
                    f" (a swap did not finish within {self._swap_wait_ms} ms)",
                    db_path=str(self.path))
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 0.2)

    def _connect_existing(self) -> bool:
        """Open the existing file (``mode=rw``); False when it vanished meanwhile (a swap)."""
        try:
            self._connect(create=False)
        except IndexStoreError:
            if self.path.exists():
                raise
            return False
        return True

    def _connect(self, *, create: bool) -> None:
        uri = f"{self.path.resolve().as_uri()}?mode={'rwc' if create else 'rw'}"
        with translate_errors(self.path):
            for attempt in range(_OPEN_ATTEMPTS):
                before = file_id(self.path)
                conn = self._retry(lambda: self._connect_once(uri))
                after = file_id(self.path)
                # A different file before and after: swapped while opening, open the new one.
                # (A file id recorded after the swap makes the next is_replaced() reopen.)
                if before == after or attempt == _OPEN_ATTEMPTS - 1:
                    break
                conn.close()
        self._conn = conn
        self._file_id = after if before == after else None

    def _connect_once(self, uri: str) -> sqlite3.Connection:
        conn = sqlite3.connect(uri, uri=True, timeout=self._busy_timeout_ms / 1000,
                               check_same_thread=False, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        for number, migration in enumerate(MIGRATIONS, start=1):
            if number <= version:
                continue
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Another process may have migrated while we waited for the lock.
                if conn.execute("PRAGMA user_version").fetchone()[0] >= number:
                    conn.execute("COMMIT")
                    continue
                migration(conn, fts_tokenizer=self._tokenizer_wanted)
                conn.execute(f"PRAGMA user_version={number}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    # -- use -------------------------------------------------------------------------------

    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection. Raises ``IndexStoreError`` after :meth:`close`."""
        if self._conn is None:
            raise IndexStoreError("index store is closed", db_path=str(self.path))
        return self._conn

    @property
    def is_open(self) -> bool:
        """Whether the connection is open."""
        return self._conn is not None

    @contextlib.contextmanager
    def locked(self) -> Iterator[sqlite3.Connection]:
        """Hold the store lock and translate SQLite errors; yields the connection."""
        with self._lock, translate_errors(self.path):
            yield self.conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: commit on success, roll back on any error.

        ``BEGIN IMMEDIATE`` is retried while another connection holds the write lock (busy
        timeout, then jittered backoff, ``busy_retry_attempts`` calls in all).

        Raises:
            IndexStoreError: on any SQLite error (including a lock held past all retries).
        """
        with self.locked() as conn:
            self._retry(lambda: conn.execute("BEGIN IMMEDIATE"))
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one read statement and return all rows (bound parameters only).

        Retried like ``BEGIN IMMEDIATE`` when SQLite reports busy.

        Raises:
            IndexStoreError: on any SQLite error.
        """
        with self.locked() as conn:
            return self._retry(lambda: conn.execute(sql, tuple(params)).fetchall())

    def user_version(self) -> int:
        """``PRAGMA user_version``: the number of migrations applied."""
        return int(self.query("PRAGMA user_version")[0][0])

    def get_meta(self, key: str) -> str | None:
        """Return one ``meta`` value, or ``None``."""
        rows = self.query("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def get_meta_json(self, key: str) -> Any:
        """Return one ``meta`` value parsed as JSON, or ``None`` when missing or unparsable."""
        raw = self.get_meta(key)
        if raw is None:
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None

    def set_meta(self, key: str, value: Any, *, conn: sqlite3.Connection | None = None) -> None:
        """Write one ``meta`` value as JSON (inside ``conn``'s transaction when given)."""
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        if conn is not None:
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, text))
            return
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, text))

    @property
    def fts_tokenizer(self) -> str:
        """The tokenizer ``chunks_fts`` was created with (``unicode61`` or ``trigram``)."""
        return self.get_meta("fts_tokenizer") or "unicode61"

    @property
    def fts_error(self) -> str | None:
        """Why FTS5 tables could not be created, or ``None`` when FTS is available."""
        return self.get_meta("fts_error")

    def quick_check(self) -> str:
        """Run ``PRAGMA quick_check``; returns ``"ok"`` or SQLite's first problem line.

        Raises:
            IndexStoreError: when the file is not a database at all.
        """
        rows = self.query("PRAGMA quick_check")
        return "ok" if rows and rows[0][0] == "ok" else "; ".join(str(r[0]) for r in rows[:5])

    def attach_copy_cache(self, other: Path) -> int:
        """Copy every ``embedding_cache`` row of the store at ``other`` into this one (upsert).

        Returns the number of rows now cached. Used to seed a rebuild (spec §4.5 step 2).
        ``other`` is attached read-only, so a missing file is never created.

        Raises:
            IndexStoreError: on any SQLite error.
        """
        uri = f"{Path(other).resolve().as_uri()}?mode=ro"
        with self.locked() as conn:
            self._retry(lambda: conn.execute("ATTACH DATABASE ? AS seed", (uri,)))
            try:
                has = conn.execute("SELECT 1 FROM seed.sqlite_master WHERE type='table'"
                                   " AND name='embedding_cache'").fetchone()
                if has:
                    self._retry(lambda: conn.execute("BEGIN IMMEDIATE"))
                    try:
                        conn.execute("INSERT OR REPLACE INTO main.embedding_cache"
                                     " SELECT provider, model, provider_key, hash, embedding,"
                                     " dims, updated_at FROM seed.embedding_cache")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    conn.execute("COMMIT")
            finally:
                conn.execute("DETACH DATABASE seed")
            return int(conn.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0])

    # -- publishing, replacement and recovery ---------------------------------------------

    def swap_from(self, temp_path: Path) -> None:
        """Publish the finished, closed rebuild at ``temp_path`` as this store's content.

        The temp database is checkpointed and switched to ``journal_mode=DELETE`` (so it has
        no ``-wal``), then copied into the live database with the online backup API in one
        transaction (see the module docstring). Only when the live file cannot take that
        (closed store, not a database, other page size) are the files renamed
        (:func:`~fallback.store.files.swap_db_files`) and the store reopened. The temp trio is
        deleted in every case (and a ``<temp>.lock`` a standalone temp store made). Call under the writer lock; the store lock is held throughout,
        so threads of this process wait instead of seeing a closed store.

        Raises:
            IndexStoreError: publishing failed (the previous index stays in place) or the new
                file cannot be opened.
        """
        with self._lock:
            try:
                with translate_errors(temp_path):
                    src = sqlite3.connect(f"{Path(temp_path).resolve().as_uri()}?mode=rw",
                                          uri=True, isolation_level=None,
                                          timeout=self._busy_timeout_ms / 1000)
                    try:
                        src.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                        src.execute("PRAGMA journal_mode=DELETE")
                        published = self._publish_by_backup(src)
                    finally:
                        src.close()
                if not published:
                    self._close_connection()
                    try:
                        swap_db_files(temp_path, self.path)
                    finally:
                        self._open()
            finally:
                remove_db_files(temp_path)
                with contextlib.suppress(OSError):  # a temp store opened with its own lock
                    os.remove(lock_path_for(Path(temp_path)))

    def _publish_by_backup(self, src: sqlite3.Connection) -> bool:
        """Copy ``src`` over the live database in one transaction; False when it cannot."""
        conn = self._conn
        if conn is None:
            return False
        try:
            live_page = conn.execute("PRAGMA page_size").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            if _is_corrupt(exc):
                return False
            raise
        if live_page != src.execute("PRAGMA page_size").fetchone()[0]:
            return False
        budget_s = self._busy_timeout_ms * max(1, self._busy_attempts) / 1000
        deadline = time.monotonic() + budget_s

        def progress(status: int, remaining: int, total: int) -> None:
            if status in (_SQLITE_BUSY, _SQLITE_LOCKED) and time.monotonic() > deadline:
                raise IndexStoreError("index store is locked by another process past the busy"
                                      f" timeout: publishing the rebuilt index waited {budget_s:g} s",
                                      db_path=str(self.path))

        try:
            src.backup(conn, progress=progress, sleep=0.05)
        except sqlite3.DatabaseError as exc:
            if _is_corrupt(exc):
                return False
            raise
        with contextlib.suppress(sqlite3.Error):
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        return True

    def is_replaced(self) -> bool:
        """Whether the file at :attr:`path` is no longer the one this store has open
        (another process swapped or removed it); False for a closed store."""
        return self._conn is not None and file_id(self.path) != self._file_id

    def reopen_if_replaced(self) -> bool:
        """Reopen when :meth:`is_replaced`; returns True when it reopened.

        Raises:
            IndexStoreError: the new file cannot be opened (see :class:`Store`).
        """
        with self._lock:
            if not self.is_replaced():
                return False
            self._close_connection()
            self._open()
            return True

    def recover_leftovers(self) -> list[str]:
        """Repair leftovers of a killed rebuild or swap, then reopen if the file changed.

        Must be called while :attr:`writer_lock` is held (before a sync). Returns the actions
        of :func:`~fallback.store.files.recover_db_files`.

        Raises:
            IndexStoreError: the writer lock is not held, or the files cannot be repaired.
        """
        if not self.writer_lock.held:
            raise IndexStoreError("recovering index files needs the writer lock",
                                  db_path=str(self.path))
        with self._lock:
            actions = recover_db_files(self.path)
            if self._conn is not None:
                self.reopen_if_replaced()
            return actions

    def reopen(self) -> None:
        """Close and open the connection again (after the file was swapped, readonly errors).

        Raises:
            IndexStoreError: the file cannot be opened.
        """
        with self._lock:
            self._close_connection()
            self._open()

    def _close_connection(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None
                self._file_id = None

    def close(self) -> None:
        """Close the connection (and the writer lock when this store created it); idempotent."""
        with self._lock:
            self._close_connection()
            if self._owns_writer_lock:
                self.writer_lock.close()

"""The builtin engine's SQLite store: connections, migrations, publishing a rebuild.

A :class:`Store` holds a writer (behind the store's write lock) and a ``query_only`` reader, so a
search answers from the last commit while a sync writes; a rebuild is published by the online
backup API in one transaction. The safety model is in docs/architecture.md ("Safety").
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

from fallback.errors import IndexStoreError
from fallback.fs.lock import backoff_s
from fallback.store.errors import (
    IndexStoreCorruptError,
    IndexStoreLockedError,
    IndexStoreReadOnlyError,
    code_kind,
    error_kind,
    retry_locked,
    translate_errors,
)
from fallback.store.files import (
    check_writable,
    file_id,
    has_leftovers,
    recover_db_files,
    remove_db_files,
    swap_db_files,
    temp_db_path,
)
from fallback.store.lock import StoreWriteLock, lock_path_for
from fallback.store.migrations import META_KEY, MIGRATIONS
from fallback.store.readonly import BUSY_TIMEOUT_MS, MetaReads

__all__ = ["META_KEY", "ReadonlyRecovery", "Store", "remove_db_files", "swap_db_files", "temp_db_path"]

T = TypeVar("T")

# Calls of a statement that keeps failing with SQLITE_BUSY/LOCKED, each after the busy timeout.
DEFAULT_BUSY_RETRY_ATTEMPTS = 3
# How long opening waits for another process to finish a rename swap, in ms.
DEFAULT_SWAP_WAIT_MS = 10_000
# The WAL is truncated back to this size after checkpoints (bytes): a publish passes the whole
# database through it.
WAL_SIZE_LIMIT_BYTES = 16 * 1024 * 1024
# Opens retried when the file at the path changes while it is being opened.
_OPEN_ATTEMPTS = 3


@dataclass
class ReadonlyRecovery:
    """Counters of readonly recovery (spec §5.3 step 6: reopen the store and retry once):
    recoveries started, retries that succeeded and failed, the last readonly error or None."""

    attempts: int = 0
    successes: int = 0
    failures: int = 0
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """``{"attempts", "successes", "failures", "lastError"}`` for ``status().custom``."""
        return {"attempts": self.attempts, "successes": self.successes,
                "failures": self.failures, "lastError": self.last_error}


class Store(MetaReads):
    """An open store: a writer and a reader connection, migrated to the latest schema.

    Args:
        path: the SQLite file; its parent directory is created.
        fts_tokenizer: ``unicode61`` or ``trigram``, for a new FTS table only.
        busy_timeout_ms: how long a statement waits for another connection's lock, in ms.
        busy_retry_attempts: calls of a busy statement before ``IndexStoreLockedError`` (>= 1).
        writer_lock: the inter-process writer lock (default a new ``StoreWriteLock``; a
            rebuild's store shares the live one's).
        swap_wait_ms: how long opening waits for another process's swap, in ms.
        scratch: a rebuild's temporary database: ``synchronous=OFF``.

    Raises ``IndexStoreError`` (typed: damaged, read-only, locked), also when another
    process's swap did not finish.
    """

    def __init__(self, path: Path, *, fts_tokenizer: str = "unicode61",
                 busy_timeout_ms: int = BUSY_TIMEOUT_MS,
                 busy_retry_attempts: int = DEFAULT_BUSY_RETRY_ATTEMPTS,
                 writer_lock: StoreWriteLock | None = None,
                 swap_wait_ms: int = DEFAULT_SWAP_WAIT_MS, scratch: bool = False) -> None:
        self.path = Path(path)
        # Lock order: _lock (the writer) before _read_lock (the reader), never the reverse.
        self._lock = threading.RLock()
        self._read_lock = threading.Lock()
        self._synchronous = "OFF" if scratch else "NORMAL"
        self._tokenizer_wanted = fts_tokenizer
        self._busy_timeout_ms = busy_timeout_ms
        self._busy_attempts = busy_retry_attempts
        self._swap_wait_ms = swap_wait_ms
        self._owns_writer_lock = writer_lock is None
        self.writer_lock = writer_lock or StoreWriteLock(self.path)
        self.readonly_recovery = ReadonlyRecovery()
        self.busy_retries = 0
        # time.monotonic() past which a transaction stops waiting for another process's lock
        # (None: the busy timeout alone); a search's sync budget sets it.
        self.lock_deadline: float | None = None
        self._conn: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._file_id: tuple[int, int] | None = None
        self._open()

    def _count_retry(self) -> None:
        self.busy_retries += 1

    def _retry(self, fn: Callable[[], T]) -> T:
        return retry_locked(fn, attempts=self._busy_attempts, on_retry=self._count_retry)

    def _open(self) -> None:
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
        def open_once() -> bool:
            if lock.try_acquire():
                try:
                    recover_db_files(self.path)
                    self._connect(create=True)
                finally:
                    lock.release()
                return True
            return self.path.exists() and self._connect_existing()  # leftovers: the writer's

        # Another process holds the writer lock and the file is missing: it is publishing a
        # rebuild. Poll (10 ms doubling to 200 ms) until the file is back.
        for wait_s in backoff_s(self._swap_wait_ms, initial_s=0.01, max_s=0.2, jitter_s=0):
            if open_once():
                return
            time.sleep(wait_s)
        if not open_once():
            raise IndexStoreError(
                "index store is missing while another process holds the writer lock"
                f" (a swap did not finish within {self._swap_wait_ms} ms)", db_path=str(self.path))

    def _connect_existing(self) -> bool:
        """Open the existing file (``mode=rw``); False when it vanished meanwhile (a swap).
        Raises ``IndexStoreReadOnlyError`` when this process may not write it."""
        try:
            self._connect(create=False)
        except IndexStoreReadOnlyError:
            raise
        except IndexStoreError:
            if not self.path.exists():
                return False
            check_writable(self.path)  # a read-only mount: name the cause
            raise
        try:
            check_writable(self.path)  # SQLite opens a file it may not write read-only, silently
        except IndexStoreReadOnlyError:
            self._close_connection()
            raise
        return True

    def _connect(self, *, create: bool) -> None:
        """Open the writer (migrating the schema), then the reader, on the same file."""
        base = self.path.resolve().as_uri()
        with translate_errors(self.path):
            for attempt in range(_OPEN_ATTEMPTS):
                before = file_id(self.path)
                conn = self._retry(lambda: self._configured(
                    f"{base}?mode={'rwc' if create else 'rw'}", "journal_mode=WAL",
                    f"synchronous={self._synchronous}", f"journal_size_limit={WAL_SIZE_LIMIT_BYTES}",
                    migrate=True))
                try:  # the reader: writes go through the writer, under its lock
                    reader = self._retry(lambda: self._configured(f"{base}?mode=rw", "query_only=ON"))
                except BaseException:
                    conn.close()
                    raise
                after = file_id(self.path)
                # A different file before and after: swapped while opening, open the new one.
                # (A file id recorded after the swap makes the next is_replaced() reopen.)
                if before == after or attempt == _OPEN_ATTEMPTS - 1:
                    break
                conn.close()
                reader.close()
        with self._read_lock:
            self._conn = conn
            self._reader = reader
            self._file_id = after if before == after else None

    def _new_connection(self, uri: str) -> sqlite3.Connection:
        conn = sqlite3.connect(uri, uri=True, timeout=self._busy_timeout_ms / 1000,
                               check_same_thread=False, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
        return conn

    def _configured(self, uri: str, *pragmas: str, migrate: bool = False) -> sqlite3.Connection:
        conn = self._new_connection(uri)
        try:
            for pragma in pragmas:
                conn.execute(f"PRAGMA {pragma}")
            if migrate:
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
                if conn.in_transaction:  # SQLITE_FULL (among others) has rolled it back already
                    conn.execute("ROLLBACK")
                raise

    @property
    def conn(self) -> sqlite3.Connection:
        """The writer connection. Raises ``IndexStoreError`` after :meth:`close`."""
        if self._conn is None:
            raise IndexStoreError("index store is closed", db_path=str(self.path))
        return self._conn

    @contextlib.contextmanager
    def locked(self) -> Iterator[sqlite3.Connection]:
        """Hold the write lock and translate SQLite errors; yields the writer connection."""
        with self._lock, translate_errors(self.path):
            yield self.conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction (retried while busy): commit on success, roll
        back on any error. Raises ``IndexStoreError`` (typed; locked past all retries)."""
        with self.locked() as conn:
            self._retry(lambda: self._begin(conn))
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:  # SQLITE_FULL (among others) has rolled it back already
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def lock_wait_ms(self, wait_ms: int) -> int:
        """The longest wait in ms for another process's lock: ``wait_ms``, or what is left
        until :attr:`lock_deadline` (>= 0) when that is sooner."""
        until = self.lock_deadline
        return wait_ms if until is None else min(wait_ms, max(0, int((until - time.monotonic()) * 1000)))

    def _begin(self, conn: sqlite3.Connection) -> None:
        if self.lock_deadline is None:
            conn.execute("BEGIN IMMEDIATE")
            return
        conn.execute(f"PRAGMA busy_timeout={self.lock_wait_ms(self._busy_timeout_ms)}")
        try:
            conn.execute("BEGIN IMMEDIATE")
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """All rows of one read statement on the reader (bound parameters only): it sees the
        last commit and waits only while a rename swap reopens the files. Raises
        ``IndexStoreError`` (typed), or ``index store is closed``."""
        def run(reader: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return self._retry(lambda: reader.execute(sql, tuple(params)).fetchall())

        with translate_errors(self.path):
            with self._read_lock:
                if self._reader is not None:
                    return run(self._reader)
            with self._lock, self._read_lock:  # closed, or reopening: wait for the writer
                if self._reader is None:
                    raise IndexStoreError("index store is closed", db_path=str(self.path))
                return run(self._reader)

    def set_meta(self, key: str, value: Any, *, conn: sqlite3.Connection | None = None) -> None:
        """Write one ``meta`` value as JSON (inside ``conn``'s transaction when given)."""
        if conn is None:
            with self.transaction() as c:
                self.set_meta(key, value, conn=c)
            return
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                     (key, orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()))

    def integrity_problem(self) -> str:
        """``"ok"``, or the first problem ``PRAGMA quick_check`` or FTS5's ``integrity-check`` of
        the full-text tables finds (quick_check never reads their pages). Raises
        ``IndexStoreCorruptError``: the file is not a database at all."""
        problem = self.quick_check()
        try:
            with self.locked() as conn:
                for table in () if self.fts_error else ("chunks_fts", "chunks_trigram"):
                    conn.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")
        except IndexStoreCorruptError as damaged:
            problem = str(damaged.__cause__)
        return problem

    def attach_copy_cache(self, other: Path) -> int:
        """Copy every ``embedding_cache`` row of the store at ``other`` (attached read-only)
        into this one; returns the rows now cached (spec §4.5 step 2). Raises ``IndexStoreError``."""
        uri = f"{Path(other).resolve().as_uri()}?mode=ro"
        with self.locked() as conn:
            self._retry(lambda: conn.execute("ATTACH DATABASE ? AS seed", (uri,)))
            try:
                has = conn.execute("SELECT 1 FROM seed.sqlite_master WHERE type='table'"
                                   " AND name='embedding_cache'").fetchone()
                if has:
                    with self.transaction():
                        conn.execute("INSERT OR REPLACE INTO main.embedding_cache"
                                     " SELECT provider, model, provider_key, hash, embedding,"
                                     " dims, updated_at FROM seed.embedding_cache")
            finally:
                conn.execute("DETACH DATABASE seed")
            return int(conn.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0])

    def swap_from(self, temp_path: Path) -> None:
        """Publish the finished, closed rebuild at ``temp_path`` as this store's content (under
        the writer lock), by the online backup API, or by renaming files where the live file
        cannot take a backup (closed, not a database, other page size); the temp files are
        deleted in every case. Raises ``IndexStoreError``: the previous index stays in place,
        or the new file cannot be opened."""
        with self._lock:
            try:
                with translate_errors(temp_path):
                    with contextlib.closing(sqlite3.connect(
                            f"{Path(temp_path).resolve().as_uri()}?mode=rw", uri=True,
                            isolation_level=None, timeout=self._busy_timeout_ms / 1000)) as src:
                        src.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                        src.execute("PRAGMA journal_mode=DELETE")
                        published = self._publish_by_backup(src)
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
        budget_s = self._busy_timeout_ms * max(1, self._busy_attempts) / 1000
        deadline = time.monotonic() + budget_s

        def progress(status: int, remaining: int, total: int) -> None:
            busy = code_kind(status)[0] is IndexStoreLockedError
            if busy and time.monotonic() > deadline:
                raise IndexStoreLockedError(
                    "index store is locked by another process past the busy timeout:"
                    f" publishing the rebuilt index waited {budget_s:g} s", db_path=str(self.path))

        try:
            page_sizes = {c.execute("PRAGMA page_size").fetchone()[0] for c in (conn, src)}
            if len(page_sizes) > 1:
                return False
            src.backup(conn, progress=progress, sleep=0.05)
        except sqlite3.DatabaseError as exc:  # a live file that is not a database
            if error_kind(exc)[0] is IndexStoreCorruptError:
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
        """Reopen when :meth:`is_replaced` (checked without a lock); True when it reopened.
        Raises ``IndexStoreError``: the new file cannot be opened."""
        if not self.is_replaced():
            return False
        with self._lock:
            if not self.is_replaced():
                return False
            self._close_connection()
            self._open()
            return True

    def recover_leftovers(self) -> list[str]:
        """Repair leftovers of a killed rebuild or swap under the held :attr:`writer_lock`,
        then reopen if the file changed; returns ``recover_db_files``'s actions. Raises
        ``IndexStoreError``: the writer lock is not held, or the files cannot be repaired."""
        if not self.writer_lock.held:
            raise IndexStoreError("recovering index files needs the writer lock",
                                  db_path=str(self.path))
        with self._lock:
            actions = recover_db_files(self.path)
            if self._conn is not None:
                self.reopen_if_replaced()
            return actions

    def reopen(self) -> None:
        """Close and open the connections again. Raises ``IndexStoreError``."""
        with self._lock:
            self._close_connection()
            self._open()

    def _close_connection(self) -> None:
        with self._lock, self._read_lock:
            for conn in (self._reader, self._conn):
                if conn is not None:
                    with contextlib.suppress(sqlite3.Error):
                        conn.close()
            self._conn = None
            self._reader = None
            self._file_id = None

    def close(self) -> None:
        """Close both connections (and the writer lock when this store created it); idempotent."""
        with self._lock:
            self._close_connection()
            if self._owns_writer_lock:
                self.writer_lock.close()

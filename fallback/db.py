"""The builtin engine's SQLite store: connection, migrations, error mapping and atomic swap.

One SQLite file per agent (``EngineSettings.db_path``), opened with WAL, ``busy_timeout`` and
``synchronous=NORMAL``; the schema comes from the numbered migrations in
``fallback/migrations.py``. Every ``sqlite3.Error`` is translated into ``IndexStoreError`` in
exactly one place, :func:`translate_errors`.

A :class:`Store` serialises all use of its one connection with a lock, so it may be shared
between worker threads (``anyio.to_thread``); each file's write is one ``BEGIN IMMEDIATE``
transaction (:meth:`Store.transaction`).

Atomic rebuild (spec §4.5): build into :func:`temp_db_path` (``<db>.tmp-<uuid>``), then
:func:`swap_db_files` renames the live trio (``db``, ``-wal``, ``-shm``) to a backup, the temp
trio onto the live name, restores the backup if that fails, and deletes the backup.
:func:`remove_db_files` deletes a trio (used when a rebuild fails, so no ``.tmp-`` file stays).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from fallback.errors import IndexStoreError
from fallback.fts import FtsPlan
from fallback.migrations import MIGRATIONS

__all__ = [
    "META_KEY",
    "Store",
    "keyword_rows",
    "remove_db_files",
    "swap_db_files",
    "temp_db_path",
    "translate_errors",
]

# Meta key of the index identity JSON (spec §4.2, E1/E2 name).
META_KEY = "memory_index_meta_v1"
# Default busy timeout: how long a writer waits for another process's lock (ms).
DEFAULT_BUSY_TIMEOUT_MS = 5000
# Suffixes of the files one SQLite database in WAL mode consists of.
_DB_SUFFIXES = ("", "-wal", "-shm")


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


def temp_db_path(db_path: Path) -> Path:
    """Return a fresh ``<db>.tmp-<uuid>`` path next to ``db_path`` for a safe rebuild."""
    return db_path.with_name(f"{db_path.name}.tmp-{uuid.uuid4().hex}")


def remove_db_files(db_path: Path) -> None:
    """Delete ``db_path`` and its ``-wal``/``-shm`` companions; missing files are ignored."""
    for suffix in _DB_SUFFIXES:
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{db_path}{suffix}")


def swap_db_files(temp_path: Path, db_path: Path) -> None:
    """Atomically publish the database at ``temp_path`` as ``db_path`` (spec §4.5 step 5).

    Both databases must be closed. The live trio is renamed to ``<db>.backup-<uuid>``, the temp
    trio onto ``<db>``; if that fails the backup is renamed back and the error re-raised;
    finally the backup trio is deleted.

    Raises:
        IndexStoreError: when the files cannot be renamed (the live database is restored).
    """
    backup = db_path.with_name(f"{db_path.name}.backup-{uuid.uuid4().hex}")
    moved: list[str] = []
    try:
        for suffix in _DB_SUFFIXES:
            if os.path.exists(f"{db_path}{suffix}"):
                os.replace(f"{db_path}{suffix}", f"{backup}{suffix}")
                moved.append(suffix)
        for suffix in _DB_SUFFIXES:
            if os.path.exists(f"{temp_path}{suffix}"):
                os.replace(f"{temp_path}{suffix}", f"{db_path}{suffix}")
    except OSError as exc:
        for suffix in moved:
            with contextlib.suppress(OSError):
                os.replace(f"{backup}{suffix}", f"{db_path}{suffix}")
        remove_db_files(temp_path)
        raise IndexStoreError(f"could not swap in the rebuilt index: {exc}",
                              db_path=str(db_path)) from exc
    remove_db_files(backup)


class Store:
    """An open store: one connection, migrated to the latest schema, lock-serialised.

    Args:
        path: the SQLite file; its parent directory is created.
        fts_tokenizer: ``unicode61`` or ``trigram``; used only when the FTS table is created
            (an existing store keeps its tokenizer, see :attr:`fts_tokenizer`).
        busy_timeout_ms: how long to wait for another writer's lock, in ms.

    Raises:
        IndexStoreError: the file cannot be opened, is corrupt, read-only or locked.
    """

    def __init__(self, path: Path, *, fts_tokenizer: str = "unicode61",
                 busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._tokenizer_wanted = fts_tokenizer
        self._busy_timeout_ms = busy_timeout_ms
        self._conn: sqlite3.Connection | None = None
        self._open()

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise IndexStoreError(f"cannot create the store directory: {exc}",
                                  db_path=str(self.path)) from exc
        with translate_errors(self.path):
            conn = sqlite3.connect(str(self.path), timeout=self._busy_timeout_ms / 1000,
                                   check_same_thread=False, isolation_level=None)
            try:
                conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                self._migrate(conn)
            except sqlite3.Error:
                conn.close()
                raise
        self._conn = conn

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

        Raises:
            IndexStoreError: on any SQLite error (including a lock held past the busy timeout).
        """
        with self.locked() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one read statement and return all rows (bound parameters only)."""
        with self.locked() as conn:
            return conn.execute(sql, tuple(params)).fetchall()

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
        """
        with self.locked() as conn:
            conn.execute("ATTACH DATABASE ? AS seed", (str(other),))
            try:
                has = conn.execute("SELECT 1 FROM seed.sqlite_master WHERE type='table'"
                                   " AND name='embedding_cache'").fetchone()
                if has:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("INSERT OR REPLACE INTO main.embedding_cache"
                                 " SELECT provider, model, provider_key, hash, embedding, dims,"
                                 " updated_at FROM seed.embedding_cache")
                    conn.execute("COMMIT")
            finally:
                conn.execute("DETACH DATABASE seed")
            return int(conn.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0])

    def swap_from(self, temp_path: Path) -> None:
        """Publish the (closed) rebuilt database at ``temp_path`` as this store and reopen.

        Holds the store lock across close, swap and reopen, so concurrent readers wait
        instead of seeing a closed store.

        Raises:
            IndexStoreError: the swap failed (the previous database is back in place and
                reopened) or the new file cannot be opened.
        """
        with self._lock:
            self.close()
            try:
                swap_db_files(temp_path, self.path)
            finally:
                self._open()

    def reopen(self) -> None:
        """Close and open the connection again (after the file was swapped)."""
        with self._lock:
            self.close()
            self._open()

    def close(self) -> None:
        """Close the connection; idempotent."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None


def keyword_rows(store: Store, plan: FtsPlan, *, sources: Sequence[str],
                 limit: int) -> list[tuple[str, str, str, int, int, str, float]]:
    """Run a keyword plan (see ``fallback/fts.py``) and return the best rows first.

    Rows are ``(chunk_id, path, source, start_line, end_line, text, rank)`` where ``rank`` is
    the FTS5 ``bm25()`` value (negative = better; ``0.0`` for LIKE-only rows), ordered by rank
    then path and start line, at most ``limit`` rows, restricted to ``sources``. Only chunks that
    still exist in ``chunks`` are returned. When ``MATCH`` itself fails (tokenizer quirks) the
    plan is retried as a LIKE scan over every token with rank 0 (spec §8.2).

    Raises:
        IndexStoreError: on any other SQLite failure.
    """
    if limit <= 0 or not sources:
        return []
    try:
        return _keyword_rows(store, plan, sources=sources, limit=limit, like_only=False)
    except IndexStoreError as exc:
        if not isinstance(exc.__cause__, sqlite3.OperationalError) or "fts5" not in str(
                exc.__cause__).lower() and "match" not in str(exc.__cause__).lower():
            raise
        return _keyword_rows(store, plan, sources=sources, limit=limit, like_only=True)


def _keyword_rows(store: Store, plan: FtsPlan, *, sources: Sequence[str], limit: int,
                  like_only: bool) -> list[tuple[str, str, str, int, int, str, float]]:
    joins: list[str] = []
    params: list[Any] = []
    rank = "0.0"
    likes = plan.fallback_like_patterns if like_only else plan.like_patterns
    if not like_only and plan.match:
        joins.append("JOIN (SELECT rowid AS rid, bm25(chunks_fts) AS r FROM chunks_fts"
                     " WHERE chunks_fts MATCH ?) m ON m.rid = c.rowid")
        params.append(plan.match)
        rank = "m.r"
    if not like_only and plan.trigram_match:
        joins.append("JOIN (SELECT rowid AS rid, bm25(chunks_trigram) AS r FROM chunks_trigram"
                     " WHERE chunks_trigram MATCH ?) t ON t.rid = c.rowid")
        params.append(plan.trigram_match)
        rank = rank if rank != "0.0" else "t.r"
    where = [f"c.source IN ({', '.join('?' for _ in sources)})"]
    params.extend(sources)
    for pattern in likes:
        where.append("c.text LIKE ? ESCAPE '\\'")
        params.append(pattern)
    sql = (f"SELECT c.id, c.path, c.source, c.start_line, c.end_line, c.text, {rank} AS rank"
           f" FROM chunks c {' '.join(joins)} WHERE {' AND '.join(where)}"
           " ORDER BY rank ASC, c.path ASC, c.start_line ASC LIMIT ?")
    params.append(int(limit))
    rows = store.query(sql, params)
    return [(r[0], r[1], r[2], int(r[3]), int(r[4]), r[5], float(r[6])) for r in rows]

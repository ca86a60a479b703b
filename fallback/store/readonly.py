"""Reading a store without writing it: the ``StoreReader`` protocol and a read-only connection.

The keyword search steps (``fallback/search/keyword.py``, ``substring.py``, ``fts_only.py``)
only read, through :class:`StoreReader`; the engine's :class:`~fallback.store.db.Store`
implements it with its reader connection, and :class:`ReadOnlyStore` with one ``query_only``
connection to an existing file, for the one-shot search of an index that is in sync
(``fallback/engine/in_sync.py``), which opens no writer, runs no migration and takes no lock.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from fallback.store.errors import (
    SQLITE_CANTOPEN,
    IndexStoreReadOnlyError,
    error_kind,
    result_code,
    translate_errors,
)

__all__ = ["BUSY_TIMEOUT_MS", "IMMUTABLE_QUERY", "MetaReads", "ReadOnlyStore", "StoreReader",
           "connect_read_only", "is_immutable"]

# How long a read waits for another connection's lock (a checkpoint), ms: the store's default.
BUSY_TIMEOUT_MS = 5000


def _cannot_write(exc: sqlite3.Error) -> bool:
    """Whether opening failed only because this process may not write the store's folder or
    files (``SQLITE_READONLY_*``, or ``SQLITE_CANTOPEN`` for a ``-shm`` it may not create)."""
    return (issubclass(error_kind(exc)[0], IndexStoreReadOnlyError)
            or (result_code(exc) or 0) & 0xFF == SQLITE_CANTOPEN)


# The URI query of the last way connect_read_only() opens a store: the main file alone, read as
# a file that never changes (the connection does not see later commits of other connections).
IMMUTABLE_QUERY = "mode=ro&immutable=1"


def is_immutable(conn: sqlite3.Connection) -> bool:
    """Whether :func:`connect_read_only` opened ``conn`` as an immutable file (the last resort
    where the store's folder cannot be written): such a connection never sees a commit made
    after it opened, so a caller that keeps connections must open it again to read one."""
    return bool(getattr(conn, "immutable", False))


class _Connection(sqlite3.Connection):
    """A ``sqlite3`` connection that remembers whether it was opened immutable."""

    immutable = False


def connect_read_only(path: Path, *, modes: Sequence[str] = ("rw", "ro"),
                      check_same_thread: bool = True) -> sqlite3.Connection:
    """A connection that only reads the existing store at ``path``, also where this process may
    not write its folder (a read-only state dir, another user's files).

    Tries each of ``modes`` in turn (``rw`` gets ``PRAGMA query_only``), moving on only when
    SQLite says it cannot write: a WAL store needs its ``-shm`` file, which a read-only folder
    cannot hold. Last comes ``mode=ro&immutable=1``, only when no ``-wal`` file with frames
    lies next to the store (SQLite then reads the main file alone; every committed
    transaction is in it, and nobody can append a ``-wal`` to a folder that cannot be written).
    Each connection is probed with ``PRAGMA user_version`` before it is returned; whether it
    was opened immutable is :func:`is_immutable`.

    Args:
        path: an existing store file.
        modes: the URI modes to try first, in order (``rw`` and/or ``ro``).
        check_same_thread: passed to ``sqlite3.connect``.

    Raises:
        IndexStoreError: typed (``fallback/store/errors.py``); the last failure when no way
            to open the file for reading works.
    """
    base = path.resolve().as_uri()
    wal = Path(f"{path}-wal")
    frames = wal.exists() and wal.stat().st_size > 0
    uris = [f"{base}?mode={m}" for m in modes] + ([] if frames else [f"{base}?{IMMUTABLE_QUERY}"])

    def probe(uri: str) -> sqlite3.Connection:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                               isolation_level=None, check_same_thread=check_same_thread,
                               factory=_Connection)
        conn.immutable = uri.endswith(IMMUTABLE_QUERY)
        try:
            if "mode=rw" in uri:
                conn.execute("PRAGMA query_only=ON")
            conn.execute("PRAGMA user_version").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    with translate_errors(path):
        for uri in uris[:-1]:
            try:
                return probe(uri)
            except sqlite3.Error as exc:
                if not _cannot_write(exc):
                    raise
        return probe(uris[-1])


class StoreReader(Protocol):
    """What read-only search code needs from a store."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one read statement with bound parameters; all rows. Raises ``IndexStoreError``."""
        ...

    @property
    def fts_tokenizer(self) -> str:
        """The tokenizer ``chunks_fts`` was created with (``unicode61`` or ``trigram``)."""
        ...

    @property
    def fts_error(self) -> str | None:
        """Why FTS5 tables could not be created, or ``None`` when FTS is available."""
        ...


class MetaReads:
    """``PRAGMA user_version`` and ``meta`` reads (the FTS tokenizer and error included) over a
    class's ``query`` (the engine's :class:`~fallback.store.db.Store` and
    :class:`ReadOnlyStore`)."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One read statement's rows: each class that takes these reads defines it."""
        raise NotImplementedError(f"{type(self).__name__} defines no query()")

    def user_version(self) -> int:
        """``PRAGMA user_version``: the number of migrations applied."""
        return int(self.query("PRAGMA user_version")[0][0])

    def get_meta(self, key: str) -> str | None:
        """One ``meta`` value, or ``None``."""
        rows = self.query("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def get_meta_json(self, key: str) -> Any:
        """One ``meta`` value parsed as JSON, or ``None`` when missing or unparsable."""
        raw = self.get_meta(key)
        try:
            return None if raw is None else json.loads(raw)
        except ValueError:
            return None

    # (connection, tokenizer, error): the FTS meta rows, read once per connection
    _fts_meta: tuple[object, str, str | None] | None = None

    def _fts_state(self) -> tuple[str, str | None]:
        """``(tokenizer, error)`` of ``chunks_fts``, read once per open connection: only the
        migration that creates the FTS tables writes them, and a rebuilt store is a new file,
        opened on a new connection."""
        conn = getattr(self, "_conn", None)
        known = self._fts_meta
        if known is None or conn is None or known[0] is not conn:
            rows = dict(self.query("SELECT key, value FROM meta"
                                   " WHERE key IN ('fts_tokenizer', 'fts_error')"))
            known = (conn, rows.get("fts_tokenizer") or "unicode61", rows.get("fts_error"))
            if conn is not None:
                self._fts_meta = known
        return known[1], known[2]

    @property
    def fts_tokenizer(self) -> str:
        """The tokenizer ``chunks_fts`` was created with (``unicode61`` or ``trigram``)."""
        return self._fts_state()[0]

    @property
    def fts_error(self) -> str | None:
        """Why FTS5 tables could not be created, or ``None`` when FTS is available."""
        return self._fts_state()[1]


class ReadOnlyStore(MetaReads):
    """One ``query_only`` connection to an existing store file (a :class:`StoreReader`).

    Errors are the store's typed ``IndexStoreError`` classes (``fallback/store/errors.py``).
    Use :meth:`open`; close with :meth:`close` or a ``with`` block.
    """

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn = conn

    @classmethod
    def open(cls, path: Path) -> ReadOnlyStore | None:
        """Open the store at ``path``; ``None`` when there is no such file (it is never created).

        Opened read-write with ``PRAGMA query_only``, like the engine's own reader: a
        ``mode=ro`` connection to a WAL database would leave its ``-wal`` and ``-shm`` files
        behind. Where the store cannot be written (a read-only state dir) it is read through
        ``mode=ro`` or as an immutable file instead (:func:`connect_read_only`).

        Raises:
            IndexStoreError: the file cannot be opened as a SQLite database.
        """
        if not path.is_file():
            return None
        return cls(path, connect_read_only(path))

    def __enter__(self) -> ReadOnlyStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; idempotent."""
        self._conn.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one read statement with bound parameters and return all rows.

        Raises:
            IndexStoreError: any SQLite error, typed by result code.
        """
        with translate_errors(self.path):
            return self._conn.execute(sql, tuple(params)).fetchall()


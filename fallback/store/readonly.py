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

from fallback.store.errors import translate_errors

__all__ = ["BUSY_TIMEOUT_MS", "MetaReads", "ReadOnlyStore", "StoreReader"]

# How long a read waits for another connection's lock (a checkpoint), ms: the store's default.
BUSY_TIMEOUT_MS = 5000


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

    @property
    def fts_tokenizer(self) -> str:
        """The tokenizer ``chunks_fts`` was created with (``unicode61`` or ``trigram``)."""
        return self.get_meta("fts_tokenizer") or "unicode61"

    @property
    def fts_error(self) -> str | None:
        """Why FTS5 tables could not be created, or ``None`` when FTS is available."""
        return self.get_meta("fts_error")


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
        behind.

        Raises:
            IndexStoreError: the file cannot be opened as a SQLite database.
        """
        if not path.is_file():
            return None
        with translate_errors(path):
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True,
                                   timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            try:
                conn.execute("PRAGMA query_only=ON")
            except BaseException:
                conn.close()
                raise
        return cls(path, conn)

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


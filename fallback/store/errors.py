"""Typed store errors and the one table that maps SQLite result codes onto them.

Every ``sqlite3`` failure of the store becomes an :class:`~fallback.errors.IndexStoreError`
here, by its result code in :data:`ERROR_TABLE` (extended code first, then primary), never by
its message text::

    IndexStoreError                   (fallback/errors.py) any other store failure
     +-- IndexStoreLockedError        SQLITE_BUSY, SQLITE_LOCKED: wait and retry
     +-- IndexStoreReadOnlyError      SQLITE_READONLY: reopen the connection, retry once
     +-- IndexStoreCorruptError       SQLITE_CORRUPT, SQLITE_NOTADB: move the file aside, rebuild
     +-- IndexStoreFullError          SQLITE_FULL, SQLITE_IOERR_SHMSIZE: the disk (or the store's
                                      page limit) is full

An error without a code (a closed connection, Python 3.10) is a plain ``IndexStoreError``.

Source: result code values and meanings from SQLite's "Result and Error Codes"
(https://www.sqlite.org/rescode.html).
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from fallback.errors import IndexStoreError

__all__ = ["ERROR_TABLE", "IndexStoreCorruptError", "IndexStoreFullError", "IndexStoreLockedError",
           "IndexStoreReadOnlyError", "code_kind", "error_kind", "is_locked", "result_code",
           "retry_locked", "translate_errors"]


class IndexStoreLockedError(IndexStoreError):
    """Raised when another connection held the store's lock past the busy timeout and the
    retries (``SQLITE_BUSY``, ``SQLITE_LOCKED``)."""


class IndexStoreReadOnlyError(IndexStoreError):
    """Raised when the store cannot be written through this connection (``SQLITE_READONLY``)."""


class IndexStoreCorruptError(IndexStoreError):
    """Raised when the store file is damaged or not a SQLite database (``SQLITE_CORRUPT``,
    ``SQLITE_NOTADB``); the engine moves it aside and rebuilds."""


class IndexStoreFullError(IndexStoreError):
    """Raised when a write finds the disk full (``SQLITE_FULL``, also ``max_page_count``), or
    opening cannot grow the ``-shm`` file for it (``SQLITE_IOERR_SHMSIZE``)."""


# SQLite primary result codes (the low 8 bits of every extended code).
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_IOERR = 10
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_CANTOPEN = 14
SQLITE_NOTADB = 26

_LOCKED = "is locked by another process past the busy timeout"
_READ_ONLY = "is read-only"
_CORRUPT = "is corrupt"

# The one mapping: SQLite result code (primary, or extended: primary | n << 8) -> (error
# class, condition in words); the message is "index store <condition>: <SQLite's text>".
ERROR_TABLE: Mapping[int, tuple[type[IndexStoreError], str]] = MappingProxyType({
    SQLITE_BUSY: (IndexStoreLockedError, _LOCKED),
    SQLITE_BUSY | 1 << 8: (IndexStoreLockedError, _LOCKED + " (another process is recovering it)"),
    SQLITE_BUSY | 2 << 8: (IndexStoreLockedError, _LOCKED + " (a read snapshot went stale)"),
    SQLITE_LOCKED: (IndexStoreLockedError, _LOCKED),
    SQLITE_READONLY: (IndexStoreReadOnlyError, _READ_ONLY),
    SQLITE_READONLY | 1 << 8: (IndexStoreReadOnlyError, _READ_ONLY + " (its WAL needs recovery)"),
    SQLITE_READONLY | 2 << 8: (IndexStoreReadOnlyError, _READ_ONLY + " (cannot lock its -shm file)"),
    SQLITE_READONLY | 3 << 8: (IndexStoreReadOnlyError, _READ_ONLY + " (a hot journal needs rollback)"),
    SQLITE_READONLY | 4 << 8: (IndexStoreReadOnlyError, _READ_ONLY + " (the file was moved or replaced)"),
    SQLITE_READONLY | 5 << 8: (IndexStoreReadOnlyError, _READ_ONLY + " (cannot initialise its -shm file)"),
    SQLITE_READONLY | 6 << 8: (IndexStoreReadOnlyError, _READ_ONLY + " (its directory is read-only)"),
    SQLITE_CORRUPT: (IndexStoreCorruptError, _CORRUPT),
    SQLITE_CORRUPT | 1 << 8: (IndexStoreCorruptError, _CORRUPT + " (a virtual table is damaged)"),
    SQLITE_CORRUPT | 2 << 8: (IndexStoreCorruptError, _CORRUPT + " (sqlite_sequence is damaged)"),
    SQLITE_CORRUPT | 3 << 8: (IndexStoreCorruptError, _CORRUPT + " (an index is damaged)"),
    SQLITE_NOTADB: (IndexStoreCorruptError, _CORRUPT),
    SQLITE_CANTOPEN: (IndexStoreError, "cannot be opened"),
    SQLITE_FULL: (IndexStoreFullError, "is full"),
    SQLITE_IOERR | 19 << 8: (IndexStoreFullError, "is full (cannot grow its -shm file)"),
})
_GENERIC = (IndexStoreError, "error")


def result_code(exc: BaseException) -> int | None:
    """The SQLite extended result code of a ``sqlite3`` exception, or None (none, negative)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code if isinstance(code, int) and code >= 0 else None


def code_kind(code: int | None) -> tuple[type[IndexStoreError], str]:
    """``(error class, condition)`` of an extended or primary result code (:data:`ERROR_TABLE`),
    else ``(IndexStoreError, "error")``."""
    if code is None:
        return _GENERIC
    return ERROR_TABLE.get(code) or ERROR_TABLE.get(code & 0xFF) or _GENERIC


def error_kind(exc: BaseException) -> tuple[type[IndexStoreError], str]:
    """:func:`code_kind` of a SQLite exception's :func:`result_code`."""
    return code_kind(result_code(exc))


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` is a SQLite exception that maps to :class:`IndexStoreLockedError`."""
    return isinstance(exc, sqlite3.Error) and issubclass(error_kind(exc)[0], IndexStoreLockedError)


@contextlib.contextmanager
def translate_errors(db_path: Path | str | None) -> Iterator[None]:
    """Re-raise any ``sqlite3`` exception inside the block as its typed error (:func:`error_kind`),
    chained: ``index store <condition>: <SQLite's text>``, ``db_path`` kept on it (None: not
    named); other exceptions pass through."""
    try:
        yield
    except sqlite3.Error as exc:
        cls, condition = error_kind(exc)
        text = str(exc) or type(exc).__name__
        raise cls(f"index store {condition}: {text}", db_path=str(db_path) if db_path else None) from exc


_T = TypeVar("_T")


def retry_locked(fn: Callable[[], _T], *, attempts: int, on_retry: Callable[[], None]) -> _T:
    """Call ``fn``; retry it while it raises a locked error (:func:`is_locked`), at most
    ``attempts`` calls in all, each retry after ``on_retry()`` and a random exponential
    backoff (up to 20 ms doubling, at most 250 ms); raises what ``fn`` raised last."""
    attempt = 1
    while True:
        try:
            return fn()
        except Exception as exc:
            if attempt >= attempts or not is_locked(exc):
                raise
        on_retry()
        time.sleep(random.uniform(0, min(0.25, 0.02 * 2 ** (attempt - 1))))
        attempt += 1

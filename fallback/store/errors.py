"""Typed store errors and the one table that maps SQLite result codes onto them.

Every SQLite failure of the store, whether it comes from Python's ``sqlite3`` or from ``apsw``,
is turned into an :class:`~fallback.errors.IndexStoreError` here and nowhere else: by its SQLite
result code, looked up in :data:`ERROR_TABLE` (the extended code first, then its primary code),
never by its message text. The subclasses say what a caller can do about it::

    IndexStoreError                   (fallback/errors.py) any other store failure
     +-- IndexStoreLockedError        SQLITE_BUSY, SQLITE_LOCKED: wait and retry
     +-- IndexStoreReadOnlyError      SQLITE_READONLY: reopen the connection, retry once
     +-- IndexStoreCorruptError       SQLITE_CORRUPT, SQLITE_NOTADB: move the file aside, rebuild
     +-- IndexStoreFullError          SQLITE_FULL: the disk (or the store's page limit) is full

Where the code comes from: ``sqlite3.Error.sqlite_errorcode`` (Python 3.11+; Python enables
extended result codes, so it is the extended code) and ``apsw.Error.extendedresult``. An error
without a code (``sqlite3`` on Python 3.10, ``sqlite3.ProgrammingError`` for a closed
connection, apsw's own ``ConnectionClosedError``) becomes a plain ``IndexStoreError``.

Source: result code values and meanings from SQLite's "Result and Error Codes"
(https://www.sqlite.org/rescode.html).
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from fallback.errors import IndexStoreError

__all__ = [
    "retry_locked",
    "ERROR_TABLE",
    "IndexStoreCorruptError",
    "IndexStoreFullError",
    "IndexStoreLockedError",
    "IndexStoreReadOnlyError",
    "code_kind",
    "error_kind",
    "is_locked",
    "is_sqlite_error",
    "result_code",
    "store_error",
    "translate_errors",
]


class IndexStoreLockedError(IndexStoreError):
    """Raised when another connection held the store's lock past the busy timeout and the
    retries (``SQLITE_BUSY``, ``SQLITE_LOCKED`` and their extended codes)."""


class IndexStoreReadOnlyError(IndexStoreError):
    """Raised when the store cannot be written through this connection (``SQLITE_READONLY``:
    file or directory permissions, a file replaced under an open connection, ``query_only``)."""


class IndexStoreCorruptError(IndexStoreError):
    """Raised when the store file is damaged or is not a SQLite database (``SQLITE_CORRUPT``,
    ``SQLITE_NOTADB``); the index is derived data, so the engine moves it aside and rebuilds."""


# SQLite primary result codes (the low 8 bits of every extended code).
class IndexStoreFullError(IndexStoreError):
    """Raised when a write finds the disk full (``SQLITE_FULL``, also the store's
    ``max_page_count``); the sync stops, and status tells it with the files left waiting."""


SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_CORRUPT = 11
SQLITE_FULL = 13
SQLITE_CANTOPEN = 14
SQLITE_NOTADB = 26
# Extended result codes whose condition deserves its own words.
SQLITE_BUSY_RECOVERY = SQLITE_BUSY | (1 << 8)
SQLITE_BUSY_SNAPSHOT = SQLITE_BUSY | (2 << 8)
SQLITE_BUSY_TIMEOUT = SQLITE_BUSY | (3 << 8)
SQLITE_LOCKED_SHAREDCACHE = SQLITE_LOCKED | (1 << 8)
SQLITE_LOCKED_VTAB = SQLITE_LOCKED | (2 << 8)
SQLITE_READONLY_RECOVERY = SQLITE_READONLY | (1 << 8)
SQLITE_READONLY_CANTLOCK = SQLITE_READONLY | (2 << 8)
SQLITE_READONLY_ROLLBACK = SQLITE_READONLY | (3 << 8)
SQLITE_READONLY_DBMOVED = SQLITE_READONLY | (4 << 8)
SQLITE_READONLY_CANTINIT = SQLITE_READONLY | (5 << 8)
SQLITE_READONLY_DIRECTORY = SQLITE_READONLY | (6 << 8)
SQLITE_CORRUPT_VTAB = SQLITE_CORRUPT | (1 << 8)
SQLITE_CORRUPT_SEQUENCE = SQLITE_CORRUPT | (2 << 8)
SQLITE_CORRUPT_INDEX = SQLITE_CORRUPT | (3 << 8)

_LOCKED = "is locked by another process past the busy timeout"
_READ_ONLY = "is read-only"
_CORRUPT = "is corrupt"

# The one mapping: SQLite result code -> (error class, condition in words). Extended codes are
# looked up first, then their primary code; any other code is a plain IndexStoreError
# ("index store error: ..."). The message is "index store <condition>: <SQLite's text>".
ERROR_TABLE: Mapping[int, tuple[type[IndexStoreError], str]] = MappingProxyType({
    SQLITE_BUSY: (IndexStoreLockedError, _LOCKED),
    SQLITE_BUSY_RECOVERY: (IndexStoreLockedError, _LOCKED + " (another process is recovering it)"),
    SQLITE_BUSY_SNAPSHOT: (IndexStoreLockedError, _LOCKED + " (a read snapshot went stale)"),
    SQLITE_BUSY_TIMEOUT: (IndexStoreLockedError, _LOCKED),
    SQLITE_LOCKED: (IndexStoreLockedError, _LOCKED),
    SQLITE_LOCKED_SHAREDCACHE: (IndexStoreLockedError, _LOCKED),
    SQLITE_LOCKED_VTAB: (IndexStoreLockedError, _LOCKED),
    SQLITE_READONLY: (IndexStoreReadOnlyError, _READ_ONLY),
    SQLITE_READONLY_RECOVERY: (IndexStoreReadOnlyError, _READ_ONLY + " (its WAL needs recovery)"),
    SQLITE_READONLY_CANTLOCK: (IndexStoreReadOnlyError, _READ_ONLY + " (cannot lock its -shm file)"),
    SQLITE_READONLY_ROLLBACK: (IndexStoreReadOnlyError, _READ_ONLY + " (a hot journal needs rollback)"),
    SQLITE_READONLY_DBMOVED: (IndexStoreReadOnlyError, _READ_ONLY + " (the file was moved or replaced)"),
    SQLITE_READONLY_CANTINIT: (IndexStoreReadOnlyError, _READ_ONLY + " (cannot initialise its -shm file)"),
    SQLITE_READONLY_DIRECTORY: (IndexStoreReadOnlyError, _READ_ONLY + " (its directory is read-only)"),
    SQLITE_CORRUPT: (IndexStoreCorruptError, _CORRUPT),
    SQLITE_CORRUPT_VTAB: (IndexStoreCorruptError, _CORRUPT + " (a virtual table is damaged)"),
    SQLITE_CORRUPT_SEQUENCE: (IndexStoreCorruptError, _CORRUPT + " (sqlite_sequence is damaged)"),
    SQLITE_CORRUPT_INDEX: (IndexStoreCorruptError, _CORRUPT + " (an index is damaged)"),
    SQLITE_NOTADB: (IndexStoreCorruptError, _CORRUPT),
    SQLITE_CANTOPEN: (IndexStoreError, "cannot be opened"),
    SQLITE_FULL: (IndexStoreFullError, "is full"),
})
_GENERIC = (IndexStoreError, "error")


def _foreign_error_types() -> tuple[type[BaseException], ...]:
    """``sqlite3.Error``, plus ``apsw.Error`` once apsw is loaded (an apsw error cannot exist
    before that, and importing apsw here would slow every start)."""
    apsw = sys.modules.get("apsw")
    error = getattr(apsw, "Error", None)
    if isinstance(error, type) and issubclass(error, BaseException):
        return (sqlite3.Error, error)
    return (sqlite3.Error,)


def is_sqlite_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``sqlite3.Error`` or an ``apsw.Error``."""
    return isinstance(exc, _foreign_error_types())


def result_code(exc: BaseException) -> int | None:
    """The SQLite extended result code carried by a ``sqlite3`` or ``apsw`` exception, or None.

    Args:
        exc: any exception; ``sqlite3.Error.sqlite_errorcode`` (Python 3.11+) and
            ``apsw.Error.extendedresult`` are read, in that order.

    Returns:
        The extended code (an int whose low 8 bits are the primary code), or None when the
        exception carries no code (or a negative one, as apsw's non-SQLite errors do).
    """
    for attr in ("sqlite_errorcode", "extendedresult", "result"):
        code = getattr(exc, attr, None)
        if isinstance(code, int) and code >= 0:
            return code
    return None


def code_kind(code: int | None) -> tuple[type[IndexStoreError], str]:
    """``(error class, condition)`` for a SQLite result code, from :data:`ERROR_TABLE` only.

    Args:
        code: an extended or primary result code, or None.

    Returns:
        The entry of the extended code, else of the primary code (``code & 0xFF``), else
        ``(IndexStoreError, "error")`` (no code, or a code the table does not claim).
    """
    if code is None:
        return _GENERIC
    return ERROR_TABLE.get(code) or ERROR_TABLE.get(code & 0xFF) or _GENERIC


def error_kind(exc: BaseException) -> tuple[type[IndexStoreError], str]:
    """``(error class, condition)`` for a SQLite exception: :func:`code_kind` of its
    :func:`result_code`."""
    return code_kind(result_code(exc))


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` is a SQLite exception that maps to :class:`IndexStoreLockedError`
    (what the store's busy retries retry on)."""
    return is_sqlite_error(exc) and issubclass(error_kind(exc)[0], IndexStoreLockedError)


def store_error(exc: BaseException, db_path: Path | str | None) -> IndexStoreError:
    """The typed error for a ``sqlite3``/``apsw`` exception (the caller raises it ``from exc``).

    Args:
        exc: the SQLite exception.
        db_path: the store file, kept as ``db_path`` on the error (None: not named).

    Returns:
        An instance of the class :func:`error_kind` picks, with the message
        ``index store <condition>: <SQLite's text>``, e.g. ``index store is corrupt: file is
        not a database``.
    """
    cls, condition = error_kind(exc)
    text = str(exc) or type(exc).__name__
    return cls(f"index store {condition}: {text}", db_path=str(db_path) if db_path else None)


@contextlib.contextmanager
def translate_errors(db_path: Path | str | None) -> Iterator[None]:
    """Re-raise any ``sqlite3``/``apsw`` exception inside the block as its typed store error.

    Other exceptions (our own ``IndexStoreError`` included) pass through unchanged.

    Raises:
        IndexStoreLockedError, IndexStoreReadOnlyError, IndexStoreCorruptError, IndexStoreError:
            chained (``from``) to the SQLite exception; see :func:`store_error`.
    """
    try:
        yield
    except Exception as exc:
        if not is_sqlite_error(exc):
            raise
        raise store_error(exc, db_path) from exc


_T = TypeVar("_T")


def retry_locked(fn: Callable[[], _T], *, attempts: int, on_retry: Callable[[], None]) -> _T:
    """Call ``fn``; retry it while it raises a locked error (:func:`is_locked`), at most
    ``attempts`` calls in all, with random exponential backoff (20 ms up to 250 ms).

    The first call runs bare: building the retry loop costs a noticeable share of a small
    store's keyword search, which makes several statements (docs/benchmarks.md). Only a locked error hands over to
    the loop, which counts that failure as its first attempt.

    Raises:
        whatever ``fn`` raised last (a locked error once the attempts are spent).
    """
    try:
        return fn()
    except Exception as exc:
        if attempts <= 1 or not is_locked(exc):
            raise
        first: Exception | None = exc
    # tenacity is imported here, not at the top: the one-shot search reads through this module
    # (translate_errors) and retries nothing.
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

    def again() -> _T:
        nonlocal first
        if first is not None:  # the bare call's failure is the loop's first attempt
            failed, first = first, None
            raise failed
        return fn()

    retrying = Retrying(retry=retry_if_exception(is_locked),
                        stop=stop_after_attempt(max(1, attempts)),
                        wait=wait_random_exponential(multiplier=0.02, max=0.25),
                        before_sleep=lambda _state: on_retry(), reraise=True)
    return retrying(again)

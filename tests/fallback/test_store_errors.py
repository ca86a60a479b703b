"""Store errors: every sqlite3 exception is translated, by result code, to a typed class.

Like httpx's ``tests/test_exceptions.py``: enumerate the lower library's exception classes and
the result codes we claim, and fail when one escapes untranslated or lands in the wrong class.
Then produce the real conditions (a held lock, a read-only connection, a damaged page, a file
that is not a database) and check what comes out.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
from functools import partial
from pathlib import Path

import pytest

from fallback.errors import IndexStoreError
from fallback.store.errors import (
    ERROR_TABLE,
    IndexStoreCorruptError,
    IndexStoreFullError,
    IndexStoreLockedError,
    IndexStoreReadOnlyError,
    error_kind,
    retry_locked,
    translate_errors,
)

# The primary result codes we claim, and the class each must become.
CLAIMED = {
    5: IndexStoreLockedError,     # SQLITE_BUSY
    6: IndexStoreLockedError,     # SQLITE_LOCKED
    8: IndexStoreReadOnlyError,   # SQLITE_READONLY
    11: IndexStoreCorruptError,   # SQLITE_CORRUPT
    26: IndexStoreCorruptError,   # SQLITE_NOTADB
    14: IndexStoreError,          # SQLITE_CANTOPEN
    13: IndexStoreFullError,      # SQLITE_FULL
}
# Extended codes claimed apart from their primary code: a -shm file that cannot grow (a full disk).
CLAIMED_EXTENDED = {sqlite3.SQLITE_IOERR_SHMSIZE: IndexStoreFullError}
ROOT = Path(__file__).resolve().parents[2]


def _exception_classes(module: object, base: type[BaseException]) -> list[type[BaseException]]:
    found = [getattr(module, name) for name in dir(module)]
    return sorted((c for c in found if isinstance(c, type) and issubclass(c, base)),
                  key=lambda c: c.__name__)


def _translated(exc: BaseException, db_path: str | None = "/x/main.sqlite") -> IndexStoreError:
    with pytest.raises(IndexStoreError) as info, translate_errors(db_path):
        raise exc
    assert info.value.__cause__ is exc
    return info.value


def test_every_sqlite3_exception_class_is_translated() -> None:
    classes = _exception_classes(sqlite3, sqlite3.Error)
    assert len(classes) == 9  # Error and its eight DB-API subclasses
    for cls in classes:
        err = _translated(cls("boom"))
        assert type(err) is IndexStoreError  # no result code: the plain class
        assert str(err) == "index store error: boom (/x/main.sqlite)"
        assert err.db_path == "/x/main.sqlite"


# The primary error codes' names; sqlite3 also exports authorizer actions and open flags.
ERROR_NAMES = ("ERROR INTERNAL PERM ABORT BUSY LOCKED NOMEM READONLY INTERRUPT IOERR CORRUPT "
               "NOTFOUND FULL CANTOPEN PROTOCOL EMPTY SCHEMA TOOBIG CONSTRAINT MISMATCH MISUSE "
               "NOLFS AUTH FORMAT RANGE NOTADB").split()


@pytest.mark.parametrize("name", sorted(n for n in dir(sqlite3) if n.startswith("SQLITE_") and (
    n[7:] in ERROR_NAMES or n[7:].split("_")[0] in ERROR_NAMES)))
def test_every_result_code_lands_in_its_class(name: str) -> None:
    code = getattr(sqlite3, name)
    expected = CLAIMED_EXTENDED.get(code) or CLAIMED.get(code & 0xFF, IndexStoreError)
    from_sqlite3 = sqlite3.OperationalError(name)
    from_sqlite3.sqlite_errorcode = code  # what Python 3.11+ sets from the extended code
    assert type(_translated(from_sqlite3)) is expected, name


def test_table_claims_exactly_the_documented_codes() -> None:
    assert {code & 0xFF for code in ERROR_TABLE if code not in CLAIMED_EXTENDED} == set(CLAIMED)
    for code, (cls, _condition) in ERROR_TABLE.items():
        assert cls is (CLAIMED_EXTENDED.get(code) or CLAIMED[code & 0xFF]), code
    assert issubclass(IndexStoreLockedError, IndexStoreError)
    assert issubclass(IndexStoreReadOnlyError, IndexStoreError)
    assert issubclass(IndexStoreCorruptError, IndexStoreError)


def test_our_own_errors_and_other_exceptions_pass_through() -> None:
    own = IndexStoreLockedError("already typed")
    with pytest.raises(IndexStoreLockedError) as info, translate_errors(None):
        raise own
    assert info.value is own
    with pytest.raises(ValueError), translate_errors(None):
        raise ValueError("not sqlite")


# -- the real conditions, through both libraries ------------------------------------------


def _make_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t(x TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [(f"row {i} " * 40,) for i in range(400)])
    conn.close()


def test_real_lock_is_locked_error(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    _make_db(db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        waiter = sqlite3.connect(db, isolation_level=None, timeout=0)
        err = _translated(_raised(lambda: waiter.execute("BEGIN IMMEDIATE")), str(db))
        assert type(err) is IndexStoreLockedError
        assert str(err) == ("index store is locked by another process past the busy timeout:"
                            f" database is locked ({db})")
        waiter.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_real_read_only_is_read_only_error(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    _make_db(db)
    ro = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    err = _translated(_raised(lambda: ro.execute("DELETE FROM t")), str(db))
    ro.close()
    assert type(err) is IndexStoreReadOnlyError
    assert str(err) == f"index store is read-only: attempt to write a readonly database ({db})"


def test_real_not_a_database_is_corrupt_error(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    db.write_bytes(b"this is definitely not sqlite" * 200)
    conn = sqlite3.connect(db)
    err = _translated(_raised(lambda: conn.execute("SELECT * FROM sqlite_master").fetchall()))
    conn.close()
    assert type(err) is IndexStoreCorruptError
    assert str(err) == "index store is corrupt: file is not a database (/x/main.sqlite)"


def test_a_store_created_on_a_full_disk_is_full_error(tmp_path: Path) -> None:
    """The schema migration of a new store fails for a full disk: SQLite has rolled the
    migration's transaction back itself, and the error says the disk is full."""
    from fallback.store.db import Store

    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "none", str(full)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here to fill a disk")
    try:
        with pytest.raises(IndexStoreFullError) as info:
            Store(full / "main.sqlite")
    finally:
        subprocess.run(["umount", str(full)], check=True)
    assert str(info.value) == f"index store is full: database or disk is full ({full / 'main.sqlite'})"


def test_real_damaged_page_is_corrupt_error(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    _make_db(db)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(db.read_bytes())
    assert len(data) >= 4 * page_size
    data[2 * page_size:3 * page_size] = b"\xff" * page_size  # a b-tree page of table t
    db.write_bytes(bytes(data))
    c = sqlite3.connect(db)
    err = _translated(_raised(partial(_scan, c)))
    c.close()
    assert type(err) is IndexStoreCorruptError
    assert str(err).startswith("index store is corrupt")


def _scan(conn) -> list:
    return list(conn.execute("SELECT count(*), max(x) FROM t"))


def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # the real exception, handed to the translator
        return exc
    raise AssertionError("expected a SQLite error")


def test_error_kind_of_a_code_less_error_is_generic() -> None:
    assert error_kind(sqlite3.ProgrammingError("Cannot operate on a closed database.")) == (
        IndexStoreError, "error")


def test_no_sqlite_error_is_classified_by_its_message() -> None:
    """Kinds travel as result codes and classes: no module matches SQLite's message text.

    The qmd modules that read ``qmd``'s stderr (a child process's text, with no code to go by)
    are the only places that look for "database is locked" in text.
    """
    stderr_readers = {"qmdbridge/qmd/runner.py", "qmdbridge/qmd/update.py"}
    pattern = re.compile(r"""["'][^"'\n]*(locked|corrupt|readonly|read-only|malformed|not a database|busy)"""
                         r"""[^"'\n]*["']\s+(not\s+)?in\s+""", re.IGNORECASE)
    offenders = []
    for path in sorted([*ROOT.glob("fallback/**/*.py"), *ROOT.glob("qmdbridge/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel in stderr_readers:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if pattern.search(line):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == []


# -- retry_locked: a bare first call, the loop only after a locked error ------------------


def test_retry_locked_counts_the_bare_failure_as_its_first_attempt(tmp_path: Path) -> None:
    db = tmp_path / "main.sqlite"
    _make_db(db)
    holder = sqlite3.connect(db, isolation_level=None)
    waiter = sqlite3.connect(db, isolation_level=None, timeout=0)
    calls: list[str] = []
    retries: list[int] = []

    def begin() -> str:
        calls.append("call")
        waiter.execute("BEGIN IMMEDIATE")
        waiter.execute("ROLLBACK")
        return "began"

    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            retry_locked(begin, attempts=3, on_retry=lambda: retries.append(1))
        assert len(calls) == 3 and len(retries) == 2  # 3 calls in all, a sleep before each retry

        calls.clear()
        retries.clear()

        def release_then_begin() -> str:
            if calls:  # the lock is gone by the second call
                holder.execute("ROLLBACK")
            return begin()

        assert retry_locked(release_then_begin, attempts=3,
                            on_retry=lambda: retries.append(1)) == "began"
        assert len(calls) == 2 and len(retries) == 1
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()
        waiter.close()


def test_retry_locked_returns_and_raises_at_once_without_a_lock(tmp_path: Path) -> None:
    retries: list[int] = []
    assert retry_locked(lambda: 7, attempts=5, on_retry=lambda: retries.append(1)) == 7
    conn = sqlite3.connect(tmp_path / "x.sqlite")
    calls: list[int] = []

    def bad() -> None:
        calls.append(1)
        conn.execute("SELECT * FROM missing_table")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        retry_locked(bad, attempts=5, on_retry=lambda: retries.append(1))
    assert calls == [1] and retries == []  # not a lock: never retried
    calls.clear()
    holder = sqlite3.connect(tmp_path / "x.sqlite", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        waiter = sqlite3.connect(tmp_path / "x.sqlite", isolation_level=None, timeout=0)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            retry_locked(lambda: (calls.append(1), waiter.execute("SELECT 1 FROM sqlite_master"))[1],
                         attempts=1, on_retry=lambda: retries.append(1))
        assert calls == [1] and retries == []  # one attempt allowed: no loop at all
        waiter.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        conn.close()

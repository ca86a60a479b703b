"""PostgreSQL for the ``postgres`` store tests (a pytest plugin, registered by ``tests/conftest.py``): one real server per test session (the ``pgserver``
wheel: PostgreSQL 16 + pgvector in a temporary folder, no root needed), one fresh database per
test. Without ``pgserver`` or the ``postgres`` extra the tests skip, except under CI, where they
fail: a missing install step must not pass as green.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def require_postgres() -> None:
    """Skip (fail under ``CI``) when the server wheel or the client libraries are missing; call
    it at the top of a test module, before it imports psycopg."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR not set
            import pgserver  # noqa: F401
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        message = f"postgres tests need pgserver and the postgres extra ({exc}); pip install -e '.[test,postgres]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message, allow_module_level=True)


@dataclass
class PgServer:
    """A running PostgreSQL: its data folder (which is also its socket folder)."""

    data_dir: Path
    handle: Any

    def dsn(self, dbname: str = "postgres", *, user: str = "postgres", password: str | None = None) -> str:
        """A key/value conninfo for ``dbname`` over the server's Unix socket."""
        from psycopg.conninfo import make_conninfo

        extra = {"password": password} if password is not None else {}
        return make_conninfo(host=str(self.data_dir), dbname=dbname, user=user, **extra)

    def admin(self, dbname: str = "postgres") -> Any:
        """An autocommit superuser connection (caller closes it)."""
        import psycopg

        return psycopg.connect(self.dsn(dbname), autocommit=True)

    def stop(self) -> None:
        """Stop the server (``pg_ctl stop``); :meth:`start` brings it back on the same socket."""
        self.handle.cleanup()

    def start(self) -> None:
        """Start the server again in the same data folder."""
        self.handle = start_pgserver(self.data_dir).handle


@contextlib.contextmanager
def password_role(server: PgServer, user: str) -> Iterator[None]:
    """A login role ``user`` whose password is ``the-right-one``, checked by scram-sha-256 over
    the Unix socket (pg_hba.conf put back and reloaded on exit), for refused-login tests."""
    hba = server.data_dir / "pg_hba.conf"
    original = hba.read_text()
    with server.admin() as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{user}"')
        conn.execute(f"CREATE ROLE \"{user}\" LOGIN PASSWORD 'the-right-one'")
        hba.write_text(f"local all {user} scram-sha-256\n" + original)
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        hba.write_text(original)
        with server.admin() as conn:
            conn.execute("SELECT pg_reload_conf()")


def start_pgserver(data_dir: Path) -> PgServer:
    """Start (or reuse) a pgserver instance in ``data_dir``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR not set
        import pgserver

        handle = pgserver.get_server(data_dir, cleanup_mode="stop")
    return PgServer(data_dir=data_dir, handle=handle)


def round_trips(store: Any, trace: Path, read: Callable[[], object]) -> int:
    """The round trips of ``read`` on ``store``'s one pooled connection, from libpq's protocol
    trace (written to ``trace``): one per run of messages the client sends before it reads the
    server's answer (the pool's check of the connection is the first, not counted).
    ``store`` is a ``PostgresStore`` whose pool holds one connection."""
    from psycopg.pq import Trace, TransactionStatus

    with trace.open("w") as out:
        with store._pool.connection() as conn:  # the pool's one connection
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        read()
        with store._pool.connection() as conn:  # its check is traced too: not counted
            conn.pgconn.untrace()
            assert conn.info.transaction_status == TransactionStatus.IDLE
    sides = [line.split("\t", 1)[0] for line in trace.read_text().splitlines()]
    return sum(side == "F" and (i == 0 or sides[i - 1] == "B") for i, side in enumerate(sides)) - 1


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL 16 (+ pgvector) for the whole session, stopped and removed at the end;
    it flushes nothing to disk at a commit (``fsync``, ``synchronous_commit`` and
    ``full_page_writes`` off): no test outlives a crash of the server, and each creates and
    drops a database."""
    require_postgres()
    server = start_pgserver(new_data_dir())
    with server.admin() as conn:  # kept in the data folder, so a restart keeps it too
        for name in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {name} = off")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)


def new_data_dir() -> Path:
    """A new data folder directly under the system temp folder: when run as root, pgserver
    starts PostgreSQL as another user, which cannot enter pytest's private temp folders (and
    the socket path must stay short)."""
    return Path(tempfile.mkdtemp(prefix="qmdbridge-pg-"))


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    """A conninfo of a fresh database of its own for one test (dropped afterwards)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with pg_server.admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_server.dsn(name)
    finally:
        with pg_server.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> dict[str, object]:
    """``memorySearch.store`` of each store, for a test that runs on both: the default SQLite
    file, or a fresh postgres database (import this fixture with ``pg_server`` and ``pg_dsn``)."""
    if request.param == "sqlite":
        return {}
    return {"driver": "postgres", "dsn": request.getfixturevalue("pg_dsn")}

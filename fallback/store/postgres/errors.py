"""psycopg's exceptions translated into the project's hierarchy, in this one place.

::

    BackendUnavailableError
     +-- PostgresUnavailableError    the server cannot be used: unreachable, login refused,
     |                               pgvector missing, schema not writable or missing a
     |                               table (carries target, hint)
     +-- BackendTimeoutError
          +-- PostgresTimeoutError   a statement ran past statement_timeout (or the lock wait)
    IndexStoreError
     +-- PostgresStoreError          any other database error of the store

Every message names the database, host, port and user (:meth:`PgTarget.describe`) and says
what to do; none holds the password (every text goes through :meth:`PgTarget.redact`).
Classification is by SQLSTATE. libpq gives none for a failed connection attempt, so there it
is read from the text: the server's ``FATAL:`` message names its refusal (a database or role
that does not exist, no connection slot left, starting up); without one the server was never
reached, and libpq's own text says why (``connection refused``, a socket that does not exist,
``timeout expired``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from fallback.errors import BackendTimeoutError, BackendUnavailableError, IndexStoreError

if TYPE_CHECKING:
    from fallback.store.postgres.target import PgTarget

__all__ = ["PostgresStoreError", "PostgresTimeoutError", "PostgresUnavailableError", "is_refusal",
           "translate"]

BACKEND = "postgres"

# SQLSTATEs (PostgreSQL Appendix A).
_AUTH_STATES = {"28000", "28P01"}          # invalid authorization / invalid password
_CANCELED = "57014"                        # query_canceled (statement_timeout)
_LOCK_TIMEOUT = "55P03"                    # lock_not_available (lock_timeout)
_NO_DATABASE = "3D000"
_PRIVILEGE = "42501"
# CREATE EXTENSION of an extension whose files are not installed: feature_not_supported
# (PostgreSQL 16: 'extension "vector" is not available') or undefined_file (older servers).
_EXTENSION_MISSING = {"0A000", "58P01"}
_SERVER_GONE = {"57P01", "57P02", "57P03"}  # admin/crash shutdown, cannot connect now
_ENDED = {"57P01", "57P02"}                 # a session the server ended (admin_shutdown, crash)
_SCHEMA_DAMAGED = {"42P01", "3F000"}         # undefined_table, invalid_schema_name
_CANNOT_CONNECT_NOW = "57P03"               # the server is starting up or shutting down
# libpq's text (strerror) when nothing listens: no Unix socket file, or ECONNREFUSED on TCP.
_REFUSED_TEXTS = ("No such file or directory", "Connection refused")
# A failed connection's FATAL message from the server -> its SQLSTATE (libpq gives none);
# any other FATAL message is the server's refusal too (_REFUSED_BY_SERVER).
_FATAL_STATES = ((re.compile(r'database ".*" does not exist'), _NO_DATABASE),
                 (re.compile(r'authentication failed|role ".*" does not exist|no pg_hba\.conf entry'),
                  "28000"),
                 (re.compile(r"the database system is (starting up|shutting down|not yet accepting"
                             r"|in recovery mode)"), _CANNOT_CONNECT_NOW),
                 (re.compile(r"too many (clients|connections)|connection slots are reserved"), "53300"))
_REFUSED_BY_SERVER = "08004"  # sqlserver_rejected_establishment_of_sqlconnection


class PostgresUnavailableError(BackendUnavailableError):
    """Raised when the postgres store cannot be used at all (the engine may fall back).

    Attributes:
        target: ``database "D" on host H port P as user U``.
        hint: what to do, one sentence.
    """

    def __init__(self, target: str, problem: str, hint: str) -> None:
        self.target = target
        self.hint = hint
        super().__init__(BACKEND, f"{problem} ({target}); {hint}")


class PostgresTimeoutError(BackendTimeoutError):
    """Raised when a statement of the store ran past its deadline (``statement_timeout``)."""

    def __init__(self, target: str, summary: str, timeout_ms: int) -> None:
        self.target = target
        super().__init__(BACKEND, f"{summary} on {target}", timeout_ms,
                         setting="memorySearch.store.statementTimeoutMs",
                         hint="a sync holding locks, or a server overloaded")


class PostgresStoreError(IndexStoreError):
    """Raised on any other database error of the postgres store.

    Attributes:
        sqlstate: the server's SQLSTATE, or ``None``.
    """

    def __init__(self, message: str, *, target: str, sqlstate: str | None = None) -> None:
        self.sqlstate = sqlstate
        super().__init__(message, db_path=target)


def is_refusal(exc: BaseException) -> bool:
    """Whether a connection attempt was refused at once (no server socket, ``ECONNREFUSED``,
    or a server starting up or shutting down), as opposed to a host that does not answer.

    Args:
        exc: what psycopg raised for a connection attempt.

    Returns:
        ``True`` when waiting longer cannot help this attempt: the caller is told now.
    """
    import psycopg

    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = _sqlstate(exc)
    if state == _CANNOT_CONNECT_NOW:
        return True
    return state is None and any(text in str(exc) for text in _REFUSED_TEXTS)


def _sqlstate(exc: BaseException) -> str | None:
    """``exc``'s SQLSTATE, or for a connection attempt the server refused with a ``FATAL``
    message (libpq sets none) the one that message stands for; ``None``: no server answered."""
    state = getattr(exc, "sqlstate", None)
    if state is not None or "FATAL:" not in str(exc):
        return state
    return next((code for pattern, code in _FATAL_STATES if pattern.search(str(exc))), _REFUSED_BY_SERVER)


def translate(exc: BaseException, target: PgTarget, *, doing: str, timeout_ms: int) -> Exception:
    """The project's exception for a psycopg (or pool) exception; raise it ``from exc``.

    Args:
        exc: what psycopg or psycopg_pool raised.
        target: the connection target (for the message and the redaction).
        doing: what the store was doing (``connect``, ``keyword search``, ``migrate``).
        timeout_ms: the deadline that applied, in ms.

    Returns:
        A :class:`PostgresUnavailableError`, :class:`PostgresTimeoutError` or
        :class:`PostgresStoreError` whose text holds no password.
    """
    import psycopg
    from psycopg_pool import PoolTimeout

    where = target.describe()
    state = _sqlstate(exc)
    detail = target.redact(" ".join(str(exc).split()))
    # libpq's own "no password supplied": the server asked for one
    if state in _AUTH_STATES or (state is None and "no password supplied" in detail):
        return PostgresUnavailableError(
            where, f"PostgreSQL refused the login: {detail}",
            "check the user and password (memorySearch.store.dsn or PGUSER/PGPASSWORD) and "
            "the server's pg_hba.conf")
    if state in (_CANCELED, _LOCK_TIMEOUT):
        return PostgresTimeoutError(where, doing, timeout_ms)
    if state == _NO_DATABASE:
        return PostgresUnavailableError(
            where, f"the database does not exist: {detail}",
            "create it (createdb) or fix the database name in memorySearch.store.dsn / PGDATABASE")
    if (state in _EXTENSION_MISSING and "extension" in detail) or (
            state == _PRIVILEGE and 'extension "vector"' in detail):
        return PostgresUnavailableError(
            where, f"the pgvector extension is not available: {detail}",
            "install pgvector on the server (e.g. the postgresql-16-pgvector package) and run "
            "CREATE EXTENSION vector as a superuser")
    if state in _SCHEMA_DAMAGED:
        return PostgresUnavailableError(
            where, f"the store's schema {target.schema} lacks a table or is gone: {detail}",
            f"restore schema {target.schema} from a backup (pg_dump -n {target.schema}), or have "
            "the schema owner drop it and set it up again (the agents' next syncs index their "
            "workspaces again); a host whose qmdbridge is older than the schema's migrations "
            "is upgraded")
    if state == _PRIVILEGE and doing == "migrate the schema":
        return PostgresUnavailableError(
            where, f"permission denied while trying to {doing}: {detail}",
            "the schema owner (a role that may create in this database) migrates the schema "
            "before an agent's own role opens it (docs/postgres.md, Row-level security)")
    if state == _PRIVILEGE:
        return PostgresUnavailableError(
            where, f"permission denied while trying to {doing}: {detail}",
            "an agent's role writes only the rows of the agent it is registered for "
            "(register_agent(agent, role_name=...): check that the config's agent id is that "
            "agent; shared rows are read-only); the schema owner runs the migrations and grants "
            "each agent's role (docs/postgres.md, Row-level security)")
    if state == "53300":
        return PostgresUnavailableError(
            where, f"PostgreSQL has no connection left for this login: {detail}",
            "raise the server's max_connections (or the role's CONNECTION LIMIT); each store "
            "keeps up to 4 connections, and a running sync two more")
    if state == _REFUSED_BY_SERVER:
        return PostgresUnavailableError(
            where, f"PostgreSQL refused the connection: {detail}",
            "the server answered with the error above: see the server's log")
    if state is None and ("SSL" in detail or "certificate" in detail):  # libpq's own text
        return PostgresUnavailableError(
            where, f"the TLS set-up with PostgreSQL failed: {detail}",
            "make sslmode (and sslrootcert) in memorySearch.store.dsn / PGSSLMODE match what the "
            "server offers, or enable ssl on the server")
    if state in _ENDED:
        return PostgresUnavailableError(
            where, f"PostgreSQL ended the connection while trying to {doing}: {detail}",
            "the server shut down, or an administrator ended the session (pg_terminate_backend); "
            "the next call connects again")
    if isinstance(exc, PoolTimeout) or state in _SERVER_GONE or (
            isinstance(exc, psycopg.OperationalError) and state is None):
        # named only when a deadline ran out (a refusal, a closed connection: at once)
        ran_out = isinstance(exc, PoolTimeout) or "timeout expired" in detail or "timed out" in detail
        waited = f" within {timeout_ms}ms" if ran_out else ""
        return PostgresUnavailableError(
            where, f"cannot reach PostgreSQL to {doing}{waited}: {detail}",
            "start the server, or fix the host and port in memorySearch.store.dsn / PGHOST, "
            "PGPORT")
    return PostgresStoreError(f"postgres store: {doing} failed: {detail}", target=where,
                              sqlstate=state)

"""The postgres store's connection pool: psycopg_pool's, except that a refused connection reaches
the caller at once instead of after the whole wait for a pooled connection.

psycopg_pool lends an idle connection or queues the caller for up to its ``timeout`` while a
worker connects in the background, retrying on a backoff (1, 2, 4 ... s); the worker's errors
never reach the queue. So with the server's socket absent (no Unix socket file,
``ECONNREFUSED``) every call waited the whole ``connectTimeoutMs``. Here a refused attempt (see
:func:`~fallback.store.postgres.errors.is_refusal`) fails the queued callers with psycopg's
error, and while the last attempt was refused a caller makes its own attempt instead of queueing
behind the backoff: refused again at once, or the server is back and that connection joins the
pool. A host that does not answer still takes the deadline: only waiting can tell.

Needs psycopg_pool 3.2 or 3.3 (pinned in pyproject: it extends the private ``_connect``, ``_getconn_unchecked``,
``_maybe_grow_pool``, ``_lock``, ``_waiting`` and ``_nconns``).
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import ConnectionPool

from fallback.store.postgres.errors import is_refusal

__all__ = ["FailFastPool"]


class FailFastPool(ConnectionPool[Any]):
    """A :class:`psycopg_pool.ConnectionPool` that raises a refused connection to its callers
    at once (same arguments as the base class).

    Raises (from ``connection()`` / ``getconn()``):
        psycopg.OperationalError: the server refused the connection (translate it as any
            other psycopg error); ``PoolTimeout`` as before when the host does not answer.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refusal: Exception | None = None  # the last attempt's refusal; None after a success

    def _connect(self, timeout: float | None = None) -> Any:
        try:
            conn = super()._connect(timeout)
        except Exception as exc:
            if is_refusal(exc):
                self._refusal = exc  # set before the lock: a caller queueing now sees one or the other
                with self._lock:
                    self._fail_waiting(exc)
            raise
        self._refusal = None
        return conn

    def _getconn_unchecked(self, timeout: float) -> Any:
        if self._refusal is None:
            return super()._getconn_unchecked(timeout)
        conn = self._connect(timeout)  # refused again: raised now
        with self._lock:
            self._nconns += 1  # the pool's own from here on, as if its worker had made it
        return conn

    def _maybe_grow_pool(self) -> None:
        # Called under the lock right after a caller queued: refused since it looked, it is
        # failed now rather than left waiting for the backoff's next attempt.
        refusal = self._refusal
        if refusal is None:
            super()._maybe_grow_pool()
        else:
            self._fail_waiting(refusal)

    def _fail_waiting(self, refusal: Exception) -> None:
        # under self._lock
        while self._waiting:
            self._waiting.popleft().fail(refusal)

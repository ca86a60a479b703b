"""Vector search over the store's chunk embeddings: sqlite-vec in the store, or numpy brute force.

Each chunk's embedding is stored once, as the float32 little-endian ``chunks.vector`` BLOB.
:class:`VectorIndex` reads it through a read-only ``sqlite3`` connection of its own (it never
writes, so it never waits for the writer):

- where Python's ``sqlite3`` can load extensions, sqlite-vec is loaded into that connection and
  the cosine distance is computed in SQL (``vec_distance_cosine``) over ``chunks.vector``: an
  exact scan, with no copy of the vectors anywhere;
- elsewhere (macOS system Python, pyenv builds), an exact cosine over a numpy matrix of the
  vectors, cached per model, sources and dims and reloaded when the store changes.

Both rank identically (cosine similarity, ties by chunk id). sqlite-vec is never driven through
a second SQLite library (``apsw``) on the store file: two SQLite copies in one process do not
see each other's POSIX locks, and closing a file in one drops the other's locks
(https://www.sqlite.org/howtocorrupt.html §2.2.1).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

from fallback.errors import IndexStoreError, ManagerClosedError
from fallback.store.errors import translate_errors
from fallback.store.files import file_id

__all__ = ["VectorIndex", "probe_sqlite_vec"]

# Busy timeout for reads, in ms (WAL readers are never blocked by writers; this covers
# checkpoints and schema changes).
READ_BUSY_TIMEOUT_MS = 5000
# Bytes per stored vector component (float32).
FLOAT32_BYTES = 4
# Why there is no sqlite-vec where Python's sqlite3 was built without extension loading.
NO_EXTENSION_LOADING = "python sqlite3 cannot load extensions; exact brute-force cosine"


def _placeholders(n: int) -> str:
    return ",".join("?" * n)


def _load_sqlite_vec(conn: sqlite3.Connection, path: str) -> None:
    conn.enable_load_extension(True)
    try:
        conn.load_extension(path)
    finally:
        conn.enable_load_extension(False)


def probe_sqlite_vec(extension_path: str | None = None) -> tuple[str | None, str | None]:
    """Whether sqlite-vec loads into Python's ``sqlite3`` (tried on an in-memory database).

    Args:
        extension_path: the loadable to try (``store.vector.extensionPath``); default the
            ``sqlite_vec`` package's.

    Returns:
        ``(path, None)`` when it loads (``path`` is what was loaded), else ``(None, reason)``,
        e.g. :data:`NO_EXTENSION_LOADING` or ``sqlite-vec failed to load: <error>; ...``.
    """
    if not hasattr(sqlite3.Connection, "enable_load_extension"):
        return None, NO_EXTENSION_LOADING
    try:
        path = extension_path
        if path is None:
            import sqlite_vec

            path = sqlite_vec.loadable_path()
        with translate_errors(None):
            probe = sqlite3.connect(":memory:")
            try:
                _load_sqlite_vec(probe, path)
                probe.execute("SELECT vec_version()").fetchall()
            finally:
                probe.close()
    except (ImportError, OSError, IndexStoreError) as exc:
        return None, f"sqlite-vec failed to load: {exc}; exact brute-force cosine"
    return path, None


class VectorIndex:
    """Cosine-similarity search over ``chunks.vector`` of one SQLite store.

    Modes (``mode``): ``"sqlite-vec"`` (sqlite-vec loaded into this index's ``sqlite3``
    connection; ``vec_distance_cosine`` over the chunks in SQL), ``"brute-force"`` (exact cosine
    over a numpy matrix cached per model, sources and dims, reloaded when the store changes),
    ``"disabled"`` (``enabled=False``; every search returns ``[]``). ``reason`` says why the mode
    is not sqlite-vec. An atomic swap of the store file (new inode) is noticed and the
    connection reopened. A vector whose length differs from the query's dims is never compared
    (no mixing of dimensionalities); zero or non-finite vectors are skipped.

    Thread-safe: one lock serialises searches on an instance.

    Args:
        db_path: the store file (WAL mode); it may not exist yet (searches return ``[]``).
        enabled: ``store.vector.enabled``.
        extension_path: ``store.vector.extensionPath``; default is the ``sqlite_vec`` package's
            loadable.
    """

    def __init__(self, db_path: Path, *, enabled: bool = True,
                 extension_path: str | None = None) -> None:
        self._db_path = Path(db_path)
        self._enabled = enabled
        self._configured_extension = extension_path
        self._lock = threading.RLock()
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        self._file_id: tuple[int, int] | None = None
        self._data_version: int | None = None
        self._last_query_mode: str | None = None
        self._dims: int | None = None
        self._matrices: dict[tuple[str, tuple[str, ...], int], tuple[list[str], Any]] = {}
        self._extension_path: str | None = None
        self._mode = "disabled"
        self._reason: str | None = "disabled by config (store.vector.enabled = false)"
        if enabled:
            self._extension_path, self._reason = probe_sqlite_vec(extension_path)
            self._mode = "sqlite-vec" if self._extension_path else "brute-force"

    # -- properties ------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """``"sqlite-vec"``, ``"brute-force"`` or ``"disabled"``."""
        return self._mode

    @property
    def reason(self) -> str | None:
        """Why sqlite-vec is not used; None when it is."""
        return self._reason

    @property
    def dims(self) -> int | None:
        """Dimensionality of the vectors last searched; None before the first search."""
        return self._dims

    # -- connection ------------------------------------------------------------------------

    def _drop_connection(self) -> None:
        """Close the connection and forget everything derived from the old file."""
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):  # a swapped-out or deleted file
                self._conn.close()
        self._conn = None
        self._file_id = None
        self._data_version = None
        self._matrices.clear()

    def _connect(self) -> sqlite3.Connection | None:
        """The open connection to the current store file, reopened after an atomic swap.

        Returns None when the store file does not exist.
        """
        current = file_id(self._db_path)
        if current is None:
            self._drop_connection()
            return None
        if self._conn is not None and current == self._file_id:
            return self._conn
        self._drop_connection()
        conn = sqlite3.connect(f"{self._db_path.resolve().as_uri()}?mode=ro", uri=True,
                               check_same_thread=False, isolation_level=None,
                               timeout=READ_BUSY_TIMEOUT_MS / 1000)
        try:
            if self._mode == "sqlite-vec":
                _load_sqlite_vec(conn, str(self._extension_path))
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._file_id = current
        return conn

    # -- public API ------------------------------------------------------------------------

    def search(self, query: list[float], *, model: str, sources: list[str],
               limit: int) -> list[tuple[str, float]]:
        """The chunks most similar to ``query``, best first.

        Only chunks with ``chunks.model == model``, ``chunks.source`` in ``sources`` and a
        vector of ``len(query)`` float32 components are considered.

        Args:
            query: the query embedding (any norm).
            model: the embedding model whose chunks are searched.
            sources: enabled sources, e.g. ``["memory", "sessions"]``; empty gives ``[]``.
            limit: maximum number of hits (``<= 0`` gives ``[]``).

        Returns:
            ``[(chunk_id, cosine_similarity)]``, similarity in ``[-1, 1]``, descending (ties by
            chunk id); ``[]`` when disabled, the store does not exist, or the query is empty,
            zero or non-finite.

        Raises:
            ManagerClosedError: after :meth:`close`.
            IndexStoreError: the store cannot be opened or read (typed by
                ``fallback/store/errors.py``).
        """
        import numpy as np

        with self._lock:
            if self._closed:
                raise ManagerClosedError("vector index is closed")
            if self._mode == "disabled" or limit <= 0 or not query or not sources:
                return []
            q = np.asarray(query, dtype=np.float64)
            norm = float(np.linalg.norm(q))
            if not np.isfinite(norm) or norm == 0.0:
                return []
            dims = len(query)
            unique_sources = sorted(set(sources))
            with translate_errors(self._db_path):
                conn = self._connect()
                if conn is None:
                    return []
                version = int(conn.execute("PRAGMA data_version").fetchall()[0][0])
                if version != self._data_version:
                    self._matrices.clear()
                    self._data_version = version
                self._dims = dims
                self._last_query_mode = self._mode
                if self._mode == "sqlite-vec":
                    return self._search_sql(conn, q, dims=dims, model=model,
                                            sources=unique_sources, limit=limit)
                return self._search_brute_force(conn, q / norm, dims=dims, model=model,
                                                sources=unique_sources, limit=limit)

    def invalidate(self) -> None:
        """Forget cached matrices (the store changed; the next search reloads)."""
        with self._lock:
            self._matrices.clear()

    def status(self) -> dict[str, Any]:
        """Health for ``status()``.

        Returns:
            ``{"enabled", "available", "mode", "reason", "dims", "extensionPath",
            "lastQueryMode"}``: ``available`` is True when vector search can answer
            (sqlite-vec or brute force); ``lastQueryMode`` is the mode that answered the last
            search (None before one).
        """
        with self._lock:
            return {
                "enabled": self._enabled,
                "available": self._mode != "disabled",
                "mode": self._mode,
                "reason": self._reason,
                "dims": self._dims,
                "extensionPath": self._extension_path or self._configured_extension,
                "lastQueryMode": self._last_query_mode,
            }

    def close(self) -> None:
        """Close the connection; idempotent. Later searches raise ``ManagerClosedError``."""
        with self._lock:
            self._drop_connection()
            self._closed = True

    # -- sqlite-vec ------------------------------------------------------------------------

    @staticmethod
    def _search_sql(conn: sqlite3.Connection, q: Any, *, dims: int, model: str,
                    sources: list[str], limit: int) -> list[tuple[str, float]]:
        """Exact cosine in SQL; zero and non-finite vectors give a NULL distance and drop out."""
        import numpy as np

        sql = ("SELECT id, dist FROM (SELECT id, vec_distance_cosine(vector, ?) AS dist"
               " FROM chunks WHERE model = ? AND source IN "
               f"({_placeholders(len(sources))}) AND vector IS NOT NULL AND length(vector) = ?)"
               " WHERE dist IS NOT NULL ORDER BY dist, id LIMIT ?")
        blob = np.asarray(q, dtype="<f4").tobytes()
        rows = conn.execute(sql, (blob, model, *sources, dims * FLOAT32_BYTES, limit)).fetchall()
        return [(r[0], 1.0 - float(r[1])) for r in rows]

    # -- brute force -----------------------------------------------------------------------

    def _load_matrix(self, conn: sqlite3.Connection, *, dims: int, model: str,
                     sources: list[str]) -> tuple[list[str], Any]:
        """Rows of unit vectors (float32, shape ``(n, dims)``) and their chunk ids, cached."""
        import numpy as np

        key = (model, tuple(sources), dims)
        cached = self._matrices.get(key)
        if cached is not None:
            return cached
        sql = ("SELECT id, vector FROM chunks WHERE model = ? AND source IN "
               f"({_placeholders(len(sources))}) AND vector IS NOT NULL AND length(vector) = ? "
               "ORDER BY id")
        rows = conn.execute(sql, (model, *sources, dims * FLOAT32_BYTES)).fetchall()
        if not rows:
            entry: tuple[list[str], Any] = ([], np.zeros((0, dims), dtype=np.float32))
        else:
            matrix = np.frombuffer(b"".join(bytes(r[1]) for r in rows), dtype="<f4")
            matrix = matrix.reshape(len(rows), dims).astype(np.float32)
            norms = np.linalg.norm(matrix.astype(np.float64), axis=1)
            keep = np.isfinite(norms) & (norms > 0)
            matrix = matrix[keep] / norms[keep, None].astype(np.float32)
            ids = [r[0] for r, ok in zip(rows, keep.tolist(), strict=True) if ok]
            entry = (ids, np.ascontiguousarray(matrix, dtype=np.float32))
        self._matrices[key] = entry
        return entry

    def _search_brute_force(self, conn: sqlite3.Connection, unit_query: Any, *, dims: int,
                            model: str, sources: list[str], limit: int) -> list[tuple[str, float]]:
        import numpy as np

        ids, matrix = self._load_matrix(conn, dims=dims, model=model, sources=sources)
        if not ids:
            return []
        scores = matrix @ unit_query.astype(np.float32)
        k = min(limit, len(ids))
        if k < len(ids):
            top = np.argpartition(-scores, k - 1)[:k]
        else:
            top = np.arange(len(ids))
        order = top[np.argsort(-scores[top], kind="stable")]
        return [(ids[i], float(scores[i])) for i in order.tolist() if np.isfinite(scores[i])]

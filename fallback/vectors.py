"""Vector search over the store's chunk embeddings: sqlite-vec KNN or exact numpy brute force.

The engine writes chunks (with a float32 little-endian ``vector`` BLOB) through its own
``sqlite3`` connection. :class:`VectorIndex` only reads them, and in ``sqlite-vec`` mode keeps a
``vec0`` mirror (``chunks_vec``) in the same file, refreshed incrementally before a query when
the store changed. Python's ``sqlite3`` often cannot load extensions (macOS system Python,
pyenv builds), so the mirror is driven through ``apsw``; without it, or when sqlite-vec does not
load, an exact cosine over a cached numpy matrix answers instead. Both modes rank identically.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from fallback.errors import IndexStoreError, ManagerClosedError

__all__ = ["VectorIndex"]

# Busy timeout for the mirror refresh, in ms: short, because a busy store only costs this query
# a brute-force answer, never an error.
MIRROR_BUSY_TIMEOUT_MS = 150
# Attempts at taking the write lock for one mirror refresh before answering by brute force.
MIRROR_LOCK_ATTEMPTS = 3
# Busy timeout for plain reads, in ms (WAL readers are never blocked by writers; this covers
# checkpoints and schema changes).
READ_BUSY_TIMEOUT_MS = 5000
# sqlite-vec refuses KNN queries with k above this.
VEC0_MAX_K = 4096
# Bytes per stored vector component (float32).
FLOAT32_BYTES = 4

_MIRROR_STATE_DDL = ("CREATE TABLE IF NOT EXISTS chunks_vec_state("
                     "id TEXT PRIMARY KEY, updated_at INTEGER NOT NULL, dims INTEGER NOT NULL)")

# Mirrored ids to delete: gone from chunks, vector removed, length changed, or row rewritten.
_STALE_SQL = ("SELECT s.id FROM chunks_vec_state s LEFT JOIN chunks c ON c.id = s.id "
              "WHERE c.id IS NULL OR c.vector IS NULL OR length(c.vector) != ? "
              "OR COALESCE(c.updated_at, 0) != s.updated_at")
# Chunks with a vector of the mirror's byte length that are not mirrored yet.
_FRESH_SQL = ("SELECT c.id, c.vector, c.model, c.source, COALESCE(c.updated_at, 0) FROM chunks c "
              "LEFT JOIN chunks_vec_state s ON s.id = c.id "
              "WHERE s.id IS NULL AND c.vector IS NOT NULL AND length(c.vector) = ?")


def _mirror_ddl(dims: int) -> str:
    """The exact CREATE statement of the ``vec0`` mirror for ``dims`` dimensions."""
    return ("CREATE VIRTUAL TABLE chunks_vec USING vec0(id TEXT PRIMARY KEY, "
            f"embedding float[{int(dims)}] distance_metric=cosine, "
            "model TEXT PARTITION KEY, source TEXT)")


def _placeholders(n: int) -> str:
    return ",".join("?" * n)


def _db_errors() -> tuple[type[BaseException], ...]:
    """The database exception classes of both drivers (apsw only when installed)."""
    try:
        import apsw
    except ImportError:
        return (sqlite3.Error,)
    return (sqlite3.Error, apsw.Error)


class VectorIndex:
    """Cosine-similarity search over ``chunks.vector`` of one SQLite store.

    Modes (``mode``): ``"sqlite-vec"`` (apsw loads the sqlite-vec extension; KNN on a ``vec0``
    mirror of the chunks), ``"brute-force"`` (exact cosine over a numpy matrix cached per model,
    sources and dims, reloaded when the store changes), ``"disabled"`` (``enabled=False``; every
    search returns ``[]``). ``reason`` says why the mode is not plain sqlite-vec.

    The mirror is a cache: it is refreshed under a short write lock (never longer than one
    refresh), tolerates concurrent writers (busy timeout and retries), and when it cannot be
    refreshed or queried the query is answered by brute force and ``status()`` says so.
    A vector whose length differs from the query's dims is never compared (no mixing of
    dimensionalities); zero or non-finite vectors are skipped.

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
        self._conn: Any = None
        self._file_id: tuple[int, int] | None = None
        self._data_version: int | None = None
        self._mirror_dims: int | None = None
        self._mirror_version: int | None = None
        self._mirror_error: str | None = None
        self._mirror_broken: str | None = None
        self._last_query_mode: str | None = None
        self._dims: int | None = None
        self._matrices: dict[tuple[str, tuple[str, ...], int], tuple[list[str], Any]] = {}
        self._extension_path: str | None = None
        self._mode, self._reason = self._probe()

    # -- properties ------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """``"sqlite-vec"``, ``"brute-force"`` or ``"disabled"``."""
        return self._mode

    @property
    def reason(self) -> str | None:
        """Why sqlite-vec is not used as is (or a note on how it is loaded); None otherwise."""
        return self._reason

    @property
    def dims(self) -> int | None:
        """Dimensionality of the vectors last searched (mirror or matrix); None before that."""
        return self._dims

    # -- probing and connections -----------------------------------------------------------

    def _probe(self) -> tuple[str, str | None]:
        """Pick the mode: try apsw + sqlite-vec on an in-memory connection."""
        if not self._enabled:
            return "disabled", "disabled by config (store.vector.enabled = false)"
        try:
            import apsw
        except ImportError as exc:
            return "brute-force", f"apsw is not installed ({exc}); exact brute-force cosine"
        try:
            path = self._configured_extension
            if path is None:
                import sqlite_vec

                path = sqlite_vec.loadable_path()
            probe = apsw.Connection(":memory:")
            try:
                probe.enableloadextension(True)
                probe.loadextension(path)
                probe.execute("SELECT vec_version()").fetchall()
            finally:
                probe.close()
        except (ImportError, apsw.Error, OSError) as exc:
            return "brute-force", f"sqlite-vec failed to load: {exc}"
        self._extension_path = path
        if not hasattr(sqlite3.Connection, "enable_load_extension"):
            return "sqlite-vec", "python sqlite3 cannot load extensions; using apsw"
        return "sqlite-vec", None

    def _current_file_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._db_path)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino)

    def _drop_connection(self) -> None:
        """Close the connection and forget everything derived from the old file."""
        if self._conn is not None:
            try:
                self._conn.close()
            except _db_errors():
                pass  # closing a connection to a swapped-out or deleted file
        self._conn = None
        self._file_id = None
        self._data_version = None
        self._mirror_dims = None
        self._mirror_version = None
        self._matrices.clear()

    def _connect(self) -> Any:
        """The open connection to the current store file, reopened after an atomic swap.

        Returns None when the store file does not exist.
        """
        file_id = self._current_file_id()
        if file_id is None:
            self._drop_connection()
            return None
        if self._conn is not None and file_id == self._file_id:
            return self._conn
        self._drop_connection()
        try:
            if self._mode == "sqlite-vec":
                import apsw

                conn = apsw.Connection(str(self._db_path), flags=apsw.SQLITE_OPEN_READWRITE)
                conn.setbusytimeout(READ_BUSY_TIMEOUT_MS)
                conn.enableloadextension(True)
                conn.loadextension(self._extension_path)
            else:
                conn = sqlite3.connect(f"{self._db_path.resolve().as_uri()}?mode=ro", uri=True,
                                       check_same_thread=False,
                                       timeout=READ_BUSY_TIMEOUT_MS / 1000)
        except (*_db_errors(), OSError) as exc:
            raise IndexStoreError(f"cannot open the store for vector search: {exc}",
                                  db_path=str(self._db_path)) from exc
        self._conn = conn
        self._file_id = file_id
        return conn

    def _read_data_version(self, conn: Any) -> int:
        return int(conn.execute("PRAGMA data_version").fetchall()[0][0])

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
            ``[(chunk_id, cosine_similarity)]``, similarity in ``[-1, 1]``, descending; ``[]``
            when disabled, the store does not exist, or the query is empty, zero or non-finite.

        Raises:
            ManagerClosedError: after :meth:`close`.
            IndexStoreError: the store cannot be opened or read.
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
            conn = self._connect()
            if conn is None:
                return []
            try:
                version = self._read_data_version(conn)
            except _db_errors() as exc:
                raise IndexStoreError(f"cannot read the store: {exc}",
                                      db_path=str(self._db_path)) from exc
            if version != self._data_version:
                self._matrices.clear()
                self._data_version = version
            dims = len(query)
            unique_sources = sorted(set(sources))
            if self._mode == "sqlite-vec" and self._mirror_broken is None:
                hits = self._search_mirror(conn, q, dims=dims, version=version, model=model,
                                           sources=unique_sources, limit=limit)
                if hits is not None:
                    self._last_query_mode = "sqlite-vec"
                    self._dims = dims
                    return hits
            self._last_query_mode = "brute-force"
            return self._search_brute_force(conn, q / norm, dims=dims, model=model,
                                            sources=unique_sources, limit=limit)

    def invalidate(self) -> None:
        """Forget cached matrices and force a mirror diff on the next search.

        Also clears a recorded mirror failure, so sqlite-vec is tried again.
        """
        with self._lock:
            self._matrices.clear()
            self._mirror_version = None
            self._mirror_broken = None

    def status(self) -> dict[str, Any]:
        """Health for ``status()``.

        Returns:
            ``{"enabled", "available", "mode", "reason", "dims", "extensionPath",
            "mirrorError", "lastQueryMode"}``: ``available`` is True when vector search can
            answer (sqlite-vec or brute force); ``mirrorError`` is the last mirror failure (the
            query it hit was answered by brute force), ``lastQueryMode`` the mode that answered
            the last search.
        """
        with self._lock:
            return {
                "enabled": self._enabled,
                "available": self._mode != "disabled",
                "mode": self._mode,
                "reason": self._reason,
                "dims": self._dims,
                "extensionPath": self._extension_path or self._configured_extension,
                "mirrorError": self._mirror_broken or self._mirror_error,
                "lastQueryMode": self._last_query_mode,
            }

    def close(self) -> None:
        """Close the connection; idempotent. Later searches raise ``ManagerClosedError``."""
        with self._lock:
            self._drop_connection()
            self._closed = True

    # -- brute force -----------------------------------------------------------------------

    def _load_matrix(self, conn: Any, *, dims: int, model: str,
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
        try:
            rows = conn.execute(sql, (model, *sources, dims * FLOAT32_BYTES)).fetchall()
        except _db_errors() as exc:
            raise IndexStoreError(f"cannot read chunk vectors: {exc}",
                                  db_path=str(self._db_path)) from exc
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

    def _search_brute_force(self, conn: Any, unit_query: Any, *, dims: int, model: str,
                            sources: list[str], limit: int) -> list[tuple[str, float]]:
        import numpy as np

        ids, matrix = self._load_matrix(conn, dims=dims, model=model, sources=sources)
        self._dims = dims
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

    # -- sqlite-vec mirror -----------------------------------------------------------------

    def _search_mirror(self, conn: Any, q: Any, *, dims: int, version: int, model: str,
                       sources: list[str], limit: int) -> list[tuple[str, float]] | None:
        """KNN on the mirror; None when the mirror failed (the caller uses brute force)."""
        import apsw
        import numpy as np

        try:
            if self._mirror_dims != dims or self._mirror_version != version:
                if not self._refresh_mirror(conn, dims=dims):
                    return None
                self._mirror_dims = dims
                self._mirror_version = version
            sql = ("SELECT id, distance FROM chunks_vec WHERE embedding MATCH ? AND k = ? "
                   f"AND model = ? AND source IN ({_placeholders(len(sources))}) "
                   "ORDER BY distance")
            blob = np.asarray(q, dtype="<f4").tobytes()
            rows = conn.execute(sql, (blob, min(limit, VEC0_MAX_K), model, *sources)).fetchall()
        except apsw.BusyError as exc:
            self._mirror_error = f"sqlite-vec mirror busy: {exc}; answered by brute force"
            return None
        except apsw.Error as exc:
            self._mirror_broken = f"sqlite-vec mirror failed: {exc}; answering by brute force"
            self._mirror_dims = None
            return None
        self._mirror_error = None
        return [(r[0], 1.0 - float(r[1])) for r in rows if r[1] is not None]

    def _refresh_mirror(self, conn: Any, *, dims: int) -> bool:
        """Bring ``chunks_vec`` in line with ``chunks`` for ``dims``; False when the store stayed
        busy (recorded in ``mirrorError``). Other apsw errors propagate to the caller."""
        import apsw

        if self._mirror_is_current(conn, dims=dims):
            return True
        conn.setbusytimeout(MIRROR_BUSY_TIMEOUT_MS)
        try:
            for _attempt in range(MIRROR_LOCK_ATTEMPTS):
                try:
                    conn.execute("BEGIN IMMEDIATE")
                except apsw.BusyError:
                    continue
                try:
                    self._diff_into_mirror(conn, dims=dims)
                    conn.execute("COMMIT")
                except BaseException:
                    if not conn.getautocommit():
                        conn.execute("ROLLBACK")
                    raise
                return True
        except apsw.BusyError as exc:
            self._mirror_error = f"sqlite-vec mirror busy: {exc}; answered by brute force"
            return False
        finally:
            conn.setbusytimeout(READ_BUSY_TIMEOUT_MS)
        self._mirror_error = "sqlite-vec mirror busy (store locked); answered by brute force"
        return False

    def _mirror_is_current(self, conn: Any, *, dims: int) -> bool:
        """Read-only check: the mirror exists for ``dims`` and no id needs inserting or deleting
        (so a change elsewhere in the store costs no write lock)."""
        existing = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'chunks_vec'").fetchall()
        state = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chunks_vec_state'"
        ).fetchall()
        if not existing or existing[0][0] != _mirror_ddl(dims) or not state:
            return False
        nbytes = dims * FLOAT32_BYTES
        pending = conn.execute(
            f"SELECT EXISTS({_STALE_SQL}) OR EXISTS({_FRESH_SQL})", (nbytes, nbytes)).fetchall()
        return not pending[0][0]

    def _diff_into_mirror(self, conn: Any, *, dims: int) -> None:
        """Inside a write transaction: recreate on a schema/dims change, then sync by id.

        Ids are compared with their ``updated_at``: an id that left ``chunks``, lost its vector,
        changed length or was rewritten is deleted; ids not mirrored yet are inserted.
        """
        import numpy as np

        ddl = _mirror_ddl(dims)
        existing = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'chunks_vec'").fetchall()
        if not existing or existing[0][0] != ddl:
            conn.execute("DROP TABLE IF EXISTS chunks_vec")
            conn.execute("DROP TABLE IF EXISTS chunks_vec_state")
            conn.execute(ddl)
        conn.execute(_MIRROR_STATE_DDL)
        nbytes = dims * FLOAT32_BYTES
        stale = conn.execute(_STALE_SQL, (nbytes,)).fetchall()
        if stale:
            conn.executemany("DELETE FROM chunks_vec WHERE id = ?", stale)
            conn.executemany("DELETE FROM chunks_vec_state WHERE id = ?", stale)
        fresh = conn.execute(_FRESH_SQL, (nbytes,)).fetchall()
        if not fresh:
            return
        matrix = np.frombuffer(b"".join(bytes(r[1]) for r in fresh), dtype="<f4")
        norms = np.linalg.norm(matrix.reshape(len(fresh), dims).astype(np.float64), axis=1)
        usable = (np.isfinite(norms) & (norms > 0)).tolist()
        conn.executemany(
            "INSERT INTO chunks_vec(id, embedding, model, source) VALUES (?, ?, ?, ?)",
            [(r[0], bytes(r[1]), r[2], r[3]) for r, ok in zip(fresh, usable, strict=True) if ok])
        conn.executemany(
            "INSERT INTO chunks_vec_state(id, updated_at, dims) VALUES (?, ?, ?)",
            [(r[0], r[4], dims) for r in fresh])

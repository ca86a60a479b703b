"""Vector search over the store's chunk embeddings: each chunk is a few window vectors, and a
chunk scores the cosine similarity of its best window (max pooling), exactly, in an in-memory
numpy matrix or, past ``matrix_max_bytes``, in SQL with sqlite-vec loaded into Python's
``sqlite3`` (never a second SQLite library on the store file:
https://www.sqlite.org/howtocorrupt.html §2.2.1).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fallback.errors import IndexStoreError, ManagerClosedError
from fallback.store.errors import translate_errors
from fallback.store.files import file_id
from fallback.store.readonly import ReadOnlyConnection, connect_read_only

__all__ = ["MATRIX_MAX_BYTES", "VectorIndex", "VectorSearch", "probe_sqlite_vec", "unit_windows"]

# Bytes per stored vector component (float32).
FLOAT32_BYTES = 4
# Why there is no sqlite-vec where Python's sqlite3 was built without extension loading.
NO_EXTENSION_LOADING = "python sqlite3 cannot load extensions; exact brute-force cosine"
# Window vectors are searched in memory up to this many bytes (about 350,000 windows of 384
# dims); above it sqlite-vec computes the cosine in SQL when it loads.
MATRIX_MAX_BYTES = 512 * 1024 * 1024
# Chunks read per statement when a refresh loads the vectors of new chunks.
ROWS_PER_FETCH = 500


def _placeholders(n: int) -> str:
    return ",".join("?" * n)


def _load_sqlite_vec(conn: sqlite3.Connection, path: str) -> None:
    conn.enable_load_extension(True)
    try:
        conn.load_extension(path)
    finally:
        conn.enable_load_extension(False)


def probe_sqlite_vec(extension_path: str | None = None) -> tuple[str | None, str | None]:
    """Whether sqlite-vec (``extension_path``, default the ``sqlite_vec`` package's) loads
    into Python's ``sqlite3``: ``(path loaded, None)``, else ``(None, reason)``
    (:data:`NO_EXTENSION_LOADING`, ``sqlite-vec failed to load: <error>; ...``)."""
    if not hasattr(sqlite3.Connection, "enable_load_extension"):
        return None, NO_EXTENSION_LOADING
    try:
        path = extension_path
        if path is None:
            import sqlite_vec

            path = sqlite_vec.loadable_path()
        with translate_errors(None):
            with contextlib.closing(sqlite3.connect(":memory:")) as probe:
                _load_sqlite_vec(probe, path)
                probe.execute("SELECT vec_version()").fetchall()
    except (ImportError, OSError, IndexStoreError) as exc:
        return None, f"sqlite-vec failed to load: {exc}; exact brute-force cosine"
    return path, None


def unit_windows(blob: bytes | None, dims: int) -> Any:
    """A chunk's ``chunks.vector`` BLOB as a ``(k, dims)`` float32 array of its windows whose
    norm is finite and non-zero, each divided by its norm; ``None`` when the blob is missing,
    does not hold whole vectors of ``dims`` components, or no window is left."""
    import numpy as np

    if not blob or dims <= 0 or len(blob) % (dims * FLOAT32_BYTES):
        return None
    raw = np.frombuffer(bytes(blob), dtype="<f4").reshape(-1, dims)
    norms = np.linalg.norm(raw.astype(np.float64), axis=1)
    keep = np.isfinite(norms) & (norms > 0)
    if not keep.any():
        return None
    return (raw[keep] / norms[keep, None]).astype(np.float32)


@dataclass(frozen=True)
class VectorSearch:
    """The answer of :meth:`VectorIndex.search_scored`: ``hits`` ``[(chunk_id, best-window
    cosine in [-1, 1])]`` best first; ``mean`` / ``std`` (population) of that cosine over every
    chunk searched (``0.0`` without chunks) and their ``count``."""

    hits: list[tuple[str, float]]
    mean: float = 0.0
    std: float = 0.0
    count: int = 0


EMPTY_SEARCH = VectorSearch(hits=[])


@dataclass(frozen=True)
class _Chunk:
    """One chunk row as held in memory (``windows``: unit rows, or ``None``)."""

    chunk_id: str
    model: str
    source: str
    dims: int
    windows: Any


@dataclass(frozen=True)
class _Matrix:
    """The windows of one (model, sources, dims), chunks in id order; ``bounds[i]`` is the
    first row of chunk ``ids[i]``, ``version`` the ``data_version`` it was built at."""

    version: int
    ids: list[str]
    windows: Any
    bounds: Any


class VectorIndex:
    """Best-window cosine search over ``chunks.vector`` of one SQLite store (thread-safe).

    Modes: ``"brute-force"`` (in memory; in SQL above ``matrix_max_bytes`` when sqlite-vec
    loads), ``"sqlite-vec"`` (``matrix_max_bytes <= 0`` and sqlite-vec loads), ``"disabled"``.
    A swapped store file is noticed and reloaded; chunks of other ``dims`` than the query are
    never compared.

    Args:
        db_path: the store file (WAL mode); it may not exist yet (searches find nothing).
        enabled / extension_path: ``store.vector.enabled`` / ``extensionPath`` (default: the
            ``sqlite_vec`` package's loadable).
        matrix_max_bytes: memory budget of the window matrix in bytes.
    """

    def __init__(self, db_path: Path, *, enabled: bool = True, extension_path: str | None = None,
                 matrix_max_bytes: int = MATRIX_MAX_BYTES) -> None:
        self._db_path = Path(db_path)
        self._enabled = enabled
        self._configured_extension = extension_path
        self._matrix_max_bytes = matrix_max_bytes
        self._lock = threading.RLock()
        self._closed = False
        self._conn: ReadOnlyConnection | None = None
        self._file_id: tuple[int, int] | None = None
        self._last_query_mode: str | None = None
        self._dims: int | None = None
        self._chunks: dict[tuple[int, str], _Chunk] | None = None
        self._version: int | None = None
        self._sql_only = False
        self._matrices: dict[tuple[str, tuple[str, ...], int], _Matrix] = {}
        self._extension_path: str | None = None
        self._mode = "disabled"
        self._reason: str | None = "disabled by config (store.vector.enabled = false)"
        if enabled:
            self._extension_path, self._reason = probe_sqlite_vec(extension_path)
            forced_sql = self._extension_path is not None and matrix_max_bytes <= 0
            self._mode = "sqlite-vec" if forced_sql else "brute-force"

    def _drop_connection(self) -> None:
        """Close the connection and forget everything derived from the old file."""
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):  # a swapped-out or deleted file
                self._conn.close()
        self._conn = None
        self._file_id = None
        self._forget()

    def _forget(self) -> None:
        """Drop every vector held in memory (the next search reads them again)."""
        self._chunks = None
        self._version = None
        self._sql_only = False
        self._matrices.clear()

    def _connect(self) -> ReadOnlyConnection | None:
        """The connection to the current store file (reopened after a swap, and for every
        search while it is an immutable read); None when the file does not exist."""
        current = file_id(self._db_path)
        if current is None:
            self._drop_connection()
            return None
        if self._conn is not None and current == self._file_id:
            if not self._conn.immutable:
                return self._conn
            # an immutable read never sees a later commit: reopen, keeping the vectors held
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
            self._version = None
        else:
            self._drop_connection()
        conn = connect_read_only(self._db_path, modes=("ro",), check_same_thread=False)
        try:
            if self._extension_path is not None:
                _load_sqlite_vec(conn, self._extension_path)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._file_id = current
        return conn

    def search_scored(self, query: list[float], *, model: str, sources: list[str],
                      limit: int) -> VectorSearch:
        """A :class:`VectorSearch` of at most ``limit`` chunks of ``model`` and ``sources`` whose
        best window is most similar to ``query`` (any norm; chunks of its length only), best
        first; none when disabled, without a store file or sources, or for an empty, zero or
        non-finite query.

        Raises ``ManagerClosedError`` after :meth:`close`; ``IndexStoreError``.
        """
        import numpy as np

        with self._lock:
            if self._closed:
                raise ManagerClosedError("vector index is closed")
            if self._mode == "disabled" or limit <= 0 or not query or not sources:
                return EMPTY_SEARCH
            q = np.asarray(query, dtype=np.float64)
            norm = float(np.linalg.norm(q))
            if not np.isfinite(norm) or norm == 0.0:
                return EMPTY_SEARCH
            dims = len(query)
            key = (model, tuple(sorted(set(sources))), dims)
            with translate_errors(self._db_path):
                conn = self._connect()
                if conn is None:
                    return EMPTY_SEARCH
                self._dims = dims
                conn.execute("BEGIN")  # one read snapshot for the refresh and the search
                try:
                    version = int(conn.execute("PRAGMA data_version").fetchall()[0][0])
                    if version != self._version:
                        self._refresh(conn)
                        self._version = version
                    if self._sql_only:
                        self._last_query_mode = "sqlite-vec"
                        return self._search_sql(conn, q, key=key, limit=limit)
                finally:
                    conn.execute("COMMIT")
                matrix = self._matrix(key, version)
            self._last_query_mode = "brute-force"
            return self._search_matrix(matrix, (q / norm).astype(np.float32), limit=limit)

    def invalidate(self) -> None:
        """Forget the vectors held in memory (the next search reads every vector again)."""
        with self._lock:
            self._forget()

    def status(self) -> dict[str, Any]:
        """Health for ``status()``: ``{"enabled", "available", "mode", "reason" (why sqlite-vec
        is not available), "dims" (of the last search), "extensionPath", "lastQueryMode"}``."""
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

    def _refresh(self, conn: sqlite3.Connection) -> None:
        """Bring the chunks held in memory up to date, reading only new ``(rowid, id)`` pairs
        (a chunk id names its content), or none once the vectors exceed the memory budget."""
        if self._sql_only:
            return
        if self._chunks is None:
            if self._extension_path is not None and (self._matrix_max_bytes <= 0 or int(conn.execute(
                    "SELECT COALESCE(SUM(length(vector)), 0) FROM chunks").fetchall()[0][0])
                    > self._matrix_max_bytes):
                self._sql_only = True
                return
            self._chunks = self._read(conn, "", [])
        else:
            keys = {(int(r[0]), str(r[1])) for r in conn.execute("SELECT rowid, id FROM chunks")}
            kept = {k: c for k, c in self._chunks.items() if k in keys}
            new = sorted(rowid for rowid, cid in keys - kept.keys())
            for i in range(0, len(new), ROWS_PER_FETCH):
                part = new[i:i + ROWS_PER_FETCH]
                kept.update(self._read(conn, f" WHERE rowid IN ({_placeholders(len(part))})", part))
            self._chunks = kept
        self._matrices.clear()
        held = sum(c.windows.nbytes for c in self._chunks.values() if c.windows is not None)
        if self._extension_path is not None and held > self._matrix_max_bytes:
            self._chunks = None
            self._sql_only = True

    @staticmethod
    def _read(conn: sqlite3.Connection, where: str, params: list[Any]) -> dict[tuple[int, str], _Chunk]:
        rows = conn.execute(f"SELECT rowid, id, model, source, vector, dims FROM chunks{where}",
                            params).fetchall()
        out = {}
        for rowid, chunk_id, model, source, blob, dims in rows:
            d = int(dims or 0)
            out[(int(rowid), str(chunk_id))] = _Chunk(str(chunk_id), str(model), str(source), d,
                                                      unit_windows(blob, d))
        return out

    def _matrix(self, key: tuple[str, tuple[str, ...], int], version: int) -> _Matrix:
        """The window matrix of ``key`` built from the chunks held (cached per version)."""
        import numpy as np

        cached = self._matrices.get(key)
        if cached is not None and cached.version == version:
            return cached
        model, sources, dims = key
        chosen = sorted((c for c in (self._chunks or {}).values()
                         if c.windows is not None and c.model == model and c.source in sources
                         and c.dims == dims), key=lambda c: c.chunk_id)
        sizes = np.fromiter((len(c.windows) for c in chosen), dtype=np.int64, count=len(chosen))
        matrix = _Matrix(
            version=version, ids=[c.chunk_id for c in chosen],
            windows=(np.ascontiguousarray(np.concatenate([c.windows for c in chosen])) if chosen
                     else np.zeros((0, dims), dtype=np.float32)),
            bounds=np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64))
        self._matrices[key] = matrix
        return matrix

    @staticmethod
    def _search_matrix(matrix: _Matrix, unit_query: Any, *, limit: int) -> VectorSearch:
        import numpy as np

        if not matrix.ids:
            return EMPTY_SEARCH
        scores = np.maximum.reduceat(matrix.windows @ unit_query, matrix.bounds)
        k = min(limit, len(scores))
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        # chunks are in id order, so a stable sort breaks ties by chunk id
        order = top[np.argsort(-scores[top], kind="stable")]
        as64 = scores.astype(np.float64)
        return VectorSearch(hits=[(matrix.ids[i], float(scores[i])) for i in order.tolist()],
                            mean=float(as64.mean()), std=float(as64.std()), count=len(scores))

    @staticmethod
    def _search_sql(conn: sqlite3.Connection, q: Any, *, key: tuple[str, tuple[str, ...], int],
                    limit: int) -> VectorSearch:
        """Exact best-window cosine in SQL (``vec_slice`` windows; zero and non-finite ones
        drop out), statistics over every grouped chunk before the LIMIT."""
        import numpy as np

        model, sources, dims = key
        window_bytes = dims * FLOAT32_BYTES
        where = (f"model = ? AND source IN ({_placeholders(len(sources))}) AND vector IS NOT NULL"
                 " AND dims = ? AND length(vector) > 0 AND length(vector) % ? = 0")
        params = (model, *sources, dims, window_bytes)
        most = conn.execute(f"SELECT MAX(length(vector)) FROM chunks WHERE {where}", params).fetchall()
        if not most or most[0][0] is None:
            return EMPTY_SEARCH
        sql = ("WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)"
               " SELECT id, dist, AVG(dist) OVER (), AVG(dist * dist) OVER (), COUNT(*) OVER ()"
               " FROM (SELECT id, MIN(vec_distance_cosine(vec_slice(vector, n.i * ?, (n.i + 1) * ?), ?))"
               f" AS dist FROM chunks CROSS JOIN n WHERE n.i < length(vector) / ? AND {where}"
               " GROUP BY id HAVING dist IS NOT NULL) ORDER BY dist, id LIMIT ?")
        blob = np.asarray(q, dtype="<f4").tobytes()
        rows = conn.execute(sql, (int(most[0][0]) // window_bytes, dims, dims, blob, window_bytes,
                                  *params, limit)).fetchall()
        if not rows:
            return EMPTY_SEARCH
        mean_dist, mean_sq = float(rows[0][2]), float(rows[0][3])
        return VectorSearch(hits=[(r[0], 1.0 - float(r[1])) for r in rows], mean=1.0 - mean_dist,
                            std=max(0.0, mean_sq - mean_dist * mean_dist) ** 0.5, count=int(rows[0][4]))

"""Vector search over the store's chunk embeddings: sqlite-vec KNN or exact numpy brute force.

The engine writes chunks (with a float32 little-endian ``vector`` BLOB) through its own
``sqlite3`` connection; :class:`VectorIndex` only reads the store, through ``sqlite3`` too.
Python's ``sqlite3`` often cannot load extensions (macOS system Python, pyenv builds), so
sqlite-vec is driven through ``apsw``. apsw links its own copy of SQLite, and two SQLite copies
in one process do not see each other's POSIX locks (closing a file in one copy drops the other's
locks: https://www.sqlite.org/howtocorrupt.html §2.2.1). So apsw never opens the store: the
``vec0`` mirror ``chunks_vec`` lives in a side file ``<store>-vec`` that only apsw opens, and it
is refreshed incrementally (by chunk id and ``updated_at``) before a query when the store
changed. Without apsw or sqlite-vec, an exact cosine over a cached numpy matrix answers instead.
Both modes rank identically.
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
# Chunk ids per ``IN (...)`` query when copying vectors into the mirror (SQLite's default
# variable limit is 32,766; smaller batches keep each statement cheap).
MIRROR_FETCH_BATCH = 500
# sqlite-vec refuses KNN queries with k above this.
VEC0_MAX_K = 4096
# Bytes per stored vector component (float32).
FLOAT32_BYTES = 4

_MIRROR_STATE_DDL = ("CREATE TABLE IF NOT EXISTS chunks_vec_state("
                     "id TEXT PRIMARY KEY, updated_at INTEGER NOT NULL, dims INTEGER NOT NULL)")

def _mirror_ddl(dims: int) -> str:
    """The exact CREATE statement of the ``vec0`` mirror for ``dims`` dimensions."""
    return ("CREATE VIRTUAL TABLE chunks_vec USING vec0(id TEXT PRIMARY KEY, "
            f"embedding float[{int(dims)}] distance_metric=cosine, "
            "model TEXT PARTITION KEY, source TEXT)")


def _placeholders(n: int) -> str:
    return ",".join("?" * n)


class VectorIndex:
    """Cosine-similarity search over ``chunks.vector`` of one SQLite store.

    Modes (``mode``): ``"sqlite-vec"`` (apsw loads the sqlite-vec extension; KNN on a ``vec0``
    mirror of the chunks), ``"brute-force"`` (exact cosine over a numpy matrix cached per model,
    sources and dims, reloaded when the store changes), ``"disabled"`` (``enabled=False``; every
    search returns ``[]``). ``reason`` says why the mode is not plain sqlite-vec.

    The mirror (``<db_path>-vec``, see the module docstring) is a cache: the store is only read,
    the mirror file is written under its own short write lock (only when something changed),
    concurrent writers get a busy timeout and retries, and when the mirror cannot be refreshed
    or queried the query is answered by brute force and ``status()`` says so. An atomic swap of
    the store file (new inode) is noticed and the connection reopened.
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
        self._mirror: Any = None
        self._mirror_path = self._db_path.with_name(self._db_path.name + "-vec")
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
            except sqlite3.Error:
                pass  # closing a connection to a swapped-out or deleted file
        self._conn = None
        self._file_id = None
        self._data_version = None
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
            conn = sqlite3.connect(f"{self._db_path.resolve().as_uri()}?mode=ro", uri=True,
                                   check_same_thread=False, isolation_level=None,
                                   timeout=READ_BUSY_TIMEOUT_MS / 1000)
        except (sqlite3.Error, OSError) as exc:
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
            except sqlite3.Error as exc:
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
            if self._mirror is not None:
                self._drop_mirror()
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
        except sqlite3.Error as exc:
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

    # -- sqlite-vec mirror (a side file that only apsw opens) --------------------------------

    def _mirror_conn(self) -> Any:
        """The apsw connection to the mirror file, created (WAL) on first use."""
        if self._mirror is not None and self._mirror_path.exists():
            return self._mirror
        self._drop_mirror()
        import apsw

        conn = apsw.Connection(str(self._mirror_path))
        try:
            conn.setbusytimeout(READ_BUSY_TIMEOUT_MS)
            conn.enableloadextension(True)
            # Set whenever the mode is "sqlite-vec", the only mode that reaches here.
            conn.loadextension(str(self._extension_path))
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
        except apsw.Error:
            conn.close()
            raise
        self._mirror = conn
        return conn

    def _drop_mirror(self) -> None:
        import apsw

        if self._mirror is not None:
            try:
                self._mirror.close()
            except apsw.Error:
                pass  # the mirror is a cache; a failed close loses nothing
        self._mirror = None
        self._mirror_dims = None
        self._mirror_version = None

    def _search_mirror(self, conn: Any, q: Any, *, dims: int, version: int, model: str,
                       sources: list[str], limit: int) -> list[tuple[str, float]] | None:
        """KNN on the mirror; None when the mirror failed (the caller uses brute force)."""
        import apsw
        import numpy as np

        try:
            mirror = self._mirror_conn()
            if self._mirror_dims != dims or self._mirror_version != version:
                if not self._refresh_mirror(conn, mirror, dims=dims):
                    return None
                self._mirror_dims = dims
                self._mirror_version = version
            sql = ("SELECT id, distance FROM chunks_vec WHERE embedding MATCH ? AND k = ? "
                   f"AND model = ? AND source IN ({_placeholders(len(sources))}) "
                   "ORDER BY distance")
            blob = np.asarray(q, dtype="<f4").tobytes()
            rows = mirror.execute(sql, (blob, min(limit, VEC0_MAX_K), model, *sources)).fetchall()
        except apsw.BusyError as exc:
            self._mirror_error = f"sqlite-vec mirror busy: {exc}; answered by brute force"
            return None
        except (apsw.Error, OSError) as exc:
            self._mirror_broken = f"sqlite-vec mirror failed: {exc}; answering by brute force"
            self._drop_mirror()
            return None
        self._mirror_error = None
        return [(r[0], 1.0 - float(r[1])) for r in rows if r[1] is not None]

    def _store_stamps(self, conn: Any, *, dims: int) -> dict[str, int]:
        """``{chunk_id: updated_at}`` of the store's chunks with a vector of ``dims``."""
        try:
            rows = conn.execute(
                "SELECT id, COALESCE(updated_at, 0) FROM chunks "
                "WHERE vector IS NOT NULL AND length(vector) = ?",
                (dims * FLOAT32_BYTES,)).fetchall()
        except sqlite3.Error as exc:
            raise IndexStoreError(f"cannot read chunk ids: {exc}",
                                  db_path=str(self._db_path)) from exc
        return {r[0]: int(r[1]) for r in rows}

    def _mirror_stamps(self, mirror: Any, *, dims: int) -> dict[str, int] | None:
        """``{chunk_id: updated_at}`` mirrored for ``dims``; None when the mirror has another
        shape (other dims, missing tables) and must be recreated."""
        existing = mirror.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'chunks_vec'").fetchall()
        state = mirror.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chunks_vec_state'"
        ).fetchall()
        if not existing or existing[0][0] != _mirror_ddl(dims) or not state:
            return None
        return {r[0]: int(r[1]) for r in mirror.execute(
            "SELECT id, updated_at FROM chunks_vec_state").fetchall()}

    def _refresh_mirror(self, conn: Any, mirror: Any, *, dims: int) -> bool:
        """Bring the mirror in line with the store's chunks of ``dims``.

        Returns False when the mirror file stayed locked by another process (recorded in
        ``mirrorError``). The write lock is taken only when something differs, and only on the
        mirror file: the store itself is only read, through ``sqlite3``.
        """
        import apsw

        wanted = self._store_stamps(conn, dims=dims)
        if self._mirror_stamps(mirror, dims=dims) == wanted:
            return True
        mirror.setbusytimeout(MIRROR_BUSY_TIMEOUT_MS)
        try:
            for _attempt in range(MIRROR_LOCK_ATTEMPTS):
                try:
                    mirror.execute("BEGIN IMMEDIATE")
                except apsw.BusyError:
                    continue
                try:
                    self._apply_diff(conn, mirror, dims=dims, wanted=wanted)
                    mirror.execute("COMMIT")
                except BaseException:
                    if not mirror.getautocommit():
                        mirror.execute("ROLLBACK")
                    raise
                return True
        finally:
            mirror.setbusytimeout(READ_BUSY_TIMEOUT_MS)
        self._mirror_error = "sqlite-vec mirror busy (locked by another process); answered by brute force"
        return False

    def _apply_diff(self, conn: Any, mirror: Any, *, dims: int, wanted: dict[str, int]) -> None:
        """Inside the mirror's write transaction: recreate on a shape change, then delete ids that
        left the store or were rewritten (other ``updated_at``) and insert the missing ones."""
        import numpy as np

        have = self._mirror_stamps(mirror, dims=dims)
        if have is None:
            mirror.execute("DROP TABLE IF EXISTS chunks_vec")
            mirror.execute("DROP TABLE IF EXISTS chunks_vec_state")
            mirror.execute(_mirror_ddl(dims))
            mirror.execute(_MIRROR_STATE_DDL)
            have = {}
        stale = [(cid,) for cid, stamp in have.items() if wanted.get(cid) != stamp]
        if stale:
            mirror.executemany("DELETE FROM chunks_vec WHERE id = ?", stale)
            mirror.executemany("DELETE FROM chunks_vec_state WHERE id = ?", stale)
        missing = [cid for cid, stamp in wanted.items() if have.get(cid) != stamp]
        nbytes = dims * FLOAT32_BYTES
        for start in range(0, len(missing), MIRROR_FETCH_BATCH):
            batch = missing[start:start + MIRROR_FETCH_BATCH]
            try:
                rows = conn.execute(
                    "SELECT id, vector, model, source, COALESCE(updated_at, 0) FROM chunks "
                    f"WHERE id IN ({_placeholders(len(batch))}) AND vector IS NOT NULL "
                    "AND length(vector) = ?", (*batch, nbytes)).fetchall()
            except sqlite3.Error as exc:
                raise IndexStoreError(f"cannot read chunk vectors: {exc}",
                                      db_path=str(self._db_path)) from exc
            if not rows:
                continue
            matrix = np.frombuffer(b"".join(bytes(r[1]) for r in rows), dtype="<f4")
            norms = np.linalg.norm(matrix.reshape(len(rows), dims).astype(np.float64), axis=1)
            usable = (np.isfinite(norms) & (norms > 0)).tolist()
            mirror.executemany(
                "INSERT INTO chunks_vec(id, embedding, model, source) VALUES (?, ?, ?, ?)",
                [(r[0], bytes(r[1]), r[2], r[3]) for r, ok in zip(rows, usable, strict=True) if ok])
            mirror.executemany(
                "INSERT INTO chunks_vec_state(id, updated_at, dims) VALUES (?, ?, ?)",
                [(r[0], int(r[4]), dims) for r in rows])

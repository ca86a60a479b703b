"""The postgres store behind the store seam (``fallback/store/seam.py``).

:class:`PostgresSearchStore` gives the search pipeline the reads of ``SearchStore`` over one
:class:`~fallback.store.postgres.store.PostgresStore` (its keyword rows, part counts, chunk rows
and statistics as they are), plus the vector side of a hybrid search (:meth:`PostgresSearchStore.search_scored`: best-window
cosine with its calibration statistics) and what that store does not answer itself: the files' mtimes for
temporal decay, the paths a sync lease holds, and FTS5 ``highlight()`` of the hits' texts, done
by SQLite over an in-memory table with the SQLite store's tokenizer (so a snippet window marks
the same tokens on both stores); and the scopes other agents share with this one
(:meth:`PostgresSearchStore.shared_scopes`), each a ``PostgresSearchStore`` of its own. The
postgres store keeps no ``meta`` table: an agent's scope
(agent + workspace) is its key, so an index never holds another workspace.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from fallback.store.fts_rows import FTS_COLUMNS
from fallback.store.postgres.store import PostgresStore, ScopeStats, SyncLease
from fallback.store.postgres.tokens import MAIN
from fallback.store.seam import KeywordRow
from fallback.store.vectors import VectorSearch
from fallback.text.scripts import contains_unspaced

# The Unicode blocks of Thai, Lao, Myanmar (and its extensions) and Khmer (and its symbols), as
# a PostgreSQL bracket expression: a chunk without such a character holds none of those scripts.
_UNSPACED_BLOCKS = "[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u19e0-\u19ff\ua9e0-\ua9ff\uaa60-\uaa7f]"

__all__ = ["PostgresSearchStore"]

# status reads a word list of each chunk without trigrams instead of the postings of the words
# of the scripts above when these are more than this many a chunk (a posting costs about a
# tenth of reading a word list).
POSTINGS_PER_WORD_LIST = 10


class PostgresSearchStore:
    """One agent's scope of a postgres store as a ``SearchStore`` (thread-safe).

    Args:
        store: the open postgres store (closed by :meth:`close`).
    """

    fts_tokenizer = "unicode61"
    fts_error: str | None = None

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self._scopes: dict[str, PostgresSearchStore] = {}  # shared_scopes(), kept across calls
        self._lock = threading.Lock()
        self._marks = sqlite3.connect(":memory:", check_same_thread=False)
        self._marks.execute(f"CREATE VIRTUAL TABLE t USING fts5({', '.join(FTS_COLUMNS)},"
                            f" tokenize='{MAIN[1]}')")

    def shared_scopes(self) -> dict[str, PostgresSearchStore]:
        """``{owner agent: its scope}`` of the agents sharing their rows with this one, read
        now (``PostgresStore.shared_scopes``: one statement), by owner; a scope's store (its
        window matrix with it) is kept while its owner shares the same workspace.

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        found = self.store.shared_scopes()
        with self._lock:
            held, self._scopes = self._scopes, {
                owner: kept if (kept := self._scopes.get(owner)) is not None
                and kept.store.workspace == ws else PostgresSearchStore(self.store.view(owner, ws))
                for owner, ws in found}
            scopes = dict(self._scopes)
        for owner, gone in held.items():
            if scopes.get(owner) is not gone:
                gone.close()
        return scopes

    def get_meta_json(self, key: str) -> None:
        """``None``: the postgres store keeps no ``meta`` (its scope key names the workspace)."""
        return None

    def stats(self) -> ScopeStats:
        """The published index's statistics (``PostgresStore.stats``)."""
        return self.store.stats()

    def has_chunks(self) -> bool:
        """Whether the published index holds a chunk."""
        return self.store.stats().chunk_count > 0

    def part_counts(self, exprs: Sequence[str]) -> tuple[int, list[int]]:
        """``PostgresStore.part_counts``."""
        return self.store.part_counts(exprs)

    def keyword_rows(self, match: str | None, *, sources: Sequence[str], limit: int,
                     trigram_match: str | None = None, like_patterns: Sequence[str] = (),
                     fallback_like_patterns: Sequence[str] = ()) -> list[KeywordRow]:
        """``PostgresStore.keyword_rows`` (its parser takes every plan of
        ``fallback/search/fts.py``, so ``fallback_like_patterns`` is never needed)."""
        return self.store.keyword_rows(match, sources=sources, limit=limit,
                                       trigram_match=trigram_match, like_patterns=like_patterns)

    def substring_rows(self, like_patterns: Sequence[str], *,
                       sources: Sequence[str]) -> list[KeywordRow]:
        """Every published chunk of ``sources`` matching all ``like_patterns`` (rank 0)."""
        return self.store.keyword_rows(None, sources=sources, limit=2**31 - 1,
                                       like_patterns=like_patterns)

    def chunk_rows(self, chunk_ids: Sequence[str]) -> list[KeywordRow]:
        """``PostgresStore.chunk_rows``."""
        return self.store.chunk_rows(chunk_ids)

    def file_mtimes(self, paths: Sequence[str]) -> dict[tuple[str, str], int]:
        """``{(source, path): mtime}`` (epoch ms) of the published files among ``paths``."""
        if not paths:
            return {}
        st = self.store
        with st._snapshot("read file times", *st._stats_sql()) as cur:
            gen = st._stats(cur).generation
            return {(r[0], r[1]): int(r[2]) for r in st._last_rows(
                cur, f"SELECT source, path, mtime FROM {st._s}.files WHERE agent_id = %s"
                " AND workspace = %s AND path = ANY(%s) AND gen_from <= %s"
                " AND (gen_to IS NULL OR gen_to > %s)", (st.agent_id, st.workspace, list(paths), gen, gen))}

    def search_scored(self, query: list[float], *, model: str, sources: list[str],
                      limit: int) -> VectorSearch:
        """The vector side of a hybrid search, as the SQLite store's
        ``VectorIndex.search_scored`` answers it: the chunks whose best window is most similar
        to ``query`` (``[(chunk_id, cosine)]``, descending, ties by chunk id) and the mean,
        standard deviation and count of that cosine over every chunk of ``model`` and
        ``sources`` searched (``PostgresStore.window_search``); no hits for an empty, zero or
        non-finite query.

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        hits, mean, std, count = self.store.window_search(query, model=model, sources=sources,
                                                          limit=limit)
        return VectorSearch(hits=hits, mean=mean, std=std, count=count)

    def highlights(self, mark_match: str, texts: Mapping[str, str], *, open_mark: str,
                   close_mark: str) -> dict[str, str]:
        """FTS5 ``highlight()`` of the hits' ``texts`` (``{chunk_id: text}``) that match
        ``mark_match``, computed by SQLite over the texts alone (no round trip)."""
        ids = list(texts)
        if not ids:
            return {}
        with self._lock:
            conn = self._marks
            conn.executemany("INSERT INTO t(rowid, text) VALUES (?, ?)",
                             [(i, texts[cid]) for i, cid in enumerate(ids)])
            try:
                marked = conn.execute("SELECT rowid, highlight(t, 0, ?, ?) FROM t WHERE t MATCH ?",
                                      (open_mark, close_mark, mark_match)).fetchall()
            finally:
                conn.execute("DELETE FROM t")
        return {ids[i]: text for i, text in marked}

    def sync_lease(self, *, wait_ms: int = 0) -> SyncLease | None:
        """``PostgresStore.sync_lease``; ``None`` with :attr:`busy_reason` when another sync
        holds it past ``wait_ms``."""
        return self.store.sync_lease(wait_ms=wait_ms)

    @property
    def busy_reason(self) -> str | None:
        """Who holds the sync lease after :meth:`sync_lease` returned ``None``."""
        return self.store.busy_reason

    def lease_paths(self, lease: SyncLease, source: str) -> dict[str, str]:
        """``{path: content hash}`` of the files of ``source`` that ``lease``'s generation holds
        (the published ones and those a killed sync wrote); ``""`` for a memory file written
        without its text (before migration ``m008``), so the sync writes it again."""
        st = self.store
        lease.flush()  # the lease's own writes first
        with st._errors("read the indexed files"):
            rows = lease._conn.execute(  # a memory file without its text is written again
                f"SELECT path, CASE WHEN source = 'memory' AND text IS NULL THEN '' ELSE hash END"
                f" FROM {st._s}.files WHERE agent_id = %s AND workspace = %s"
                " AND source = %s AND gen_from <= %s AND (gen_to IS NULL OR gen_to > %s)",
                (st.agent_id, st.workspace, source, lease.generation, lease.generation)).fetchall()
        return {str(p): str(h) for p, h in rows}

    def keep_failure(self, key: str, failure: Mapping[str, Any] | None) -> None:
        """Keep ``failure`` as ``key`` of this scope's ``workspaces.meta``, where every process's
        status reads it (:meth:`failure`); ``None`` removes it.

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        st = self.store
        with st._errors("record a failure"), st._pool.connection() as conn:
            if failure is None:
                conn.execute(f"UPDATE {st._s}.workspaces SET meta = meta - %s::text"
                             " WHERE agent_id = %s AND workspace = %s", (key, st.agent_id, st.workspace))
            else:  # the scope's row may not exist yet: the query is embedded before the first sync
                conn.execute(f"INSERT INTO {st._s}.workspaces AS w (agent_id, workspace, meta)"
                             " VALUES (%s, %s, %s::jsonb) ON CONFLICT (agent_id, workspace)"
                             " DO UPDATE SET meta = w.meta || EXCLUDED.meta",
                             (st.agent_id, st.workspace, json.dumps({key: failure})))

    def failure(self, key: str) -> dict[str, Any] | None:
        """The failure :meth:`keep_failure` keeps as ``key``, or ``None``.

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        st = self.store
        with st._errors("read a failure"), st._pool.connection() as conn:
            row = conn.execute(f"SELECT meta -> %s::text FROM {st._s}.workspaces"
                               " WHERE agent_id = %s AND workspace = %s", (key, st.agent_id, st.workspace)).fetchone()
        return row[0] if row is not None and isinstance(row[0], dict) else None

    def describe(self) -> dict[str, Any]:
        """What ``status`` shows of the store: ``{driver, target, schema, schemaVersion,
        generation, counts: {source: {files, chunks}}, lastSyncAtMs, cacheEntries, vectorDims,
        unspacedWithoutTrigrams, skipped: [{path, reason}], sharedScopes: [{agent, workspace}]}``
        (the shared embedding cache's entries; the length of the published vectors, ``None``
        before any; the published chunks with Thai, Lao, Khmer or Myanmar text but no trigram
        postings, written before those scripts were searched as substrings; the files the
        published sync skipped or indexed with a caveat, by path; the scopes other agents share
        with this one); the target without its password (``PgTarget.describe``)."""
        st = self.store
        with st._snapshot("read the store's counts", *st._stats_sql()) as cur:
            stats = st._stats(cur)
            cur.execute(f"SELECT max(version) FROM {st._s}.schema_migrations")
            version: Any = cur.fetchone()
            counts: dict[str, dict[str, int]] = {}
            for table in ("files", "chunks"):
                cur.execute(f"SELECT source, count(*) FROM {st._s}.{table} WHERE agent_id = %s"
                            " AND workspace = %s AND gen_from <= %s AND (gen_to IS NULL OR gen_to > %s)"
                            " GROUP BY source", (st.agent_id, st.workspace, stats.generation,
                                                 stats.generation))
                for source, n in cur.fetchall():
                    counts.setdefault(source, {"files": 0, "chunks": 0})[table] = int(n)
            cur.execute(f"SELECT meta -> 'skipped' FROM {st._s}.workspaces WHERE agent_id = %s"
                        " AND workspace = %s", (st.agent_id, st.workspace))
            kept: Any = cur.fetchone()
            cur.execute(f"SELECT count(*) FROM {st._s}.embedding_cache")
            cached: Any = cur.fetchone()
            cur.execute(f"SELECT v.dims FROM {st._s}.chunk_vectors v JOIN {st._s}.chunks c"
                        " ON c.chunk_rowid = v.chunk_rowid WHERE v.agent_id = %s AND v.workspace = %s"
                        " AND c.gen_from <= %s AND (c.gen_to IS NULL OR c.gen_to > %s) LIMIT 1",
                        (st.agent_id, st.workspace, stats.generation, stats.generation))
            dims: Any = cur.fetchone()
            # chunks of those scripts written without trigram postings (before they took the
            # substring path), read from the side with less to scan: the postings of the index's
            # words in the scripts' blocks (a word list, not every text, is scanned) or, past
            # POSTINGS_PER_WORD_LIST of them a chunk without trigrams (a store of those scripts
            # holds millions), those chunks' word lists; none without such chunks;
            # contains_unspaced decides
            live = "c.gen_from <= %s AND (c.gen_to IS NULL OR c.gen_to > %s)"
            bare, postings = stats.chunk_count - stats.trigram_chunk_count, 0
            if bare:
                cur.execute(f"SELECT coalesce(sum(df), 0) FROM {st._s}.term_stats WHERE agent_id = %s"
                            " AND workspace = %s AND term ~ %s", (st.agent_id, st.workspace, _UNSPACED_BLOCKS))
                postings = cur.fetchone()[0]
            if bare and postings > POSTINGS_PER_WORD_LIST * bare:
                cur.execute(f"SELECT c.chunk_rowid, c.text FROM {st._s}.chunks c WHERE c.agent_id = %s"
                            f" AND c.workspace = %s AND c.trigram_len IS NULL AND {live} AND c.terms ~ %s",
                            (st.agent_id, st.workspace, stats.generation, stats.generation, _UNSPACED_BLOCKS))
            elif bare and postings:
                cur.execute(f"SELECT DISTINCT c.chunk_rowid, c.text FROM {st._s}.term_stats ts"
                            f" JOIN {st._s}.posting_blocks b ON b.agent_id = ts.agent_id"
                            " AND b.workspace = ts.workspace AND b.term = ts.term"
                            f" CROSS JOIN LATERAL unnest(b.rowids) AS u(r) JOIN {st._s}.chunks c"
                            " ON c.chunk_rowid = u.r WHERE ts.agent_id = %s AND ts.workspace = %s"
                            f" AND ts.df > 0 AND ts.term ~ %s AND c.trigram_len IS NULL AND {live}",
                            (st.agent_id, st.workspace, _UNSPACED_BLOCKS, stats.generation, stats.generation))
            untrigrammed = sum(1 for _, text in cur if contains_unspaced(text)) if bare and postings else 0
        return {"driver": "postgres", "target": st.target.redact(st.target.describe()),
                "schema": st.target.schema, "schemaVersion": int(version[0] or 0),
                "generation": stats.generation, "counts": counts,
                "lastSyncAtMs": stats.last_sync_at_ms, "cacheEntries": int(cached[0]),
                "vectorDims": None if dims is None else int(dims[0]),
                "unspacedWithoutTrigrams": untrigrammed,
                "skipped": [{"path": p, "reason": r} for p, r in (kept[0] if kept and kept[0] else [])],
                "sharedScopes": [{"agent": agent, "workspace": ws} for agent, ws in st.shared_scopes()]}

    def close(self) -> None:
        """Close the postgres store, the in-memory table and the shared scopes (idempotent)."""
        with self._lock:
            held, self._scopes = self._scopes, {}
        for scope in held.values():
            scope.close()
        self.store.close()
        self._marks.close()

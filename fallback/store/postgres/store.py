"""The postgres store: one PostgreSQL + pgvector database shared by many agents and hosts.

A :class:`PostgresStore` serves one agent's workspace (its *scope*): keyword rows ranked like the
SQLite store's FTS5 ``bm25()``, chunk rows by id, vector rows by cosine distance, the published
index's statistics, and the shared embedding cache. Writes go through a :class:`SyncLease`:

- one sync per agent + workspace at a time across hosts: the lease holds a session-level
  advisory lock on a connection of its own (:meth:`PostgresStore.sync_lease` waits up to
  ``wait_ms`` or returns ``None`` with the holder named in :attr:`PostgresStore.busy_reason`);
- readers never wait for a sync: the lease writes generation ``P + 1`` beside the published
  ``P`` (one transaction per file) and :meth:`SyncLease.publish` moves the workspace's pointer in
  one transaction; a search reads the pointer and the rows in one snapshot;
- ``kill -9`` of a syncing process: the server ends its session, which releases the lock; the
  published generation is untouched, and the files the killed sync committed stay written in
  generation ``P + 1``, where the next lease finds them (:meth:`SyncLease.file_hash`) and
  publishes them with the rest.

Connections come from a psycopg pool that checks each connection before lending it, so a server
restart costs the next call a reconnect, not an error. Every psycopg error is translated by
``fallback/store/postgres/errors.py``; no message holds the password.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import heapq
import itertools
import json
import math
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fallback.errors import UsageError
from fallback.store.postgres.bm25 import (
    BM25_B,
    BM25_K1,
    MatchQuery,
    count_matches,
    idf,
    parse_match,
    phrase_instances,
    rank_rows,
    required_tokens,
)
from fallback.store.postgres.errors import PostgresUnavailableError, translate
from fallback.store.postgres.migrations import TF_COLUMNS, migrate
from fallback.store.postgres.rows import Column, write_rows
from fallback.store.postgres.rows import int_array as _int_array
from fallback.store.postgres.rows import text_array as _text_array
from fallback.store.postgres.target import PgTarget
from fallback.store.postgres.tokens import MAIN, TRIGRAM, Fts5Tokenizer, Postings
from fallback.store.seam import COLUMN_WEIGHTS, KeywordRow, row_order
from fallback.store.vectors import MATRIX_MAX_BYTES, VectorIndex, _Matrix
from fallback.text.scripts import contains_unspaced

__all__ = ["ChunkRow", "FileRows", "KeywordRow", "PostgresStore", "ScopeStats", "SyncLease"]

# Keyword candidates ranked exactly per wanted row in the first round, and the growth of the
# candidate count per further round (see PostgresStore._top_rows).
CANDIDATES_PER_ROW = 8
CANDIDATE_GROWTH = 4
# Candidates ranked exactly at a time before the bound of the next one is checked.
RANK_STEP = 16
# Relative slack of a round's window: candidates whose bound is this close below the limit-th
# lower bound are read too (far above the error of a float sum in another order).
WINDOW_MARGIN = 1e-6
# A posting read by key (an index descent and its block's arrays) costs about as much as this
# many postings of a block read in a scan of all the term's blocks.
BY_KEY_POSTINGS = 16
# The postings of the essential words from which a search first reads the rarest word's to
# know the score to beat (see PostgresStore._top_rows): below, the extra statement costs
# more than the scan it may spare.
PROBE_POSTINGS = 20000
# publish() runs ANALYZE when the sync wrote at least 1 / ANALYZE_SHARE of the published chunks.
ANALYZE_SHARE = 10
# Relative margin between an exact score and a candidate bound computed in SQL (the same
# formula summed in another order).
BOUND_MARGIN = 1e-9
# Every read of several statements: one consistent snapshot.
_BEGIN_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
# Most postings one INSERT writes (a write batch of many files is several statements, each well
# inside the statement deadline on a loaded server).
POSTINGS_PER_STATEMENT = 5000
# Most postings (or rows) one statement of a write's new rows carries (COPY, or INSERT where
# row-level security applies): larger statements cost the client less per row, and such a
# statement still takes the server a small share of the statement deadline.
WRITE_POSTINGS_PER_STATEMENT = 20_000
# Most chunks of one posting block (a term's postings of one write, migration m009): a block of
# a common word stays a few KB, so reading one chunk's posting from it costs little.
BLOCK_CHUNKS = 64
# Chunks a sync lease gathers from write_files calls before it writes them in one transaction:
# a term's postings of one write form one block, so fewer, larger writes make fewer rows for
# the server to store (a first sync of LoCoMo chunks: about 4.8 blocks a chunk, against 7.3 at
# 500 chunks a write and 21 at the engine's 25 files); larger writes overlap less.
WRITE_CHUNKS = 1000
# Writes of a sync lease in flight at once, each on a connection of its own (the server works
# on one while the client sends the other, and the next is built meanwhile).
WRITES_IN_FLIGHT = 2


@dataclass(frozen=True)
class ChunkRow:
    """One chunk to write.

    Attributes:
        chunk_id: the chunk id (as the SQLite store's ``chunks.id``).
        start_line / end_line: 1-based inclusive lines.
        content_hash: sha256 hex of the chunk text.
        model: the embedding model id (``""`` without one).
        text: the chunk text.
        derived_terms: the FTS ``terms`` column (``fallback.text.terms.derived_terms``).
        embedding: the chunk's vector (one window), or ``None``.
        windows: the chunk's window vectors (``fallback/index/windows.py``; written instead of
            ``embedding`` when given).
    """

    chunk_id: str
    start_line: int
    end_line: int
    content_hash: str
    model: str
    text: str
    derived_terms: str
    embedding: Sequence[float] | None = None
    windows: tuple[Sequence[float], ...] = ()

    @property
    def vectors(self) -> tuple[Sequence[float], ...]:
        """The window vectors written for the chunk (``windows``, else ``embedding`` alone)."""
        return self.windows or ((self.embedding,) if self.embedding else ())


@dataclass(frozen=True)
class FileRows:
    """One file to write with its chunks (:meth:`SyncLease.write_files`).

    Attributes:
        path: workspace-relative path.
        source: ``memory`` or ``sessions``.
        content_hash: sha256 hex of the file.
        mtime_ms: modification time, epoch ms.
        size: bytes.
        title: the file's FTS ``title`` column (``fallback.store.fts_rows.note_title``).
        chunks: its chunks.
        text: the file's text as the sync read it (kept for a memory file, which agents it is
            shared with read by ``memory_get``), or ``None``.
    """

    path: str
    source: str
    content_hash: str
    mtime_ms: int
    size: int
    title: str
    chunks: tuple[ChunkRow, ...] = ()
    text: str | None = None


@dataclass(frozen=True)
class ScopeStats:
    """The published index of one agent + workspace.

    Attributes:
        generation: the published generation (0: nothing published yet).
        chunk_count: chunks in it (FTS5's ``N``).
        token_count: tokens of all chunks in all indexed columns.
        last_sync_at_ms: epoch ms of the last publish, or ``None``.
        trigram_chunk_count: chunks with CJK text (the trigram index's ``N``).
        trigram_token_count: trigrams of those chunks.
    """

    generation: int
    chunk_count: int
    token_count: int
    last_sync_at_ms: int | None
    trigram_chunk_count: int = 0
    trigram_token_count: int = 0


def _visible(alias: str) -> str:
    return f"{alias}.gen_from <= %(gen)s AND ({alias}.gen_to IS NULL OR {alias}.gen_to > %(gen)s)"


def _vector_text(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


class PostgresStore:
    """One agent's workspace in a shared PostgreSQL database.

    Args:
        target: where to connect (``target.resolve_target``).
        agent_id: the agent whose rows this store reads and writes.
        workspace: the workspace key (e.g. its absolute path).
        connect_timeout_ms: deadline of a connection attempt and of waiting for a pooled one.
        statement_timeout_ms: deadline of one statement (``statement_timeout``).
        pool_size: most connections kept open.
        run_migrations: migrate the schema on open (the schema owner's job; an agent role with
            only row privileges passes ``False``).

    Raises:
        PostgresUnavailableError: the server cannot be reached, refuses the login, lacks
            pgvector, or the schema cannot be created.
    """

    def __init__(self, target: PgTarget, *, agent_id: str, workspace: str,
                 connect_timeout_ms: int = 5000, statement_timeout_ms: int = 10000,
                 pool_size: int = 4, run_migrations: bool = True) -> None:
        self.target = target
        self.agent_id = agent_id
        self.workspace = workspace
        self.connect_timeout_ms = connect_timeout_ms
        self.statement_timeout_ms = statement_timeout_ms
        self.busy_reason: str | None = None
        self._view_of: PostgresStore | None = None  # the store whose connections a view uses
        # window_search's windows: {chunk_rowid: (id, model, source, dims, unit rows) or None}
        # of the published generation _windows_gen; None above MATRIX_MAX_BYTES.
        self._windows: dict[int, tuple[str, str, str, int, Any] | None] | None = {}
        self._windows_gen = -1
        self._matrices: dict[tuple[str, tuple[str, ...], int], Any] = {}
        self._windows_lock = threading.Lock()
        self._tokenizer = Fts5Tokenizer(MAIN)
        self._trigrams = Fts5Tokenizer(TRIGRAM)
        self._s = f'"{target.schema}"'
        with self._errors("connect"):
            first = self._connect()
        try:
            if run_migrations:
                with self._errors("migrate the schema"):
                    migrate(first, target.schema)
        finally:
            first.close()
        from fallback.store.postgres.pool import FailFastPool

        self._pool = FailFastPool(
            target.conninfo, min_size=1, max_size=pool_size, open=False,
            kwargs=self._connect_kwargs(), configure=self._configure,
            check=FailFastPool.check_connection, timeout=connect_timeout_ms / 1000,
            # the pool's own reconnect attempts back off (1, 2, 4 ... s); past this it stops
            # them and the next call connects at once: a server back after a long outage
            # answers within a few seconds, not after the backoff's next step
            reconnect_timeout=max(1.0, connect_timeout_ms / 1000), name="qmdbridge-postgres")
        with self._errors("connect"):
            self._pool.open(wait=True, timeout=connect_timeout_ms / 1000)

    # -- connections ---------------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        # libpq's connect_timeout is in whole seconds (and below 2 it counts as 2).
        # A server that stops answering on an open TCP connection (a network partition, a
        # black-holed host) would leave a call waiting for the kernel's retransmissions (about
        # 15 minutes): what was sent and not acknowledged within connectTimeoutMs +
        # statementTimeoutMs ends the connection (tcp_user_timeout; keepalive probes count
        # while a call waits for an answer). A slow statement is acknowledged, and a server
        # too busy to read a COPY (a full receive window) for that long would have cancelled
        # the statement itself. (Unix sockets ignore these.)
        # prepare_threshold None: no server-side prepared statements, whose generic plans do
        # not see which agent or terms a query names.
        seconds = max(2, math.ceil(self.connect_timeout_ms / 1000))
        return {"connect_timeout": seconds, "keepalives": 1, "keepalives_idle": seconds,
                "keepalives_interval": 1, "keepalives_count": 3,
                "tcp_user_timeout": seconds * 1000 + int(self.statement_timeout_ms),
                "application_name": f"qmdbridge:{self.agent_id}", "prepare_threshold": None}

    def _configure(self, conn: Any) -> None:
        conn.autocommit = True
        # jit off: a search's estimated cost over a large database can pass jit_above_cost, and
        # compiling then takes longer than the query.
        conn.execute(f"SET statement_timeout = {int(self.statement_timeout_ms)}; SET jit = off")

    def _connect(self) -> Any:
        import psycopg

        conn = psycopg.connect(self.target.conninfo, **self._connect_kwargs())
        self._configure(conn)
        return conn

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        import psycopg
        from psycopg_pool import PoolTimeout

        try:
            yield
        except (psycopg.Error, PoolTimeout) as exc:
            # the deadline that ran out: connecting (and the pool's wait) or the statement
            waited = isinstance(exc, PoolTimeout) or doing == "connect"
            # Not chained: libpq's own text may hold the DSN; the translation is redacted.
            raise translate(exc, self.target, doing=doing, timeout_ms=self.connect_timeout_ms
                            if waited else self.statement_timeout_ms) from None

    @contextlib.contextmanager
    def _snapshot(self, doing: str, sql: str | None = None, args: Any = None) -> Iterator[Any]:
        """A cursor in a read-only REPEATABLE READ transaction (one consistent snapshot).

        ``sql`` (with ``args``), when given, is the snapshot's first statement: it goes out
        with the ``BEGIN`` in one message (one round trip) and the cursor holds its rows.
        :meth:`_last_rows` ends the snapshot with its last statement; else it ends with a
        ``ROLLBACK`` of its own. The cursor binds arguments client-side (``ClientCursor``:
        statements joined in one message take no server-side parameters).
        """
        from psycopg import ClientCursor
        from psycopg.pq import TransactionStatus

        with self._errors(doing), self._pool.connection() as conn:
            try:
                with ClientCursor(conn) as cur:
                    if sql is None:
                        cur.execute(_BEGIN_SNAPSHOT)
                    else:
                        cur.execute(f"{_BEGIN_SNAPSHOT}; {sql}", args)
                        cur.nextset()
                    yield cur
            finally:
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    conn.execute("ROLLBACK")

    @staticmethod
    def _last_rows(cur: Any, sql: str, args: Any) -> list[Any]:
        """The rows of a snapshot's last statement, sent with its ``ROLLBACK`` in one message."""
        cur.execute(f"{sql}; ROLLBACK", args)
        return cur.fetchall()

    # -- setup (schema owner) --------------------------------------------------------------------

    def register_agent(self, agent_id: str, *, role_name: str | None = None,
                       share_with: Sequence[str] = ()) -> None:
        """Record which role acts for ``agent_id`` (``None`` keeps the recorded one) and which
        agents may read its rows (``memorySearch.store.shareWith`` is ``share_with``). Writes
        nothing when both are recorded already, so an agent's own role, which may only read
        these tables, opens a store the schema owner set up.

        Raises:
            PostgresUnavailableError: this role may not write ``agents`` and ``shares`` and
                something differs from what is recorded (the message says what to do), or the
                server cannot be used.
            PostgresStoreError: on another database failure.
        """
        s = self._s
        with self._errors("register the agent"), self._pool.connection() as conn, conn.transaction():
            readers = [r for (r,) in conn.execute(
                f"SELECT reader_agent FROM {s}.shares WHERE owner_agent = %s ORDER BY reader_agent",
                (agent_id,)).fetchall()]
            roles = conn.execute(f"SELECT role_name FROM {s}.agents WHERE agent_id = %s",
                                 (agent_id,)).fetchall()
            wanted = sorted(set(share_with))
            if roles and role_name in (None, roles[0][0]) and readers == wanted:
                return
            if not conn.execute("SELECT has_table_privilege(%s, 'INSERT') AND has_table_privilege("
                                "%s, 'UPDATE') AND has_table_privilege(%s, 'INSERT') AND"
                                " has_table_privilege(%s, 'DELETE')",
                                (f"{s}.agents", f"{s}.agents", f"{s}.shares", f"{s}.shares"),
                                ).fetchone()[0]:
                raise PostgresUnavailableError(
                    self.target.describe(),
                    f"the role of agent {agent_id} may not change who reads its rows: "
                    f"store.shareWith {wanted} differs from the recorded {readers}",
                    f"leave store.shareWith out (the recorded readers stay) or set it to "
                    f"{readers}, or have the schema owner record it: register_agent("
                    f"{agent_id!r}, share_with={wanted}) (docs/postgres.md, Row-level security)")
            conn.execute(f"INSERT INTO {s}.agents (agent_id, role_name) VALUES (%s, %s)"
                         " ON CONFLICT (agent_id) DO UPDATE SET"
                         f" role_name = coalesce(EXCLUDED.role_name, {s}.agents.role_name)",
                         (agent_id, role_name))
            conn.execute(f"DELETE FROM {s}.shares WHERE owner_agent = %s", (agent_id,))
            for reader in dict.fromkeys(share_with):
                conn.execute(f"INSERT INTO {s}.shares (owner_agent, reader_agent) VALUES (%s, %s)",
                             (agent_id, reader))

    def grant_role(self, role_name: str) -> None:
        """Grant an agent's role what it needs: its rows (row-level security limits them) and
        the shared embedding cache; the schema owner runs this.

        Raises:
            PostgresUnavailableError / PostgresStoreError: on a database failure.
        """
        from psycopg import sql

        s, role = self._s, sql.Identifier(role_name).as_string(None)
        with self._errors("grant the agent's role"), self._pool.connection() as conn, conn.transaction():
            conn.execute(f"GRANT USAGE ON SCHEMA {s} TO {role}")
            conn.execute(f"GRANT SELECT ON {s}.agents, {s}.shares, {s}.schema_migrations TO {role}")
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.workspaces, {s}.files,"
                         f" {s}.chunks, {s}.posting_blocks, {s}.trigram_postings, {s}.term_stats, {s}.chunk_vectors"
                         f" TO {role}")
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.embedding_cache TO {role}")

    # -- reads (the store seam) -------------------------------------------------------------------

    def stats(self) -> ScopeStats:
        """The published index's generation and BM25 statistics.

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        rows = self._rows("read the index statistics", *self._stats_sql())  # one statement: one snapshot
        return _scope_stats(rows[0] if rows else None)

    def _stats_sql(self) -> tuple[str, tuple[str, str]]:
        """The statement (and its arguments) :meth:`_stats` reads the scope's statistics from."""
        return (f"SELECT published_generation, chunk_count, token_count,"
                " (extract(epoch FROM last_sync_at) * 1000)::bigint, trigram_chunk_count,"
                f" trigram_token_count FROM {self._s}.workspaces"
                " WHERE agent_id = %s AND workspace = %s", (self.agent_id, self.workspace))

    @staticmethod
    def _stats(cur: Any) -> ScopeStats:
        """The scope's statistics from ``cur``, which holds the rows of :meth:`_stats_sql` (a
        snapshot's first statement)."""
        return _scope_stats(cur.fetchone())

    def shared_scopes(self) -> list[tuple[str, str]]:
        """``(owner agent, workspace)`` of every other agent that shares its rows with this
        one (``shares.reader_agent``) and has published an index, by owner: of an owner with
        several workspaces, the one it published last (ties by workspace).

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        s = self._s
        return [(str(a), str(w)) for a, w in self._rows(
            "read the shared scopes",
            f"SELECT DISTINCT ON (w.agent_id) w.agent_id, w.workspace FROM {s}.shares sh"
            f" JOIN {s}.workspaces w ON w.agent_id = sh.owner_agent WHERE sh.reader_agent = %s"
            " AND w.agent_id <> %s AND w.published_generation > 0"
            " ORDER BY w.agent_id, w.last_sync_at DESC NULLS LAST, w.workspace",
            (self.agent_id, self.agent_id))]

    def _rows(self, doing: str, sql: str, args: Sequence[Any]) -> list[Any]:
        """The rows of one read statement on a pooled connection (its own snapshot)."""
        with self._errors(doing), self._pool.connection() as conn:
            return conn.execute(sql, args).fetchall()

    def view(self, agent_id: str, workspace: str) -> PostgresStore:
        """The scope ``agent_id`` + ``workspace`` read over this store's connections: every
        read of this class, no sync (:meth:`sync_lease` refuses), :meth:`close` closes nothing."""
        view = copy.copy(self)
        view.agent_id, view.workspace, view._view_of = agent_id, workspace, self
        view._windows, view._windows_gen, view._matrices = {}, -1, {}
        view._windows_lock = threading.Lock()
        return view

    def file_text(self, path: str) -> str | None:
        """The text of the published memory file ``path`` as its sync read it, or ``None``:
        no such file, or one written before the store kept texts (its next sync keeps it).

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        s = self._s
        rows = self._rows(
            "read a file",
            f"SELECT f.text FROM {s}.files f JOIN {s}.workspaces w ON w.agent_id = f.agent_id"
            " AND w.workspace = f.workspace WHERE f.agent_id = %s AND f.workspace = %s"
            " AND f.path = %s AND f.source = 'memory' AND f.gen_from <= w.published_generation"
            " AND (f.gen_to IS NULL OR f.gen_to > w.published_generation)",
            (self.agent_id, self.workspace, path))
        return rows[0][0] if rows else None

    def keyword_rows(self, match: str | None, *, sources: Sequence[str], limit: int,
                     trigram_match: str | None = None, like_patterns: Sequence[str] = (),
                     weights: Sequence[float] = COLUMN_WEIGHTS) -> list[KeywordRow]:
        """Keyword rows of the published index, best first, as the SQLite store's
        ``keyword_rows`` gives them for the same plan (``fallback/search/fts.py``).

        Args:
            match: the plan's ``MATCH`` expression for the main index (``FtsPlan.match``), or
                ``None``.
            sources: sources searched (``memory``, ``sessions``).
            limit: most rows returned.
            trigram_match: the plan's ``MATCH`` for the CJK trigram index
                (``FtsPlan.trigram_match``), or ``None``; rows must match it too.
            like_patterns: escaped ``%tok%`` patterns every row's text must match
                (``FtsPlan.like_patterns``, ``LIKE ... ESCAPE '\\'``).
            weights: bm25 weight of the text, title and terms columns.

        Returns:
            :data:`KeywordRow` tuples ordered by rank, then path, then start line. The rank is
            FTS5's: ``-bm25`` of ``match`` over the whole index (every source counts for IDF),
            else ``-bm25`` of ``trigram_match`` over the chunks with CJK text, else ``0.0``.

        Raises:
            ValueError: an expression outside ``fallback/search/fts.py``'s grammar.
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        if limit <= 0 or not sources:
            return []
        main = parse_match(match, self._tokenizer.phrase_tokens) if match else None
        tri = parse_match(trigram_match, self._trigrams.phrase_tokens) if trigram_match else None
        if (main is not None and tri is None and not like_patterns and min(weights) >= 0
                and all(c is None for c in main.columns)):
            return self._top_rows(main, sources=sources, limit=limit, weights=weights)
        s = self._s
        with self._snapshot("keyword search", *self._stats_sql()) as cur:
            st = self._stats(cur)
            args = {"agent": self.agent_id, "ws": self.workspace, "gen": st.generation,
                    "sources": list(sources), "limit": limit, "likes": list(like_patterns)}
            like_sql = " AND c.text LIKE ALL(%(likes)s)" if like_patterns else ""
            if main is None and tri is None:
                if not like_patterns:
                    return []
                return [_keyword_row(r) for r in self._last_rows(
                    cur, f"SELECT c.id, c.path, c.source, c.start_line, c.end_line, c.text, 0.0"
                    f" FROM {s}.chunks c WHERE c.agent_id = %(agent)s AND c.workspace = %(ws)s"
                    f" AND {_visible('c')} AND c.source = ANY(%(sources)s){like_sql}"
                    " ORDER BY c.path, c.start_line LIMIT %(limit)s", args)]
            ranks: dict[int, float] | None = None
            order: dict[int, tuple[str, str, int]] = {}
            for query, table, length, n_rows, n_tokens, col_weights in (
                    (main, "posting_blocks", "doc_len", st.chunk_count, st.token_count, weights),
                    (tri, "trigram_postings", "trigram_len", st.trigram_chunk_count,
                     st.trigram_token_count, (1.0,))):
                if query is None:
                    continue
                rows, doc_len = self._postings(cur, table, length, query.tokens, args, order)
                found = rank_rows(query, rows, doc_len, row_count=n_rows, token_count=n_tokens,
                                  weights=col_weights)
                ranks = found if ranks is None else {r: v for r, v in ranks.items() if r in found}
            assert ranks is not None
            allowed = set(sources)
            ranked = sorted((r for r in ranks if order[r][0] in allowed),
                            key=lambda r: row_order(ranks[r], *order[r][1:]))
            picked = ranked if like_patterns else ranked[:limit]
            if not picked:
                return []
            args["ids"] = picked
            text_of = {r[0]: r[1:] for r in self._last_rows(
                cur, f"SELECT c.chunk_rowid, c.id, c.path, c.source, c.start_line, c.end_line,"
                f" c.text FROM {s}.chunks c WHERE c.chunk_rowid = ANY(%(ids)s){like_sql}", args)}
        out = [(*text_of[r], ranks[r]) for r in picked if r in text_of][:limit]
        return [_keyword_row(r) for r in out]

    def _top_rows(self, query: MatchQuery, *, sources: Sequence[str], limit: int,
                  weights: Sequence[float]) -> list[KeywordRow]:
        """:meth:`keyword_rows` of an expression without column filters, reading the postings
        of the rare terms only (MaxScore over an upper bound of ``bm25()``).

        The statistics come first (one snapshot for the whole search): the published
        generation and, per query term, ``term_stats``' chunk count (its IDF) and bounds of
        its postings, so each phrase has a bound: ``IDF * F * (k1 + 1) / (F + norm)`` with the
        most column-weighted hits ``F`` and the shortest chunk of any posting of its (first)
        term. A phrase of several tokens counts its chunks (its IDF's ``n``) from the postings
        of the chunks holding its tokens (one statement); its hits in a chunk are at most its
        first token's, so its bound is that token's with the phrase's IDF.
        Terms whose phrases' bounds sum below the score to beat (the *non-essential* terms,
        the common ones) are not scanned: a chunk holding no other term cannot reach the top.
        The score to beat is first half the largest phrase bound or, when the terms that
        leaves essential hold :data:`PROBE_POSTINGS` postings or more, the ``limit``-th best
        share of the rarest term whose phrases count wherever it stands, if higher.
        One statement ranks the chunks of ``sources`` holding an essential term by an upper
        bound: each phrase of an essential term adds ``IDF * f * (k1 + 1) / (f + norm)`` with
        its chunk's own ``f`` and length, each phrase of a non-essential term the same with its
        term's most hits ``F`` (at the chunk's own length), when
        the chunk holds the essential tokens the phrase needs (``bm25.required_tokens``:
        ``NEAR`` and ``AND`` only drop instances). The first ``K`` chunks by bound are ranked
        exactly (``bm25.rank_rows``) in bound order. The statement returns the postings of every
        term of the candidates the ranking can need (the non-essential terms' read by key for
        them alone): a chunk's *lower* bound sums the exact contributions of its phrases that
        count wherever their essential term stands (no ``NEAR`` or ``AND`` above them), so the
        ``limit``-th exact score is at least the ``limit``-th lower bound, and the ranking ends
        before the candidates whose bound is below it; the window is the others, in whole steps of
        :data:`RANK_STEP`: when the ranking gets past it, only chunks holding non-essential terms
        alone can still beat the answer. The texts are read for the answer's chunks only. The answer stands when the ``limit``-th exact
        score is above (by a relative :data:`BOUND_MARGIN`) both the bound of chunk ``K + 1``
        and the bound of a chunk holding non-essential terms only; else terms become essential,
        or ``K`` grows, and the statement runs again, up to every chunk of every term. A round
        with every term essential takes at least every candidate whose bound reaches the
        ``limit``-th exact score found before (a lower bound of the answer's), so chunks tied
        at the answer's score (copies of a note) are ranked in one more round.
        """
        terms = list(query.tokens)
        slot = {t: i + 1 for i, t in enumerate(terms)}
        s = self._s
        with self._snapshot(
                "keyword search", f"SELECT w.published_generation, w.chunk_count, w.token_count,"
                f" t.k, ts.df, ts.max_tf, ts.min_dl FROM {s}.workspaces w CROSS JOIN"
                " unnest(%(terms)s::text[]) WITH ORDINALITY AS t(term, k)"
                f" LEFT JOIN {s}.term_stats ts ON ts.agent_id = w.agent_id"
                " AND ts.workspace = w.workspace AND ts.term = t.term"
                " WHERE w.agent_id = %(agent)s AND w.workspace = %(ws)s",
                {"agent": self.agent_id, "ws": self.workspace, "terms": terms}) as cur:
            found = cur.fetchall()
            if not found:
                return []
            gen, n_chunks, n_tokens = int(found[0][0]), int(found[0][1]), int(found[0][2])
            avgdl = n_tokens / max(n_chunks, 1) if n_tokens else 1.0
            df = dict.fromkeys(terms, 0)
            idfs: dict[str, float] = {}
            top_f: dict[str, float] = {}  # a term's most column-weighted hits in one chunk
            shortest: dict[str, float] = {}  # the bm25 norm of a term's shortest chunk
            for _, _, _, k, n, max_tf, min_dl in found:
                t = terms[k - 1]
                if n is None or n <= 0:
                    continue
                df[t], idfs[t] = int(n), idf(n_chunks, int(n))
                top_f[t] = sum(w * h for w, h in zip(weights, max_tf, strict=False))
                shortest[t] = BM25_K1 * (1 - BM25_B + BM25_B * min_dl / avgdl)
            # A phrase of several tokens: the chunks holding it (its IDF's n) counted from its
            # tokens' postings; its hits in a chunk are at most its first token's.
            holding = dict(df)
            several = [p for p in query.phrases if len(p) > 1 and all(t in idfs for t in p)]
            if several:
                # The positions of the chunks holding enough of the phrases' tokens only.
                cur.execute(
                    "WITH t(term) AS (SELECT unnest(%(terms)s::text[])),"
                    " blk AS MATERIALIZED (SELECT k.term, k.chunk_rowid AS kb, k.rowids,"
                    " array_cat(k.ends, '{}') AS ends, array_cat(k.positions, '{}') AS positions"
                    f" FROM t JOIN {s}.posting_blocks k ON k.agent_id = %(agent)s"
                    " AND k.workspace = %(ws)s AND k.term = t.term WHERE k.gen_from <= %(g)s),"
                    f" p AS MATERIALIZED (SELECT u.r, blk.term, blk.kb, u.i FROM blk"
                    f" {_unnest_block('blk', 'u', ('rowids', 'r'))}),"
                    " hold AS (SELECT r FROM p GROUP BY r HAVING count(*) >= %(need)s)"
                    f" SELECT p.r, p.term, {_block_positions('blk', 'p.i')} FROM p JOIN hold ON hold.r = p.r"
                    " JOIN blk ON blk.term = p.term AND blk.kb = p.kb",
                    {"agent": self.agent_id, "ws": self.workspace, "g": gen,
                     "terms": list(dict.fromkeys(t for p in several for t in p)),
                     "need": min(len(set(p)) for p in several)})
                rows: dict[int, dict[str, list[int]]] = {}
                for r, t, positions in cur.fetchall():
                    rows.setdefault(r, {})[t] = positions
                holding.update((" ".join(p), sum(1 for r in rows.values() if phrase_instances(p, r)))
                               for p in several)
            phrase_rows = [holding.get(" ".join(p), 0) if p else 0 for p in query.phrases]
            # Phrases that can count somewhere: (its first term, the tokens it needs, its IDF,
            # its bound: its first term's most hits in that term's shortest chunk).
            live = [(p[0], needed, idf(n_chunks, n), idf(n_chunks, n) * top_f[p[0]] * (BM25_K1 + 1)
                     / (top_f[p[0]] + shortest[p[0]]) if top_f[p[0]] > 0 else 0.0)
                    for p, needed, n in zip(query.phrases, required_tokens(query), phrase_rows, strict=True)
                    if p and n > 0 and all(t in idfs for t in needed)]
            if not live:
                return []

            def free_bound(common: set[str]) -> float:
                """The bound of a chunk holding only ``common`` terms."""
                return sum(most for _, needed, _, most in live if needed <= common)

            def common_terms(beat: float) -> set[str]:
                """The most common terms whose phrases' bounds sum below ``beat``."""
                weight = {t: sum(most for h, _, _, most in live if h == t) for t in idfs}
                common: set[str] = set()
                for t in sorted(idfs, key=lambda t: (weight[t], t)):
                    if len(common) + 1 >= len(idfs) or free_bound(common | {t}) * (1 + BOUND_MARGIN) >= beat:
                        break
                    common.add(t)
                return common

            # The score to beat, first: half the largest phrase bound, or, when higher and the
            # words it leaves essential hold PROBE_POSTINGS postings or more, the limit-th best
            # share of the rarest word whose phrases count wherever it stands (a lower bound
            # of the answer's limit-th score, from that word's postings alone).
            guess = max(most for *_, most in live) / 2
            alone = [(df[h], h) for h, needed, *_ in live if needed == {h}]
            if (alone and min(alone)[0] >= limit
                    and sum(df[t] for t in idfs if t not in common_terms(guess)) >= PROBE_POSTINGS):
                rare = min(alone)[1]
                factor = sum(phrase_idf for h, needed, phrase_idf, _ in live if h == rare and needed == {h})
                wf = " + ".join(f"u.h{i} * {float(w)!r}::float8" for i, w in enumerate(weights))
                cur.execute(
                    f"SELECT {factor * (BM25_K1 + 1)!r} * wf / (wf + {BM25_K1!r} * ({1 - BM25_B!r}"
                    f" + {BM25_B!r} * dl / {avgdl!r})) AS share FROM (SELECT u.dl::float8 AS dl,"
                    f" {wf} AS wf FROM {s}.posting_blocks k {_unnest_block('k', 'u', ('lens', 'dl'), *((c, f'h{i}') for i, c in enumerate(TF_COLUMNS)))}"
                    " WHERE k.agent_id = %(agent)s AND k.workspace = %(ws)s AND k.term = %(term)s"
                    " AND k.gen_from <= %(g)s AND k.source = ANY(%(sources)s)) u"
                    " ORDER BY share DESC OFFSET %(limit)s - 1 LIMIT 1",
                    {"agent": self.agent_id, "ws": self.workspace, "term": rare, "g": gen,
                     "sources": list(sources), "limit": limit})
                found_share = cur.fetchone()
                if found_share is not None:
                    guess = max(guess, float(found_share[0]) * (1 - BOUND_MARGIN))
            common = common_terms(guess)
            want = limit * CANDIDATES_PER_ROW
            ranks: dict[int, float] = {}  # exact ranks (one snapshot: they hold across rounds)
            best: list[float] = []  # the limit best scores ranked yet, a heap (the worst first)
            by_key: dict[tuple[Any, ...], float | None] = {}
            floor: float | None = None
            info: dict[int, Any] = {}
            args = {"agent": self.agent_id, "ws": self.workspace, "g": gen, "sources": list(sources)}
            while True:
                essential = [t for t in terms if t in idfs and t not in common]
                bound, lower = [], []
                for h, needed, phrase_idf, _ in live:
                    # a common term's bound in the candidate: its most hits at the chunk's length
                    w = f"{top_f[h]!r}::float8" if h in common else f"w{slot[h]}"
                    value = (f"{phrase_idf!r} * {w} * {BM25_K1 + 1!r} / ({w} + {BM25_K1!r}"
                             f" * ({1 - BM25_B!r} + {BM25_B!r} * r.dl / {avgdl!r}))")
                    held = " AND ".join(f"w{slot[t]} IS NOT NULL"
                                        for t in sorted(needed - common, key=slot.__getitem__))
                    bound.append(f"CASE WHEN {held} THEN {value} ELSE 0 END" if held else value)
                    if needed == {h} and h not in common:
                        lower.append(bound[-1])
                cols = ", ".join(f"max(wf) FILTER (WHERE k = {slot[t]}) AS w{slot[t]}" for t in essential)

                # The column-weighted frequency of a posting's term, from its hits per column.
                wf = " + ".join(f"u.h{i} * {float(w)!r}::float8" for i, w in enumerate(weights))
                hits = [f"h{i}" for i in range(len(TF_COLUMNS))]
                # A common term's postings of the window: by key (its block at or below each
                # chunk) or, when it is in fewer than BY_KEY_POSTINGS chunks per window chunk,
                # from all its blocks.
                common_sql = (
                    f" UNION ALL SELECT u.r, n.k, {_block_positions('q', 'u.i')} FROM n JOIN {s}.posting_blocks b"
                    " ON b.agent_id = %(agent)s AND b.workspace = %(ws)s AND b.term = n.term"
                    f" {_unnest_block('b', 'u', ('rowids', 'r'))} JOIN win ON win.r = u.r CROSS JOIN LATERAL"
                    " (SELECT array_cat(b.positions, '{}') AS positions, array_cat(b.ends, '{}') AS ends) q"
                    f" WHERE b.gen_from <= %(g)s AND n.df < {BY_KEY_POSTINGS} * (SELECT count(*) FROM win)"
                    f" UNION ALL SELECT win.r, n.k, {_block_positions('q', 'q.i')} FROM win CROSS JOIN n CROSS JOIN"
                    " LATERAL (SELECT array_cat(b.positions, '{}') AS positions,"
                    " array_cat(b.ends, '{}') AS ends, array_position(b.rowids, win.r) AS i"
                    f" FROM {s}.posting_blocks b WHERE b.agent_id = %(agent)s"
                    " AND b.workspace = %(ws)s AND b.term = n.term AND b.chunk_rowid <= win.r"
                    " ORDER BY b.chunk_rowid DESC LIMIT 1) q"
                    f" WHERE q.i IS NOT NULL AND n.df >= {BY_KEY_POSTINGS} * (SELECT count(*) FROM win)")
                sql = (
                    "WITH t(term, k) AS (SELECT * FROM unnest(%(ess)s::text[], %(ess_k)s::int[])),"
                    + (" n AS (SELECT * FROM unnest(%(common)s::text[], %(common_k)s::int[],"
                       " %(common_df)s::int[]) AS n(term, k, df))," if common else "") +
                    # The essential terms' blocks, each read once; the positions are sliced
                    # for the window's chunks alone.
                    " blk AS MATERIALIZED (SELECT t.k, k.chunk_rowid AS kb, k.rowids, k.lens,"
                    f" {', '.join(f'k.{c}' for c in TF_COLUMNS)}, array_cat(k.ends, '{{}}') AS ends,"
                    " array_cat(k.positions, '{}') AS positions"
                    f" FROM t JOIN {s}.posting_blocks k ON k.agent_id = %(agent)s"
                    " AND k.workspace = %(ws)s AND k.term = t.term"
                    " WHERE k.gen_from <= %(g)s AND k.source = ANY(%(sources)s)),"
                    f" p AS MATERIALIZED (SELECT u.r, blk.k, blk.kb, u.i, u.dl::float8 AS dl, {wf} AS wf"
                    f" FROM blk {_unnest_block('blk', 'u', ('rowids', 'r'), ('lens', 'dl'), *zip(TF_COLUMNS, hits, strict=True))}),"
                    f" r AS (SELECT r, dl, {cols} FROM p GROUP BY r, dl),"
                    f" rb AS (SELECT r.r, r.dl, ({' + '.join(bound)})::float8 AS ub,"
                    f" ({' + '.join(lower) or '0'})::float8 AS lb FROM r),"
                    # The first K candidates by bound; past a first round, at least every one
                    # whose bound reaches the limit-th exact score found then (ties at once).
                    + (" top AS MATERIALIZED (SELECT * FROM rb ORDER BY ub DESC, r LIMIT %(k)s),"
                       if floor is None else
                       " rbm AS MATERIALIZED (SELECT * FROM rb), top AS MATERIALIZED (SELECT * FROM rbm"
                       " ORDER BY ub DESC, r LIMIT (SELECT greatest(%(k)s, ceil(count(*)::float8 / %(step)s) * %(step)s + 1) FROM rbm"
                       f" WHERE ub * {1 + BOUND_MARGIN!r} >= %(floor)s)),") +
                    # The window of candidates the ranking can need, by bound: those whose
                    # bound reaches the limit-th lower bound (whole steps); only theirs are read.
                    " o AS MATERIALIZED (SELECT r, ub, dl, row_number() OVER (ORDER BY ub DESC, r) AS n FROM top),"
                    " win AS MATERIALIZED (SELECT r FROM o WHERE n <= (SELECT least(greatest(%(k)s, (SELECT count(*) FROM top)) - 1,"
                    " ceil(greatest(%(limit)s + 1, count(*))::float8 / %(step)s) * %(step)s) FROM top"
                    f" WHERE ub * {1 + WINDOW_MARGIN!r} >= coalesce((SELECT lb FROM top"
                    " ORDER BY lb DESC OFFSET %(limit)s - 1 LIMIT 1), 0))),"
                    # Every term's postings of the window: the essential ones already read,
                    # the common ones' (below).
                    f" x AS (SELECT p.r, p.k, {_block_positions('blk', 'p.i')} FROM p JOIN win ON win.r = p.r"
                    f" JOIN blk ON blk.k = p.k AND blk.kb = p.kb{common_sql if common else ''})"
                    # Rows of three shapes: a candidate's bound, place and how many there are
                    # (of the window's candidates, the next one and the last one); a window
                    # chunk's path and start line; one posting of a window chunk, its term's
                    # slot and positions (not grouped per chunk).
                    " SELECT o.r, o.ub, o.dl, o.n::int, NULL::text, (SELECT count(*) FROM o)::int"
                    " FROM o WHERE o.n <= (SELECT count(*) FROM win) + 1 OR o.n = (SELECT count(*) FROM o)"
                    " UNION ALL SELECT win.r, NULL, NULL, NULL, c.path, c.start_line FROM win"
                    f" JOIN {s}.chunks c ON c.chunk_rowid = win.r"
                    " UNION ALL SELECT x.r, NULL, NULL, x.k, x.positions::text, NULL FROM x")
                round_args = {**args, "k": want + 1, "ess": _text_array(essential),
                              "ess_k": _int_array(slot[t] for t in essential),
                              "common": _text_array(sorted(common)),
                              "common_k": _int_array(slot[t] for t in sorted(common)),
                              "common_df": _int_array(df[t] for t in sorted(common))}

                # The bounds of the first K + 1 candidates by place, with the postings, path and
                # start line of the window's (the first read_to of them by bound): (rowid,
                # bound, length, {term slot: positions as an array literal}, path, start
                # line); (rowid, bound, length) for the next one and the last one; () for the
                # others (never read).
                cur.execute(sql, {**round_args, "limit": limit, "step": RANK_STEP, "floor": floor})
                tops: list[tuple[int, float, int, int]] = []
                window: dict[int, tuple[str, int]] = {}
                read: dict[int, dict[int, str]] = {}
                candidates = 0
                for r, ub, dl, k, text, number in cur.fetchall():
                    if ub is not None:
                        tops.append((r, ub, dl, k))
                        candidates = number
                    elif k is not None:  # positions as an array literal, parsed when ranked
                        read.setdefault(r, {})[k] = text
                    else:
                        window[r] = (text, number)
                # by place; only the window's, the next one's and the last one's are read
                bounds: list[tuple[Any, ...]] = [()] * candidates
                for r, ub, dl, n in tops:
                    bounds[n - 1] = (r, ub, dl, read.get(r, {}), *window[r]) if r in window else (r, ub, dl)
                want = max(want, len(bounds) - 1)
                read_to = len(window)
                rest = free_bound(common)
                # Rank the candidates in the order of their bounds, a few at a time, until the
                # limit-th exact score is above the bound of every chunk not ranked yet.
                for first in range(0, min(want, len(bounds)) + 1, RANK_STEP):
                    if first >= read_to and read_to < min(want, len(bounds)):
                        # Past the window: only the chunks holding common terms alone may still
                        # beat the answer (the next round's terms decide).
                        break
                    todo = [r for r in bounds[first:min(first + RANK_STEP, want)] if r[0] not in ranks]
                    # Chunks with the same length and the same postings of the query's terms
                    # (a note copied, repeated boilerplate) have the same rank: ranked once.
                    keys = {r[0]: (r[2], *sorted(r[3].items())) for r in todo}
                    fresh = {keys[r[0]]: r for r in todo if keys[r[0]] not in by_key}
                    found_ranks = rank_rows(
                        query, {r[0]: {terms[k - 1]: [int(x) for x in pos[1:-1].split(",")]
                                       for k, pos in r[3].items()} for r in fresh.values()},
                        {r[0]: int(r[2]) for r in fresh.values()}, row_count=n_chunks,
                        token_count=n_tokens, weights=weights,
                        phrase_rows=phrase_rows)
                    by_key.update((key, found_ranks.get(r[0])) for key, r in fresh.items())
                    for r in todo:
                        rank = by_key[keys[r[0]]]
                        if rank is not None:  # None: the row does not match
                            ranks[r[0]] = rank
                            (heapq.heappush if len(best) < limit else heapq.heappushpop)(best, -rank)
                    info.update((r[0], r) for r in todo)
                    beat = best[0] if len(best) == limit else None
                    upto = min(first + RANK_STEP, want)
                    outside = max(rest, float(bounds[upto][1]) if len(bounds) > upto else 0.0)
                    if outside == 0 or (beat is not None and beat > outside * (1 + BOUND_MARGIN)):
                        picked = heapq.nsmallest(limit, ranks, key=lambda r: row_order(ranks[r], info[r][4], info[r][5]))
                        # The texts of the answer only (not of every candidate).
                        text_of = {row[0]: row[1:] for row in self._last_rows(
                            cur, f"SELECT chunk_rowid, id, path, source, start_line, end_line, text"
                            f" FROM {s}.chunks WHERE chunk_rowid = ANY(%s)", (picked,))}
                        return [_keyword_row((*text_of[r], ranks[r])) for r in picked]
                next_bound = float(bounds[want][1]) if len(bounds) > want else 0.0
                if common and (beat is None or rest * (1 + BOUND_MARGIN) >= beat):
                    common = common_terms(beat or 0.0)
                elif len(bounds) > want and (beat is None or next_bound * (1 + BOUND_MARGIN) >= beat):
                    if common:  # the common terms' bounds loosen every candidate's: read them
                        common = set()
                    elif beat is None or (floor is not None and floor >= beat):
                        want *= CANDIDATE_GROWTH
                # With every term read, the next round takes at least every candidate whose
                # bound reaches the limit-th exact score found so far (a lower bound of the
                # answer's): ties, as copies of a note make them, in one more round.
                floor = beat if not common else None

    def part_counts(self, exprs: Sequence[str]) -> tuple[int, list[int]]:
        """The published chunk count and, per ``MATCH`` expression, how many chunks it matches
        (what ``fallback/search/keyword.py``'s ``search_plan`` counts on the SQLite store to
        find a plan's common parts).

        Args:
            exprs: ``MATCH`` expressions of single parts (``FtsPlan.parts`` expressions).

        Returns:
            ``(chunks, [matching chunks per expression])``, over every source.

        Raises:
            ValueError: an expression outside ``fallback/search/fts.py``'s grammar.
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        queries = [parse_match(e, self._tokenizer.phrase_tokens) for e in exprs]
        # A part of one word: its chunk count is the word's df (term_stats), no posting read.
        words = {i: q.phrases[0][0] for i, q in enumerate(queries) if q.root.kind == "phrase"
                 and len(q.phrases[0]) == 1 and q.columns[0] is None}
        tokens = list(dict.fromkeys(t for i, q in enumerate(queries) if i not in words for t in q.tokens))
        with self._snapshot("count keyword parts", *self._stats_sql()) as cur:
            st = self._stats(cur)
            df_read = (f"SELECT term, df FROM {self._s}.term_stats WHERE agent_id = %s AND workspace = %s"
                       " AND term = ANY(%s)", (self.agent_id, self.workspace, list(set(words.values()))))
            # the last statement when no posting is read: it goes with the ROLLBACK
            df = dict(cur.execute(*df_read).fetchall() if tokens else self._last_rows(cur, *df_read))
            rows: dict[int, dict[str, list[int]]] = {}
            if tokens:
                rows, _ = self._postings(cur, "posting_blocks", "doc_len", tokens,
                                         {"agent": self.agent_id, "ws": self.workspace,
                                          "gen": st.generation}, {})
        return st.chunk_count, [int(df.get(words[i], 0)) if i in words else count_matches(q, rows)
                                for i, q in enumerate(queries)]

    def _postings(self, cur: Any, table: str, length: str, tokens: Sequence[str],
                  args: dict[str, Any], order: dict[int, tuple[str, str, int]]
                  ) -> tuple[dict[int, dict[str, list[int]]], dict[int, int]]:
        """Postings of ``tokens`` in the published chunks: ``({rowid: {term: positions}},
        {rowid: doc length})``; ``order`` gets ``(source, path, start_line)`` per row."""
        s = self._s
        if table == "posting_blocks":
            found = (f"SELECT u.r AS chunk_rowid, k.term, {_block_positions('b', 'u.i')} AS positions"
                     f" FROM {s}.posting_blocks k {_read_block('k', 'b')}"
                     f" {_unnest_block('k', 'u', ('rowids', 'r'))} WHERE k.agent_id = %(agent)s"
                     " AND k.workspace = %(ws)s AND k.term = ANY(%(terms)s) AND k.gen_from <= %(gen)s")
        else:
            found = (f"SELECT chunk_rowid, term, positions FROM {s}.{table} WHERE agent_id = %(agent)s"
                     " AND workspace = %(ws)s AND term = ANY(%(terms)s)")
        cur.execute(f"SELECT p.chunk_rowid, p.term, p.positions, c.{length}, c.source, c.path,"
                    f" c.start_line FROM ({found}) p JOIN {s}.chunks c"
                    f" ON c.chunk_rowid = p.chunk_rowid WHERE {_visible('c')}",
                    {**args, "terms": list(tokens)})
        rows: dict[int, dict[str, list[int]]] = {}
        doc_len: dict[int, int] = {}
        for rowid, term, positions, n, source, path, start in cur.fetchall():
            rows.setdefault(rowid, {})[term] = positions
            doc_len[rowid] = n
            order[rowid] = (source, path, start)
        return rows, doc_len

    def chunk_rows(self, chunk_ids: Sequence[str]) -> list[KeywordRow]:
        """The published chunks with these ids (rank ``0.0``), in the order of ``chunk_ids``.

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        if not chunk_ids:
            return []
        with self._snapshot("read chunks", *self._stats_sql()) as cur:
            st = self._stats(cur)
            by_id = {r[0]: r for r in self._last_rows(
                cur, f"SELECT c.id, c.path, c.source, c.start_line, c.end_line, c.text, 0.0"
                f" FROM {self._s}.chunks c WHERE c.agent_id = %(agent)s"
                f" AND c.workspace = %(ws)s AND c.id = ANY(%(ids)s) AND {_visible('c')}",
                {"agent": self.agent_id, "ws": self.workspace, "gen": st.generation,
                 "ids": list(chunk_ids)})}
        return [_keyword_row(by_id[c]) for c in dict.fromkeys(chunk_ids) if c in by_id]

    def vector_rows(self, vector: Sequence[float], *, sources: Sequence[str],
                    limit: int) -> list[KeywordRow]:
        """The published chunks nearest to ``vector`` by cosine distance, nearest first.

        Args:
            vector: the query embedding (its length selects the chunks of that many dims).
            sources: sources searched.
            limit: most rows returned.

        Returns:
            :data:`KeywordRow` tuples whose last field is the cosine distance (0 = same
            direction, 2 = opposite): every vector of the scope is compared (exact; the store
            keeps no vector index, migration ``m010``).

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        if limit <= 0 or not sources or not vector:
            return []
        d = len(vector)
        dist = f"embedding::vector({d}) <=> %(q)s::vector({d})"
        scope = f"agent_id = %(agent)s AND workspace = %(ws)s AND dims = {d}"
        args = {"q": _vector_text(vector), "agent": self.agent_id, "ws": self.workspace,
                "sources": list(sources), "limit": limit}
        with self._errors("vector search"), self._pool.connection() as conn:
            rows = conn.execute(self._vector_sql(
                f"SELECT chunk_rowid, {dist} AS dist FROM {self._s}.chunk_vectors WHERE {scope}"),
                args).fetchall()
        return [_keyword_row(r) for r in rows]

    def _vector_sql(self, nearest: str) -> str:
        """The vector search over the rows of ``nearest`` (``chunk_rowid``, ``dist``): the
        published chunks of the searched sources among them, nearest first (one statement:
        the published generation is read in it)."""
        return (f"WITH st AS (SELECT published_generation AS g FROM {self._s}.workspaces"
                " WHERE agent_id = %(agent)s AND workspace = %(ws)s),"
                f" v AS MATERIALIZED ({nearest})"
                " SELECT c.id, c.path, c.source, c.start_line, c.end_line, c.text, v.dist"
                f" FROM v JOIN {self._s}.chunks c ON c.chunk_rowid = v.chunk_rowid CROSS JOIN st"
                " WHERE c.gen_from <= st.g AND (c.gen_to IS NULL OR c.gen_to > st.g)"
                " AND c.source = ANY(%(sources)s) ORDER BY v.dist, c.path, c.start_line"
                " LIMIT %(limit)s")

    def window_search(self, vector: Sequence[float], *, model: str, sources: Sequence[str],
                      limit: int) -> tuple[list[tuple[str, float]], float, float, int]:
        """The published chunks whose best window is most similar to ``vector``, with the
        statistics of that similarity over every chunk searched (what the SQLite store's
        ``VectorIndex.search_scored`` answers, for the calibration of the hybrid fusion).

        Only chunks of ``model`` and ``sources`` with windows of ``len(vector)`` dims count. The
        statistics need every chunk's best cosine, so every window of the scope is compared:
        as the SQLite store does, over a matrix of the published windows held in memory (per
        store, rebuilt when the published generation moves, reading only the chunks it does
        not hold yet); above ``MATRIX_MAX_BYTES`` of windows, by one exact SQL statement.

        Args:
            vector: the query embedding (any finite, non-zero norm).
            model: the embedding model whose chunks are searched.
            sources: sources searched.
            limit: most hits returned.

        Returns:
            ``(hits, mean, std, count)``: hits ``[(chunk_id, cosine)]`` (per chunk the largest
            cosine of its windows), descending, ties by chunk id; the mean and population
            standard deviation of that cosine over the ``count`` chunks searched. Nothing
            (``([], 0.0, 0.0, 0)``) for an empty, zero or non-finite ``vector``.

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        import numpy as np

        q = np.asarray(vector, dtype=np.float64)
        norm = float(np.linalg.norm(q)) if len(q) else 0.0
        if limit <= 0 or not sources or not math.isfinite(norm) or norm == 0.0:
            return [], 0.0, 0.0, 0
        key = (model, tuple(sorted(set(sources))), len(q))
        with self._errors("vector search"), self._pool.connection() as conn, self._windows_lock:
            row = conn.execute(f"SELECT published_generation FROM {self._s}.workspaces"
                               " WHERE agent_id = %s AND workspace = %s",
                               (self.agent_id, self.workspace)).fetchone()
            if row is None:
                return [], 0.0, 0.0, 0
            matrix = self._window_matrix(conn, int(row[0]), key)
            if matrix is None:
                return self._window_search_sql(conn, [float(x) / norm for x in vector], key, limit)
        found = VectorIndex._search_matrix(matrix, (q / norm).astype(np.float32), limit=limit)
        return found.hits, found.mean, found.std, found.count

    def _window_matrix(self, conn: Any, gen: int, key: tuple[str, tuple[str, ...], int]) -> Any:
        """The window matrix of ``key`` (model, sources, dims) in generation ``gen``, or
        ``None`` above the memory budget. Chunks are held by rowid (a rowid's chunk never
        changes): a new generation costs the list of its rowids and the windows of the new
        ones."""
        import numpy as np

        if self._windows is not None and self._windows_gen != gen:
            live = {r[0] for r in conn.execute(
                f"SELECT c.chunk_rowid FROM {self._s}.chunks c WHERE c.agent_id = %(agent)s"
                f" AND c.workspace = %(ws)s AND {_visible('c')}",
                {"agent": self.agent_id, "ws": self.workspace, "gen": gen}).fetchall()}
            held = {r: c for r, c in self._windows.items() if r in live}
            new = sorted(live - held.keys())
            for first in range(0, len(new), POSTINGS_PER_STATEMENT):
                part = new[first:first + POSTINGS_PER_STATEMENT]
                held.update(dict.fromkeys(part))
                rows = conn.execute(
                    f"SELECT v.chunk_rowid, c.id, c.model, c.source, v.dims, v.embedding::text"
                    f" FROM {self._s}.chunk_vectors v JOIN {self._s}.chunks c"
                    " ON c.chunk_rowid = v.chunk_rowid WHERE v.chunk_rowid = ANY(%s)"
                    " ORDER BY v.chunk_rowid, v.window_no", (part,)).fetchall()
                for rowid, group in itertools.groupby(rows, key=lambda r: r[0]):
                    windows = list(group)
                    _, chunk_id, chunk_model, source, dims, _ = windows[0]
                    held[rowid] = (str(chunk_id), str(chunk_model), str(source), int(dims), np.stack(
                        [np.fromstring(w[5][1:-1], dtype=np.float32, sep=",") for w in windows]))
            self._windows_gen, self._matrices = gen, {}
            self._windows = held
            if sum(c[4].nbytes for c in held.values() if c is not None) > MATRIX_MAX_BYTES:
                self._windows = None
        if self._windows is None:
            return None
        matrix = self._matrices.get(key)
        if matrix is None:
            model, sources, dims = key
            chosen = sorted((c for c in self._windows.values() if c is not None and c[1] == model
                             and c[2] in sources and c[3] == dims), key=lambda c: c[0])
            sizes = np.fromiter((len(c[4]) for c in chosen), dtype=np.int64, count=len(chosen))
            matrix = self._matrices[key] = _Matrix(
                version=gen, ids=[c[0] for c in chosen],
                windows=(np.ascontiguousarray(np.concatenate([c[4] for c in chosen])) if chosen
                         else np.zeros((0, dims), dtype=np.float32)),
                bounds=np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64))
        return matrix

    def _window_search_sql(self, conn: Any, unit: list[float], key: tuple[str, tuple[str, ...], int],
                           limit: int) -> tuple[list[tuple[str, float]], float, float, int]:
        """:meth:`window_search` by one exact statement over the scope's windows (the unit
        query ``unit``; windows are stored as unit vectors)."""
        model, sources, d = key
        rows = conn.execute(
            f"WITH st AS (SELECT published_generation AS g FROM {self._s}.workspaces"
            " WHERE agent_id = %(agent)s AND workspace = %(ws)s),"
            # the cosine is the inner product with the unit query (pgvector's <#> negates it)
            f" best AS (SELECT c.id, max(-(v.embedding::vector({d}) <#> %(q)s::vector({d})))"
            f" AS sim FROM {self._s}.chunk_vectors v JOIN {self._s}.chunks c"
            " ON c.chunk_rowid = v.chunk_rowid CROSS JOIN st WHERE v.agent_id = %(agent)s"
            f" AND v.workspace = %(ws)s AND v.dims = {d} AND c.model = %(model)s"
            " AND c.source = ANY(%(sources)s) AND c.gen_from <= st.g"
            " AND (c.gen_to IS NULL OR c.gen_to > st.g) GROUP BY c.chunk_rowid, c.id)"
            " SELECT id, sim, avg(sim) OVER (), stddev_pop(sim) OVER (), count(*) OVER ()"
            ' FROM best ORDER BY sim DESC, id COLLATE "C" LIMIT %(limit)s',
            {"q": _vector_text(unit), "agent": self.agent_id, "ws": self.workspace, "model": model,
             "sources": list(sources), "limit": limit}).fetchall()
        if not rows:
            return [], 0.0, 0.0, 0
        return ([(str(r[0]), float(r[1])) for r in rows], float(rows[0][2]), float(rows[0][3]),
                int(rows[0][4]))

    # -- embedding cache (shared by every agent) --------------------------------------------------

    def cached_embeddings(self, content_hashes: Sequence[str], fingerprint: str) -> dict[str, list[float]]:
        """``{content_hash: vector}`` of the hashes the shared cache holds for ``fingerprint``.

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        if not content_hashes:
            return {}
        with self._errors("read the embedding cache"), self._pool.connection() as conn:
            rows = conn.execute(f"SELECT content_hash, embedding::text FROM {self._s}.embedding_cache"
                                " WHERE fingerprint = %s AND content_hash = ANY(%s)",
                                (fingerprint, list(content_hashes))).fetchall()
        return {h: [float(x) for x in v.strip("[]").split(",")] for h, v in rows}

    def cache_embeddings(self, vectors: dict[str, Sequence[float]], fingerprint: str) -> None:
        """Store ``{content_hash: vector}`` in the shared cache (existing entries are kept).

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        if not vectors:
            return
        with self._errors("write the embedding cache"), self._pool.connection() as conn:
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {self._s}.embedding_cache (content_hash, fingerprint,"
                                " dims, embedding) VALUES (%s, %s, %s, %s::vector)"
                                " ON CONFLICT DO NOTHING",
                                [(h, fingerprint, len(v), _vector_text(v)) for h, v in vectors.items()])

    def prune_embedding_cache(self, max_entries: int, *, used: Sequence[str] = (),
                              fingerprint: str = "") -> int:
        """Mark the entries a sync found in the shared cache used now, then delete the cache's
        least recently used entries (``updated_at``, then key) beyond its cap, the rule of the
        SQLite store's cache (``fallback.index.embedding_cache.prune``); one transaction. The
        cap is ``max_entries`` (``cache.maxEntries``, >= 1) for each agent that holds an index
        in the schema: every agent's cache is bounded as its own SQLite file's would be, and
        one agent's sync does not evict the rest of the fleet. Hosts pruning at once take
        turns (an advisory lock), so together they never go below the cap. Returns the
        entries deleted.

        Args:
            max_entries: the cap per agent.
            used: content hashes of ``fingerprint`` whose vectors the sync took from the cache
                (their ``updated_at`` becomes now, in one statement).
            fingerprint: the provider's cache key (``embedding_cache.fingerprint``).

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        s = self._s
        with self._errors("prune the embedding cache"), self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                         (f"qmdbridge.cache-prune:{self.target.schema}",))
            if used:
                conn.execute(f"UPDATE {s}.embedding_cache SET updated_at = now()"
                             " WHERE fingerprint = %s AND content_hash = ANY(%s::text[])",
                             (fingerprint, _text_array(used)))
            count, agents = conn.execute(
                f"SELECT (SELECT count(*) FROM {s}.embedding_cache),"
                f" (SELECT count(DISTINCT agent_id) FROM {s}.workspaces)").fetchone()
            cap = max_entries * max(1, int(agents))
            if int(count) <= cap:
                return 0
            return int(conn.execute(
                f"DELETE FROM {s}.embedding_cache WHERE (content_hash, fingerprint) IN"
                f" (SELECT content_hash, fingerprint FROM {s}.embedding_cache"
                " ORDER BY updated_at, content_hash, fingerprint LIMIT %s)",
                (int(count) - cap,)).rowcount)

    # -- writes -------------------------------------------------------------------------------------

    def sync_lease(self, *, wait_ms: int = 0) -> SyncLease | None:
        """Take the one sync of this agent + workspace across hosts.

        Args:
            wait_ms: how long to wait for another host's sync to finish (0: do not wait).

        Returns:
            The lease, or ``None`` when another sync holds it past ``wait_ms``; then
            :attr:`busy_reason` names the holder (application, host, pid).

        Raises:
            PostgresUnavailableError / PostgresStoreError.
            UsageError: this store is a :meth:`view` of a shared scope (read-only).
        """
        import psycopg

        if self._view_of is not None:
            raise UsageError(f"the shared scope of agent {self.agent_id} is read-only")
        with self._errors("take the sync lock"):
            conn = self._connect()
        try:
            key = f"qmdbridge.sync:{self.target.schema}:{self.agent_id}:{self.workspace}"
            deadline = time.monotonic() + wait_ms / 1000
            with self._errors("take the sync lock"):
                while True:
                    got = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)).fetchone()[0]
                    if got:
                        break
                    if time.monotonic() >= deadline:
                        self.busy_reason = self._holder(conn, key)
                        conn.close()
                        return None
                    # Wait on the lock itself (lock_timeout bounds it, not the statement
                    # deadline, which is shorter than a sync), not on a sleep.
                    remaining = max(1, int((deadline - time.monotonic()) * 1000))
                    conn.execute(f"SET lock_timeout = {remaining}; SET statement_timeout = 0")
                    try:
                        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (key,))
                        break
                    except psycopg.errors.LockNotAvailable:  # lock_timeout ended the wait
                        pass
                    finally:
                        conn.execute("SET lock_timeout = 0;"
                                     f" SET statement_timeout = {int(self.statement_timeout_ms)}")
            self.busy_reason = None
            return SyncLease(self, conn)
        except BaseException:
            conn.close()
            raise

    def _holder(self, conn: Any, key: str) -> str:
        row = conn.execute(
            "SELECT a.application_name, coalesce(host(a.client_addr), 'local socket'), a.pid"
            " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"
            " AND l.granted AND l.objid = (hashtext(%s)::bigint & 4294967295)::oid LIMIT 1",
            (key,)).fetchone()
        who = f"{row[0] or 'a client'} from {row[1]} (server pid {row[2]})" if row else "another client"
        return (f"another sync of agent {self.agent_id} workspace {self.workspace} is running:"
                f" {who}")

    def close(self) -> None:
        """Close the pool and the tokenizer (idempotent); a :meth:`view` closes nothing."""
        if self._view_of is not None:
            return
        self._pool.close()
        self._tokenizer.close()
        self._trigrams.close()


class SyncLease:
    """The one running sync of a store's agent + workspace; writes generation ``P + 1``.

    Use as a context manager; leaving it without :meth:`publish` keeps what was written for the
    next lease (nothing is published, nothing is lost).

    :meth:`write_files` gathers files until they hold :data:`WRITE_CHUNKS` chunks and writes
    them in one transaction (a *write*); every other method writes the gathered ones first.
    A write's rows are built in the caller's thread and its transaction runs on one of the
    lease's writer threads, each with a connection of its own (the lease's, which holds the
    lock, and one more), so the next write is built while the server works on this one: at most
    :data:`WRITES_IN_FLIGHT` writes in flight, which every other method waits for first
    (:meth:`flush` waits for them alone). Writes in flight hold disjoint files, and the chunk
    row ids of each are drawn one write after another (a range of its own, as the posting
    blocks need); a write of a file that generation ``P + 1`` already holds waits for the
    writes before it (replacing its rows rewrites posting blocks other files share). A write's
    failure is raised by the next call (:meth:`write_files`, :meth:`flush`,
    :meth:`delete_file`, :meth:`file_hash` or :meth:`publish`).

    Attributes:
        published / generation: the published generation ``P`` and the one written, ``P + 1``.
        chunks_written: chunks this lease wrote; :meth:`publish` refreshes the planner's
            statistics when they are at least a tenth of the published chunks.
    """

    def __init__(self, store: PostgresStore, conn: Any) -> None:
        self.store = store
        self._conn = conn
        s = store._s
        self._scope = {"agent": store.agent_id, "ws": store.workspace}
        with store._errors("start the sync"), conn.transaction():
            conn.execute(f"INSERT INTO {s}.workspaces (agent_id, workspace) VALUES (%(agent)s, %(ws)s)"
                         " ON CONFLICT DO NOTHING", self._scope)
            published = conn.execute(f"SELECT published_generation FROM {s}.workspaces"
                                     " WHERE agent_id = %(agent)s AND workspace = %(ws)s",
                                     self._scope).fetchone()[0]
            self.published = int(published)
            self.generation = self.published + 1
            # COPY writes postings fastest, but PostgreSQL refuses COPY FROM where row-level
            # security applies (an agent's own role): INSERTs there.
            self._copy = not conn.execute("SELECT row_security_active(%s)",
                                          (f"{s}.posting_blocks",)).fetchone()[0]
            # The chunks' identity sequence, when this role may draw from it: a write draws
            # its chunks' row ids first and COPYs the chunks with them (else an INSERT
            # returns them).
            seq = conn.execute("SELECT pg_get_serial_sequence(%s, 'chunk_rowid')",
                               (f"{s}.chunks",)).fetchone()[0]
            self._ids_seq = seq if self._copy and conn.execute(
                "SELECT has_sequence_privilege(%s, 'USAGE')", (seq,)).fetchone()[0] else None
            # (path, source) of the files with chunks in generation P + 1 (its posting blocks)
            self._held = set(conn.execute(
                f"SELECT DISTINCT path, source FROM {s}.chunks WHERE agent_id = %(agent)s"
                " AND workspace = %(ws)s AND gen_from = %(gen)s",
                {**self._scope, "gen": self.generation}).fetchall())
            # A killed sync's rows of generation P + 1 are published with this one: their terms
            # count in the statistics this lease publishes. A posting block holds postings of
            # existing chunks of its own generation alone (_delete_chunks), so without such
            # chunks there is no such block, and the scan of the agent's blocks is skipped.
            self._terms = _TermCounts()
            if self._held:
                self._terms.add_rows(conn.execute(
                    f"SELECT b.term, count(*), max(u.h0), max(u.h1), max(u.h2), min(u.dl) FROM"
                    f" {s}.posting_blocks b CROSS JOIN LATERAL unnest(b.lens, b.{', b.'.join(TF_COLUMNS)})"
                    " AS u(dl, h0, h1, h2) WHERE b.agent_id = %(agent)s"
                    " AND b.workspace = %(ws)s AND b.gen_from = %(gen)s GROUP BY b.term",
                    {**self._scope, "gen": self.generation}).fetchall())
        self.chunks_written = 0
        self._writer: Any = None  # the writer threads (an executor), started by a write
        self._conns = [conn]  # the writers' connections: the lease's first, one more when needed
        # the writes in flight, oldest first: (future of its term counts, its connection)
        self._pending: collections.deque[tuple[Any, Any]] = collections.deque()
        self._gathered: list[FileRows] = []  # files given to write_files, not yet written
        self._rowids = threading.Lock()  # held while a write's chunks draw their row ids

    def flush(self) -> None:
        """Write the files gathered and wait for the writes in flight (:meth:`write_files` may
        return before their commit).

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError: a failure of
                one (the oldest failed).
        """
        self._send()
        while self._pending:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        """Wait for the oldest write in flight and count its terms (raises its failure)."""
        future, _ = self._pending.popleft()
        self._terms.merge(future.result())

    def __enter__(self) -> SyncLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def file_hash(self, path: str, source: str) -> str | None:
        """The content hash of ``path`` as generation ``P + 1`` holds it (a killed sync's write
        included), or ``None`` when it holds no such file."""
        self.flush()
        s = self.store._s
        with self.store._errors("read a file's state"):
            row = self._conn.execute(
                f"SELECT hash FROM {s}.files WHERE agent_id = %(agent)s AND workspace = %(ws)s"
                " AND path = %(path)s AND source = %(source)s AND gen_from <= %(gen)s"
                " AND (gen_to IS NULL OR gen_to > %(gen)s)",
                {**self._scope, "path": path, "source": source, "gen": self.generation}).fetchone()
        return str(row[0]) if row else None

    def write_file(self, path: str, source: str, *, content_hash: str, mtime_ms: int, size: int,
                   title: str, chunks: Sequence[ChunkRow]) -> None:
        """Replace one file's rows in generation ``P + 1`` (one transaction); see
        :meth:`write_files` for the arguments.

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        self.write_files([FileRows(path, source, content_hash, mtime_ms, size, title, tuple(chunks))])

    def write_files(self, files: Sequence[FileRows]) -> None:
        """Replace the rows of several files in generation ``P + 1``: gathered with the files
        of the calls before until they hold :data:`WRITE_CHUNKS` chunks, then written in one
        transaction on a writer thread (see the class docstring): files and chunks by one
        ``INSERT`` each over arrays sent as array literals; the posting blocks, trigram
        postings and vectors built column-wise (numpy) and sent by binary ``COPY``
        (``rows.write_rows``; an ``INSERT`` where row-level security applies), by statements
        of at most :data:`WRITE_POSTINGS_PER_STATEMENT` postings.

        Args:
            files: the files, each with its chunks (a path at most once).

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError: the failure
                of a write before; nothing of the failed write is kept.
        """
        if not files:
            return
        keys = {(f.path, f.source) for f in files}
        if any((f.path, f.source) in keys for f in self._gathered):
            self._send()  # a path at most once a write
        self._gathered += files
        if sum(len(f.chunks) for f in self._gathered) >= WRITE_CHUNKS:
            self._send()

    def _send(self) -> None:
        """Write the files gathered (one write, see :meth:`write_files`)."""
        from concurrent.futures import ThreadPoolExecutor

        files, self._gathered = self._gathered, []
        if not files:
            return
        store = self.store
        # One source after the other: a source's chunks get a range of row ids of their own,
        # so the blocks of a term (one per source) do not interleave (see _new_blocks).
        files = sorted(files, key=lambda f: f.source)
        chunks = [(f, c) for f in files for c in f.chunks]
        self.chunks_written += len(chunks)
        post = store._tokenizer.postings([(c.text, f.title, c.derived_terms) for f, c in chunks])
        cjk = [i for i, (_, c) in enumerate(chunks) if contains_unspaced(c.text)]
        trigrams = store._trigrams.postings([(chunks[i][1].text,) for i in cjk])
        import numpy as np

        # per chunk, its trigram count (NULL: no CJK text)
        tri_len = np.ma.masked_all(len(chunks), dtype=np.int64)
        tri_len[cjk] = trigrams.doc_len
        args = {**self._scope, "gen": self.generation,
                "paths": _text_array(f.path for f in files),
                "sources": _text_array(f.source for f in files)}
        keys = {(f.path, f.source) for f in files}
        if keys & self._held:
            self.flush()  # its rows in this generation go first (see the class docstring)
        self._held |= keys
        while len(self._pending) >= WRITES_IN_FLIGHT:
            self._wait_oldest()
        busy = [c for _, c in self._pending]
        conn = next((c for c in self._conns if not any(c is b for b in busy)), None)
        if conn is None:
            with store._errors("connect a writer"):
                conn = store._connect()
            self._conns.append(conn)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(WRITES_IN_FLIGHT, thread_name_prefix="qmdbridge-pg-writer")
        self._pending.append((self._writer.submit(self._write, conn, files, chunks, post, cjk, trigrams,
                                                  args, tri_len), conn))

    def _write(self, conn: Any, files: Sequence[FileRows], chunks: list[tuple[FileRows, ChunkRow]],
               post: Postings, cjk: list[int], trigrams: Postings, args: dict[str, Any],
               tri_len: Any) -> _TermCounts:
        """The transaction of :meth:`write_files` on ``conn`` (on a writer thread); the term
        counts it changed."""
        import numpy as np

        store, s = self.store, self.store._s
        counts = _TermCounts()
        with store._errors("write files"), conn.transaction(), conn.cursor() as cur:
            counts.remove(self._retire(cur, args))
            cur.execute(f"INSERT INTO {s}.files (agent_id, workspace, path, source, hash, mtime, size,"
                        " text, gen_from) SELECT %(agent)s, %(ws)s, x.p, x.s, x.h, x.m, x.n, x.t, %(gen)s"
                        " FROM unnest(%(paths)s::text[], %(sources)s::text[], %(hashes)s::text[],"
                        " %(mtimes)s::bigint[], %(sizes)s::bigint[], %(ftexts)s::text[])"
                        " AS x(p, s, h, m, n, t)",
                        {**args, "hashes": _text_array(f.content_hash for f in files),
                         "mtimes": _int_array(f.mtime_ms for f in files),
                         "sizes": _int_array(f.size for f in files),
                         "ftexts": [f.text for f in files]})
            if not chunks:
                return counts
            n = len(chunks)
            columns = [Column("agent_id", "text", [self._scope["agent"]] * n),
                       Column("workspace", "text", [self._scope["ws"]] * n),
                       Column("id", "text", [c.chunk_id for _, c in chunks]),
                       Column("path", "text", [f.path for f, _ in chunks]),
                       Column("source", "text", [f.source for f, _ in chunks]),
                       Column("start_line", "int4", np.fromiter((c.start_line for _, c in chunks), np.int64, n)),
                       Column("end_line", "int4", np.fromiter((c.end_line for _, c in chunks), np.int64, n)),
                       Column("hash", "text", [c.content_hash for _, c in chunks]),
                       Column("model", "text", [c.model for _, c in chunks]),
                       Column("text", "text", [c.text for _, c in chunks]),
                       Column("doc_len", "int4", post.doc_len),
                       Column("trigram_len", "int4", tri_len),
                       Column("terms", "text", list(map(" ".join, post.chunk_terms()))),
                       Column("gen_from", "int8", np.full(n, self.generation, dtype=np.int64))]
            # The row ids of one write after another's: a range of its own (see _new_blocks).
            with self._rowids:
                if self._ids_seq is None:
                    rowids = np.asarray(write_rows(cur, f"{s}.chunks", columns, copy=False,
                                                   returning="chunk_rowid"), dtype=np.int64)
                else:
                    cur.execute("SELECT nextval(%s::regclass) FROM generate_series(1, %s)", (self._ids_seq, n))
                    rowids = np.fromiter((r[0] for r in cur.fetchall()), dtype=np.int64, count=n)
            rowids = np.sort(rowids)
            if self._ids_seq is not None:
                write_rows(cur, f"{s}.chunks", [Column("chunk_rowid", "int8", rowids), *columns], copy=True)
            counts.add_postings(post)
            sources = [f.source for f, _ in chunks]
            _write_blocks(cur, f"{s}.posting_blocks", self._scope,
                          _new_blocks(post, rowids, sources, self.generation), copy=self._copy)
            if cjk:
                tri_rows = np.asarray(cjk, dtype=np.int64)[trigrams.chunk]
                _write_limited(cur, f"{s}.trigram_postings", self._scope, [
                    Column("term", "text", [trigrams.terms[t] for t in trigrams.term.tolist()]),
                    Column("chunk_rowid", "int8", rowids[tri_rows]),
                    Column("positions", "int4[]", trigrams.positions,
                           np.diff(trigrams.ends, prepend=0))], copy=self._copy)
            embedded = [(r, i, v) for r, (_, c) in zip(rowids.tolist(), chunks, strict=True)
                        for i, v in enumerate(c.vectors)]
            if embedded:
                sizes = np.fromiter((len(v) for _, _, v in embedded), dtype=np.int64, count=len(embedded))
                _write_limited(cur, f"{s}.chunk_vectors", self._scope, [
                    Column("chunk_rowid", "int8", np.fromiter((r for r, _, _ in embedded), dtype=np.int64)),
                    Column("window_no", "int4", np.fromiter((i for _, i, _ in embedded), dtype=np.int64)),
                    Column("dims", "int4", sizes),
                    Column("embedding", "vector", np.fromiter(
                        itertools.chain.from_iterable(v for _, _, v in embedded), dtype=np.float32,
                        count=int(sizes.sum())), sizes)], copy=self._copy)
        return counts

    def delete_file(self, path: str, source: str) -> None:
        """Leave ``path`` out of generation ``P + 1`` (one transaction).

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        self.flush()
        args = {**self._scope, "paths": _text_array([path]), "sources": _text_array([source]),
                "gen": self.generation}
        with self.store._errors("delete a file"), self._conn.transaction(), self._conn.cursor() as cur:
            gone = self._retire(cur, args)
        self._terms.remove(gone)

    def _retire(self, cur: Any, args: dict[str, Any]) -> list[str]:
        """Drop this generation's own rows of the files ``args["paths"]`` / ``args["sources"]``
        (array literals) and end the older ones at it; the terms of the dropped postings (one
        per posting). Only the
        files the scope holds are touched (a new file's statements found nothing, on a first
        sync a tenth of its time)."""
        s = self.store._s
        where = ("agent_id = %(agent)s AND workspace = %(ws)s AND (path, source) IN"
                 " (SELECT * FROM unnest(%(paths)s::text[], %(sources)s::text[]))")
        # A file's chunks are written and retired with its files row. Each path looked up by
        # the scope's index (LATERAL): the planner, taking the scope for a few rows, compared
        # every file of the scope with every path of the write (quadratic over a first sync).
        cur.execute(f"SELECT f.path, f.source FROM unnest(%(paths)s::text[], %(sources)s::text[])"
                    f" AS x(p, src) CROSS JOIN LATERAL (SELECT path, source FROM {s}.files"
                    " WHERE agent_id = %(agent)s AND workspace = %(ws)s AND path = x.p"
                    " AND source = x.src AND (gen_to IS NULL OR gen_from = %(gen)s) OFFSET 0) f", args)
        held = cur.fetchall()
        if not held:
            return []
        args = {**args, "paths": _text_array(p for p, _ in held),
                "sources": _text_array(src for _, src in held)}
        gone = _delete_chunks(cur, s, f"{where} AND gen_from = %(gen)s", args, copy=self._copy)
        cur.execute(f"DELETE FROM {s}.files WHERE {where} AND gen_from = %(gen)s", args)
        for table in ("chunks", "files"):
            cur.execute(f"UPDATE {s}.{table} SET gen_to = %(gen)s WHERE {where} AND gen_to IS NULL",
                        args)
        return gone

    def publish(self, *, skipped: Sequence[tuple[str, str]] = ()) -> ScopeStats:
        """Make generation ``P + 1`` the one readers see and delete the rows it retired, in one
        transaction (a posting carries no ``gen_to``). The lease ends.

        Args:
            skipped: ``(path, reason)`` of each file the sync skipped or indexed with a caveat,
                kept with the published generation (``workspaces.meta``'s ``skipped``) for
                ``status``.

        Returns:
            The new published statistics.

        Raises:
            PostgresUnavailableError / PostgresTimeoutError / PostgresStoreError.
        """
        self.flush()
        s = self.store._s
        args = {**self._scope, "gen": self.generation}
        with self.store._errors("publish the sync"):
            with self._conn.transaction():
                count, tokens, tri_count, tri_tokens = self._conn.execute(
                    f"SELECT count(*), coalesce(sum(doc_len), 0), count(trigram_len),"
                    f" coalesce(sum(trigram_len), 0) FROM {s}.chunks c"
                    f" WHERE c.agent_id = %(agent)s AND c.workspace = %(ws)s AND {_visible('c')}",
                    args).fetchone()
                self._conn.execute(f"UPDATE {s}.workspaces SET published_generation = %(gen)s,"
                                   " chunk_count = %(n)s, token_count = %(t)s,"
                                   " trigram_chunk_count = %(tn)s, trigram_token_count = %(tt)s,"
                                   " last_sync_at = now(), meta = jsonb_set(meta, '{skipped}', %(skipped)s::jsonb)"
                                   " WHERE agent_id = %(agent)s AND workspace = %(ws)s",
                                   {**args, "n": count, "t": tokens, "tn": tri_count,
                                    "tt": tri_tokens, "skipped": json.dumps(sorted(map(list, skipped)))})
                # In the same transaction: postings have no gen_to (a search of the new
                # generation must not find the rows it retired).
                with self._conn.cursor() as cur:
                    where = "agent_id = %(agent)s AND workspace = %(ws)s AND gen_to <= %(gen)s"
                    self._terms.remove(_delete_chunks(cur, s, where, args, copy=self._copy))
                    cur.execute(f"DELETE FROM {s}.files WHERE {where}", args)
                    self._terms.publish(cur, f"{s}.term_stats", self._scope)
            # Fresh planner statistics once the tables changed much: on tables it has not
            # analysed, the planner took an agent's postings for a handful of rows and scanned
            # all of them for a query's terms, and an agent's files for one row, comparing each
            # with every path a write replaces. A small sync skips it (autovacuum's analyze
            # follows the drift; ANALYZE of a large table after every small sync took CPU from
            # the searches). A role that does not own the tables is skipped by ANALYZE with a
            # notice. The largest table is analysed on the second writer's connection meanwhile.
            if self.chunks_written * ANALYZE_SHARE >= count:
                tables = ["files", "chunks", "trigram_postings", "term_stats", "chunk_vectors"]
                blocks = f"ANALYZE {s}.posting_blocks"
                aside = self._writer.submit(self._conns[1].execute, blocks) if len(self._conns) > 1 else None
                for table in tables:
                    self._conn.execute(f"ANALYZE {s}.{table}")
                if aside is None:
                    self._conn.execute(blocks)
                else:
                    aside.result()
        stats = ScopeStats(self.generation, int(count), int(tokens), None, int(tri_count),
                           int(tri_tokens))
        self.close()
        return stats

    def close(self) -> None:
        """End the lease without publishing (releases the lock; idempotent): the files
        gathered are written and the writes in flight end first (their errors are not raised:
        nothing is published either way)."""
        with contextlib.suppress(Exception):
            self._send()  # what write_files was given is written, as the writes in flight
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
            self._pending.clear()
        if not self._conn.closed:
            # Released before the connection closes: its session ends after close() returns,
            # and a sync starting then would find the lock still held.
            with contextlib.suppress(Exception):
                self._conn.execute("SELECT pg_advisory_unlock_all()")
        for conn in self._conns:
            if not conn.closed:
                conn.close()


def _delete_chunks(cur: Any, schema: str, where: str, args: dict[str, Any], *,
                   copy: bool) -> list[str]:
    """Delete the chunks matching ``where`` with their postings, trigram postings and vectors;
    the terms of the deleted postings (one per posting). A chunk's postings leave their
    blocks: each block holding one (found by key from the chunk's ``terms``) is deleted and
    its other chunks' postings written again as a block (``copy``: by ``COPY``), by statements
    of about :data:`POSTINGS_PER_STATEMENT` postings (whole terms: a block is one term's, so
    each is read and written again once)."""
    cur.execute(f"DELETE FROM {schema}.chunks WHERE {where} RETURNING chunk_rowid, terms", args)
    deleted = cur.fetchall()
    if not deleted:
        return []
    gone = [r for r, _ in deleted]
    terms: list[str] = []
    rowids: list[int] = []
    for rowid, held in deleted:
        if held:
            split = held.split(" ")
            terms += split
            rowids += [rowid] * len(split)
    scope = {"agent": args["agent"], "ws": args["ws"]}
    pairs = sorted(zip(terms, rowids, strict=True))
    start = 0
    while start < len(pairs):
        end = min(start + POSTINGS_PER_STATEMENT, len(pairs))
        while end < len(pairs) and pairs[end][0] == pairs[end - 1][0]:
            end += 1  # a term's postings in one statement
        part = pairs[start:end]
        start = end
        cur.execute(f"DELETE FROM {schema}.posting_blocks b WHERE b.agent_id = %(agent)s"
                    " AND b.workspace = %(ws)s AND (b.term, b.chunk_rowid) IN (SELECT g.term,"
                    f" (SELECT max(k.chunk_rowid) FROM {schema}.posting_blocks k"
                    " WHERE k.agent_id = %(agent)s AND k.workspace = %(ws)s AND k.term = g.term"
                    " AND k.chunk_rowid <= g.r) FROM unnest(%(terms)s::text[], %(rowids)s::bigint[])"
                    f" AS g(term, r)) RETURNING b.term, b.source, b.gen_from, b.rowids, b.lens,"
                    f" b.{', b.'.join(TF_COLUMNS)}, b.ends, b.positions",
                    {**scope, "terms": _text_array([t for t, _ in part]),
                     "rowids": _int_array([r for _, r in part])})
        _write_blocks(cur, f"{schema}.posting_blocks", scope, _kept_blocks(cur.fetchall(), gone), copy=copy)
    for table in ("trigram_postings", "chunk_vectors"):
        cur.execute(f"DELETE FROM {schema}.{table} WHERE chunk_rowid = ANY(%s)", (gone,))
    return terms


class _TermCounts:
    """What a sync changes in ``term_stats``: per term, the postings added less those removed
    (``df``), and the most hits per column and the shortest chunk of the added ones. Counts are
    kept as the arrays each write gave and summed per term once, at :meth:`publish`."""

    # A removal's shortest chunk: it narrows no bound.
    _NO_LENGTH = 2**31 - 1

    def __init__(self) -> None:
        # (terms, df, hits per column, min length, added) per count, aligned numpy arrays
        self._parts: list[tuple[list[str], Any, Any, Any, bool]] = []

    def add_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Count aggregated postings: ``(term, count, max hits of each column..., min length)``."""
        import numpy as np

        if rows:
            values = np.asarray([r[1:] for r in rows], dtype=np.int64)
            self._parts.append(([r[0] for r in rows], values[:, 0], values[:, 1:-1], values[:, -1], True))

    def add_postings(self, post: Postings) -> None:
        """Count the postings of a write (``tokens.Postings``: ordered by term)."""
        import numpy as np

        if not len(post.term):
            return
        starts = np.flatnonzero(np.diff(post.term, prepend=-1))
        self._parts.append(([post.terms[t] for t in post.term[starts].tolist()],
                            np.diff(starts, append=len(post.term)),
                            np.maximum.reduceat(post.hits, starts, axis=0),
                            np.minimum.reduceat(post.doc_len[post.chunk], starts), True))

    def remove(self, dropped: list[str]) -> None:
        """Count postings deleted (a term once per posting)."""
        import numpy as np

        if dropped:
            n = len(dropped)
            self._parts.append((dropped, np.full(n, -1, dtype=np.int64),
                                np.zeros((n, len(TF_COLUMNS)), dtype=np.int64),
                                np.full(n, self._NO_LENGTH, dtype=np.int64), False))

    def merge(self, other: _TermCounts) -> None:
        """Add another count (a committed write's)."""
        self._parts += other._parts

    def publish(self, cur: Any, table: str, scope: dict[str, Any]) -> None:
        """Apply the counts to ``table`` (``term_stats``) by statements of at most
        :data:`POSTINGS_PER_STATEMENT` terms; terms no chunk holds any more are deleted."""
        import numpy as np

        if not self._parts:
            return
        names = list(itertools.chain.from_iterable(p[0] for p in self._parts))
        terms = list(dict.fromkeys(names))
        slot = dict(zip(terms, range(len(terms)), strict=True))
        at = np.fromiter(map(slot.__getitem__, names), dtype=np.int64, count=len(names))
        df = np.zeros(len(terms), dtype=np.int64)
        np.add.at(df, at, np.concatenate([p[1] for p in self._parts]))
        most = np.zeros((len(terms), len(TF_COLUMNS)), dtype=np.int64)
        np.maximum.at(most, at, np.concatenate([p[2] for p in self._parts]))
        least = np.full(len(terms), self._NO_LENGTH, dtype=np.int64)
        np.minimum.at(least, at, np.concatenate([p[3] for p in self._parts]))
        added = np.zeros(len(terms), dtype=bool)
        added[at[np.concatenate([np.full(len(p[0]), p[4]) for p in self._parts])]] = True
        changed = [i for i in sorted(range(len(terms)), key=terms.__getitem__) if df[i] or added[i]]
        for first in range(0, len(changed), POSTINGS_PER_STATEMENT):
            rows = np.asarray(changed[first:first + POSTINGS_PER_STATEMENT], dtype=np.int64)
            part = [terms[i] for i in rows.tolist()]
            cur.execute(f"INSERT INTO {table} AS s (agent_id, workspace, term, df, max_tf, min_dl)"
                        " SELECT %(agent)s, %(ws)s, t, n, ARRAY[a, b, c], m FROM unnest(%(terms)s::text[],"
                        " %(dfs)s::bigint[], %(a)s::int[], %(b)s::int[], %(c)s::int[], %(m)s::int[])"
                        " AS x(t, n, a, b, c, m) ORDER BY t"
                        " ON CONFLICT (agent_id, workspace, term) DO UPDATE SET df = s.df + EXCLUDED.df,"
                        " max_tf = ARRAY[greatest(s.max_tf[1], EXCLUDED.max_tf[1]),"
                        " greatest(s.max_tf[2], EXCLUDED.max_tf[2]), greatest(s.max_tf[3], EXCLUDED.max_tf[3])],"
                        " min_dl = least(s.min_dl, EXCLUDED.min_dl)",
                        {**scope, "terms": _text_array(part), "dfs": _int_array(df[rows]),
                         "a": _int_array(most[rows, 0]), "b": _int_array(most[rows, 1]),
                         "c": _int_array(most[rows, 2]), "m": _int_array(least[rows])})
            cur.execute(f"DELETE FROM {table} WHERE agent_id = %(agent)s AND workspace = %(ws)s"
                        " AND term = ANY(%(terms)s::text[]) AND df <= 0", {**scope, "terms": _text_array(part)})


@dataclass(frozen=True)
class _Blocks:
    """Posting blocks to write, column-wise (numpy arrays; see migration ``m009``).

    Attributes:
        term / source: per block (lists of ``str``); gen_from: per block.
        size: per block, its postings (the postings are block after block).
        rowid / dl / hits / count: per posting, its chunk's row id and ``doc_len``, its hits
            per column (``(postings, columns)``) and its positions' count.
        positions: every posting's positions, posting after posting.
    """

    term: list[str]
    source: list[str]
    gen_from: Any
    size: Any
    rowid: Any
    dl: Any
    hits: Any
    count: Any
    positions: Any


def _new_blocks(post: Postings, rowids: Any, sources: Sequence[str], gen: int) -> _Blocks:
    """The posting blocks of chunks written in generation ``gen`` (``post``: their postings;
    ``rowids`` / ``sources``: per chunk, ascending row ids, the chunks of each source
    together): per term and source, runs of at most :data:`BLOCK_CHUNKS` chunks. A term's
    blocks hold ranges of row ids that do not overlap, so a chunk's posting is in the block
    with the largest key at or below it."""
    import numpy as np

    n = len(post.term)
    names = sorted(set(sources))
    source = np.asarray([names.index(x) for x in sources] if len(names) > 1 else [0] * len(sources),
                        dtype=np.int32)[post.chunk]
    group = np.ones(n, dtype=bool)  # a posting that starts a (term, source) run
    group[1:] = (post.term[1:] != post.term[:-1]) | (source[1:] != source[:-1])
    index = np.arange(n)
    since = index - np.maximum.accumulate(np.where(group, index, 0))
    starts = np.flatnonzero(group | (since % BLOCK_CHUNKS == 0))
    terms = post.terms
    return _Blocks([terms[t] for t in post.term[starts].tolist()],
                   [names[x] for x in source[starts].tolist()],
                   np.full(len(starts), gen, dtype=np.int64), np.diff(starts, append=n),
                   rowids[post.chunk], post.doc_len[post.chunk], post.hits,
                   np.diff(post.ends, prepend=0), post.positions)


def _kept_blocks(rows: Sequence[Sequence[Any]], gone: Sequence[int]) -> _Blocks:
    """The blocks of ``rows`` (``term, source, gen_from, rowids, lens``, the hits per column,
    ``ends, positions`` as read) without the postings of the chunks ``gone``; a block left
    with none is dropped."""
    import numpy as np

    def flat(k: int) -> Any:
        return np.fromiter(itertools.chain.from_iterable(r[k] for r in rows), dtype=np.int64)

    columns = len(TF_COLUMNS)
    size = np.fromiter((len(r[3]) for r in rows), dtype=np.int64, count=len(rows))
    rowid, dl, ends, positions = flat(3), flat(4), flat(5 + columns), flat(6 + columns)
    hits = np.stack([flat(5 + c) for c in range(columns)], axis=1)
    first = np.cumsum(size) - size
    count = ends - np.where(np.isin(np.arange(len(ends)), first), 0, np.roll(ends, 1))
    keep = ~np.isin(rowid, np.asarray(gone, dtype=np.int64))
    block = np.repeat(np.arange(len(rows)), size)
    size = np.bincount(block[keep], minlength=len(rows))
    live = np.flatnonzero(size)
    return _Blocks([rows[i][0] for i in live.tolist()], [rows[i][1] for i in live.tolist()],
                   np.asarray([rows[i][2] for i in live.tolist()], dtype=np.int64), size[live],
                   rowid[keep], dl[keep], hits[keep], count[keep], positions[np.repeat(keep, count)])


def _write_blocks(cur: Any, table: str, scope: dict[str, Any], blocks: _Blocks, *, copy: bool) -> None:
    """Write posting blocks (``rows.write_rows``: binary ``COPY`` with ``copy``, else an
    ``INSERT``) by statements of at most :data:`WRITE_POSTINGS_PER_STATEMENT` postings."""
    import numpy as np

    size = blocks.size
    if not len(size):
        return
    first = np.cumsum(size) - size
    cum = np.cumsum(blocks.count)
    ends = cum - np.repeat((cum - blocks.count)[first], size)  # within the block
    _write_limited(cur, table, scope, [
        Column("term", "text", blocks.term), Column("source", "text", blocks.source),
        Column("chunk_rowid", "int8", blocks.rowid[first]),
        Column("rowids", "int8[]", blocks.rowid, size), Column("lens", "int4[]", blocks.dl, size),
        *(Column(c, "int4[]", blocks.hits[:, i], size) for i, c in enumerate(TF_COLUMNS)),
        Column("ends", "int4[]", ends, size),
        Column("positions", "int4[]", blocks.positions, np.add.reduceat(blocks.count, first)),
        Column("gen_from", "int8", blocks.gen_from)], copy=copy)


def _write_limited(cur: Any, table: str, scope: dict[str, Any], columns: list[Column], *,
                   copy: bool) -> None:
    """``rows.write_rows`` of ``columns`` with the scope's ``agent_id`` and ``workspace``, by
    statements of at most :data:`WRITE_POSTINGS_PER_STATEMENT` rows, or elements of the first array
    column (one row more when a single row holds more; a ``vector`` counts as one, the server
    reads it whole): the statement deadline bounds each statement, so a write of any size goes
    through."""
    import numpy as np

    weighted = next((c.counts for c in columns if c.counts is not None and c.kind != "vector"), None)
    rows = len(columns[0].values) if columns[0].counts is None else len(columns[0].counts)
    weight = np.ones(rows, dtype=np.int64) if weighted is None else np.asarray(weighted)
    before = np.cumsum(weight) - weight
    cuts = np.flatnonzero(np.diff(before // WRITE_POSTINGS_PER_STATEMENT, prepend=-1)).tolist() + [rows]
    for a, b in itertools.pairwise(cuts):
        part = [_rows_of(c, a, b) for c in columns]
        part += [Column("agent_id", "text", [scope["agent"]] * (b - a)),
                 Column("workspace", "text", [scope["ws"]] * (b - a))]
        write_rows(cur, table, part, copy=copy)


def _rows_of(column: Column, a: int, b: int) -> Column:
    """Rows ``a`` to ``b`` (exclusive) of ``column``."""
    if column.counts is None:
        return Column(column.name, column.kind, column.values[a:b])
    first = int(column.counts[:a].sum())
    counts = column.counts[a:b]
    return Column(column.name, column.kind, column.values[first:first + int(counts.sum())], counts)


def _read_block(table: str, alias: str) -> str:
    """SQL: a lateral row ``alias`` with the positions of the posting block ``table`` read once
    (``array_cat(x, '{}')`` is ``x`` detoasted): each subscript of a toasted array reads it
    again, once per chunk of the block (a four-word search read 20 times the buffers)."""
    arrays = ", ".join(f"array_cat({table}.{c}, '{{}}') AS {c}" for c in ("ends", "positions"))
    return f"CROSS JOIN LATERAL (SELECT {arrays} OFFSET 0) {alias}"


def _unnest_block(table: str, alias: str, *arrays: tuple[str, str]) -> str:
    """SQL: a lateral ``alias`` with one row per chunk of the posting block ``table``: each
    ``(array, name)`` of ``arrays`` unnested side by side and ``i``, the chunk's 1-based place.
    The set-returning functions stand in a select list (one projection), which costs a block
    about half what ``unnest(a, b, ...) WITH ORDINALITY`` in ``FROM`` costs (a function scan
    that stores its rows before returning them)."""
    cols = ", ".join(f"unnest({table}.{a}) AS {n}" for a, n in arrays)
    return (f"CROSS JOIN LATERAL (SELECT {cols}, generate_series(1, cardinality({table}.rowids)) AS i)"
            f" {alias}")


def _block_positions(block: str, i: str) -> str:
    """SQL: the positions of the ``i``-th (1-based) chunk of posting block ``block``."""
    return f"{block}.positions[coalesce({block}.ends[{i} - 1], 0) + 1:{block}.ends[{i}]]"


def _scope_stats(row: Sequence[Any] | None) -> ScopeStats:
    """:class:`ScopeStats` of a row of ``PostgresStore._stats_sql`` (``None``: no published index)."""
    if row is None:
        return ScopeStats(0, 0, 0, None)
    return ScopeStats(int(row[0]), int(row[1]), int(row[2]),
                      int(row[3]) if row[3] is not None else None, int(row[4]), int(row[5]))


def _keyword_row(r: Sequence[Any]) -> KeywordRow:
    return (str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]), str(r[5]), float(r[6]))
